/*
 * dsv4-gpu-conformance — the backend conformance harness
 * (src/backend/conformance.h) with the CUDA backend as the test backend and
 * the CPU reference backend as the reference, at the tiny shapes and at the
 * real Flash shapes, the attention-state layouts (paged compressed rows on the
 * CUDA side, verify-shaped batches, long chunks, ratio 128), then a short
 * timing of the CUDA ops (attention-state ops at contexts up to 64K with the
 * achieved key bandwidth).
 *
 * Needs a GPU: built only with DSV4_CUDA, never part of ctest
 * (tests/gpu/run_conformance_h200.sh builds it with nvcc + gcc alone).
 *   dsv4-gpu-conformance [--tol X] [--flash-rows N]... [--no-perf]
 * Prints one line per op output (normalised error, or "unsupported") and a
 * summary; exit status 1 when an implemented op exceeds the tolerance,
 * 2 on an error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/conformance.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/timing.h"

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One conformance run: fresh backends, so every run starts from nothing. */
static int run(const char *title, const dsv4_conf_shape *s, dsv4_numerics num, double tol, int timed) {
    dsv4_err e = {0};
    dsv4_backend *ref = dsv4_backend_cpu_create(num, &e);
    dsv4_backend *cu = ref ? dsv4_backend_cuda_create(num, 0, &e) : NULL;
    if (!cu) {
        fprintf(stderr, "%s: %s\n", title, e.msg);
        if (ref) ref->free(ref);
        return -1;
    }
    dsv4_backend *test = timed ? dsv4_backend_timing_wrap(cu, 1, &e) : cu;
    printf("== %s (rows %d, d %d, heads %d x %d, experts %d top-%d, %s numerics, tol %.1e; segments of %s rows, "
           "first position %d, ratio %d%s%s)\n", title, s->rows, s->d, s->n_heads, s->head_dim, s->n_exp, s->top_k,
           num == DSV4_NUMERICS_HF ? "HF" : "reference", tol, s->seg_rows ? "k" : "rows/2", s->pos0 ? s->pos0 : 5,
           s->ratio ? s->ratio : 4, s->paged ? ", CUDA side paged" : "", s->attn_only ? ", attention ops only" : "");
    if (s->seg_rows) printf("   (k = %d)\n", s->seg_rows);
    double t0 = now_sec();
    int fails = test ? dsv4_backend_conformance(test, ref, s, tol, 7, timed ? NULL : stdout, &e) : -1;
    double dt = now_sec() - t0;
    if (fails < 0) printf("ERROR: %s\n", e.msg);
    else if (!timed) printf("wall %.1f s (CPU reference included)\n\n", dt);
    if (timed && fails >= 0) {
        printf("per-op wall time of the CUDA backend in that run (one call each, synchronised after every op; "
               "first calls include cuBLAS / expert-set set-up):\n");
        dsv4_backend_timing_report(test, stdout);
        printf("\n");
    }
    if (timed && test) test->free(test);
    cu->free(cu);
    ref->free(ref);
    return fails;
}

/* ---- steady-state timing of the two weight-streaming ops, Flash shapes ---- */

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint8_t rb(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint8_t)(rs >> 24);
}

static dsv4_linear host_lin(dsv4_dtype dt, int64_t o, int64_t i) {
    dsv4_linear l = {.out = o, .in = i};
    size_t wb = dt == DSV4_DT_I8 ? (size_t)(o * i / 2) : (size_t)(o * i);
    size_t sb = dt == DSV4_DT_I8 ? (size_t)(o * i / 32) : (size_t)((o / 128) * (i / 128));
    uint8_t *w = malloc(wb), *s = malloc(sb);
    for (size_t k = 0; w && k < wb; k++) {
        uint8_t b = rb();
        w[k] = dt == DSV4_DT_I8 ? b : ((b & 0x7F) == 0x7F ? 0x38 : (uint8_t)(b & 0xBF));
    }
    for (size_t k = 0; s && k < sb; k++) s[k] = (uint8_t)(120 + k % 3);
    l.w = (dsv4_tview){.dtype = dt, .ndim = 2, .shape = {o, dt == DSV4_DT_I8 ? i / 2 : i}, .data = w, .nbytes = wb};
    l.scale = (dsv4_tview){.dtype = DSV4_DT_F8_E8M0, .ndim = 2,
                           .shape = {dt == DSV4_DT_I8 ? o : o / 128, dt == DSV4_DT_I8 ? i / 32 : i / 128},
                           .data = s, .nbytes = sb};
    return l;
}

