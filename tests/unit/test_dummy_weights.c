/*
 * --load-format dummy and --hf-overrides (issue 7):
 *  - every dummy tensor of a small config is legal and benign: FP8 E4M3
 *    codes finite with |q| <= 1, E8M0 scales never NaN, BF16/F32 finite,
 *    dequantised FP8/FP4/BF16 linears with std within a factor 1.5 of
 *    1/sqrt(in) (the power-of-two scale alone allows sqrt(2)), norms near 1,
 *    tid2eid rows of distinct valid expert ids; the same spec fills the same
 *    bytes twice;
 *  - a CPU forward over dummy weights (target, DSpark drafter, MTP block)
 *    gives finite, non-constant logits and generates through the engine;
 *  - --hf-overrides refuses unknown keys, wrong types, null and non-objects
 *    with the key named; and a backend without fill_dummy is refused.
 * The small configs are the real ones (configs/) shrunk by --hf-overrides.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/dummy.h"
#include "model/formats.h"
#include "model/forward.h"
#include "model/weights.h"
#include "test.h"
#include "test_engine_util.h"

#define SHRINK                                                                                          \
    "\"num_hidden_layers\": 4, \"hidden_size\": 256, \"num_attention_heads\": 4, \"head_dim\": 128, "   \
    "\"q_lora_rank\": 128, \"o_groups\": 2, \"o_lora_rank\": 64, \"moe_intermediate_size\": 128, "      \
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 16, \"index_n_heads\": 4, " \
    "\"index_topk\": 4, \"vocab_size\": 1024, \"num_hash_layers\": 2"
static const char *SMALL_0731 = "{" SHRINK ", \"dspark_noise_token_id\": 1000, \"dspark_markov_rank\": 32}";
static const char *SMALL_FLASH = "{" SHRINK "}";
#define DIR_0731 DSV4_SOURCE_DIR "/configs/deepseek-v4-flash-0731"
#define DIR_FLASH DSV4_SOURCE_DIR "/configs/deepseek-v4-flash"

static double std_of(const float *x, int64_t n) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += x[i], q += (double)x[i] * x[i];
    double m = s / (double)n;
    return sqrt(q / (double)n - m * m);
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Fill every tensor of the inventory on the CPU and check its values. */
static void test_values(void) {
    dsv4_err err = {0};
    dsv4_config c;
    dsv4_dummy *d = NULL;
    dsv4_weights *w = NULL;
    if (dsv4_config_load_ex(DIR_0731, SMALL_0731, &c, &err) || dsv4_dummy_create(&c, 7, &d, &err) ||
        dsv4_weights_bind(&c, dsv4_dummy_ckpt(d), &w, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(0);
        dsv4_dummy_free(d);
        return;
    }
    dsv4_backend *be = dsv4_dummy_backend(d, dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err), &err);
    CHECK(be != NULL);
    if (!be) return;
    const dsv4_ckpt *ck = dsv4_dummy_ckpt(d);
    int bad_code = 0, bad_float = 0, bad_norm = 0, n_lin = 0, bad_lin = 0, bad_ids = 0, n_tid = 0;
    for (size_t i = 0; i < dsv4_ckpt_count(ck); i++) {
        dsv4_tview v = *dsv4_ckpt_at(ck, i);
        const char *nm = v.name;
        size_t ln = strlen(nm);
        if (ln > 6 && !strcmp(nm + ln - 6, ".scale")) continue; /* with its weight below */
        int is_lin = ln > 7 && !strcmp(nm + ln - 7, ".weight") && v.ndim == 2 && !strstr(nm, "embed");
        if (is_lin) {
            /* a linear: weight (+ scale), dequantised row by row */
            dsv4_linear l = {0};
            l.w = v;
            char sn[512];
            snprintf(sn, sizeof sn, "%.*s.scale", (int)(ln - 7), nm);
            const dsv4_tview *s = dsv4_ckpt_find(ck, sn);
            if (s) l.scale = *s;
            l.out = v.shape[0];
            l.in = v.dtype == DSV4_DT_I8 ? 2 * v.shape[1] : v.shape[1];
            if (dsv4_upload_linear(be, &l, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                CHECK(0);
                break;
            }
            if (l.w.dtype == DSV4_DT_F8_E4M3)
                for (size_t k = 0; k < l.w.nbytes; k++) {
                    uint8_t q = ((const uint8_t *)l.w.data)[k];
                    bad_code += (q & 0x7f) == 0x7f || fabsf(dsv4_e4m3_to_f32(q)) > 1.0f;
                }
            if (l.scale.data)
                for (size_t k = 0; k < l.scale.nbytes; k++) bad_code += ((const uint8_t *)l.scale.data)[k] == 0xff;
            int64_t rows = l.out < 64 ? l.out : 64;
            float *x = malloc(sizeof(float) * (size_t)(rows * l.in));
            if (!x || dsv4_linear_dequant_rows(&l, 0, rows, x, &err)) {
                CHECK(0);
                free(x);
                break;
            }
            double sd = std_of(x, rows * l.in), want = 1.0 / sqrt((double)l.in);
            if (rows * l.in >= 8192) {
                n_lin++;
                if (!(sd > want / 1.5 && sd < want * 1.5) || !all_finite(x, rows * l.in)) {
                    bad_lin++;
                    fprintf(stderr, "%s: std %.4g, 1/sqrt(in) %.4g\n", nm, sd, want);
                }
            }
            free(x);
            continue;
        }
        if (v.dtype == DSV4_DT_I64) { /* tid2eid: host values, checked by the binder too */
            const int64_t *t = v.data;
            int k = (int)v.shape[1];
            n_tid++;
            for (int64_t r = 0; r < v.shape[0]; r++)
                for (int a = 0; a < k; a++) {
                    bad_ids += t[r * k + a] < 0 || t[r * k + a] >= c.n_routed_experts;
                    for (int b = 0; b < a; b++) bad_ids += t[r * k + a] == t[r * k + b];
                }
            continue;
        }
        if (dsv4_upload_view(be, &v, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            CHECK(0);
            break;
        }
        int64_t n = dsv4_tview_numel(&v);
        float *f = malloc(sizeof(float) * (size_t)n);
        for (int64_t k = 0; k < n; k++)
            f[k] = v.dtype == DSV4_DT_F32 ? ((const float *)v.data)[k] : dsv4_bf16_to_f32(((const uint16_t *)v.data)[k]);
        bad_float += !all_finite(f, n);
        if (strstr(nm, "norm.weight"))
            for (int64_t k = 0; k < n; k++) bad_norm += fabsf(f[k] - 1.0f) > 0.051f;
        free(f);
    }
    CHECK_EQ_INT(bad_code, 0);
    CHECK_EQ_INT(bad_float, 0);
    CHECK_EQ_INT(bad_norm, 0);
    CHECK_EQ_INT(bad_ids, 0);
    CHECK_EQ_INT(n_tid, 2);
    CHECK(n_lin > 100); /* FP8 attention, FP4 experts, BF16 router/compressor/head were seen */
    CHECK_EQ_INT(bad_lin, 0);
    uint64_t nt, nb;
    dsv4_dummy_stats(d, &nt, &nb);
    CHECK(nt > 0 && nb > 0);

    /* the same spec fills the same bytes; another seed other bytes */
    const dsv4_tview *e = dsv4_ckpt_find(ck, "layers.3.ffn.experts.5.w2.weight");
    CHECK(e != NULL);
    if (e) {
        dsv4_tview a = *e, b = *e;
        CHECK_EQ_INT(dsv4_upload_view(be, &a, &err), 0);
        CHECK_EQ_INT(dsv4_upload_view(be, &b, &err), 0);
        CHECK(a.data != b.data && memcmp(a.data, b.data, a.nbytes) == 0);
        dsv4_fill f2 = *dsv4_dummy_fill_for(d, e);
        f2.seed ^= 1;
        dsv4_tview x = *e;
        x.data = NULL;
        CHECK_EQ_INT(be->fill_dummy(be, &f2, &x, &err), 0);
        CHECK(memcmp(a.data, x.data, a.nbytes) != 0);
        /* a kind that does not fit the dtype is refused */
        dsv4_fill bf = {DSV4_FILL_UNIFORM, 1, 0, 1, 0, 0, 0, 0, 0};
        x = *e;
        CHECK_EQ_INT(be->fill_dummy(be, &bf, &x, &err), DSV4_EINVAL);
    }
    be->free(be);
    dsv4_weights_free(w);
    dsv4_dummy_free(d);
}

static int generate(dsv4_engine *e, const int32_t *p, int n, int max_tokens, int32_t *out) {
    return tu_generate_greedy(e, p, n, max_tokens, out, 16, NULL);
}

/* A forward and a speculative generation over dummy weights. */
static void test_forward(const char *dir, const char *ov, dsv4_draft_kind want) {
    dsv4_model_runner_opts mo = {.n_slots = 2, .max_len = 128, .max_spec = 2, .numerics = DSV4_NUMERICS_REFERENCE,
                                 .n_pages = -1}; /* per-slot state: the test drives the runner without an engine */
    dsv4_load_opts lo = {.dummy = 1, .hf_overrides = ov};
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    if (dsv4_model_runner_open_ex(dir, &mo, &lo, &mr, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        CHECK(0);
        return;
    }
    const dsv4_config *c = dsv4_model_runner_config(mr);
    CHECK_EQ_INT(c->draft_kind, want);
    dsv4_runner run = dsv4_model_runner_iface(mr);
    enum { T = 9 };
    int32_t tok[T], pos[T], slot[T], sidx[T], cu[2] = {0, T}, sslot = 0, spos0 = 0, rows[2] = {3, T - 1};
    for (int t = 0; t < T; t++) tok[t] = 2 + (t * 97) % (c->vocab_size - 2), pos[t] = t, slot[t] = 0, sidx[t] = 0;
    dsv4_batch b = {T, 1, tok, pos, slot, sidx, cu, &sslot, &spos0};
    float *lg = malloc(sizeof(float) * 2 * (size_t)c->vocab_size);
    CHECK_EQ_INT(run.forward(run.ctx, &b, rows, 2, lg, &err), 0);
    CHECK(all_finite(lg, 2 * (int64_t)c->vocab_size));
    double sd = std_of(lg, c->vocab_size);
    printf("%s: logits std %.3g\n", dir, sd);
    CHECK(sd > 1e-3 && sd < 1e3);
    free(lg);
    run.release(run.ctx, 0);

    dsv4_drafter dr;
    CHECK(dsv4_model_runner_drafter(mr, &dr));
    int k = want == DSV4_DRAFT_DSPARK ? 2 : 1;
    dsv4_engine_opts eo = {1, 64, 128, k, 1, {{0}}, 0, 0};
    dsv4_engine *e = NULL;
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, &dr, &e, &err), 0);
    int32_t out[16];
    if (e) CHECK_EQ_INT(generate(e, tok, 5, 6, out), 6);
    dsv4_engine_free(e);
    dsv4_model_runner_free(mr);
}

static void refused(const char *ov, const char *needle) {
    dsv4_config c;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_config_load_ex(DIR_FLASH, ov, &c, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_overrides(void) {
    refused("{\"num_hidden_layer\": 8}", "unknown key \"num_hidden_layer\"");
    refused("{\"num_hidden_layers\": \"8\"}", "\"num_hidden_layers\" must be a number");
    refused("{\"rope_scaling\": {\"facter\": 2}}", "unknown key \"rope_scaling.facter\"");
    refused("{\"rope_scaling\": 16}", "\"rope_scaling\" must be an object");
    refused("{\"hc_eps\": null}", "\"hc_eps\" is null");
    refused("[{\"num_hidden_layers\": 8}]", "must be a JSON object");
    refused("{\"num_hidden_layers\": 8", "must be a JSON object");
    /* a known key of the right type that the parser then rejects names the key */
    dsv4_config c;
    dsv4_err err = {0};
    CHECK(dsv4_config_load_ex(DIR_FLASH, "{\"num_hidden_layers\": 8.5}", &c, &err) != 0);
    CHECK_CONTAINS(err.msg, "num_hidden_layers");
    CHECK_CONTAINS(err.msg, "--hf-overrides");
    /* nested merge keeps the other keys */
    CHECK_EQ_INT(dsv4_config_load_ex(DIR_FLASH, "{\"rope_scaling\": {\"factor\": 8}}", &c, &err), 0);
    CHECK_NEAR(c.yarn.factor, 8, 0);
    CHECK_NEAR(c.yarn.beta_fast, 32, 0);
    /* explicit lists win over the automatic cut */
    CHECK_EQ_INT(dsv4_config_load_ex(DIR_0731, "{\"num_hidden_layers\": 2, \"compress_ratios\": [0, 4, 0, 0, 0], "
                                               "\"dspark_target_layer_ids\": [0, 1], \"num_hash_layers\": 1}",
                                     &c, &err),
                 0);
    CHECK_EQ_INT(c.n_compress_ratios, 5);
    CHECK_EQ_INT(c.compress_ratios[1], 4);
    CHECK_EQ_INT(c.n_dspark_target_layer_ids, 2);
    CHECK_EQ_INT(c.num_hash_layers, 1);
}

static void no_free(dsv4_backend *be) { free(be); }

static void test_backend_refused(void) {
    dsv4_backend *be = calloc(1, sizeof *be);
    be->name = "test";
    be->free = no_free;
    dsv4_err err = {0};
    CHECK(dsv4_dummy_backend(NULL, be, &err) == NULL); /* frees be */
    CHECK_EQ_INT(err.code, DSV4_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "cannot make dummy weights");
}

int main(void) {
    test_values();
    test_forward(DIR_0731, SMALL_0731, DSV4_DRAFT_DSPARK);
    test_forward(DIR_FLASH, SMALL_FLASH, DSV4_DRAFT_MTP);
    test_overrides();
    test_backend_refused();
    return TEST_REPORT();
}
