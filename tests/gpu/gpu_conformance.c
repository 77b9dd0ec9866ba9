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
 *   dsv4-gpu-conformance [--tol X] [--flash-rows N]... [--no-perf] [--attn-perf]
 *                        [--rows-only | --no-rows] [--rows-tol X] [--small-only | --no-small]
 *                        [--layouts-only] [--att-exact]
 * (--attn-perf: only the attention-state op timings of 1 request at context 4K / 32K,
 * decode, verify and a 4096-row prefill, and 8x6 verify; --att-exact: only the bit-exactness of the
 * staged coded-row attention kernels against the direct ones, and of the small-row pv (PDL, last-block
 * split sum) against the plain launch + k_att_reduce, of the tensor-core pv after k_att_softmax against
 * the per-slice statistics (DSV4_CUDA_ATT_PSM=0) and of 128-candidate staged score blocks against 64
 * (DSV4_CUDA_ATT_SC128=0), of the bf16 probabilities against fp32 ones (DSV4_CUDA_ATT_PBF=0), and of
 * shape-static launches (CUDA graphs; state 8x or 128x the context) against position-sized ones, attn_exact)
 * First the fp32-activation linears (linear_grouped wo_a, the BF16 gate
 * shape, F32 linears) at T = 1 .. 4096 against the CPU op on sampled rows
 * (tolerance --rows-tol, default 1e-4; --rows-only stops after them,
 * --no-rows skips them), then the small ops at real shapes (--small-only
 * stops after them, --no-small skips them).
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
#include "model/kvcodec.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/timing.h"

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* An attention-state layout of the harness: tiny or Flash shapes, rows, verify-shaped segments, start
 * position, compress ratio, paged CUDA side. */
typedef struct layout {
    const char *title;
    int flash, rows, seg, pos0, ratio, paged;
} layout;

/* s = the attention-only shape of layout l (the KV row dtype is the caller's). */
static void layout_shape(const layout *l, dsv4_conf_shape *s) {
    if (l->flash) dsv4_conf_shape_flash(s, l->rows);
    else dsv4_conf_shape_tiny(s);
    s->rows = l->rows;
    s->seg_rows = l->seg;
    s->pos0 = l->pos0;
    s->ratio = l->ratio;
    s->paged = l->paged;
    s->attn_only = 1;
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
    size_t sb = dt == DSV4_DT_I8 ? (size_t)(o * i / 32) : (size_t)(((o + 127) / 128) * ((i + 127) / 128));
    uint8_t *w = malloc(wb), *s = malloc(sb);
    for (size_t k = 0; w && k < wb; k++) {
        uint8_t b = rb();
        w[k] = dt == DSV4_DT_I8 ? b : ((b & 0x7F) == 0x7F ? 0x38 : (uint8_t)(b & 0xBF));
    }
    for (size_t k = 0; s && k < sb; k++) s[k] = (uint8_t)(120 + k % 3);
    l.w = (dsv4_tview){.dtype = dt, .ndim = 2, .shape = {o, dt == DSV4_DT_I8 ? i / 2 : i}, .data = w, .nbytes = wb};
    l.scale = (dsv4_tview){.dtype = DSV4_DT_F8_E8M0, .ndim = 2,
                           .shape = {dt == DSV4_DT_I8 ? o : (o + 127) / 128, dt == DSV4_DT_I8 ? i / 32 : (i + 127) / 128},
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
    CK(be->experts_ready(be, dw, dw + E, dw + 2 * E, E, &e)); /* the expert set, made as a model load makes it */
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
        CK(be->moe_experts(be, &x, dw, dw + E, dw + 2 * E, E, &ids, &w, 10.0f, &y, &e));
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

/* ---- the fp32-activation linears (cuda_rows.cu) at the real shapes, every T path ---- */

/* A host linear [o][i]: FP8 as host_lin (random codes, scales 2^-7..2^-5), BF16 / F32 random in
 * [-1, 1) / sqrt(i) (the BF16 values exact in F32 too). */
static dsv4_linear host_rows_lin(dsv4_dtype dt, int64_t o, int64_t i) {
    if (dt == DSV4_DT_F8_E4M3 || dt == DSV4_DT_I8) return host_lin(dt, o, i);
    dsv4_linear l = {.out = o, .in = i};
    size_t es = dt == DSV4_DT_BF16 ? 2 : 4, n = (size_t)(o * i);
    uint8_t *w = malloc(n * es);
    const float sc = 1.0f / sqrtf((float)i);
    for (size_t k = 0; w && k < n; k++) {
        float f = sc * (float)((int)rb() - 128) / 128.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        if (es == 2) ((uint16_t *)w)[k] = (uint16_t)(u >> 16);
        else ((float *)w)[k] = f;
    }
    l.w = (dsv4_tview){.dtype = dt, .ndim = 2, .shape = {o, i}, .data = w, .nbytes = n * es};
    return l;
}

/* One case: the CUDA op on T rows (timed), the CPU reference on up to 64 of them (evenly
 * spaced), normalised error over those. groups > 0: linear_grouped; 0: linear. Returns 1 when
 * the error exceeds tol, 2 on an error. */
static int rows_case(const char *name, dsv4_dtype dt, int64_t out, int64_t in, int groups, int T, double tol) {
    dsv4_err e = {0};
    dsv4_backend *cu = dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &e);
    dsv4_backend *cpu = cu ? dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e) : NULL;
    if (!cpu) {
        fprintf(stderr, "rows %s: %s\n", name, e.msg);
        if (cu) cu->free(cu);
        return 2;
    }
    const int g = groups > 0 ? groups : 1, S = T < 64 ? T : 64;
    const int64_t xc = in * g, ow = out; /* x columns, y columns */
    dsv4_linear h = host_rows_lin(dt, out, in), L, Lc = h;
    float *hx = malloc((size_t)T * xc * 4), *hy = malloc((size_t)T * ow * 4);
    float *sx = malloc((size_t)S * xc * 4), *sy = malloc((size_t)S * ow * 4);
    int rc = 0;
    dsv4_buf x, y, cx, cy;
    /* full 24-bit mantissas (multiples of 1/64 would make every product and sum exact) */
    for (size_t k = 0; hx && k < (size_t)T * xc; k++)
        hx[k] = (float)(((uint32_t)rb() << 16 | (uint32_t)rb() << 8 | rb()) * (1.0 / 4194304.0) - 2.0);
    CK(!hx || !hy || !sx || !sy);
    CK(cu->upload_linear(cu, &h, &L, &e));
    if (cpu->upload_linear) CK(cpu->upload_linear(cpu, &h, &Lc, &e));
    CK(cu->buf_alloc(cu, DSV4_DT_F32, T, xc, &x, &e));
    CK(cu->buf_alloc(cu, DSV4_DT_F32, T, ow, &y, &e));
    CK(cu->buf_write(cu, &x, hx, &e));
#define ROWS_OP(be, xx, LL, yy) (groups > 0 ? (be)->linear_grouped((be), (xx), (LL), groups, (yy), &e) \
                                            : (be)->linear((be), (xx), (LL), (yy), &e))
    CK(ROWS_OP(cu, &x, &L, &y));
    CK(cu->sync(cu, &e));
    CK(cu->buf_read(cu, &y, hy, &e));
    const int reps = T <= 64 ? 100 : 5;
    double t0 = now_sec();
    for (int r = 0; r < reps; r++) CK(ROWS_OP(cu, &x, &L, &y));
    CK(cu->sync(cu, &e));
    const double dt_s = (now_sec() - t0) / reps;
    /* reference on the sampled rows */
    for (int j = 0; j < S; j++) memcpy(sx + (size_t)j * xc, hx + (size_t)((int64_t)j * T / S) * xc, (size_t)xc * 4);
    CK(cpu->buf_alloc(cpu, DSV4_DT_F32, S, xc, &cx, &e));
    CK(cpu->buf_alloc(cpu, DSV4_DT_F32, S, ow, &cy, &e));
    CK(cpu->buf_write(cpu, &cx, sx, &e));
    CK(ROWS_OP(cpu, &cx, &Lc, &cy));
    CK(cpu->sync(cpu, &e));
    CK(cpu->buf_read(cpu, &cy, sy, &e));