static void free_host_lin(dsv4_linear *l) {
    free((void *)l->w.data);
    free((void *)l->scale.data);
}

#define CK(x)                                                   \
    do {                                                        \
        if (x) {                                                \
            fprintf(stderr, "perf: %s: %s\n", #x, e.msg);       \
            return 2;                                           \
        }                                                       \
    } while (0)

static int perf(void) {
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &e);
    if (!be) {
        fprintf(stderr, "perf: %s\n", e.msg);
        return 2;
    }
    enum { E = 16, K = 6, D = 4096, F = 2048, REPS = 200 };
    printf("== steady state, CUDA backend ops through the op table (%d calls, wall clock / call, one sync at "
           "the end; same weights every call, so partly L2-resident: not a roofline number)\n", REPS);
    dsv4_linear hq = host_lin(DSV4_DT_F8_E4M3, 32768, 1024), q;
    CK(be->upload_linear(be, &hq, &q, &e));
    free_host_lin(&hq);
    dsv4_linear *hw = calloc(6 * E, sizeof *hw), *dw = hw + 3 * E;
    for (int x = 0; x < E; x++) {
        hw[x] = host_lin(DSV4_DT_I8, F, D);
        hw[E + x] = host_lin(DSV4_DT_I8, F, D);
        hw[2 * E + x] = host_lin(DSV4_DT_I8, D, F);
        for (int j = 0; j < 3; j++) {
            CK(be->upload_linear(be, &hw[j * E + x], &dw[j * E + x], &e));
            free_host_lin(&hw[j * E + x]);
        }
    }
    for (int n = 1; n <= 6; n += 5) {
        dsv4_buf x, y, xq, yq, ids, w;
        CK(be->buf_alloc(be, DSV4_DT_F32, n, 1024, &xq, &e));
        CK(be->buf_alloc(be, DSV4_DT_F32, n, 32768, &yq, &e));
        CK(be->buf_alloc(be, DSV4_DT_F32, n, D, &x, &e));
        CK(be->buf_alloc(be, DSV4_DT_F32, n, D, &y, &e));
        CK(be->buf_alloc(be, DSV4_DT_I32, n, K, &ids, &e));
        CK(be->buf_alloc(be, DSV4_DT_F32, n, K, &w, &e));
        float *hx = malloc((size_t)n * D * 4), *hwt = malloc((size_t)n * K * 4);
        int32_t *hid = malloc((size_t)n * K * 4);
        for (int i = 0; i < n * D; i++) hx[i] = (float)((int)rb() - 128) / 64.0f;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < K; j++) hid[t * K + j] = (t * 5 + j * 3) % E, hwt[t * K + j] = 0.25f;
        CK(be->buf_write(be, &x, hx, &e));
        CK(be->buf_write(be, &ids, hid, &e));
        CK(be->buf_write(be, &w, hwt, &e));
        CK(be->linear(be, &xq, &q, &yq, &e));
        CK(be->moe_experts(be, &x, dw, dw + E, dw + 2 * E, E, &ids, &w, 10.0f, &y, &e)); /* assembles the set */
        CK(be->sync(be, &e));
        double t0 = now_sec();
        for (int r = 0; r < REPS; r++) CK(be->linear(be, &xq, &q, &yq, &e));
        CK(be->sync(be, &e));
        double t1 = now_sec();
        for (int r = 0; r < REPS; r++) CK(be->moe_experts(be, &x, dw, dw + E, dw + 2 * E, E, &ids, &w, 10.0f, &y, &e));
        CK(be->sync(be, &e));
        double t2 = now_sec();
        printf("n=%d  linear FP8 32768x1024 (wq_b): %.2f us   moe_experts FP4 top-%d of %d, d=%d F=%d: %.2f us\n", n,
               (t1 - t0) / REPS * 1e6, K, E, D, F, (t2 - t1) / REPS * 1e6);
        dsv4_buf *bs[6] = {&x, &y, &xq, &yq, &ids, &w};
        for (int i = 0; i < 6; i++) be->buf_free(be, bs[i]);
        free(hx);
        free(hwt);
        free(hid);
    }
    free(hw);
    be->free(be);
    printf("\n");
    return 0;
}

