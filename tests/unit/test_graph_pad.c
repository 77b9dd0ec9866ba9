/*
 * Capture sizes and padding (issue 7): decode / verify steps are padded up to
 * the next capture size with sequences in a reserved slot
 * (src/model/forward_pad.c). On the CPU backend with the shape-static mode
 * (cuda_graphs = 2: padding, no graphs) against the same runner without
 * capture sizes (no padding):
 *  - runner level: after the warm-up (which runs the padding-only batches of
 *    every captured shape), the logits of every real row of prefills, plain
 *    decode steps (1, 3 and 2 sequences, padded to 2 and 4) and verify steps
 *    (3 rows per sequence) are bit-identical, on tiny-flash and tiny-dspark
 *    (DSpark taps on);
 *  - engine level, prefix cache on: greedy tokens of concurrent requests are
 *    identical, plain decode (tiny-flash) and DSpark verify (tiny-dspark,
 *    k = 3), over two rounds whose second reuses the first's prefixes;
 *  - dsv4_graph_sizes_resolve / dsv4_graph_rows_plan follow vLLM's default
 *    pattern and rules.
 * The expected sizes come from vLLM's rule (1, 2, 4, then steps of 8 to 256,
 * then steps of 16; max = min(2 * max_num_seqs, 512); the list's largest
 * entry must equal max_cudagraph_capture_size), not from running this code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/graph_sizes.h"
#include "engine/model_runner.h"
#include "model/forward.h"
#include "model/kvcodec.h"
#include "test.h"

static unsigned long long padded(dsv4_model_runner *mr) {
    dsv4_model *m;
    dsv4_state *st;
    dsv4_model_runner_target(mr, &m, &st);
    return m->n_padded;
}

/* The start-up warm-up's prefill row counts (dsv4_warmup_prefill_rows): every GEMM row bucket from 128
 * up to the largest step, the largest step itself, and the env's refusals. */
static void check_warmup_rows(void) {
    int r[DSV4_WARMUP_PREFILL_MAX], n = -1;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(8192, NULL, r, &n, &err), 0);
    const int want[] = {8192, 4096, 2048, 1024, 512, 256, 128};
    CHECK_EQ_INT(n, 7);
    for (int i = 0; i < 7 && i < n; i++) CHECK_EQ_INT(r[i], want[i]);
    /* not a power of two: itself, then every power of two below it (8192's bucket holds 8193..16384) */
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(10000, "1", r, &n, &err), 0);
    CHECK_EQ_INT(n, 8);
    CHECK_EQ_INT(r[0], 10000);
    CHECK_EQ_INT(r[1], 8192);
    CHECK_EQ_INT(r[7], 128);
    /* small steps: only the step itself; 129 keeps the 128 bucket */
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(100, NULL, r, &n, &err), 0);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(r[0], 100);
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(129, NULL, r, &n, &err), 0);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(r[1], 128);
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(0, NULL, r, &n, &err), 0);
    CHECK_EQ_INT(n, 0);
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(8192, "0", r, &n, &err), 0);
    CHECK_EQ_INT(n, 0);
    /* a list replaces the default; entries are cut to the largest step */
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(8192, "9000,300,1", r, &n, &err), 0);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(r[0], 8192);
    CHECK_EQ_INT(r[1], 300);
    CHECK_EQ_INT(r[2], 1);
    const char *bad[] = {"64x", "-5", "0,64", "64,", ",64", "abc", "64;128", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err = (dsv4_err){0};
        n = -1;
        int rc = dsv4_warmup_prefill_rows(8192, bad[i], r, &n, &err);
        if (!bad[i][0]) { /* an empty value is the default, as unset */
            CHECK_EQ_INT(rc, 0);
            CHECK_EQ_INT(n, 7);
            continue;
        }
        CHECK_MSG(rc == DSV4_EINVAL, "'%s' accepted", bad[i]);
        CHECK_EQ_INT(n, 0);
        CHECK_MSG(strstr(err.msg, "DSV4_WARMUP_PREFILL") != NULL, "'%s': %s", bad[i], err.msg);
    }
    char many[200] = "1";
    for (int i = 1; i <= DSV4_WARMUP_PREFILL_MAX; i++) strcat(many, ",1");
    err = (dsv4_err){0};
    CHECK_EQ_INT(dsv4_warmup_prefill_rows(8192, many, r, &n, &err), DSV4_EINVAL);
}