#undef ROWS_OP
    double num = 0, den = 0;
    for (int j = 0; j < S; j++)
        for (int64_t o = 0; o < ow; o++) {
            const double a = hy[(size_t)((int64_t)j * T / S) * ow + o], b = sy[(size_t)j * ow + o];
            num += (a - b) * (a - b);
            den += b * b;
        }
    const double ne = sqrt(num) / fmax(sqrt(den), 1e-30);
    const double wbytes = (double)h.w.nbytes + (double)h.scale.nbytes, flop = 2.0 * T * (double)out * (double)in;
    rc = !(ne <= tol);
    printf("  %-34s T=%-5d nerr %.3e %s  %9.1f us/call  weights %7.1f GB/s  %7.2f TFLOP/s\n", name, T, ne,
           rc ? "FAIL" : "ok", dt_s * 1e6, wbytes / dt_s / 1e9, flop / dt_s / 1e12);
    cpu->free(cpu);
    cu->free(cu);
    free(hx);
    free(hy);
    free(sx);
    free(sy);
    if (dt == DSV4_DT_F8_E4M3 || dt == DSV4_DT_I8) free_host_lin(&h);
    else free((void *)h.w.data);
    return rc;
}

static int rows_cases(double tol) {
    printf("== fp32-activation linears (cuda_rows.cu), real shapes, CUDA vs CPU reference on up to 64 sampled rows, "
           "tol %.1e; wall clock / call after one warm-up call (weights partly L2-resident at small T)\n", tol);
    static const int Ts_all[] = {1, 2, 6, 8, 16, 48, 64, 96, 192, 256, 512, 4096}, Ts_few[] = {1, 48};
    /* DSV4_CONF_ROWS_FEW=1: the real shapes at T = 1 and 48 only (a short device run) */
    const int few = getenv("DSV4_CONF_ROWS_FEW") != NULL;
    const int *Ts = few ? Ts_few : Ts_all;
    const size_t nTs = few ? 2 : sizeof Ts_all / sizeof Ts_all[0];
    int bad = 0, err = 0;
    for (size_t i = 0; i < nTs; i++) {
        int r = rows_case("wo_a FP8 8x[1024x4096] grouped", DSV4_DT_F8_E4M3, 8192, 4096, 8, Ts[i], tol);
        bad += r == 1, err += r == 2;
        if (Ts[i] == 1 || Ts[i] == 48) { /* the 16-row-tile kernel (large shapes with out_g % 128 != 0) */
            setenv("DSV4_CUDA_ROWS_MMA1", "1", 1);
            r = rows_case("  same, k_rows_mma (16-row tiles)", DSV4_DT_F8_E4M3, 8192, 4096, 8, Ts[i], tol);
            unsetenv("DSV4_CUDA_ROWS_MMA1");
            bad += r == 1, err += r == 2;
        }
        if (Ts[i] >= 64 && Ts[i] <= 256) { /* the other FP8 path at the same T (where the switch sits) */
            setenv("DSV4_CUDA_ROWS_MMA_MAX", Ts[i] == 256 ? "256" : "48", 1);
            r = rows_case(Ts[i] == 256 ? "  same, mma slabs" : "  same, cuBLAS hi+mid+lo", DSV4_DT_F8_E4M3, 8192, 4096,
                          8, Ts[i], tol);
            unsetenv("DSV4_CUDA_ROWS_MMA_MAX");
            bad += r == 1, err += r == 2;
        }
    }
    static const int Tg[] = {1, 6, 16, 48, 4096};
    for (size_t i = 0; i < (few ? 1 : sizeof Tg / sizeof Tg[0]); i++) {
        int r = rows_case("gate BF16 256x4096 (grouped, 1)", DSV4_DT_BF16, 256, 4096, 1, Tg[i], tol);
        bad += r == 1, err += r == 2;
        r = rows_case("F32 256x4096 linear", DSV4_DT_F32, 256, 4096, 0, Tg[i], tol);
        bad += r == 1, err += r == 2;
    }
    /* the tiny checkpoints' wo_a (k_rows_mma up to 64 rows, cuBLAS above) and its TP = 2 slice */
    static const int Tt[] = {1, 5, 6, 300};
    for (size_t i = 0; i < sizeof Tt / sizeof Tt[0]; i++) {
        int r = rows_case("tiny wo_a FP8 2x[64x256] grouped", DSV4_DT_F8_E4M3, 128, 256, 2, Tt[i], tol);
        bad += r == 1, err += r == 2;
        r = rows_case("tiny wo_a TP=2 slice FP8 1x[64x256]", DSV4_DT_F8_E4M3, 64, 256, 1, Tt[i], tol);
        bad += r == 1, err += r == 2;
    }
    /* W8A8 linears below the 128 tiles (TP = 2 slices of the tiny checkpoints: shared w1/w3 rows,
     * wo_b / shared w2 / expert w2 columns): uploaded zero-padded (cuda_subtile.cu) */
    static const int Tp[] = {1, 5, 300};
    for (size_t i = 0; i < sizeof Tp / sizeof Tp[0]; i++) {
        int r = rows_case("sub-tile FP8 [64x256] linear (padded rows)", DSV4_DT_F8_E4M3, 64, 256, 0, Tp[i], tol);
        bad += r == 1, err += r == 2;
        r = rows_case("sub-tile FP8 [256x64] linear (padded columns)", DSV4_DT_F8_E4M3, 256, 64, 0, Tp[i], tol);
        bad += r == 1, err += r == 2;
        r = rows_case("sub-tile FP4 [256x64] linear (padded columns)", DSV4_DT_I8, 256, 64, 0, Tp[i], tol);
        bad += r == 1, err += r == 2;
    }
    /* shapes the fast paths refuse: the one-warp-per-output fallback */
    int r = rows_case("F32 24x1001 linear (fallback)", DSV4_DT_F32, 24, 1001, 0, 5, tol);
    bad += r == 1, err += r == 2;
    printf("rows: %d cases above tolerance, %d errors\n\n", bad, err);
    return err ? -1 : bad;
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

/* The exactness half of attn_state_run: random coded rows into the n_st state buffers st (nr[i] records
 * of dim values), the selection from the indexer, then the three attention calls once with env=val (the
 * kernels before: env DSV4_CUDA_ATT_CODED_DIRECT, direct coded rows, or DSV4_CUDA_ATT_DEC=0, the
 * small-row pv without PDL / last-block split sum) and twice with env=val_new (the second call checks that
 * nothing left by the first, e.g. the split counters, changes a result); prints one line per call.
 * env NULL: position-sized launches (be->static_shapes 0) against shape-static ones (1, what a CUDA
 * graph is captured with), the indexer's selection as well.
 * Returns the number of calls whose outputs (no floats) differ, -1 on error. */
static int attn_exact(dsv4_backend *be, struct attn_bench *a, dsv4_buf *const st[3], const int64_t nr[3],
                      dsv4_kv_dtype kvt, int dim, int64_t rbytes, size_t no, const char *env, const char *val,
                      const char *val_new) {
    float *x = malloc((size_t)dim * sizeof(float)), *o[3] = {malloc(no * 4), malloc(no * 4), malloc(no * 4)};
    int rc = !x || !o[0] || !o[1] || !o[2] ? -1 : 0, fails = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        uint8_t *h = malloc((size_t)(nr[i] * rbytes));
        rc = h ? 0 : -1;
        for (int64_t r = 0; h && r < nr[i]; r++) {
            for (int d = 0; d < dim; d++) x[d] = (float)((int)rb() - 128) / 32.0f;
            dsv4_kvcodec_encode(kvt, dim, 64, x, h + r * rbytes);
        }
        if (!rc && be->buf_write(be, st[i], h, a->e)) rc = -1;
        free(h);
    }
    if (!env && !rc) { /* shape-static vs position-sized: the indexer's selection first */
        const size_t ns = (size_t)a->sel.rows * (size_t)a->sel.cols;
        int32_t *s0 = malloc(ns * 4), *s1 = malloc(ns * 4);
        be->static_shapes = 1;
        if (!s0 || !s1 || call_sel(be, a) || be->buf_read(be, &a->sel, s1, a->e)) rc = -1;
        be->static_shapes = 0;
        if (!rc && (call_sel(be, a) || be->buf_read(be, &a->sel, s0, a->e))) rc = -1;
        size_t nd = 0;
        for (size_t j = 0; !rc && j < ns; j++) nd += s0[j] != s1[j];
        if (!rc) printf("  %-44s %zu of %zu selected rows differ: %s\n", "indexer_select", nd, ns, nd ? "FAIL" : "ok");
        fails += nd != 0;
        free(s0);
        free(s1);
    } else if (!rc && call_sel(be, a)) rc = -1;
    static const struct { const char *name; int (*f)(dsv4_backend *, void *); } ops[3] = {
        {"attention, window 128 + 512 selected", call_att_sel},
        {"attention, window 128 + all ratio-128 rows", call_att_128},
        {"attention, window 128 only", call_att_win}};
    for (int i = 0; i < 3 && !rc; i++) {
        for (int v = 0; v < 3 && !rc; v++) { /* v = 0: the kernels before (env=val), 1, 2: the new ones */
            if (env) setenv(env, v == 0 ? val : val_new, 1);
            else be->static_shapes = v != 0; /* no env: position-sized launches, then shape-static ones */
            if (ops[i].f(be, a) || be->buf_read(be, &a->o, o[v], a->e)) rc = -1;
        }
        if (env) unsetenv(env);
        be->static_shapes = 0;
        if (rc) break;
        size_t nd = 0, nf = 0;
        double md = 0, ss = 0;
        for (size_t j = 0; j < no; j++) {
            for (int v = 1; v < 3; v++)
                if (memcmp(&o[0][j], &o[v][j], sizeof(float))) nd++, md = fmax(md, fabs((double)o[0][j] - o[v][j]));
            nf += !isfinite(o[1][j]);
            ss += (double)o[1][j] * o[1][j];
        }
        printf("  %-44s %zu of %zu outputs differ in bits (max |diff| %.3e), rms %.4e, %zu not finite: %s\n",
               ops[i].name, nd, no, md, sqrt(ss / (double)no), nf, nd || nf ? "FAIL" : "ok");
        fails += nd || nf;
    }
    if (rc) fprintf(stderr, "attn_exact: %s\n", a->e->msg);
    free(x);
    free(o[0]);
    free(o[1]);
    free(o[2]);
    return rc ? -1 : fails;
}