/* logit_top (issue 7: greedy ids where the logits are): n rows of the 129280-wide vocabulary, k = 1.
 * Cheap (well under a second), so it runs with --no-perf too. */
static int perf_logit_top(void) {
    enum { REPS = 200 };
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &e);
    if (!be) {
        fprintf(stderr, "perf: %s\n", e.msg);
        return 2;
    }
    printf("== logit_top, CUDA (%d calls, wall clock / call, one sync at the end; zero logits: every element ties, "
           "the worst case of the tie rule)\n", REPS);
    static const int ltn[3] = {1, 48, 384};
    for (int i = 0; i < 3; i++) {
        int n = ltn[i];
        dsv4_buf lx, lid;
        CK(be->buf_alloc(be, DSV4_DT_F32, n, 129280, &lx, &e));
        CK(be->buf_alloc(be, DSV4_DT_I32, n, 1, &lid, &e));
        CK(be->logit_top(be, &lx, &lid, NULL, &e));
        CK(be->sync(be, &e));
        double t0 = now_sec();
        for (int r = 0; r < REPS; r++) CK(be->logit_top(be, &lx, &lid, NULL, &e));
        CK(be->sync(be, &e));
        double us = (now_sec() - t0) / REPS * 1e6;
        printf("n=%d  logit_top k=1 over %d x 129280 F32 logits: %.2f us (%.0f GB/s of logits read)\n", n, n, us,
               (double)n * 129280 * 4 / (us * 1e3));
        be->buf_free(be, &lx);
        be->buf_free(be, &lid);
    }
    be->free(be);
    printf("\n");
    return 0;
}

/* ---- steady-state attention-state ops at Flash shapes and long contexts (CUDA only) ---- */

static double timed_calls(dsv4_backend *be, int reps, int (*call)(dsv4_backend *, void *), void *arg, dsv4_err *e) {
    if (call(be, arg) || be->sync(be, e)) return -1; /* warm-up (workspace growth, attributes) */
    double t0 = now_sec();
    for (int r = 0; r < reps; r++)
        if (call(be, arg)) return -1;
    if (be->sync(be, e)) return -1;
    return (now_sec() - t0) / reps;
}

typedef struct attn_bench {
    dsv4_buf q, kv, o, qi, g, sel, K, Z;
    dsv4_win_state ws;
    dsv4_cmp_state cm, c128, ix;
    dsv4_tview sinks, ape, nw;
    dsv4_rope rope;
    dsv4_batch *b;
    dsv4_err *e;
} attn_bench;