static void check_sizes(void) {
    int out[96], n;
    dsv4_err err = {0};
    n = dsv4_graph_sizes_resolve(NULL, 0, 0, 64, out, 96, &err);
    CHECK_EQ_INT(n, 11); /* 1 2 4 8 16 24 32 40 48 56 64 */
    if (n == 11) {
        CHECK_EQ_INT(out[0], 1);
        CHECK_EQ_INT(out[2], 4);
        CHECK_EQ_INT(out[3], 8);
        CHECK_EQ_INT(out[4], 16);
        CHECK_EQ_INT(out[10], 64);
    }
    n = dsv4_graph_sizes_resolve(NULL, 0, 0, 512, out, 96, &err); /* 3 + 32 (8..256) + 16 (272..512) */
    CHECK_EQ_INT(n, 51);
    if (n == 51) CHECK_EQ_INT(out[35], 272);
    n = dsv4_graph_sizes_resolve(NULL, 0, 0, 3, out, 96, &err); /* 1 2, then max_num_seqs itself */
    CHECK_EQ_INT(n, 3);
    if (n == 3) CHECK_EQ_INT(out[2], 3);
    n = dsv4_graph_sizes_resolve(NULL, 0, 16, 64, out, 96, &err); /* max given: up to it, nothing added */
    CHECK_EQ_INT(n, 5);
    if (n == 5) CHECK_EQ_INT(out[4], 16);
    int given[] = {8, 1, 4, 4, 32};
    n = dsv4_graph_sizes_resolve(given, 5, 0, 16, out, 96, &err); /* sorted, deduplicated, <= max_num_seqs */
    CHECK_EQ_INT(n, 3);
    if (n == 3) CHECK(out[0] == 1 && out[1] == 4 && out[2] == 8);
    n = dsv4_graph_sizes_resolve(given, 5, 16, 64, out, 96, &err);
    CHECK_EQ_INT(n, -1);
    CHECK_CONTAINS(err.msg, "max_cudagraph_capture_size 16 must equal the largest");
    int bad[] = {0, 2};
    CHECK_EQ_INT(dsv4_graph_sizes_resolve(bad, 2, 0, 64, out, 96, &err), -1);
    /* rows: k = 5 for 1-2 running, 3 for 3-8; sizes 1 2 4 8 */
    int sizes[] = {1, 2, 4, 8}, rows[16], mx[16];
    int sched[1][3] = {{1, 2, 5}};
    n = dsv4_graph_rows_plan(3, (const int(*)[3])sched, 1, 8, sizes, 4, rows, mx, 16);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK(rows[0] == 1 && mx[0] == 0);
        CHECK(rows[1] == 6 && mx[1] == 2);
        CHECK(rows[2] == 4 && mx[2] == 8);
    }
    CHECK_EQ_INT(dsv4_graph_rows_plan(0, NULL, 0, 8, sizes, 4, rows, mx, 16), 1);
    /* k = 16 (--speculative-config allows it): 17 rows a sequence fit no graph, so only plain decode is
     * planned (asking for 17 made the runner refuse to open, with graphs or --enforce-eager's warm-up);
     * k = 15 still gets its 16-row entry */
    CHECK_EQ_INT(dsv4_graph_rows_plan(16, NULL, 0, 8, sizes, 4, rows, mx, 16), 1);
    CHECK_EQ_INT(rows[0], 1);
    CHECK_EQ_INT(dsv4_graph_rows_plan(15, NULL, 0, 8, sizes, 4, rows, mx, 16), 2);
    CHECK_EQ_INT(rows[1], 16);
}

#define NS 3 /* request slots */

/* pad: 0 no capture sizes; 1 capture sizes {2, 4} (padding, cuda_graphs 2); 2 the same sizes with no graphs
 * (cuda_graphs 0) and warm_eager: warmed at start, never padded (--enforce-eager on a GPU) */
static dsv4_model_runner *open_runner_kv(const char *dir, int k, int pad, int n_slots, int kv_dtype) {
    static const int sizes[] = {2, 4}, rows[] = {1, 3, 4}, rmax[] = {0, 0, 0};
    dsv4_model_runner_opts o = {.n_slots = n_slots, .max_len = 128, .max_spec = k,
                                .numerics = DSV4_NUMERICS_REFERENCE, .cuda_graphs = pad == 2 ? 0 : 2,
                                .warm_eager = pad == 2, .kv_dtype = kv_dtype};
    if (pad) {
        o.graph_sizes = sizes;
        o.n_graph_sizes = 2;
        o.graph_rows = rows;
        o.graph_rows_max_seqs = rmax;
        o.n_graph_rows = 3;
        o.warm_rows = 64;
    }
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    int rc = dsv4_model_runner_open(dir, &o, &mr, &err);
    CHECK_MSG(rc == 0, "%s: %s (run scripts/setup.sh to generate the tiny checkpoints)", dir, err.msg);
    return mr;
}