/* R requests of k rows (k = 1 decode, 6 verify) ending near position ctx-1; random queries, index keys
 * and batch rows, the rest of the state zeros (attention timing does not depend on values).
 * exact: instead of timing, random window / compressed rows too (through the CPU codec, as the store
 * holds them), and each attention call twice, with the coded rows staged in shared memory (default)
 * and decoded from global memory (DSV4_CUDA_ATT_CODED_DIRECT=1, the kernels before the staging): the
 * outputs must be bit-identical (cuda_attn.cu). Returns 1 when they are not. */
static int attn_state_run(int ctx, int R, int k, dsv4_kv_dtype kvt, dsv4_numerics num, int exact) {
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cuda_create(num, 0, &e);
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
    /* exact 6 (shape-static vs position-sized): the state holds 8x the context (128x for up to 6 rows:
     * then a ratio-128 layer's static width passes the 1024 candidates where the score blocks change
     * shape), as a server's state sized by --max-model-len holds more than a request's context */
    const int64_t capx = exact == 6 ? (T <= 6 ? 128 : 8) : 1;
    int64_t mr4 = capx * ctx / 4 + 1, mr128 = capx * ctx / 128 + 1;
    dsv4_buf ring, rows4, rows128, irows, ckv, csc, ikv, isc, c128kv, c128sc;
    CK(be->batch_begin(be, &b, &e));
    /* window and main compressed rows in the --kv-cache-dtype record (kvcodec.h) */
    const int64_t rbytes = dsv4_kvcodec_row_bytes(kvt, HD, 64);
    const dsv4_dtype kdt = kvt == DSV4_KV_F32 ? DSV4_DT_F32 : kvt == DSV4_KV_BF16 ? DSV4_DT_BF16 : DSV4_DT_U8;
    const int64_t kcols = kvt == DSV4_KV_FP8_DS_MLA ? rbytes : HD;
    CK(be->buf_alloc(be, kdt, (int64_t)R * (W + 8), kcols, &ring, &e));
    CK(be->buf_alloc(be, kdt, R * mr4, kcols, &rows4, &e));
    CK(be->buf_alloc(be, kdt, R * mr128, kcols, &rows128, &e));
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
        kb_win += nw * rbytes;
        kb_sel += (nw + 512) * rbytes;
        kb_128 += (nw + floor((p + 1) / 128)) * rbytes;
        kb_idx += floor((p + 1) / 4) * DK * 4;
    }
    struct { const char *name; int (*f)(dsv4_backend *, void *); double bytes; } ops[5] = {
        {"indexer_select (64 heads x 128, top-512)", call_sel, kb_idx},
        {"attention, window 128 + 512 selected", call_att_sel, kb_sel},
        {"attention, window 128 + all ratio-128 rows", call_att_128, kb_128},
        {"attention, window 128 only", call_att_win, kb_win},
        {"compress (ratio 4, overlap, FP8 QAT)", call_compress, 0}};
    if (exact) {
        int fails = attn_exact(be, &a, (dsv4_buf *[3]){&ring, &rows4, &rows128},
                               (int64_t[3]){(int64_t)R * (W + 8), R * mr4, R * mr128}, kvt, HD, rbytes,
                               (size_t)T * H * HD,
                               exact == 6   ? NULL
                               : exact == 5 ? "DSV4_CUDA_ATT_PBF"
                               : exact == 4 ? "DSV4_CUDA_ATT_SC128"
                               : exact == 3 ? "DSV4_CUDA_ATT_PSM"
                               : exact == 2 ? "DSV4_CUDA_ATT_DEC"
                                            : "DSV4_CUDA_ATT_CODED_DIRECT",
                               exact >= 2 ? "0" : "1", exact >= 2 ? "1" : "0");
        printf("== %s, %s numerics: %d requests x %d rows at context %d, %s key rows: "
               "%s\n\n",
               exact == 6   ? "shape-static (graph) vs position-sized launches, state 8x / 128x the context"
               : exact == 5 ? "tensor-core pv: bf16 vs fp32 probabilities (PBF)"
               : exact == 4 ? "staged scores: 128 vs 64 candidates a block"
               : exact == 3 ? "tensor-core pv: softmax kernel (PSM) vs per-slice statistics"
               : exact == 2 ? "small-row pv: PDL + last-block sum vs plain + reduce" : "staged vs direct coded attention",
               num == DSV4_NUMERICS_HF ? "HF" : "reference", R, k, ctx, dsv4_kv_dtype_name(kvt),
               fails < 0 ? "ERROR" : fails ? "DIFFER" : "bit-identical");
        free(hq);
        free(hs);
        free(arr);
        be->free(be);
        return fails < 0 ? 2 : fails != 0;
    }
    printf("== attention-state ops, CUDA, Flash shapes: %d requests x %d rows at context %d, %s key rows (%lld "
           "bytes) (%d calls each, wall clock / call, one sync at the end)\n", R, k, ctx, dsv4_kv_dtype_name(kvt),
           (long long)rbytes, reps);
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

static int perf_attn(int ctx, int R, int k, dsv4_kv_dtype kvt) {
    return attn_state_run(ctx, R, k, kvt, DSV4_NUMERICS_REFERENCE, 0);
}

/* ---- the small ops at real shapes (issue 7): CUDA vs CPU, then CUDA time per call ----
 * hc_pre / hc_head (n_hc 4, d 4096: fn [24|4][16384] F32), the router tail
 * (256 experts top-6 with bias, on logits that are exact in fp32 so both
 * backends see the same values and ties are frequent; hash-routed with a
 * tid2eid table), rmsnorm (groups 4096 / 1024 / 512), qat_fp8 (head 512,
 * 448 quantised), and the MoE grouping through moe_experts (256 experts,
 * up to 4096 rows: several grouping calls, skewed routing). Rows 1, 6, 48, 4096. */

typedef struct sm_ctx {
    dsv4_backend *be[2]; /* 0 CUDA, 1 CPU */
    dsv4_err e;
    int bad, err;
    double tol;
} sm_ctx;

static float frnd(void) { return (float)((int)rb() - 128) / 128.0f + (float)((int)rb() - 128) / 32768.0f; }

static int sm_pair(sm_ctx *s, dsv4_dtype dt, int64_t r, int64_t c, const void *host, dsv4_buf b[2]) {
    for (int i = 0; i < 2; i++) {
        memset(&b[i], 0, sizeof b[i]);
        if (s->be[i]->buf_alloc(s->be[i], dt, r, c, &b[i], &s->e)) return -1;
        if (host && s->be[i]->buf_write(s->be[i], &b[i], host, &s->e)) return -1;
    }
    return 0;
}

