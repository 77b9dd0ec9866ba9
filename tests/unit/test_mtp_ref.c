/*
 * The C MTP block (src/model/mtp.c, spec/MODEL.md §3.9) on tiny-flash against
 *  - tools/ref_mtp.py (tests/fixtures/ref/mtp): fed the same target streams,
 *    HF numerics vs transformers building blocks, reference numerics vs the
 *    reference's own primitives; in one call and in two chunks (the block's
 *    own window ring must carry the first chunk);
 *  - the MTP reference of tools/ref_transformers.py (tests/fixtures/ref/
 *    tiny-flash, mtp_129), fed by OUR target forward's final streams: the
 *    whole path target → streams → MTP end to end.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/mtp.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_models.h"

static char models[512];

static float *load_array(const char *dir, const cJSON *entry) {
    const cJSON *it;
    size_t want = 1;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(entry, "shape")) want *= (size_t)it->valueint;
    char path[900];
    snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItem(entry, "file")->valuestring);
    size_t n = 0;
    float *a = (float *)tm_read_file(path, &n);
    CHECK_MSG(a && n == want * 4, "%s: %zu bytes, expected %zu", path, n, want * 4);
    return a;
}

static const cJSON *arr(const cJSON *o, const char *k) { return cJSON_GetObjectItem(cJSON_GetObjectItem(o, "arrays"), k); }

static cJSON *load_index(const char *dir, char **js) {
    char path[800];
    snprintf(path, sizeof path, "%s/index.json", dir);
    *js = tm_read_file(path, NULL);
    cJSON *idx = *js ? cJSON_Parse(*js) : NULL;
    CHECK_MSG(idx != NULL, "cannot read %s", path);
    return idx;
}

typedef struct mrun {
    dsv4_config cfg;
    dsv4_ckpt *ck;
    dsv4_weights *w;
    dsv4_backend *be;
    dsv4_model *m;
    dsv4_state *st;
    dsv4_mtp *mtp;
} mrun;

static int open_mtp(dsv4_numerics num, mrun *r) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tiny-flash", models);
    dsv4_err e = {0};
    memset(r, 0, sizeof *r);
    int rc = dsv4_config_load(dir, &r->cfg, &e);
    if (!rc) rc = dsv4_ckpt_open(dir, &r->ck, &e);
    if (!rc) rc = dsv4_config_set_drafts(&r->cfg, r->ck, &e);
    if (!rc) rc = dsv4_weights_bind(&r->cfg, r->ck, &r->w, &e);
    if (!rc) r->be = dsv4_backend_cpu_create(num, &e);
    if (!rc && !r->be) rc = e.code ? e.code : DSV4_EBACKEND;
    if (!rc) rc = dsv4_model_create(&r->cfg, r->w, r->be, &r->m, &e);
    int ratios[DSV4_MAX_LAYERS];
    for (int l = 0; l < r->cfg.num_hidden_layers; l++) ratios[l] = dsv4_config_layer_ratio(&r->cfg, l);
    if (!rc) rc = dsv4_state_create(r->be, &r->cfg, ratios, r->cfg.num_hidden_layers, 1, 512, 0, &r->st, &e);
    if (!rc) rc = dsv4_mtp_create(&r->cfg, r->w, r->m, 2, 512, 0, &r->mtp, &e);
    CHECK_MSG(rc == 0, "open tiny-flash: %s", e.msg);
    return rc;
}

static void close_mtp(mrun *r) {
    dsv4_mtp_free(r->mtp);
    dsv4_state_free(r->st);
    dsv4_model_free(r->m);
    if (r->be) r->be->free(r->be);
    dsv4_weights_free(r->w);
    dsv4_ckpt_free(r->ck);
}

/* One segment of n rows in `slot` from position p0, tokens tok[0..n). */
static int mtp_call(mrun *r, int slot, int p0, int n, const int32_t *tok, const float *streams, float *logits,
                    float *out_streams) {
    int32_t *mem = malloc(sizeof(int32_t) * (size_t)n * 4), *pos = mem, *sl = mem + n, *sq = mem + 2 * n,
            *tk = mem + 3 * n;
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        sl[i] = slot;
        sq[i] = 0;
        tk[i] = tok[i];
    }
    int32_t cu[2] = {0, n}, ss = slot, sp = p0;
    dsv4_batch b = {.n_rows = n, .n_seqs = 1, .token = tk, .pos = pos, .slot = sl, .seq_idx = sq,
                    .cu_seqlens = cu, .seq_slot = &ss, .seq_pos0 = &sp};
    dsv4_err e = {0};
    int rc = dsv4_mtp_forward(r->mtp, &b, streams, logits, out_streams, &e);
    CHECK_MSG(rc == 0, "mtp forward: %s", e.msg);
    free(mem);
    return rc;
}

static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double maxabs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