static int call_sel(dsv4_backend *be, void *p) {
    attn_bench *a = p;
    return be->indexer_select(be, &a->qi, &a->g, 0.01f, &a->ix, 512, a->b, &a->sel, a->e);
}
static int call_att_sel(dsv4_backend *be, void *p) {
    attn_bench *a = p;
    return be->attention(be, &a->q, &a->kv, &a->ws, &a->cm, &a->sel, &a->sinks, 64, a->b, &a->o, a->e);
}
static int call_att_128(dsv4_backend *be, void *p) {
    attn_bench *a = p;
    return be->attention(be, &a->q, &a->kv, &a->ws, &a->c128, NULL, &a->sinks, 64, a->b, &a->o, a->e);
}
static int call_att_win(dsv4_backend *be, void *p) {
    attn_bench *a = p;
    return be->attention(be, &a->q, &a->kv, &a->ws, NULL, NULL, &a->sinks, 64, a->b, &a->o, a->e);
}
static int call_compress(dsv4_backend *be, void *p) {
    attn_bench *a = p;
    return be->compress(be, &a->cm, &a->K, &a->Z, &a->ape, &a->nw, 1e-6f, &a->rope, DSV4_QAT_FP8_NOPE, a->b, a->e);
}

/* R requests of k rows (k = 1 decode, 6 verify) ending near position ctx-1; random queries, index keys
 * and batch rows, the rest of the state zeros (attention timing does not depend on values). */