static dsv4_model_runner *open_runner(const char *dir, int k, int pad, int n_slots) {
    return open_runner_kv(dir, k, pad, n_slots, DSV4_KV_F32);
}

static int32_t tok_of(int slot, int pos) { return (int32_t)((slot * 7919 + pos * 104729 + 13) % 200 + 3); }

/* prefill of every slot, then decode / verify steps; all logits into lg; returns rows. */
static int run_steps(dsv4_model_runner *mr, float *lg, int V, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    if (run.set_pages) { /* engine-style pool mapping: slot s gets pages [s*per, (s+1)*per) */
        int per = (128 + run.page_tokens - 1) / run.page_tokens;
        int32_t ids[16];
        for (int s = 0; s < NS; s++) {
            for (int j = 0; j < per; j++) ids[j] = s * per + j;
            int rc = run.set_pages(run.ctx, s, per, ids, err);
            if (rc) return -rc;
        }
    }
    int len[NS] = {0}, out = 0;
    int32_t tok[64], pos[64], slot[64], sidx[64], rows[64], cu[NS + 1], sslot[NS], spos0[NS];
    for (int s = 0; s < NS; s++) {
        int P = 6 + 3 * s;
        for (int i = 0; i < P; i++) tok[i] = tok_of(s, i), pos[i] = i, slot[i] = s, sidx[i] = 0, rows[i] = i;
        cu[0] = 0, cu[1] = P, sslot[0] = s, spos0[0] = 0;
        dsv4_batch b = {P, 1, tok, pos, slot, sidx, cu, sslot, spos0};
        int rc = run.forward(run.ctx, &b, rows, P, lg + (size_t)out * V, err);
        if (rc) return -rc;
        out += P;
        len[s] = P;
    }
    /* (sequences, rows per sequence): 3 -> 4, 1 -> 2, 2 (a size: unpadded), verify 3x3 -> 4x3, 1x3 -> 2x3 */
    static const int steps[][2] = {{3, 1}, {1, 1}, {2, 1}, {3, 3}, {3, 1}, {1, 3}, {2, 3}, {3, 1}};
    for (size_t st = 0; st < sizeof steps / sizeof steps[0]; st++) {
        int ns = steps[st][0], rp = steps[st][1], T = 0;
        cu[0] = 0;
        for (int i = 0; i < ns; i++) {
            int s = (int)(st + (size_t)i) % NS;
            sslot[i] = s;
            spos0[i] = len[s];
            for (int r = 0; r < rp; r++, T++) {
                pos[T] = len[s] + r;
                tok[T] = tok_of(s, pos[T]);
                slot[T] = s;
                sidx[T] = i;
                rows[T] = T;
            }
            cu[i + 1] = T;
            len[s] += 1; /* a verify step commits one row; the others are written again later */
        }
        dsv4_batch b = {T, ns, tok, pos, slot, sidx, cu, sslot, spos0};
        int rc = run.forward(run.ctx, &b, rows, T, lg + (size_t)out * V, err);
        if (rc) return -rc;
        out += T;
    }
    return out;
}

/* kv_dtype: the state's row storage (kvcodec.h). Coded rows (fp8_ds_mla, the CUDA default) with the
 * padding slot: its page and rings must exist in the coded layout and its rows must stay out of the
 * real slots' pages (docs/REVIEW-2026-12-01.md item 3). */