static void sm_free(sm_ctx *s, dsv4_buf b[2]) {
    for (int i = 0; i < 2; i++) s->be[i]->buf_free(s->be[i], &b[i]);
}

static int sm_view(sm_ctx *s, dsv4_dtype dt, int64_t r, int64_t c, const void *host, dsv4_tview v[2]) {
    size_t es = dt == DSV4_DT_I64 ? 8 : dt == DSV4_DT_BF16 ? 2 : 4;
    dsv4_tview h = {.dtype = dt, .ndim = 2, .shape = {r, c}, .data = host, .nbytes = (size_t)(r * c) * es};
    for (int i = 0; i < 2; i++)
        if (s->be[i]->upload(s->be[i], &h, &v[i], &s->e)) return -1;
    return 0;
}

/* normalised error of an F32 output; prints and counts a failure above tol */
static void sm_check(sm_ctx *s, const char *what, int T, dsv4_buf b[2]) {
    size_t n = (size_t)(b[1].rows * b[1].cols);
    float *x = malloc(n * 4), *y = malloc(n * 4);
    if (!x || !y || s->be[0]->buf_read(s->be[0], &b[0], x, &s->e) || s->be[1]->buf_read(s->be[1], &b[1], y, &s->e)) {
        printf("%-34s T=%-5d ERROR %s\n", what, T, s->e.msg);
        s->err++;
    } else {
        double d2 = 0, r2 = 0;
        for (size_t i = 0; i < n; i++) {
            double d = (double)x[i] - y[i];
            d2 += d * d;
            r2 += (double)y[i] * y[i];
        }
        double ne = sqrt(d2) / fmax(sqrt(r2), 1e-30);
        int bad = !(ne <= s->tol);
        s->bad += bad;
        printf("%-34s T=%-5d nerr %.3e %s\n", what, T, ne, bad ? "FAIL" : "ok");
    }
    free(x);
    free(y);
}

/* expert ids must be equal, in order; prints the rows that differ */
static void sm_check_ids(sm_ctx *s, const char *what, int T, dsv4_buf b[2]) {
    size_t n = (size_t)(b[1].rows * b[1].cols);
    int32_t *x = malloc(n * 4), *y = malloc(n * 4);
    if (!x || !y || s->be[0]->buf_read(s->be[0], &b[0], x, &s->e) || s->be[1]->buf_read(s->be[1], &b[1], y, &s->e)) {
        printf("%-34s T=%-5d ERROR %s\n", what, T, s->e.msg);
        s->err++;
    } else {
        int64_t K = b[1].cols, diff = 0;
        for (int64_t t = 0; t < b[1].rows; t++) diff += memcmp(x + t * K, y + t * K, (size_t)K * 4) != 0;
        s->bad += diff != 0;
        printf("%-34s T=%-5d rows with other ids (in order): %lld of %lld %s\n", what, T, (long long)diff,
               (long long)b[1].rows, diff ? "FAIL" : "ok");
    }
    free(x);
    free(y);
}

/* Two outputs of the CUDA backend (a fused op and the ops it replaces) must be the same bits. */
static void sm_same_bits(sm_ctx *s, const char *what, int T, const dsv4_buf *a, const dsv4_buf *b) {
    size_t n = (size_t)(a->rows * a->cols), nd = 0;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    int bad = !x || !y || a->rows != b->rows || a->cols != b->cols || s->be[0]->buf_read(s->be[0], a, x, &s->e) ||
              s->be[0]->buf_read(s->be[0], b, y, &s->e);
    for (size_t i = 0; !bad && i < n; i++) nd += memcmp(&x[i], &y[i], 4) != 0;
    printf("%-34s T=%-5d %zu of %zu floats differ from the unfused ops: %s\n", what, T, nd, n,
           bad ? "ERROR" : nd ? "FAIL" : "ok");
    s->err += bad;
    s->bad += !bad && nd != 0;
    free(x);
    free(y);
}