static int perf_attn(int ctx, int R, int k) {
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &e);
    if (!be) {
        fprintf(stderr, "perf_attn: %s\n", e.msg);
        return 2;
    }
    enum { H = 64, HD = 512, IH = 64, DK = 128, W = 128 };
    int T = R * k, reps = 20;
    int32_t *arr = calloc((size_t)T * 4 + 3 * (size_t)R + 1, sizeof(int32_t));
    int32_t *cu = arr + 4 * T, *ss = cu + R + 1, *sp = ss + R;
    for (int r = 0; r <= R; r++) cu[r] = r * k;
    for (int r = 0; r < R; r++) {
        ss[r] = r;
        sp[r] = ctx - k - 4 * r; /* staggered, so some rows complete a window */
        for (int j = 0; j < k; j++) {
            arr[r * k + j] = 1;
            arr[T + r * k + j] = sp[r] + j;
            arr[2 * T + r * k + j] = r;
            arr[3 * T + r * k + j] = r;
        }
    }
    dsv4_batch b = {.n_rows = T, .n_seqs = R, .token = arr, .pos = arr + T, .slot = arr + 2 * T,
                    .seq_idx = arr + 3 * T, .cu_seqlens = cu, .seq_slot = ss, .seq_pos0 = sp};
    attn_bench a = {.b = &b, .e = &e};
    int64_t mr4 = ctx / 4 + 1, mr128 = ctx / 128 + 1;
    dsv4_buf ring, rows4, rows128, irows, ckv, csc, ikv, isc, c128kv, c128sc;
    CK(be->batch_begin(be, &b, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * (W + 8), HD, &ring, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, R * mr4, HD, &rows4, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, R * mr128, HD, &rows128, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, R * mr4, DK, &irows, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 16, 2 * HD, &ckv, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 16, 2 * HD, &csc, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 16, 2 * DK, &ikv, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 16, 2 * DK, &isc, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 136, HD, &c128kv, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, (int64_t)R * 136, HD, &c128sc, &e));
    a.ws = (dsv4_win_state){.window = W, .cap = W + 8, .n_slots = R, .rows = ring};
    a.cm = (dsv4_cmp_state){.ratio = 4, .overlap = 1, .out_dim = HD, .cap = 16, .n_slots = R, .max_rows = mr4,
                            .kv = ckv, .score = csc, .rows = rows4};
    a.ix = (dsv4_cmp_state){.ratio = 4, .overlap = 1, .out_dim = DK, .cap = 16, .n_slots = R, .max_rows = mr4,
                            .kv = ikv, .score = isc, .rows = irows};
    a.c128 = (dsv4_cmp_state){.ratio = 128, .overlap = 0, .out_dim = HD, .cap = 136, .n_slots = R,
                              .max_rows = mr128, .kv = c128kv, .score = c128sc, .rows = rows128};
    CK(be->buf_alloc(be, DSV4_DT_F32, T, (int64_t)H * HD, &a.q, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, HD, &a.kv, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, (int64_t)H * HD, &a.o, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, (int64_t)IH * DK, &a.qi, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, IH, &a.g, &e));
    CK(be->buf_alloc(be, DSV4_DT_I32, T, 512, &a.sel, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, 2 * HD, &a.K, &e));
    CK(be->buf_alloc(be, DSV4_DT_F32, T, 2 * HD, &a.Z, &e));
    /* random index keys: the top-k then sees a realistic spread of scores (zeros would all tie) */
    float *hk = malloc((size_t)R * mr4 * DK * 4);
    for (size_t i = 0; hk && i < (size_t)R * mr4 * DK; i++) hk[i] = (float)((int)rb() - 128) / 128.0f;
    CK(!hk || be->buf_write(be, &irows, hk, &e));
    free(hk);
    float *hq = malloc((size_t)T * H * HD * 4), *hs = malloc(8 * HD * 4);
    for (size_t i = 0; i < (size_t)T * H * HD; i++) hq[i] = (float)((int)rb() - 128) / 128.0f;
    for (int i = 0; i < 8 * HD; i++) hs[i] = 0.01f * (float)(i % 7);
    CK(be->buf_write(be, &a.q, hq, &e));
    CK(be->buf_write(be, &a.qi, hq, &e));
    CK(be->buf_write(be, &a.kv, hq, &e));
    dsv4_tview hsink = {.dtype = DSV4_DT_F32, .ndim = 1, .shape = {H}, .data = hs, .nbytes = H * 4};
    dsv4_tview hape = {.dtype = DSV4_DT_F32, .ndim = 2, .shape = {4, 2 * HD}, .data = hs, .nbytes = 8 * HD * 4};
    dsv4_tview hnw = {.dtype = DSV4_DT_F32, .ndim = 1, .shape = {HD}, .data = hs, .nbytes = HD * 4};
    CK(be->upload(be, &hsink, &a.sinks, &e));
    CK(be->upload(be, &hape, &a.ape, &e));
    CK(be->upload(be, &hnw, &a.nw, &e));
    CK(dsv4_rope_init(&a.rope, 64, 160000, 16, 65536, 32, 1, &e));
    /* key bytes the kernels read per call (each row reads its own candidates; L2 serves repeats) */
    double kb_sel = 0, kb_128 = 0, kb_win = 0, kb_idx = 0;
    for (int t = 0; t < T; t++) {
        double p = arr[T + t], nw = p + 1 < W ? p + 1 : W;
        kb_win += nw * HD * 4;
        kb_sel += (nw + 512) * HD * 4;
        kb_128 += (nw + floor((p + 1) / 128)) * HD * 4;
        kb_idx += floor((p + 1) / 4) * DK * 4;
    }
    struct { const char *name; int (*f)(dsv4_backend *, void *); double bytes; } ops[5] = {
        {"indexer_select (64 heads x 128, top-512)", call_sel, kb_idx},
        {"attention, window 128 + 512 selected", call_att_sel, kb_sel},
        {"attention, window 128 + all ratio-128 rows", call_att_128, kb_128},
        {"attention, window 128 only", call_att_win, kb_win},
        {"compress (ratio 4, overlap, FP8 QAT)", call_compress, 0}};
    printf("== attention-state ops, CUDA, Flash shapes: %d requests x %d rows at context %d (%d calls each, wall "
           "clock / call, one sync at the end)\n", R, k, ctx, reps);
    for (int i = 0; i < 5; i++) {
        double dt = timed_calls(be, reps, ops[i].f, &a, &e);
        if (dt < 0) {
            fprintf(stderr, "perf_attn: %s: %s\n", ops[i].name, e.msg);
            return 2;
        }
        if (ops[i].bytes > 0)
            printf("  %-44s %9.1f us   keys %7.2f MB/call  %7.1f GB/s  (%.3f of the 4.58 TB/s HBM roofline)\n",
                   ops[i].name, dt * 1e6, ops[i].bytes / 1e6, ops[i].bytes / dt / 1e9, ops[i].bytes / dt / 4.58e12);
        else
            printf("  %-44s %9.1f us\n", ops[i].name, dt * 1e6);
    }
    free(hq);
    free(hs);
    free(arr);
    be->free(be); /* frees every buffer with the context */
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    double tol = 2e-2;
    int rows[8], nrows = 0, do_perf = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tol") && i + 1 < argc) tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--flash-rows") && i + 1 < argc && nrows < 8) rows[nrows++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-perf")) do_perf = 0;
        else {
            fprintf(stderr, "usage: %s [--tol X] [--flash-rows N]... [--no-perf]\n", argv[0]);
            return 2;
        }
    }
    if (!nrows) rows[nrows++] = 4;
    int bad = 0, err = 0, f;
    dsv4_conf_shape s;
    dsv4_conf_shape_tiny(&s);
    f = run("tiny", &s, DSV4_NUMERICS_REFERENCE, tol, 0);
    bad += f > 0, err += f < 0;
    f = run("tiny", &s, DSV4_NUMERICS_HF, tol, 0);
    bad += f > 0, err += f < 0;
    for (int i = 0; i < nrows; i++) {
        dsv4_conf_shape_flash(&s, rows[i]);
        f = run("flash", &s, DSV4_NUMERICS_REFERENCE, tol, 0);
        bad += f > 0, err += f < 0;
    }
    /* the attention-state layouts: paged CUDA side vs unpaged CPU, verify-shaped segments, long chunks
     * (longer than the rings, crossing compressor windows), ratio 128 */
    static const struct { const char *title; int flash, rows, seg, pos0, ratio, paged; } L[] = {
        {"tiny, verify 4x6, paged", 0, 24, 6, 300, 0, 1},
        {"tiny, long chunks 2x150", 0, 300, 0, 0, 0, 0},
        {"tiny, long chunks 2x150, ratio 128, paged", 0, 300, 0, 0, 128, 1},
        {"flash, verify 8x6, paged", 1, 48, 6, 3000, 0, 1},
        {"flash, long chunks 2x160 (ring 132)", 1, 320, 160, 2000, 0, 0},
        {"flash, verify 4x6, ratio 128, paged", 1, 24, 6, 20000, 128, 1},
        {"flash, decode 16x1, paged", 1, 16, 1, 9000, 0, 1},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        if (L[i].flash) dsv4_conf_shape_flash(&s, L[i].rows);
        else dsv4_conf_shape_tiny(&s);
        s.rows = L[i].rows;
        s.seg_rows = L[i].seg;
        s.pos0 = L[i].pos0;
        s.ratio = L[i].ratio;
        s.paged = L[i].paged;
        s.attn_only = 1;
        f = run(L[i].title, &s, DSV4_NUMERICS_REFERENCE, tol, 0);
        bad += f > 0, err += f < 0;
    }
    if (do_perf) {
        err += perf_attn(65536, 32, 1) != 0;
        err += perf_attn(65536, 8, 6) != 0;
        err += perf_attn(8192, 1, 1) != 0;
        printf("(the same with the attention pv kernel built for 1 block / SM: DSV4_CUDA_ATT_PV_MINB=1)\n");
        setenv("DSV4_CUDA_ATT_PV_MINB", "1", 1);
        err += perf_attn(65536, 32, 1) != 0;
        err += perf_attn(65536, 8, 6) != 0;
        unsetenv("DSV4_CUDA_ATT_PV_MINB");
        dsv4_conf_shape_flash(&s, rows[0]);
        f = run("flash, timed", &s, DSV4_NUMERICS_REFERENCE, tol, 1);
        err += f < 0;
        err += perf() != 0;
    }
    err += perf_logit_top() != 0;
    printf("summary: %d runs with outputs above tolerance, %d runs with errors\n", bad, err);
    return err ? 2 : bad ? 1 : 0;
}