static void check_runner_kv(const char *dir, int k, int kv_dtype) {
    dsv4_model_runner *ref = open_runner_kv(dir, k, 0, NS, kv_dtype), *pad = open_runner_kv(dir, k, 1, NS + 1, kv_dtype);
    if (!ref || !pad) {
        dsv4_model_runner_free(ref);
        dsv4_model_runner_free(pad);
        return;
    }
    dsv4_err err = {0};
    int ng = -1;
    /* a malformed DSV4_WARMUP_PREFILL is an error naming it, not a silent skip */
    setenv("DSV4_WARMUP_PREFILL", "64x", 1);
    CHECK(dsv4_model_runner_warmup(pad, &ng, &err) == DSV4_EINVAL);
    CHECK_MSG(strstr(err.msg, "DSV4_WARMUP_PREFILL") != NULL, "%s: %s", dir, err.msg);
    err = (dsv4_err){0};
    /* the default: the prefill-sized warm-up step too (64 rows: the largest step; no power of two >= 128 below it) */
    unsetenv("DSV4_WARMUP_PREFILL");
    CHECK_MSG(dsv4_model_runner_warmup(pad, &ng, &err) == 0, "%s: warm-up: %s", dir, err.msg);
    CHECK_EQ_INT(ng, 0); /* cuda_graphs 2: the forwards run, nothing is captured */
    dsv4_runner it = dsv4_model_runner_iface(pad);
    CHECK_EQ_INT(it.n_slots, NS + 1); /* the padding slot is not the engine's */
    CHECK(it.warmup != NULL);
    CHECK(dsv4_model_runner_iface(ref).warmup == NULL);
    int V = dsv4_model_runner_config(ref)->vocab_size;
    size_t cap = (size_t)200 * V;
    float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
    int na = run_steps(ref, a, V, &err);
    CHECK_MSG(na > 0, "%s: unpadded: %s", dir, err.msg);
    unsigned long long p0 = padded(pad);
    int nb = run_steps(pad, b, V, &err);
    CHECK_MSG(nb > 0, "%s: padded: %s", dir, err.msg);
    /* every decode / verify step but those of 2 sequences (a size); prefills (1 x 6..12 rows) never */
    CHECK_EQ_INT((int)(padded(pad) - p0), 6);
    CHECK_EQ_INT((int)padded(ref), 0);
    CHECK_EQ_INT(na, nb);
    if (na > 0 && na == nb) {
        size_t diff = 0;
        for (size_t i = 0; i < (size_t)na * V; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s k=%d kv %s: %zu of %zu logits differ between padded and unpadded steps", dir, k,
                  dsv4_kv_dtype_name((dsv4_kv_dtype)kv_dtype), diff, (size_t)na * V);
        printf("%s k=%d kv %s: %d rows, padded == unpadded logits bit for bit\n", dir, k,
               dsv4_kv_dtype_name((dsv4_kv_dtype)kv_dtype), na);
    }
    free(a);
    free(b);
    dsv4_model_runner_free(ref);
    dsv4_model_runner_free(pad);
}

static void check_runner(const char *dir, int k) { check_runner_kv(dir, k, DSV4_KV_F32); }

#define MAXT 10
static uint64_t last_accepted; /* spec_accepted_tokens of the last engine_tokens */
/* Two rounds of NS concurrent greedy requests (the second round's prompts extend the first's: prefix cache). */
static void engine_tokens(dsv4_model_runner *mr, int k, int32_t tok[2][NS][MAXT], uint64_t *drafts, uint64_t *hits) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    dsv4_drafter dr;
    int has = k > 0 && dsv4_model_runner_drafter(mr, &dr);
    dsv4_engine_opts eo = {NS, 64, 128, k, 1, {{0}}, 0, 1};
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    int rc = dsv4_engine_create(&eo, &run, has ? &dr : NULL, &e, &err);
    CHECK_MSG(rc == 0, "engine: %s", err.msg);
    if (rc) return;
    if (run.warmup) {
        int ng;
        CHECK_EQ_INT(run.warmup(run.ctx, &ng, &err), 0);
    }
    for (int round = 0; round < 2; round++) {
        dsv4_request *r[NS];
        for (int i = 0; i < NS; i++) {
            int32_t p[64];
            int len = 6 + 5 * i;
            for (int j = 0; j < len; j++) p[j] = 2 + (int32_t)((i * 131 + j * 17 + j * j) % 250);
            if (round) { /* the first round's conversation continued: its prompt, its answer, 3 more tokens */
                memcpy(p + len, tok[0][i], sizeof(int32_t) * (size_t)(MAXT - 2 * i));
                len += MAXT - 2 * i;
                for (int j = 0; j < 3; j++, len++) p[len] = 5 + j;
            }
            dsv4_gen_params gp;
            dsv4_gen_params_default(&gp);
            gp.sampling.temperature = 0;
            gp.max_tokens = MAXT - 2 * i; /* requests finish at different steps: batch sizes 3, 2, 1 */
            gp.ignore_eos = 1;
            CHECK_EQ_INT(dsv4_engine_submit(e, p, len, &gp, &r[i], &err), 0);
        }
        while (dsv4_engine_step(e, &err) > 0) {}
        for (int i = 0; i < NS; i++) {
            dsv4_finish f;
            memset(tok[round][i], 0, sizeof tok[round][i]);
            CHECK_EQ_INT(dsv4_request_poll(r[i], tok[round][i], MAXT, &f, 0), MAXT - 2 * i);
            dsv4_request_release(r[i]);
        }
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    *drafts = st.spec_drafts;
    last_accepted = st.spec_accepted_tokens;
    *hits = st.prefix_hits;
    dsv4_engine_free(e);
}

