/*
 * dsv4-gpu-conformance — the backend conformance harness
 * (src/backend/conformance.h) with the CUDA backend as the test backend and
 * the CPU reference backend as the reference, at the tiny shapes and at the
 * real Flash shapes, then a short timing of the CUDA ops.
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
    printf("== %s (rows %d, d %d, heads %d x %d, experts %d top-%d, %s numerics, tol %.1e)\n", title, s->rows, s->d,
           s->n_heads, s->head_dim, s->n_exp, s->top_k, num == DSV4_NUMERICS_HF ? "HF" : "reference", tol);
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
    if (do_perf) {
        dsv4_conf_shape_flash(&s, rows[0]);
        f = run("flash, timed", &s, DSV4_NUMERICS_REFERENCE, tol, 1);
        err += f < 0;
        err += perf() != 0;
    }
    printf("summary: %d runs with outputs above tolerance, %d runs with errors\n", bad, err);
    return err ? 2 : bad ? 1 : 0;
}