static void against_ref_mtp(const char *mode, dsv4_numerics num) {
    char dir[700], *js = NULL;
    snprintf(dir, sizeof dir, "%s/tests/fixtures/ref/mtp", DSV4_SOURCE_DIR);
    cJSON *idx = load_index(dir, &js);
    mrun r;
    if (!idx || open_mtp(num, &r)) {
        cJSON_Delete(idx);
        free(js);
        return;
    }
    int V = r.cfg.vocab_size, HD = r.cfg.hc_mult * r.cfg.hidden_size;
    int from = cJSON_GetObjectItem(idx, "compare_from_position")->valueint;
    double tol = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "tolerance"), mode), "logits_abs")
                     ->valuedouble;
    char key[32];
    snprintf(key, sizeof key, "logits_%s", mode);
    const cJSON *c;
    int ncase = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(idx, "cases")) {
        const cJSON *it;
        int T = 0;
        int32_t tok[512];
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(c, "next_ids")) tok[T++] = it->valueint;
        float *H = load_array(dir, arr(c, "streams")), *want = load_array(dir, arr(c, key));
        float *lg = malloc(sizeof(float) * (size_t)T * V), *lg2 = malloc(sizeof(float) * (size_t)T * V);
        float *xo = malloc(sizeof(float) * (size_t)T * HD);
        dsv4_mtp_reset_slot(r.mtp, 0, NULL);
        dsv4_mtp_reset_slot(r.mtp, 1, NULL);
        if (!mtp_call(&r, 0, 0, T, tok, H, lg, xo)) {
            double md = maxdiff(lg + (size_t)from * V, want + (size_t)from * V, (size_t)(T - from) * V);
            CHECK_MSG(md <= tol, "mtp %s case %d: max |dlogit| %g > %g", mode, ncase, md, tol);
            printf("mtp %-3s T=%-3d max |dlogit| %.2e (tolerance %.0e)\n", mode, T, md, tol);
            if (!strcmp(mode, "hf")) {
                float *wx = load_array(dir, arr(c, "out_streams_hf"));
                CHECK(maxdiff(xo, wx, (size_t)T * HD) <= 1e-5 * maxabs(wx, (size_t)T * HD));
                free(wx);
            }
            /* two chunks in slot 1: the second must read the first from the MTP's own ring */
            int k = T / 2 + 1;
            if (!mtp_call(&r, 1, 0, k, tok, H, lg2, NULL) &&
                !mtp_call(&r, 1, k, T - k, tok + k, H + (size_t)k * HD, lg2 + (size_t)k * V, NULL))
                /* ref: W8A8 codes may flip where summation order differs, hence the mode tolerance */
                CHECK_MSG(maxdiff(lg2, lg, (size_t)T * V) <=
                              (strcmp(mode, "ref") ? 1e-4 * fmax(1.0, maxabs(lg, (size_t)T * V)) : tol),
                          "mtp %s: chunked differs from one call", mode);
        }
        free(H);
        free(want);
        free(lg);
        free(lg2);
        free(xo);
        ncase++;
    }
    CHECK(ncase >= 2);
    close_mtp(&r);
    cJSON_Delete(idx);
    free(js);
}

/* End to end: our target's final streams → our MTP vs ref_transformers' MTP (HF numerics). */
static void against_transformers_fixture(void) {
    char dir[700], *js = NULL;
    snprintf(dir, sizeof dir, "%s/tests/fixtures/ref/tiny-flash", DSV4_SOURCE_DIR);
    cJSON *idx = load_index(dir, &js);
    mrun r;
    if (!idx || open_mtp(DSV4_NUMERICS_HF, &r)) {
        cJSON_Delete(idx);
        free(js);
        return;
    }
    const cJSON *mt = cJSON_GetObjectItem(idx, "mtp"), *c, *src = NULL;
    const char *sname = cJSON_GetObjectItem(mt, "source_case")->valuestring;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(idx, "cases")) if (!strcmp(cJSON_GetObjectItem(c, "name")->valuestring, sname)) src = c;
    CHECK(src != NULL);
    if (src) {
        int V = r.cfg.vocab_size, HD = r.cfg.hc_mult * r.cfg.hidden_size, T = 0;
        int32_t ids[600];
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItem(src, "input_ids")) ids[T++] = it->valueint;
        float *streams = malloc(sizeof(float) * (size_t)T * HD), *lg = malloc(sizeof(float) * (size_t)T * V);
        int32_t *mem = malloc(sizeof(int32_t) * (size_t)T * 3), *pos = mem, *sl = mem + T, *sq = mem + 2 * T;
        for (int i = 0; i < T; i++) pos[i] = i, sl[i] = 0, sq[i] = 0;
        int32_t cu[2] = {0, T}, ss = 0, sp = 0;
        dsv4_batch b = {.n_rows = T, .n_seqs = 1, .token = ids, .pos = pos, .slot = sl, .seq_idx = sq,
                        .cu_seqlens = cu, .seq_slot = &ss, .seq_pos0 = &sp};
        dsv4_err e = {0};
        int rc = dsv4_forward(r.m, r.st, &b, NULL, 0, NULL, streams, &e);
        CHECK_MSG(rc == 0, "target forward: %s", e.msg);
        /* rows 0..T-2: streams at i paired with ids[i+1] (MODEL.md §3.9) */
        if (!rc && !mtp_call(&r, 0, 0, T - 1, ids + 1, streams, lg, NULL)) {
            float *want = load_array(dir, arr(mt, "logits"));
            double md = 0;
            int n = 0;
            cJSON_ArrayForEach(it, cJSON_GetObjectItem(mt, "positions")) {
                md = fmax(md, maxdiff(lg + (size_t)it->valueint * V, want + (size_t)n * V, V));
                n++;
            }
            CHECK_MSG(md <= 1e-3, "target+mtp vs ref_transformers mtp_129: max |dlogit| %g", md);
            printf("target+mtp vs ref_transformers %s (%d rows): max |dlogit| %.2e\n", sname, n, md);
            free(want);
        }
        free(streams);
        free(lg);
        free(mem);
    }
    close_mtp(&r);
    cJSON_Delete(idx);
    free(js);
}

int main(void) {
    {
        static const char *const need[] = {"tiny-flash"};
        tm_find_models(models, sizeof models, need, (int)(sizeof need / sizeof need[0]));
    }
    against_ref_mtp("hf", DSV4_NUMERICS_HF);
    against_ref_mtp("ref", DSV4_NUMERICS_REFERENCE);
    against_transformers_fixture();
    return TEST_REPORT();
}