static void check_engine(const char *dir, int k) {
    /* NS request slots + 2 for the prefix cache; the padded runner sizes go up to 4 */
    dsv4_model_runner *ref = open_runner(dir, k, 0, NS + 2), *pad = open_runner(dir, k, 1, NS + 2);
    if (ref && pad) {
        int32_t a[2][NS][MAXT], b[2][NS][MAXT];
        uint64_t da = 0, db = 0, ha = 0, hb = 0;
        engine_tokens(ref, k, a, &da, &ha);
        engine_tokens(pad, k, b, &db, &hb);
        CHECK(hb > 0); /* the second round reused the first's prefixes */
        CHECK(ha == hb);
        CHECK(padded(pad) > 0);
        CHECK_MSG(!memcmp(a, b, sizeof a), "%s k=%d: greedy tokens differ between padded and unpadded steps", dir, k);
        CHECK(da == db);
        if (k > 0) CHECK(db > 0);
        printf("%s k=%d: engine tokens equal (prefix cache on: %llu tokens hit; %llu verify steps)\n", dir, k,
               (unsigned long long)hb, (unsigned long long)db);
    }
    dsv4_model_runner_free(ref);
    dsv4_model_runner_free(pad);
}

/* --enforce-eager's warm-up (opts.warm_eager, no graphs): the capture sizes' shapes and the prefill-sized
 * step run once each on the reserved slot, then nothing is padded and every logit equals a runner that
 * never warmed; the engine's greedy tokens too (prefix cache on, DSpark verify with k > 0). */
static void check_eager(const char *dir, int k) {
    dsv4_model_runner *ref = open_runner(dir, k, 0, NS + 1), *ew = open_runner(dir, k, 2, NS + 1);
    if (!ref || !ew) {
        dsv4_model_runner_free(ref);
        dsv4_model_runner_free(ew);
        return;
    }
    dsv4_err err = {0};
    int ng = -1;
    dsv4_runner it = dsv4_model_runner_iface(ew);
    CHECK(it.warmup != NULL);
    CHECK_EQ_INT(it.n_slots, NS + 1); /* the warm-up's slot is not the engine's */
    CHECK_MSG(dsv4_model_runner_warmup(ew, &ng, &err) == 0, "%s: eager warm-up: %s", dir, err.msg);
    CHECK_EQ_INT(ng, 0);
    /* 3 row counts x 2 sizes (x 2 with the greedy-ids variant), then the 64-row prefill step */
    int ws = dsv4_model_runner_warm_steps(ew);
    CHECK_MSG(ws == 7 || ws == 13, "%s: %d warm-up forwards (want 7 or 13)", dir, ws);
    int V = dsv4_model_runner_config(ref)->vocab_size;
    size_t cap = (size_t)200 * V;
    float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
    int na = run_steps(ref, a, V, &err);
    CHECK_MSG(na > 0, "%s: cold: %s", dir, err.msg);
    int nb = run_steps(ew, b, V, &err);
    CHECK_MSG(nb > 0, "%s: warmed: %s", dir, err.msg);
    CHECK_EQ_INT((int)padded(ew), 0);
    CHECK_EQ_INT(na, nb);
    if (na > 0 && na == nb) {
        size_t diff = 0;
        for (size_t i = 0; i < (size_t)na * V; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s k=%d: %zu of %zu logits differ after the eager warm-up", dir, k, diff,
                  (size_t)na * V);
    }
    free(a);
    free(b);
    dsv4_model_runner_free(ref);
    dsv4_model_runner_free(ew);
    /* engine level (engine_tokens runs the warm-up when the runner has one) */
    ref = open_runner(dir, k, 0, NS + 2);
    ew = open_runner(dir, k, 2, NS + 2);
    if (ref && ew) {
        int32_t ta[2][NS][MAXT], tb[2][NS][MAXT];
        uint64_t da = 0, db = 0, ha = 0, hb = 0;
        engine_tokens(ref, k, ta, &da, &ha);
        engine_tokens(ew, k, tb, &db, &hb);
        CHECK(dsv4_model_runner_warm_steps(ew) > 0);
        CHECK_EQ_INT((int)padded(ew), 0);
        CHECK(hb > 0 && ha == hb);
        CHECK_MSG(!memcmp(ta, tb, sizeof ta), "%s k=%d: greedy tokens differ after the eager warm-up", dir, k);
        CHECK(da == db);
        printf("%s k=%d: eager warm-up (%d forwards) leaves logits and engine tokens unchanged\n", dir, k, ws);
    }
    dsv4_model_runner_free(ref);
    dsv4_model_runner_free(ew);
}