#define SMCK(x)                                                         \
    do {                                                                \
        if (x) {                                                        \
            printf("%s: %s\n", #x, s->e.msg);                           \
            s->err++;                                                   \
            goto out;                                                   \
        }                                                               \
    } while (0)

/* CUDA wall time per call of `stmt` (reps calls, one sync). */
#define SMTIME(label, T, reps, stmt)                                                              \
    do {                                                                                         \
        dsv4_backend *be_ = s->be[0];                                                            \
        SMCK(be_->sync(be_, &s->e));                                                             \
        double t0_ = now_sec();                                                                  \
        for (int r_ = 0; r_ < (reps); r_++) SMCK(stmt);                                          \
        SMCK(be_->sync(be_, &s->e));                                                             \
        printf("   time %-27s T=%-5d %9.2f us/call\n", label, T, (now_sec() - t0_) / (reps) * 1e6); \
    } while (0)

static void sm_batch(int T, int V, dsv4_batch *b, int32_t *a /* 4T + 4 */) {
    for (int t = 0; t < T; t++) {
        a[t] = (int32_t)((t * 7919u + 13) % (unsigned)V);
        a[T + t] = 100 + t;
        a[2 * T + t] = 0;
        a[3 * T + t] = 0;
    }
    int32_t *cu = a + 4 * T;
    cu[0] = 0, cu[1] = T, cu[2] = 0, cu[3] = 100;
    *b = (dsv4_batch){.n_rows = T, .n_seqs = 1, .token = a, .pos = a + T, .slot = a + 2 * T, .seq_idx = a + 3 * T,
                      .cu_seqlens = cu, .seq_slot = cu + 2, .seq_pos0 = cu + 3};
}

static int small_ops(double tol) {
    sm_ctx S = {.tol = tol}, *s = &S;
    s->be[1] = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &s->e);
    s->be[0] = s->be[1] ? dsv4_backend_cuda_create(DSV4_NUMERICS_REFERENCE, 0, &s->e) : NULL;
    if (!s->be[0]) {
        printf("small ops: %s\n", s->e.msg);
        if (s->be[1]) s->be[1]->free(s->be[1]);
        return 2;
    }
    enum { NHC = 4, D = 4096, N = NHC * D, NM = NHC * (2 + NHC), E = 256, K = 6, V = 1000, DG = 128 };
    static const int Ts[] = {1, 6, 48, 1300, 4096}; /* 1300: the large-T hc kernels with partial blocks */
    printf("== small ops at real shapes, CUDA vs CPU (tol %.1e), then CUDA wall time per call\n", tol);
    /* weights shared by all row counts */
    float *fn = malloc((size_t)NM * N * 4), *hfn = malloc((size_t)NHC * N * 4), base[NM], hbase[NHC], sc[3];
    int64_t *t2e = malloc((size_t)V * K * 8);
    uint16_t *gate = malloc((size_t)E * DG * 2);
    float bias[E], nw[D];
    const float fs = 1.0f / sqrtf((float)N);
    for (size_t i = 0; i < (size_t)NM * N; i++) fn[i] = frnd() * fs;
    for (size_t i = 0; i < (size_t)NHC * N; i++) hfn[i] = frnd() * fs;
    for (int i = 0; i < NM; i++) base[i] = frnd();
    for (int i = 0; i < NHC; i++) hbase[i] = frnd();
    for (int i = 0; i < 3; i++) sc[i] = 1.0f + 0.25f * frnd();
    /* exact-in-fp32 router logits: gate and x are multiples of 1/16 in [-0.5, 0.5], d = 128 */
    for (int i = 0; i < E * DG; i++) {
        float g = (float)((int)(rb() % 17) - 8) / 16.0f;
        uint32_t u;
        memcpy(&u, &g, 4);
        gate[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < E; i++) bias[i] = (float)((int)(rb() % 9) - 4) / 16.0f;
    for (int v = 0; v < V; v++) /* distinct experts per token */
        for (int j = 0; j < K; j++) t2e[v * K + j] = (v * 37 + j * 41) % E;
    for (int i = 0; i < D; i++) nw[i] = 1.0f + 0.1f * frnd();
    dsv4_tview vfn[2], vbase[2], vsc[2], vhsc[2], vhfn[2], vhbase[2], vbias[2], vt2e[2], vnw[2];
    dsv4_linear lgate[2];
    SMCK(sm_view(s, DSV4_DT_F32, NM, N, fn, vfn) || sm_view(s, DSV4_DT_F32, 1, NM, base, vbase) ||
         sm_view(s, DSV4_DT_F32, 1, 3, sc, vsc) || sm_view(s, DSV4_DT_F32, 1, 1, sc, vhsc) || sm_view(s, DSV4_DT_F32, NHC, N, hfn, vhfn) ||
         sm_view(s, DSV4_DT_F32, 1, NHC, hbase, vhbase) || sm_view(s, DSV4_DT_F32, 1, E, bias, vbias) ||
         sm_view(s, DSV4_DT_I64, V, K, t2e, vt2e) || sm_view(s, DSV4_DT_F32, 1, D, nw, vnw));
    {
        dsv4_linear hg = {.out = E, .in = DG};
        hg.w = (dsv4_tview){.dtype = DSV4_DT_BF16, .ndim = 2, .shape = {E, DG}, .data = gate, .nbytes = (size_t)E * DG * 2};
        for (int i = 0; i < 2; i++) {
            if (s->be[i]->upload_linear) SMCK(s->be[i]->upload_linear(s->be[i], &hg, &lgate[i], &s->e));
            else {
                lgate[i] = hg;
                SMCK(s->be[i]->upload(s->be[i], &hg.w, &lgate[i].w, &s->e));
            }
        }
    }
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int T = Ts[ti], reps = T >= 1024 ? 5 : 50;
        int32_t *ba = malloc((size_t)(4 * T + 4) * 4);
        float *hx = malloc((size_t)T * N * 4), *hr = malloc((size_t)T * DG * 4);
        for (size_t i = 0; i < (size_t)T * N; i++) hx[i] = 2.0f * frnd();
        for (size_t i = 0; i < (size_t)T * DG; i++) hr[i] = (float)((int)(rb() % 17) - 8) / 16.0f;
        dsv4_batch b;
        sm_batch(T, V, &b, ba);
        dsv4_buf X[2], y[2], post[2], comb[2], xr[2], ids[2], w[2], xn[2], yn[2];
        SMCK(s->be[0]->batch_begin(s->be[0], &b, &s->e) || s->be[1]->batch_begin(s->be[1], &b, &s->e));
        SMCK(sm_pair(s, DSV4_DT_F32, T, N, hx, X) || sm_pair(s, DSV4_DT_F32, T, D, NULL, y) ||
             sm_pair(s, DSV4_DT_F32, T, NHC, NULL, post) || sm_pair(s, DSV4_DT_F32, T, NHC * NHC, NULL, comb) ||
             sm_pair(s, DSV4_DT_F32, T, DG, hr, xr) || sm_pair(s, DSV4_DT_I32, T, K, NULL, ids) ||
             sm_pair(s, DSV4_DT_F32, T, K, NULL, w) || sm_pair(s, DSV4_DT_F32, T, D, hx, xn) ||
             sm_pair(s, DSV4_DT_F32, T, D, NULL, yn));
        for (int i = 0; i < 2; i++)
            SMCK(s->be[i]->hc_pre(s->be[i], &X[i], &vfn[i], &vbase[i], &vsc[i], NHC, 20, 1e-6f, &y[i], &post[i],
                                  &comb[i], &s->e));
        sm_check(s, "hc_pre y (n_hc 4, d 4096)", T, y);
        sm_check(s, "hc_pre post", T, post);
        sm_check(s, "hc_pre comb", T, comb);
        /* k_hc_part_lr (2 rows a thread, the default at nm 24) / k_hc_fin with batched loads vs DSV4_CUDA_HC_PF=0 (the old
         * kernels), DSV4_CUDA_HC_ROWS=1 (k_hc_part_lp) and DSV4_CUDA_HC_ROWS=4: bit for bit */
        static const char *hv[3][2] = {{"DSV4_CUDA_HC_PF", "0"}, {"DSV4_CUDA_HC_ROWS", "1"}, {"DSV4_CUDA_HC_ROWS", "4"}};
        for (int vi = 0; T >= 1024 && vi < 3; vi++) {
            dsv4_buf *ob[3] = {&y[0], &post[0], &comb[0]};
            size_t no[3], tot = 0, nd = 0;
            for (int i = 0; i < 3; i++) tot += no[i] = (size_t)(ob[i]->rows * ob[i]->cols);
            float *h = malloc(2 * tot * 4);
            int bad = !h;
            for (int v = 0; v < 2 && !bad; v++) {
                if (v) {
                    setenv(hv[vi][0], hv[vi][1], 1);
                    bad = s->be[0]->hc_pre(s->be[0], &X[0], &vfn[0], &vbase[0], &vsc[0], NHC, 20, 1e-6f, &y[0],
                                           &post[0], &comb[0], &s->e);
                    unsetenv(hv[vi][0]);
                }
                for (int i = 0, off = 0; i < 3 && !bad; off += (int)no[i], i++)
                    bad = s->be[0]->buf_read(s->be[0], ob[i], h + v * tot + off, &s->e);
            }
            for (size_t i = 0; !bad && i < tot; i++) nd += memcmp(&h[i], &h[tot + i], 4) != 0;
            printf("%-34s T=%-5d %zu of %zu floats differ (%s=%s vs default): %s\n", "hc_pre bit-exact", T, nd, tot,
                   hv[vi][0], hv[vi][1], bad ? "ERROR" : nd ? "FAIL" : "ok");
            s->err += bad;
            s->bad += nd != 0;
            free(h);
        }
        SMTIME("hc_pre", T, reps, s->be[0]->hc_pre(s->be[0], &X[0], &vfn[0], &vbase[0], &vsc[0], NHC, 20, 1e-6f, &y[0],
                                                   &post[0], &comb[0], &s->e));
        for (int i = 0; i < 2; i++)
            SMCK(s->be[i]->hc_head(s->be[i], &X[i], &vhfn[i], &vhbase[i], &vhsc[i], NHC, 1e-6f, &y[i], &s->e));
        sm_check(s, "hc_head y", T, y);
        SMTIME("hc_head", T, reps, s->be[0]->hc_head(s->be[0], &X[0], &vhfn[0], &vhbase[0], &vhsc[0], NHC, 1e-6f,
                                                     &y[0], &s->e));
        for (int i = 0; i < 2; i++)
            SMCK(s->be[i]->moe_route(s->be[i], &xr[i], &lgate[i], &vbias[i], NULL, K, 1.5f, &b, &ids[i], &w[i],
                                     &s->e));
        sm_check_ids(s, "moe_route ids (256 top-6, bias)", T, ids);
        sm_check(s, "moe_route weights", T, w);
        SMTIME("moe_route (bias)", T, reps, s->be[0]->moe_route(s->be[0], &xr[0], &lgate[0], &vbias[0], NULL, K, 1.5f,
                                                                &b, &ids[0], &w[0], &s->e));
        for (int i = 0; i < 2; i++)
            SMCK(s->be[i]->moe_route(s->be[i], &xr[i], &lgate[i], NULL, &vt2e[i], K, 1.5f, &b, &ids[i], &w[i],
                                     &s->e));
        SMCK(s->be[0]->sync(s->be[0], &s->e));
        sm_check_ids(s, "moe_route ids (hash)", T, ids);
        sm_check(s, "moe_route weights (hash)", T, w);
        SMTIME("moe_route (hash)", T, reps, s->be[0]->moe_route(s->be[0], &xr[0], &lgate[0], NULL, &vt2e[0], K, 1.5f,
                                                                &b, &ids[0], &w[0], &s->e));
        /* hc_post on this X with random post / comb, then rope (32 heads of 512, 1 head), rope_dim 64 */
        {
            float *hp = malloc((size_t)T * NHC * NHC * 4), *hf = malloc((size_t)T * D * 4);
            for (size_t i = 0; i < (size_t)T * NHC * NHC; i++) hp[i] = 0.5f + 0.5f * frnd();
            for (size_t i = 0; i < (size_t)T * D; i++) hf[i] = frnd();
            dsv4_buf pc[2], pp[2], fb[2], xo[2];
            SMCK(sm_pair(s, DSV4_DT_F32, T, NHC * NHC, hp, pc) || sm_pair(s, DSV4_DT_F32, T, NHC, hp, pp) ||
                 sm_pair(s, DSV4_DT_F32, T, D, hf, fb) || sm_pair(s, DSV4_DT_F32, T, N, NULL, xo));
            for (int i = 0; i < 2; i++)
                SMCK(s->be[i]->hc_post(s->be[i], &X[i], &fb[i], &pp[i], &pc[i], NHC, &xo[i], &s->e));
            sm_check(s, "hc_post", T, xo);
            SMTIME("hc_post", T, reps, s->be[0]->hc_post(s->be[0], &X[0], &fb[0], &pp[0], &pc[0], NHC, &xo[0], &s->e));
            /* hc_post_pre_norm (hc_post folded into the next mixes' launch below 16 rows): against the CPU's
             * composition by normalised error, and bit for bit against CUDA's hc_post (xo above) + hc_pre_norm */
            if (s->be[0]->hc_post_pre_norm) {
                dsv4_buf xo2[2], y2[2], p2[2], c2[2], y3[2], p3[2], c3[2];
                SMCK(sm_pair(s, DSV4_DT_F32, T, N, NULL, xo2) || sm_pair(s, DSV4_DT_F32, T, D, NULL, y2) ||
                     sm_pair(s, DSV4_DT_F32, T, NHC, NULL, p2) || sm_pair(s, DSV4_DT_F32, T, NHC * NHC, NULL, c2) ||
                     sm_pair(s, DSV4_DT_F32, T, D, NULL, y3) || sm_pair(s, DSV4_DT_F32, T, NHC, NULL, p3) ||
                     sm_pair(s, DSV4_DT_F32, T, NHC * NHC, NULL, c3));
                for (int i = 0; i < 2; i++) {
                    dsv4_backend *bi = s->be[i];
                    if (bi->hc_post_pre_norm)
                        SMCK(bi->hc_post_pre_norm(bi, &X[i], &fb[i], &pp[i], &pc[i], NHC, &xo2[i], &vfn[i], &vbase[i],
                                                  &vsc[i], 20, 1e-6f, &vnw[i], 1e-6f, &y2[i], &p2[i], &c2[i], &s->e));
                    else
                        SMCK(bi->hc_post(bi, &X[i], &fb[i], &pp[i], &pc[i], NHC, &xo2[i], &s->e) ||
                             bi->hc_pre(bi, &xo2[i], &vfn[i], &vbase[i], &vsc[i], NHC, 20, 1e-6f, &y2[i], &p2[i],
                                        &c2[i], &s->e) ||
                             bi->rmsnorm(bi, &y2[i], &vnw[i], D, 1e-6f, &y2[i], &s->e));
                }
                sm_check(s, "hc_post_pre_norm Xout", T, xo2);
                sm_check(s, "hc_post_pre_norm y", T, y2);
                sm_check(s, "hc_post_pre_norm post", T, p2);
                sm_check(s, "hc_post_pre_norm comb", T, c2);
                SMCK(s->be[0]->hc_pre_norm(s->be[0], &xo[0], &vfn[0], &vbase[0], &vsc[0], NHC, 20, 1e-6f, &vnw[0],
                                           1e-6f, &y3[0], &p3[0], &c3[0], &s->e));
                sm_same_bits(s, "hc_post_pre_norm Xout (exact)", T, &xo2[0], &xo[0]);
                sm_same_bits(s, "hc_post_pre_norm y (exact)", T, &y2[0], &y3[0]);
                sm_same_bits(s, "hc_post_pre_norm post (exact)", T, &p2[0], &p3[0]);
                sm_same_bits(s, "hc_post_pre_norm comb (exact)", T, &c2[0], &c3[0]);
                SMTIME("hc_post_pre_norm", T, reps,
                       s->be[0]->hc_post_pre_norm(s->be[0], &X[0], &fb[0], &pp[0], &pc[0], NHC, &xo2[0], &vfn[0],
                                                  &vbase[0], &vsc[0], 20, 1e-6f, &vnw[0], 1e-6f, &y2[0], &p2[0],
                                                  &c2[0], &s->e));
                SMTIME("hc_post + hc_pre_norm", T, reps,
                       s->be[0]->hc_post(s->be[0], &X[0], &fb[0], &pp[0], &pc[0], NHC, &xo[0], &s->e) ||
                           s->be[0]->hc_pre_norm(s->be[0], &xo[0], &vfn[0], &vbase[0], &vsc[0], NHC, 20, 1e-6f,
                                                 &vnw[0], 1e-6f, &y3[0], &p3[0], &c3[0], &s->e));
                dsv4_buf *fz[] = {xo2, y2, p2, c2, y3, p3, c3};
                for (size_t i = 0; i < sizeof fz / sizeof fz[0]; i++) sm_free(s, fz[i]);
            }
            dsv4_rope rp;
            SMCK(dsv4_rope_init(&rp, 64, 10000.0, 0, 0, 0, 0, &s->e));
            static const int nhs[] = {32, 1}; /* 32 x 512 = the columns of hx */
            for (int hi = 0; hi < 2; hi++) {
                dsv4_buf q[2];
                SMCK(sm_pair(s, DSV4_DT_F32, T, (int64_t)nhs[hi] * 512, hx, q));
                for (int i = 0; i < 2; i++) SMCK(s->be[i]->rope(s->be[i], &q[i], 512, &rp, &b, hi, &s->e));
                sm_check(s, hi ? "rope (1 head, inverse)" : "rope (32 heads of 512)", T, q);
                SMTIME(hi ? "rope (1 head)" : "rope (32 heads)", T, reps,
                       s->be[0]->rope(s->be[0], &q[0], 512, &rp, &b, hi, &s->e));
                sm_free(s, q);
            }
            sm_free(s, pc);
            sm_free(s, pp);
            sm_free(s, fb);
            sm_free(s, xo);
            free(hp);
            free(hf);
        }
        /* linear_swiglu_add (the shared expert's w2, FP8 4096 x 2048, added into the routed output; u reaches
         * the ±10 clamp): against the CPU's swiglu, linear, add, and bit for bit against CUDA's three ops */
        if (s->be[0]->linear_swiglu_add) {
            enum { SF = 2048 };
            dsv4_linear hw2 = host_lin(DSV4_DT_F8_E4M3, D, SF), lw2[2];
            for (int i = 0; i < 2; i++) {
                if (s->be[i]->upload_linear) {
                    SMCK(s->be[i]->upload_linear(s->be[i], &hw2, &lw2[i], &s->e));
                } else {
                    lw2[i] = hw2;
                    SMCK(s->be[i]->upload(s->be[i], &hw2.w, &lw2[i].w, &s->e) ||
                         s->be[i]->upload(s->be[i], &hw2.scale, &lw2[i].scale, &s->e));
                }
            }
            float *hg = malloc((size_t)T * SF * 4), *hu = malloc((size_t)T * SF * 4), *hy = malloc((size_t)T * D * 4);
            SMCK(!hg || !hu || !hy);
            for (size_t i = 0; i < (size_t)T * SF; i++) hg[i] = 4 * frnd(), hu[i] = 20 * frnd();
            for (size_t i = 0; i < (size_t)T * D; i++) hy[i] = frnd();
            dsv4_buf gb[2], ub[2], yb2[2], yb3[2], hb[2], tb[2];
            SMCK(sm_pair(s, DSV4_DT_F32, T, SF, hg, gb) || sm_pair(s, DSV4_DT_F32, T, SF, hu, ub) ||
                 sm_pair(s, DSV4_DT_F32, T, D, hy, yb2) || sm_pair(s, DSV4_DT_F32, T, D, hy, yb3) ||
                 sm_pair(s, DSV4_DT_F32, T, SF, NULL, hb) || sm_pair(s, DSV4_DT_F32, T, D, NULL, tb));
            SMCK(s->be[0]->linear_swiglu_add(s->be[0], &gb[0], &ub[0], 10.0f, &lw2[0], &yb2[0], &s->e));
            for (int i = 0; i < 2; i++) { /* the three ops: CPU into yb2[1], CUDA into yb3[0] */
                dsv4_backend *bi = s->be[i];
                dsv4_buf *yo = i ? &yb2[1] : &yb3[0];
                SMCK(bi->swiglu(bi, &gb[i], &ub[i], 10.0f, &hb[i], &s->e) ||
                     bi->linear(bi, &hb[i], &lw2[i], &tb[i], &s->e) || bi->add(bi, yo, &tb[i], yo, &s->e));
            }
            sm_check(s, "linear_swiglu_add (shared w2)", T, yb2);
            sm_same_bits(s, "linear_swiglu_add (exact)", T, &yb2[0], &yb3[0]);
            SMTIME("linear_swiglu_add", T, reps,
                   s->be[0]->linear_swiglu_add(s->be[0], &gb[0], &ub[0], 10.0f, &lw2[0], &yb2[0], &s->e));
            SMTIME("swiglu + linear + add", T, reps,
                   s->be[0]->swiglu(s->be[0], &gb[0], &ub[0], 10.0f, &hb[0], &s->e) ||
                       s->be[0]->linear(s->be[0], &hb[0], &lw2[0], &tb[0], &s->e) ||
                       s->be[0]->add(s->be[0], &yb3[0], &tb[0], &yb3[0], &s->e));
            dsv4_buf *fz[] = {gb, ub, yb2, yb3, hb, tb};
            for (size_t i = 0; i < sizeof fz / sizeof fz[0]; i++) sm_free(s, fz[i]);
            free(hg);
            free(hu);
            free(hy);
            free_host_lin(&hw2);
        }
        static const int groups[] = {4096, 1024, 512, 64};
        for (int gi = 0; gi < 4; gi++) {
            for (int i = 0; i < 2; i++)
                SMCK(s->be[i]->rmsnorm(s->be[i], &xn[i], groups[gi] == 4096 ? &vnw[i] : NULL, groups[gi], 1e-6f,
                                       &yn[i], &s->e));
            char lab[64];
            snprintf(lab, sizeof lab, "rmsnorm group %d%s", groups[gi], groups[gi] == 4096 ? " (weight)" : "");
            sm_check(s, lab, T, yn);
            SMTIME(lab, T, reps, s->be[0]->rmsnorm(s->be[0], &xn[0], groups[gi] == 4096 ? &vnw[0] : NULL, groups[gi],
                                                   1e-6f, &yn[0], &s->e));
        }
        /* qat_fp8 on 8 heads of 512 (in place: copy x first) */
        for (int i = 0; i < 2; i++) SMCK(s->be[i]->buf_write(s->be[i], &yn[i], hx, &s->e));
        for (int i = 0; i < 2; i++) SMCK(s->be[i]->qat_fp8(s->be[i], &yn[i], 512, 448, 64, &s->e));
        sm_check(s, "qat_fp8 (512, 448, 64)", T, yn);
        SMTIME("qat_fp8", T, reps, s->be[0]->qat_fp8(s->be[0], &yn[0], 512, 448, 64, &s->e));
        dsv4_buf *all[] = {X, y, post, comb, xr, ids, w, xn, yn};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sm_free(s, all[i]);
        free(ba);
        free(hx);
        free(hr);
    }
    /* MoE grouping (k_route_group) through moe_experts: 256 small experts, skewed ids */
    {
        enum { ED = 256, EF = 256 };
        dsv4_linear *hw = calloc(3 * E, sizeof *hw), *dw = calloc(3 * E, sizeof *dw);
        for (int x = 0; x < 3 * E; x++) {
            hw[x] = x < 2 * E ? host_lin(DSV4_DT_I8, EF, ED) : host_lin(DSV4_DT_I8, ED, EF);
            SMCK(s->be[0]->upload_linear(s->be[0], &hw[x], &dw[x], &s->e));
        }
        SMCK(s->be[0]->experts_ready(s->be[0], dw, dw + E, dw + 2 * E, E, &s->e)); /* as a model load does */
        static const int Tm[] = {6, 48, 1365, 4096};
        for (int ti = 0; ti < 4; ti++) {
            const int T = Tm[ti];
            float *hx = malloc((size_t)T * ED * 4), *hwt = malloc((size_t)T * K * 4);
            int32_t *hid = malloc((size_t)T * K * 4);
            for (size_t i = 0; i < (size_t)T * ED; i++) hx[i] = frnd();
            for (int t = 0; t < T; t++) {
                /* expert 3 for most rows (long runs of one expert), distinct ids per row */
                for (int j = 0; j < K; j++) {
                    hid[t * K + j] = j == 0 && t % 4 ? 3 : (int32_t)((t * 13 + j * 43 + 7) % E);
                    for (int jj = 0; jj < j; jj++)
                        if (hid[t * K + jj] == hid[t * K + j]) hid[t * K + j] = (hid[t * K + j] + 1) % E, jj = -1;
                    hwt[t * K + j] = 0.1f + 0.05f * j;
                }
            }
            dsv4_buf x[2], ids[2], w[2], y[2];
            SMCK(sm_pair(s, DSV4_DT_F32, T, ED, hx, x) || sm_pair(s, DSV4_DT_I32, T, K, hid, ids) ||
                 sm_pair(s, DSV4_DT_F32, T, K, hwt, w) || sm_pair(s, DSV4_DT_F32, T, ED, NULL, y));
            SMCK(s->be[0]->moe_experts(s->be[0], &x[0], dw, dw + E, dw + 2 * E, E, &ids[0], &w[0], 10.0f, &y[0], &s->e));
            SMCK(s->be[1]->moe_experts(s->be[1], &x[1], hw, hw + E, hw + 2 * E, E, &ids[1], &w[1], 10.0f, &y[1], &s->e));
            sm_check(s, "moe_experts (256 experts, grouping)", T, y);
            SMTIME("moe_experts 256x(256,256)", T, T >= 1365 ? 5 : 20,
                   s->be[0]->moe_experts(s->be[0], &x[0], dw, dw + E, dw + 2 * E, E, &ids[0], &w[0], 10.0f, &y[0],
                                         &s->e));
            sm_free(s, x);
            sm_free(s, ids);
            sm_free(s, w);
            sm_free(s, y);
            free(hx);
            free(hwt);
            free(hid);
        }
        for (int x = 0; x < 3 * E; x++) free_host_lin(&hw[x]);
        free(hw);
        free(dw);
    }
out:
    printf("small ops: %d outputs above tolerance, %d errors\n\n", s->bad, s->err);
    free(fn);
    free(hfn);
    free(t2e);
    free(gate);
    s->be[0]->free(s->be[0]);
    s->be[1]->free(s->be[1]);
    return s->err ? -1 : s->bad;
}