/* One prefill of every slot, drafts, a verify-shaped step whose commits leave gaps in its rows (so the
 * features are gathered, not passed in place), drafts again. Fills lg (every row's logits) and dr_out
 * (k drafts per slot, twice). Returns 0 or the failing call's code. */
static int feats_run(dsv4_model_runner *mr, int k, float *lg, int V, int32_t *dr_out, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    dsv4_drafter dr;
    if (!dsv4_model_runner_drafter(mr, &dr)) return dsv4_err_set(err, DSV4_EINVAL, "no drafter");
    if (run.set_pages) { /* as run_steps: slot s gets pages [s*per, (s+1)*per) */
        int per = (128 + run.page_tokens - 1) / run.page_tokens;
        int32_t ids[16];
        for (int s = 0; s < NS; s++) {
            for (int j = 0; j < per; j++) ids[j] = s * per + j;
            int rc = run.set_pages(run.ctx, s, per, ids, err);
            if (rc) return rc;
        }
    }
    int32_t tok[64], pos[64], slot[64], sidx[64], rows[64], cu[NS + 1], sslot[NS], spos0[NS], anchor[NS];
    int64_t len[NS], apos[NS];
    int T = 0, rc, qv[NS];
    cu[0] = 0;
    for (int s = 0; s < NS; s++) { /* one prefill step of NS prompts */
        int P = 7 + 4 * s;
        for (int i = 0; i < P; i++, T++)
            tok[T] = tok_of(s, i), pos[T] = i, slot[T] = s, sidx[T] = s, rows[T] = T;
        cu[s + 1] = T, sslot[s] = s, spos0[s] = 0, len[s] = P;
    }
    dsv4_batch b = {T, NS, tok, pos, slot, sidx, cu, sslot, spos0};
    if ((rc = run.forward(run.ctx, &b, rows, T, lg, err))) return rc;
    int32_t sl[NS] = {0, 1, 2};
    if ((rc = dr.commit(dr.ctx, NS, sl, len, err))) return rc;
    for (int s = 0; s < NS; s++) anchor[s] = tok_of(s, (int)len[s]), apos[s] = len[s];
    if ((rc = dr.propose(dr.ctx, NS, sl, anchor, apos, k, NULL, NULL, dr_out, NULL, qv, err))) return rc;
    /* verify-shaped: k+1 rows a slot; commit 2, k+1 and 1 of them (gaps between the committed runs) */
    int out = T;
    T = 0;
    for (int s = 0; s < NS; s++) {
        for (int r = 0; r <= k; r++, T++) {
            pos[T] = (int32_t)len[s] + r;
            tok[T] = r ? dr_out[s * k + r - 1] : anchor[s];
            slot[T] = s, sidx[T] = s, rows[T] = T;
        }
        cu[s + 1] = T, sslot[s] = s, spos0[s] = (int32_t)len[s];
    }
    b = (dsv4_batch){T, NS, tok, pos, slot, sidx, cu, sslot, spos0};
    if ((rc = run.forward(run.ctx, &b, rows, T, lg + (size_t)out * V, err))) return rc;
    static const int acc[NS] = {2, 4, 1};
    for (int s = 0; s < NS; s++) {
        int a = acc[s] <= k + 1 ? acc[s] : k + 1;
        len[s] += a;
        anchor[s] = tok_of(s + 1, (int)len[s]);
        apos[s] = len[s];
    }
    if ((rc = dr.commit(dr.ctx, NS, sl, len, err))) return rc;
    return dr.propose(dr.ctx, NS, sl, anchor, apos, k, NULL, NULL, dr_out + NS * k, NULL, qv, err);
}

/* A padded decode step (3 sequences run as 4) whose padded rows do not fit the runner's feature buffer
 * (grown to 3 rows): the forward writes its own taps buffer and copies the real rows in
 * (forward.c dsv4_forward_finish, the path every CUDA graph replay takes). Prefills of 2 rows a slot
 * first, no warm-up (it would grow the buffer). Drafts after it into dr_out [NS][k]. */
static int feats_pad_run(dsv4_model_runner *mr, int k, int32_t *dr_out, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    dsv4_drafter dr;
    if (!dsv4_model_runner_drafter(mr, &dr)) return dsv4_err_set(err, DSV4_EINVAL, "no drafter");
    int V = dsv4_model_runner_config(mr)->vocab_size, rc, qv[NS];
    float *lg = malloc(sizeof(float) * 4 * (size_t)V);
    if (!lg) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (run.set_pages) {
        int per = (128 + run.page_tokens - 1) / run.page_tokens;
        int32_t ids[16];
        for (int s = 0; s < NS; s++) {
            for (int j = 0; j < per; j++) ids[j] = s * per + j;
            if ((rc = run.set_pages(run.ctx, s, per, ids, err))) goto out;
        }
    }
    int32_t tok[4], pos[4], slot[4], sidx[4], rows[4] = {0, 1, 2, 3}, cu[NS + 1], sslot[NS], spos0[NS], anchor[NS];
    int32_t sl[NS] = {0, 1, 2};
    int64_t len[NS], apos[NS];
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < 2; i++) tok[i] = tok_of(s, i), pos[i] = i, slot[i] = s, sidx[i] = 0;
        cu[0] = 0, cu[1] = 2, sslot[0] = s, spos0[0] = 0;
        dsv4_batch b = {2, 1, tok, pos, slot, sidx, cu, sslot, spos0};
        if ((rc = run.forward(run.ctx, &b, rows, 2, lg, err))) goto out;
        len[s] = 2;
        if ((rc = dr.commit(dr.ctx, 1, &sl[s], &len[s], err))) goto out;
    }
    for (int s = 0; s < NS; s++) {
        tok[s] = tok_of(s, 2), pos[s] = 2, slot[s] = s, sidx[s] = s;
        cu[s + 1] = s + 1, sslot[s] = s, spos0[s] = 2;
    }
    cu[0] = 0;
    dsv4_batch b = {NS, NS, tok, pos, slot, sidx, cu, sslot, spos0};
    if ((rc = run.forward(run.ctx, &b, rows, NS, lg, err))) goto out;
    for (int s = 0; s < NS; s++) len[s] = 3, anchor[s] = tok_of(s, 3), apos[s] = 3;
    if ((rc = dr.commit(dr.ctx, NS, sl, len, err))) goto out;
    rc = dr.propose(dr.ctx, NS, sl, anchor, apos, k, NULL, NULL, dr_out, NULL, qv, err);
out:
    free(lg);
    return rc;
}

/* DSpark context features kept in backend memory (dsv4_fwd_out.taps_dev; the CPU backend has hc_mean
 * too; DSV4_DSPARK_DEV_FEATS=1: from 1 row, where the default starts at 512) against the host copy
 * (DSV4_DSPARK_DEV_FEATS=0): every logit and every draft token identical,
 * at the runner (in place after a prefill, gathered after a verify step with gaps) and in the engine. */