int main(int argc, char **argv) {
    double tol = 2e-2;
    int rows[8], nrows = 0, do_perf = 1, attn_perf = 0, rows_only = 0, do_rows = 1, small = 1, layouts_only = 0;
    int att_exact = 0;
    double rows_tol = 1e-4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tol") && i + 1 < argc) tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--flash-rows") && i + 1 < argc && nrows < 8) rows[nrows++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-perf")) do_perf = 0;
        else if (!strcmp(argv[i], "--attn-perf")) attn_perf = 1;
        else if (!strcmp(argv[i], "--rows-only")) rows_only = 1;
        else if (!strcmp(argv[i], "--no-rows")) do_rows = 0;
        else if (!strcmp(argv[i], "--rows-tol") && i + 1 < argc) rows_tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--small-only")) small = 2;
        else if (!strcmp(argv[i], "--layouts-only")) layouts_only = 1; /* only the attention-state layouts */
        else if (!strcmp(argv[i], "--no-small")) small = 0;
        else if (!strcmp(argv[i], "--att-exact")) att_exact = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--tol X] [--flash-rows N]... [--no-perf] [--attn-perf] [--rows-only | --no-rows] "
                    "[--rows-tol X] [--small-only | --no-small] [--layouts-only] [--att-exact]\n",
                    argv[0]);
            return 2;
        }
    }
    if (att_exact) { /* only the staged vs direct coded attention: a prefill chunk from position 0 (rows with
                      * few candidates), one at 3072, a batch of 64 decode rows and 8 x 8 verify rows (the
                      * tensor-core paths), 8 x 6 (the SIMT kernels, shared by both) */
        int e2 = 0, d2 = 0;
        static const int C[][3] = {{512, 1, 512}, {4096, 1, 1024}, {4096, 64, 1}, {8192, 8, 8}, {4096, 8, 6}};
        for (int kv = DSV4_KV_BF16; kv <= DSV4_KV_FP8_DS_MLA; kv++)
            for (int n = 0; n < 2; n++)
                for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
                    int f2 = attn_state_run(C[i][0], C[i][1], C[i][2], (dsv4_kv_dtype)kv,
                                            n ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE, 1);
                    d2 += f2 == 1, e2 += f2 > 1;
                }
        /* the small-row pv (PDL, early loads, last-block split sum) against the plain launch + k_att_reduce:
         * decode batch 1 / 2 / 8, verify 1 x 6 and 8 x 6 (no split: 48 rows fill the GPU), every key format */
        static const int D[][3] = {{4096, 1, 1}, {100, 1, 1}, {4096, 2, 1}, {4096, 8, 1}, {4096, 1, 6}, {4096, 8, 6}};
        for (int kv = 0; kv < DSV4_KV_COUNT; kv++)
            for (int n = 0; n < 2; n++)
                for (size_t i = 0; i < sizeof D / sizeof D[0]; i++) {
                    int f2 = attn_state_run(D[i][0], D[i][1], D[i][2], (dsv4_kv_dtype)kv,
                                            n ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE, 2);
                    d2 += f2 == 1, e2 += f2 > 1;
                }
        /* the tensor-core pv reading k_att_softmax's probabilities against the pv deriving them per slice
         * (DSV4_CUDA_ATT_PSM=0), every key format; staged score blocks of 128 candidates against 64
         * (DSV4_CUDA_ATT_SC128=0), coded formats: the prefill / decode-64 / verify cases above */
        for (int x = 3; x <= 5; x++) /* 5: bf16 probabilities (DSV4_CUDA_ATT_PBF=0 vs 1), every key format */
            for (int kv = x == 4 ? DSV4_KV_BF16 : 0; kv < DSV4_KV_COUNT; kv++)
                for (int n = 0; n < 2; n++)
                    for (size_t i = 0; i < 4; i++) {
                        int f2 = attn_state_run(C[i][0], C[i][1], C[i][2], (dsv4_kv_dtype)kv,
                                                n ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE, x);
                        d2 += f2 == 1, e2 += f2 > 1;
                    }
        /* shape-static launches (graphs, sized by the state's capacity: 8x the context here) against
         * position-sized ones: decode 1 / 8, verify 1 x 6 and 4 x 6 (small-row kernels), 16 x 6 and
         * 64 x 1 (tensor-core kernels), every key format, both numerics */
        static const int G[][3] = {{4096, 1, 1}, {4096, 8, 1}, {4096, 1, 6}, {4096, 4, 6}, {4096, 16, 6}, {2048, 64, 1}};
        for (int kv = 0; kv < DSV4_KV_COUNT; kv++)
            for (int n = 0; n < 2; n++)
                for (size_t i = 0; i < sizeof G / sizeof G[0]; i++) {
                    int f2 = attn_state_run(G[i][0], G[i][1], G[i][2], (dsv4_kv_dtype)kv,
                                            n ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE, 6);
                    d2 += f2 == 1, e2 += f2 > 1;
                }
        printf("att-exact summary: %d runs differ, %d runs with errors\n", d2, e2);
        return e2 ? 2 : d2 ? 1 : 0;
    }
    if (attn_perf) { /* only the attention-state timings of one request (decode, verify, prefill) */
        int e2 = 0;
        for (int kv = 0; kv < DSV4_KV_COUNT; kv++) { /* f32, bf16, fp8_ds_mla key rows */
            e2 += perf_attn(4096, 1, 1, (dsv4_kv_dtype)kv) != 0;
            e2 += perf_attn(32768, 1, 1, (dsv4_kv_dtype)kv) != 0;
            e2 += perf_attn(32768, 64, 1, (dsv4_kv_dtype)kv) != 0;
            e2 += perf_attn(4096, 8, 6, (dsv4_kv_dtype)kv) != 0;
            e2 += perf_attn(4096, 1, 4096, (dsv4_kv_dtype)kv) != 0;
        }
        return e2 ? 2 : 0;
    }
    if (!nrows) rows[nrows++] = 4;
    int bad = 0, err = 0, f;
    if (layouts_only) do_rows = 0, small = 0, do_perf = 0;
    if (do_rows && small != 2) {
        f = rows_cases(rows_tol);
        bad += f > 0, err += f < 0;
    }
    if (rows_only) {
        printf("summary: %d runs with outputs above tolerance, %d runs with errors\n", bad, err);
        return err ? 2 : bad ? 1 : 0;
    }
    if (small) {
        f = small_ops(tol);
        bad += f > 0, err += f < 0;
        if (small == 2) {
            printf("summary: %d runs with outputs above tolerance, %d runs with errors\n", bad, err);
            return err ? 2 : bad ? 1 : 0;
        }
    }
    dsv4_conf_shape s;
    dsv4_conf_shape_tiny(&s);
    if (!layouts_only) {
        f = run("tiny", &s, DSV4_NUMERICS_REFERENCE, tol, 0);
        bad += f > 0, err += f < 0;
        f = run("tiny", &s, DSV4_NUMERICS_HF, tol, 0);
        bad += f > 0, err += f < 0;
    }
    for (int i = 0; !layouts_only && i < nrows; i++) {
        dsv4_conf_shape_flash(&s, rows[i]);
        f = run("flash", &s, DSV4_NUMERICS_REFERENCE, tol, 0);
        bad += f > 0, err += f < 0;
    }
    /* the attention-state layouts: paged CUDA side vs unpaged CPU, verify-shaped segments, long chunks
     * (longer than the rings, crossing compressor windows), ratio 128 */
    static const layout L[] = {
        {"tiny, verify 4x6, paged", 0, 24, 6, 300, 0, 1},
        {"tiny, long chunks 2x150", 0, 300, 0, 0, 0, 0},
        {"tiny, long chunks 2x150, ratio 128, paged", 0, 300, 0, 0, 128, 1},
        {"flash, verify 8x6, paged", 1, 48, 6, 3000, 0, 1},
        {"flash, long chunks 2x160 (ring 132)", 1, 320, 160, 2000, 0, 0},
        {"flash, verify 4x6, ratio 128, paged", 1, 24, 6, 20000, 128, 1},
        {"flash, decode 16x1, paged", 1, 16, 1, 9000, 0, 1},
        /* few rows at context ~4K (the split-key indexer / attention paths: decode, one verify
         * request) and a prefill chunk (the many-row paths: tensor-core attention) */
        {"flash, decode 2x1 at 4095, paged", 1, 2, 1, 4095, 0, 1}, /* the harness takes >= 2 rows */
        {"flash, verify 1x6 at 4090", 1, 6, 6, 4090, 0, 0},
        {"flash, prefill chunk 1x512 at 3000", 1, 512, 512, 3000, 0, 0},
        /* a prefill-sized indexer chunk (2048 rows seeing 1500..2011 keys: the tensor-core scores) */
        {"flash, prefill chunk 1x2048 at 6000", 1, 2048, 2048, 6000, 0, 0},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        layout_shape(&L[i], &s);
        f = run(L[i].title, &s, DSV4_NUMERICS_REFERENCE, tol, 0);
        bad += f > 0, err += f < 0;
    }
    /* --kv-cache-dtype bf16 / fp8_ds_mla: window and main compressed rows stored as records on both
     * sides (src/model/kvcodec.h; the CPU codec is the reference), on the layouts that take each
     * kernel path: tiny, paged verify, paged decode, ratio 128, verify at 4K, a tensor-core prefill chunk */
    static const int KL[] = {0, 2, 5, 6, 8, 9};
    for (int kv = DSV4_KV_BF16; kv <= DSV4_KV_FP8_DS_MLA; kv++)
        for (size_t k = 0; k < sizeof KL / sizeof KL[0]; k++) {
            const int i = KL[k];
            layout_shape(&L[i], &s);
            s.kv_dtype = kv;
            char title[160];
            snprintf(title, sizeof title, "%s, kv %s", L[i].title, dsv4_kv_dtype_name((dsv4_kv_dtype)kv));
            f = run(title, &s, DSV4_NUMERICS_REFERENCE, tol, 0);
            bad += f > 0, err += f < 0;
        }
    if (do_perf) {
        for (int kv = 0; kv < DSV4_KV_COUNT; kv++) { /* f32, bf16, fp8_ds_mla key rows */
            err += perf_attn(65536, 32, 1, (dsv4_kv_dtype)kv) != 0;
            err += perf_attn(65536, 8, 6, (dsv4_kv_dtype)kv) != 0;
            err += perf_attn(8192, 1, 1, (dsv4_kv_dtype)kv) != 0;
        }
        printf("(the same with the attention pv kernel built for 1 block / SM: DSV4_CUDA_ATT_PV_MINB=1)\n");
        setenv("DSV4_CUDA_ATT_PV_MINB", "1", 1);
        err += perf_attn(65536, 32, 1, DSV4_KV_F32) != 0;
        err += perf_attn(65536, 8, 6, DSV4_KV_F32) != 0;
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