static void check_dev_feats(const char *dir, int k) {
    setenv("DSV4_DSPARK_DEV_FEATS", "0", 1);
    dsv4_model_runner *host = open_runner(dir, k, 0, NS);
    setenv("DSV4_DSPARK_DEV_FEATS", "1", 1);
    dsv4_model_runner *dev = open_runner(dir, k, 0, NS);
    unsetenv("DSV4_DSPARK_DEV_FEATS");
    if (host && dev) {
        int V = dsv4_model_runner_config(host)->vocab_size;
        size_t cap = (size_t)64 * V;
        float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
        int32_t da[2 * NS * 8], db[2 * NS * 8];
        memset(da, 0xff, sizeof da);
        memset(db, 0xff, sizeof db);
        dsv4_err err = {0};
        CHECK_MSG(feats_run(host, k, a, V, da, &err) == 0, "%s: host features: %s", dir, err.msg);
        CHECK_MSG(feats_run(dev, k, b, V, db, &err) == 0, "%s: backend features: %s", dir, err.msg);
        CHECK_MSG(!memcmp(a, b, cap * sizeof(float)), "%s: logits differ (host vs backend features)", dir);
        CHECK_MSG(!memcmp(da, db, sizeof(int32_t) * 2 * NS * (size_t)k), "%s: drafts differ (host vs backend features)",
                  dir);
        int distinct = 0;
        for (int i = 1; i < 2 * NS * k; i++) distinct += da[i] != da[0];
        CHECK(distinct > 0); /* the drafts are not all one token: they say something about the features */
        /* mixed: from 13 rows, so the 33-row prefill keeps them on the backend and the 12-row verify step
         * on the host (the default's split between prefill chunks and decode steps, at a test's size) */
        setenv("DSV4_DSPARK_DEV_FEATS", "13", 1);
        dsv4_model_runner *mix = open_runner(dir, k, 0, NS);
        unsetenv("DSV4_DSPARK_DEV_FEATS");
        int32_t dm[2 * NS * 8];
        memset(dm, 0xff, sizeof dm);
        CHECK_MSG(mix && feats_run(mix, k, b, V, dm, &err) == 0, "%s: mixed features: %s", dir, err.msg);
        CHECK_MSG(!memcmp(da, dm, sizeof(int32_t) * 2 * NS * (size_t)k), "%s: drafts differ (host vs mixed)", dir);
        dsv4_model_runner_free(mix);
        free(a);
        free(b);
    }
    if (dev) CHECK(dsv4_model_runner_backend(dev)->hc_mean != NULL); /* else both ran the host copy */
    dsv4_model_runner_free(host);
    dsv4_model_runner_free(dev);
    /* a padded step copying its real rows in (no warm-up: the buffer stays smaller than the padded step) */
    setenv("DSV4_DSPARK_DEV_FEATS", "0", 1);
    host = open_runner(dir, k, 1, NS + 1);
    setenv("DSV4_DSPARK_DEV_FEATS", "1", 1);
    dev = open_runner(dir, k, 1, NS + 1);
    unsetenv("DSV4_DSPARK_DEV_FEATS");
    if (host && dev) {
        int32_t da[NS * 8], db[NS * 8];
        dsv4_err err = {0};
        memset(da, 0xff, sizeof da);
        memset(db, 0xff, sizeof db);
        CHECK_MSG(feats_pad_run(host, k, da, &err) == 0, "%s: padded, host features: %s", dir, err.msg);
        CHECK_MSG(feats_pad_run(dev, k, db, &err) == 0, "%s: padded, backend features: %s", dir, err.msg);
        CHECK(padded(dev) > 0);
        CHECK_MSG(!memcmp(da, db, sizeof(int32_t) * NS * (size_t)k),
                  "%s: drafts after a padded step differ (host vs backend features)", dir);
    }
    dsv4_model_runner_free(host);
    dsv4_model_runner_free(dev);
    /* engine level: concurrent greedy requests with DSpark verify, prefix cache on */
    setenv("DSV4_DSPARK_DEV_FEATS", "0", 1);
    host = open_runner(dir, k, 0, NS + 2);
    setenv("DSV4_DSPARK_DEV_FEATS", "1", 1); /* every forward (the default keeps steps under 512 rows on the host) */
    dev = open_runner(dir, k, 0, NS + 2);
    unsetenv("DSV4_DSPARK_DEV_FEATS");
    if (host && dev) {
        int32_t ta[2][NS][MAXT], tb[2][NS][MAXT];
        uint64_t da = 0, db = 0, ha = 0, hb = 0, aa, ab;
        engine_tokens(host, k, ta, &da, &ha);
        aa = last_accepted;
        engine_tokens(dev, k, tb, &db, &hb);
        ab = last_accepted;
        CHECK_MSG(!memcmp(ta, tb, sizeof ta), "%s: engine tokens differ (host vs backend features)", dir);
        CHECK(da == db && da > 0);
        CHECK_MSG(aa == ab, "%s: accepted draft tokens %llu (host features) vs %llu (backend)", dir,
                  (unsigned long long)aa, (unsigned long long)ab);
        printf("%s k=%d: backend-resident draft features == host copy (logits, drafts, %llu verify steps, %llu "
               "accepted draft tokens)\n", dir, k, (unsigned long long)db, (unsigned long long)ab);
    }
    dsv4_model_runner_free(host);
    dsv4_model_runner_free(dev);
}

int main(void) {
    check_warmup_rows();
    check_sizes();
    check_runner("models/tiny-flash", 0);
    check_runner("models/tiny-dspark", 3);
    check_runner_kv("models/tiny-flash", 0, DSV4_KV_FP8_DS_MLA);
    check_runner_kv("models/tiny-dspark", 3, DSV4_KV_BF16);
    check_engine("models/tiny-flash", 0);
    check_engine("models/tiny-dspark", 3);
    check_eager("models/tiny-flash", 0);
    check_eager("models/tiny-dspark", 3);
    check_dev_feats("models/tiny-dspark", 3);
    return TEST_REPORT();
}
