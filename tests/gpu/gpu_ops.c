/*
 * dsv4-gpu-ops — op test harness for the CUDA backend, in the spirit of
 * ggml's test-backend-ops: every implemented op runs on the GPU and against
 * a CPU reference (plain C, double accumulation, the same W8A8 quantisation
 * steps as spec/MODEL.md §2.4), at tiny shapes and at the real Flash shapes,
 * and prints the normalised error ‖gpu − ref‖ / ‖ref‖. With --perf it times
 * each op at the Flash shapes for 1..64 rows (CUDA-graph replay, weights
 * rotated over several copies so the 60 MB L2 cannot serve them) and prints
 * achieved GB/s next to the HBM read bandwidth measured in the same run
 * (spec/PERFORMANCE.md §1, §6).
 *
 * Needs a GPU: built only with DSV4_CUDA, never part of ctest.
 *   dsv4-gpu-ops                 correctness (tiny + Flash shapes)
 *   dsv4-gpu-ops --perf          correctness, then timings
 *   dsv4-gpu-ops --perf-only     timings only
 *   dsv4-gpu-ops --prefill       prefill sizes (n = 64..8192): GEMM vs decode kernels
 *   dsv4-gpu-ops --moe [--perf]  MoE only: FP16-mma expert kernels == FP8-mma form bit for bit (+ timings of both)
 *   dsv4-gpu-ops --moe-wg [--perf]  MoE only: the warpgroup-MMA grouped GEMM (DSV4_CUDA_MOE_WG=1/2, sm_90a
 *                                builds) vs k_moe_gemm and vs the reference (+ timings of all three)
 * Exit status 1 when any correctness case fails.
 *
 * The CPU reference lives here until the CPU backend (branch cpufwd)
 * publishes its ops; then the harness should call those instead.
 */
#define _POSIX_C_SOURCE 200809L /* setenv / unsetenv (set_paths) */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/dsv4_cuda.h"

static dsv4_cuda_ctx *G;
static int n_fail, n_pass;

#define DIE_IF(rc, err)                                                                      \
    do {                                                                                     \
        if (rc) {                                                                            \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, (err).msg);                   \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

/* ------------------------------------------------------------------- random */

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return rng_s * 2685821657736338717ull;
}
static double urand(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static float nrand(void) { /* ~N(0,1) from 4 uniforms */
    return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7320508);
}
static void fill_bytes(uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)rnd();
}

/* Activations with per-128-block magnitudes spread over 2^-4..2^4, so the
 * W8A8 block scales differ from block to block. */
static void fill_act(float *x, size_t n, int dim) {
    float m = 1.f;
    for (size_t i = 0; i < n; i++) {
        if (i % 128 == 0) m = ldexpf(1.f, (int)(rnd() % 9) - 4);
        x[i] = nrand() * m;
    }
    (void)dim;
}

/* --------------------------------------------------------- number formats */

static float e4m3_tab[256];
static const float fp4_tab[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

static void init_tables(void) {
    for (int b = 0; b < 256; b++) {
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        float v = e ? ldexpf(1.f + m / 8.f, e - 7) : ldexpf(m / 8.f, -6);
        if ((b & 0x7f) == 0x7f) v = NAN;
        e4m3_tab[b] = s ? -v : v;
    }
}
static double e8m0(uint8_t e) { return ldexp(1.0, (int)e - 127); }

/* Round to nearest E4M3 (ties to even code), saturating at ±448. */
static uint8_t e4m3_enc(float v) {
    uint8_t sign = v < 0 ? 0x80 : 0;
    float a = fabsf(v);
    if (a >= 448.f) return sign | 0x7e;
    int best = 0;
    float bd = a;
    for (int c = 1; c < 0x7f; c++) {
        float d = fabsf(e4m3_tab[c] - a);
        if (d < bd || (d == bd && (c & 1) == 0 && (best & 1))) {
            bd = d;
            best = c;
        }
        if (e4m3_tab[c] > a) break; /* table is increasing: past the value */
    }
    return sign | (uint8_t)best;
}

static float pow2_ceil_f(float r) {
    uint32_t b;
    memcpy(&b, &r, 4);
    uint32_t e = (b >> 23) & 0xff;
    if (b & 0x7fffff) e++;
    b = e << 23;
    float o;
    memcpy(&o, &b, 4);
    return o;
}

/* W8A8 activation quantiser, spec/MODEL.md §2.4 (amax/448 in fp32). */
static void ref_act_quant(const float *x, int n, int dim, uint8_t *q, float *s) {
    int nb = dim / 128;
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)r * dim + b * 128;
            float amax = 0;
            for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(xb[i]));
            amax = fmaxf(amax, 1e-4f);
            float sc = pow2_ceil_f(amax / 448.0f);
            s[(size_t)r * nb + b] = sc;
            for (int i = 0; i < 128; i++) q[(size_t)r * dim + b * 128 + i] = e4m3_enc(xb[i] / sc);
        }
}

static float bf16r(float v) { /* RNE to bf16 */
    uint32_t b;
    memcpy(&b, &v, 4);
    b += 0x7fff + ((b >> 16) & 1);
    b &= 0xffff0000u;
    float o;
    memcpy(&o, &b, 4);
    return o;
}

/* ------------------------------------------------------ reference linears */

typedef struct {
    dsv4_linear lin;
    uint8_t *w, *s;
} host_lin;

static void make_lin(host_lin *h, dsv4_dtype dt, int64_t out, int64_t in) {
    memset(h, 0, sizeof *h);
    dsv4_linear *l = &h->lin;
    l->out = out;
    l->in = in;
    l->w.dtype = dt;
    l->w.ndim = 2;
    l->w.shape[0] = out;
    if (dt == DSV4_DT_F8_E4M3) {
        l->w.shape[1] = in;
        l->w.nbytes = (size_t)(out * in);
        h->w = malloc(l->w.nbytes);
        fill_bytes(h->w, l->w.nbytes);
        for (size_t i = 0; i < l->w.nbytes; i++)
            if ((h->w[i] & 0x7f) == 0x7f) h->w[i] ^= 0x01; /* no NaN codes */
        l->scale.dtype = DSV4_DT_F8_E8M0;
        l->scale.ndim = 2;
        l->scale.shape[0] = (out + 127) / 128;
        l->scale.shape[1] = (in + 127) / 128;
        l->scale.nbytes = (size_t)(l->scale.shape[0] * l->scale.shape[1]);
        h->s = malloc(l->scale.nbytes);
        for (size_t i = 0; i < l->scale.nbytes; i++) h->s[i] = (uint8_t)(114 + rnd() % 10);
    } else if (dt == DSV4_DT_I8) {
        l->w.shape[1] = in / 2;
        l->w.nbytes = (size_t)(out * in / 2);
        h->w = malloc(l->w.nbytes);
        fill_bytes(h->w, l->w.nbytes);
        l->scale.dtype = DSV4_DT_F8_E8M0;
        l->scale.ndim = 2;
        l->scale.shape[0] = out;
        l->scale.shape[1] = in / 32;
        l->scale.nbytes = (size_t)(out * (in / 32));
        h->s = malloc(l->scale.nbytes);
        for (size_t i = 0; i < l->scale.nbytes; i++) h->s[i] = (uint8_t)(118 + rnd() % 8);
    } else { /* BF16 */
        l->w.shape[1] = in;
        l->w.nbytes = (size_t)(out * in * 2);
        h->w = malloc(l->w.nbytes);
        uint16_t *p = (uint16_t *)h->w;
        for (size_t i = 0; i < (size_t)(out * in); i++) {
            float v = nrand() * 0.05f;
            uint32_t b;
            memcpy(&b, &v, 4);
            p[i] = (uint16_t)(b >> 16);
        }
    }
    l->w.data = h->w;
    l->scale.data = h->s;
}
static void free_lin(host_lin *h) {
    free(h->w);
    free(h->s);
}

/* y[t, r] for FP8 / FP4 weights from quantised activations (double). */
static void ref_linear_q(const host_lin *h, const uint8_t *xq, const float *xs, int n, float *y) {
    const dsv4_linear *l = &h->lin;
    int64_t R = l->out, K = l->in, C = K / 128;
    for (int t = 0; t < n; t++) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t r = 0; r < R; r++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) {
                double part = 0;
                const uint8_t *xb = xq + (size_t)t * K + c * 128;
                if (l->w.dtype == DSV4_DT_F8_E4M3) {
                    const uint8_t *wb = h->w + r * K + c * 128;
                    for (int i = 0; i < 128; i++) part += (double)e4m3_tab[wb[i]] * e4m3_tab[xb[i]];
                    part *= e8m0(h->s[(r / 128) * C + c]);
                } else {
                    for (int gi = 0; gi < 4; gi++) {
                        double gp = 0;
                        const uint8_t *wb = h->w + r * (K / 2) + c * 64 + gi * 16;
                        for (int i = 0; i < 16; i++) {
                            gp += (double)fp4_tab[wb[i] & 15] * e4m3_tab[xb[gi * 32 + 2 * i]];
                            gp += (double)fp4_tab[wb[i] >> 4] * e4m3_tab[xb[gi * 32 + 2 * i + 1]];
                        }
                        part += gp * e8m0(h->s[r * (K / 32) + c * 4 + gi]);
                    }
                }
                acc += part * xs[(size_t)t * C + c];
            }
            y[(size_t)t * R + r] = (float)acc;
        }
    }
}

static void ref_linear(const host_lin *h, const float *x, int n, float *y) {
    const dsv4_linear *l = &h->lin;
    int64_t R = l->out, K = l->in;
    if (l->w.dtype == DSV4_DT_BF16) {
        const uint16_t *w = (const uint16_t *)h->w;
        for (int t = 0; t < n; t++) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
            for (int64_t r = 0; r < R; r++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    uint32_t b = (uint32_t)w[r * K + k] << 16;
                    float wf;
                    memcpy(&wf, &b, 4);
                    acc += (double)wf * x[(size_t)t * K + k];
                }
                y[(size_t)t * R + r] = (float)acc;
            }
        }
        return;
    }
    uint8_t *xq = malloc((size_t)n * K);
    float *xs = malloc((size_t)n * (K / 128) * sizeof(float));
    ref_act_quant(x, n, (int)K, xq, xs);
    ref_linear_q(h, xq, xs, n, y);
    free(xq);
    free(xs);
}

/* ---------------------------------------------------------------- compare */

static double nerr(const float *a, const float *ref, size_t n, double *maxabs, size_t *nonfinite) {
    double num = 0, den = 0, mx = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) nf++;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    *maxabs = mx;
    *nonfinite = nf;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void report(const char *op, const char *shape, const float *gpu, const float *ref, size_t n,
                   double tol) {
    double mx;
    size_t nf;
    double e = nerr(gpu, ref, n, &mx, &nf);
    int ok = nf == 0 && e <= tol;
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %-34s nerr %.3e  maxabs %.3e  (tol %.0e)%s\n", ok ? "ok" : "FAIL", op, shape, e,
           mx, tol, nf ? "  NON-FINITE" : "");
    fflush(stdout);
}

/* device helpers */
static void *dalloc(size_t b) {
    dsv4_err err = {0};
    void *p = NULL;
    DIE_IF(dsv4_cuda_alloc(G, b, &p, &err), err);
    return p;
}
static void *dup_up(const void *h, size_t b) {
    dsv4_err err = {0};
    void *p = dalloc(b);
    DIE_IF(dsv4_cuda_upload(G, p, h, b, &err), err);
    return p;
}
static void down(void *h, const void *d, size_t b) {
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_download(G, h, d, b, &err), err);
}
/* Fill device output with NaN first: every element must be written. */
static void poison(void *d, size_t b) {
    void *h = malloc(b);
    memset(h, 0xff, b);
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_upload(G, d, h, b, &err), err);
    free(h);
}

/* -------------------------------------------------------------- test cases */

static void t_act_quant(int n, int dim) {
    size_t ne = (size_t)n * dim, ns = (size_t)n * (dim / 128);
    float *x = malloc(ne * 4), *s = malloc(ns * 4), *sg = malloc(ns * 4);
    uint8_t *q = malloc(ne), *qg = malloc(ne);
    fill_act(x, ne, dim);
    ref_act_quant(x, n, dim, q, s);
    float *dx = dup_up(x, ne * 4), *ds = dalloc(ns * 4);
    uint8_t *dq = dalloc(ne);
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_act_quant(G, dx, n, dim, dq, ds, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(qg, dq, ne);
    down(sg, ds, ns * 4);
    size_t bad = 0;
    for (size_t i = 0; i < ne; i++) bad += q[i] != qg[i];
    for (size_t i = 0; i < ns; i++) bad += s[i] != sg[i];
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d", n, dim);
    int ok = bad == 0;
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %-34s %zu of %zu bytes/scales differ (exact match required)\n", ok ? "ok" : "FAIL",
           "act_quant", shape, bad, ne + ns);
    dsv4_cuda_free(G, dx);
    dsv4_cuda_free(G, ds);
    dsv4_cuda_free(G, dq);
    free(x); free(s); free(sg); free(q); free(qg);
}

static const char *dtname(dsv4_dtype d) {
    return d == DSV4_DT_F8_E4M3 ? "fp8" : d == DSV4_DT_I8 ? "fp4" : "bf16";
}

static void t_linear(const char *label, dsv4_dtype dt, int64_t R, int64_t K, int n, double tol) {
    host_lin h;
    make_lin(&h, dt, R, K);
    size_t nx = (size_t)n * K, ny = (size_t)n * R;
    float *x = malloc(nx * 4), *y = malloc(ny * 4), *yg = malloc(ny * 4);
    fill_act(x, nx, (int)K);
    if (dt == DSV4_DT_BF16)
        for (size_t i = 0; i < nx; i++) x[i] *= 0.25f;
    ref_linear(&h, x, n, y);
    dsv4_err err = {0};
    dsv4_cuda_weight w;
    DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, &w, &err), err);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(ny * 4);
    poison(dy, ny * 4);
    DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, 0, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(yg, dy, ny * 4);
    char op[32], shape[80];
    snprintf(op, sizeof op, "linear_%s", dtname(dt));
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", label, (long long)R, (long long)K, n);
    report(op, shape, yg, y, ny, tol);
    /* bf16 output flag: every value must be the bf16 rounding of the fp32 one */
    DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, DSV4_CUDA_OUT_BF16, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    float *yb = malloc(ny * 4);
    down(yb, dy, ny * 4);
    size_t bad = 0;
    for (size_t i = 0; i < ny; i++) bad += yb[i] != bf16r(yb[i]) || fabsf(yb[i] - yg[i]) > fabsf(yg[i]) * 0.0079f + 1e-30f;
    if (bad) {
        n_fail++;
        printf("FAIL  %-14s %-34s OUT_BF16: %zu values not the bf16 rounding\n", op, shape, bad);
    }
    free(yb);
    dsv4_cuda_weight_free(G, &w);
    dsv4_cuda_free(G, dx);
    dsv4_cuda_free(G, dy);
    free(x); free(y); free(yg);
    free_lin(&h);
}

static void t_rmsnorm(int n, int dim, int weighted) {
    size_t ne = (size_t)n * dim;
    float *x = malloc(ne * 4), *y = malloc(ne * 4), *yg = malloc(ne * 4);
    uint16_t *w = malloc((size_t)dim * 2);
    fill_act(x, ne, dim);
    for (int i = 0; i < dim; i++) {
        float v = 1.f + 0.3f * nrand();
        uint32_t b;
        memcpy(&b, &v, 4);
        w[i] = (uint16_t)(b >> 16);
    }
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[(size_t)r * dim + i] * x[(size_t)r * dim + i];
        double rs = 1.0 / sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; i++) {
            uint32_t b = (uint32_t)w[i] << 16;
            float wf;
            memcpy(&wf, &b, 4);
            y[(size_t)r * dim + i] = (float)(x[(size_t)r * dim + i] * rs * (weighted ? wf : 1.0));
        }
    }
    float *dx = dup_up(x, ne * 4), *dy = dalloc(ne * 4);
    uint16_t *dw = dup_up(w, (size_t)dim * 2);
    poison(dy, ne * 4);
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_rmsnorm(G, dx, weighted ? dw : NULL, n, dim, 1e-6f, dy, 0, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(yg, dy, ne * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d dim=%d %s", n, dim, weighted ? "weighted" : "unweighted");
    report("rmsnorm", shape, yg, y, ne, 1e-6);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, dw);
    free(x); free(y); free(yg); free(w);
}

/* ------------------------------------------------------------------- MoE */

typedef struct {
    int E;
    int64_t dm, dff;
    host_lin *w1, *w3, *w2;
    dsv4_cuda_experts dev;
} moe_set;

static void moe_make(moe_set *m, int E, int64_t dm, int64_t dff) {
    m->E = E;
    m->dm = dm;
    m->dff = dff;
    m->w1 = calloc(E, sizeof(host_lin));
    m->w3 = calloc(E, sizeof(host_lin));
    m->w2 = calloc(E, sizeof(host_lin));
    dsv4_linear *l1 = calloc(E, sizeof *l1), *l3 = calloc(E, sizeof *l3), *l2 = calloc(E, sizeof *l2);
    for (int e = 0; e < E; e++) {
        make_lin(&m->w1[e], DSV4_DT_I8, dff, dm);
        make_lin(&m->w3[e], DSV4_DT_I8, dff, dm);
        make_lin(&m->w2[e], DSV4_DT_I8, dm, dff);
        l1[e] = m->w1[e].lin;
        l3[e] = m->w3[e].lin;
        l2[e] = m->w2[e].lin;
    }
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_experts_upload(G, E, l1, l3, l2, &m->dev, &err), err);
    free(l1); free(l3); free(l2);
}
static void moe_free(moe_set *m) {
    for (int e = 0; e < m->E; e++) {
        free_lin(&m->w1[e]);
        free_lin(&m->w3[e]);
        free_lin(&m->w2[e]);
    }
    free(m->w1); free(m->w3); free(m->w2);
    dsv4_cuda_experts_free(G, &m->dev);
}

static void pick_ids(int *ids, float *wts, int n, int topk, int E) {
    for (int t = 0; t < n; t++) {
        double sum = 0;
        for (int k = 0; k < topk; k++) {
            int v, dup;
            do {
                v = (int)(rnd() % (uint64_t)E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * topk + j] == v;
            } while (dup);
            ids[t * topk + k] = v;
            wts[t * topk + k] = (float)(0.2 + urand());
            sum += wts[t * topk + k];
        }
        for (int k = 0; k < topk; k++) wts[t * topk + k] = (float)(wts[t * topk + k] / sum * 1.5);
    }
}

static float silu_f(float v) { return v / (1.f + expf(-v)); }

static void ref_moe(const moe_set *m, const float *x, int n, const int *ids, const float *wts,
                    int topk, const float *shared, float *y) {
    int64_t dm = m->dm, dff = m->dff;
    uint8_t *xq = malloc((size_t)dm), *hq = malloc((size_t)dff);
    float *xs = malloc((size_t)dm / 128 * 4), *hs = malloc((size_t)dff / 128 * 4);
    float *g = malloc((size_t)dff * 4), *u = malloc((size_t)dff * 4), *h = malloc((size_t)dff * 4);
    float *o = malloc((size_t)dm * 4);
    for (int t = 0; t < n; t++) {
        ref_act_quant(x + (size_t)t * dm, 1, (int)dm, xq, xs);
        double *acc = calloc((size_t)dm, sizeof(double));
        for (int k = 0; k < topk; k++) {
            int e = ids[t * topk + k];
            ref_linear_q(&m->w1[e], xq, xs, 1, g);
            ref_linear_q(&m->w3[e], xq, xs, 1, u);
            for (int64_t i = 0; i < dff; i++) {
                float gv = fminf(bf16r(g[i]), 10.f), uv = fminf(fmaxf(bf16r(u[i]), -10.f), 10.f);
                h[i] = bf16r(silu_f(gv) * uv * wts[t * topk + k]);
            }
            ref_act_quant(h, 1, (int)dff, hq, hs);
            ref_linear_q(&m->w2[e], hq, hs, 1, o);
            for (int64_t i = 0; i < dm; i++) acc[i] += bf16r(o[i]);
        }
        for (int64_t i = 0; i < dm; i++)
            y[(size_t)t * dm + i] = (float)(acc[i] + (shared ? shared[(size_t)t * dm + i] : 0.0));
        free(acc);
    }
    free(xq); free(hq); free(xs); free(hs); free(g); free(u); free(h); free(o);
}

static void t_moe(moe_set *m, const char *label, int n, int topk, int with_shared, double tol) {
    int64_t dm = m->dm;
    size_t nx = (size_t)n * dm;
    float *x = malloc(nx * 4), *y = malloc(nx * 4), *yg = malloc(nx * 4), *sh = malloc(nx * 4);
    int *ids = malloc((size_t)n * topk * 4);
    float *wts = malloc((size_t)n * topk * 4);
    fill_act(x, nx, (int)dm);
    for (size_t i = 0; i < nx; i++) sh[i] = nrand();
    pick_ids(ids, wts, n, topk, m->E);
    ref_moe(m, x, n, ids, wts, topk, with_shared ? sh : NULL, y);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(nx * 4), *dsh = dup_up(sh, nx * 4);
    int *dids = dup_up(ids, (size_t)n * topk * 4);
    float *dw = dup_up(wts, (size_t)n * topk * 4);
    poison(dy, nx * 4);
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, with_shared ? dsh : NULL, dy, DSV4_CUDA_MOE_BF16, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(yg, dy, nx * 4);
    char shape[96];
    snprintf(shape, sizeof shape, "%s E=%d %lldx%lld top%d n=%d%s", label, m->E, (long long)m->dff,
             (long long)dm, topk, n, with_shared ? " +sh" : "");
    report("moe_fp4", shape, yg, y, nx, tol);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, dsh);
    dsv4_cuda_free(G, dids); dsv4_cuda_free(G, dw);
    free(x); free(y); free(yg); free(sh); free(ids); free(wts);
}

/* linear_q / moe_q from one act_quant must equal linear / moe bit for bit. */
static void t_shared_quant(dsv4_dtype dt, int64_t R, int64_t K, int n, moe_set *m) {
    dsv4_err err = {0};
    int64_t in = m ? m->dm : K, outw = m ? m->dm : R;
    size_t nx = (size_t)n * in, ny = (size_t)n * outw;
    float *x = malloc(nx * 4), *y1 = malloc(ny * 4), *y2 = malloc(ny * 4);
    fill_act(x, nx, (int)in);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(ny * 4), *ds = dalloc((size_t)n * (in / 128) * 4);
    uint8_t *dq = dalloc(nx);
    DIE_IF(dsv4_cuda_act_quant(G, dx, n, (int)in, dq, ds, &err), err);
    char shape[96];
    host_lin h;
    dsv4_cuda_weight w;
    int *dids = NULL;
    float *dw = NULL;
    if (!m) {
        make_lin(&h, dt, R, K);
        DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, &w, &err), err);
        DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, DSV4_CUDA_OUT_BF16, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(y1, dy, ny * 4);
        poison(dy, ny * 4);
        DIE_IF(dsv4_cuda_linear_q(G, &w, dq, ds, n, dy, DSV4_CUDA_OUT_BF16, &err), err);
        snprintf(shape, sizeof shape, "%s %lldx%lld n=%d", dtname(dt), (long long)R, (long long)K, n);
    } else {
        int *ids = malloc((size_t)n * 6 * 4);
        float *wts = malloc((size_t)n * 6 * 4);
        pick_ids(ids, wts, n, 6, m->E);
        dids = dup_up(ids, (size_t)n * 6 * 4);
        dw = dup_up(wts, (size_t)n * 6 * 4);
        DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, 6, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(y1, dy, ny * 4);
        poison(dy, ny * 4);
        DIE_IF(dsv4_cuda_moe_q(G, &m->dev, dx, dq, ds, n, dids, dw, 6, NULL, dy, 0, &err), err);
        snprintf(shape, sizeof shape, "moe E=%d top6 n=%d", m->E, n);
        free(ids);
        free(wts);
    }
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(y2, dy, ny * 4);
    size_t bad = 0;
    for (size_t i = 0; i < ny; i++) bad += memcmp(&y1[i], &y2[i], 4) != 0;
    int ok = bad == 0;
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %-34s %zu of %zu outputs differ from the unshared call (bit-exact required)\n",
           ok ? "ok" : "FAIL", m ? "moe_q" : "linear_q", shape, bad, ny);
    if (!m) {
        dsv4_cuda_weight_free(G, &w);
        free_lin(&h);
    }
    dsv4_cuda_free(G, dids); dsv4_cuda_free(G, dw);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, ds); dsv4_cuda_free(G, dq);
    free(x); free(y1); free(y2);
}

/* dsv4_cuda_linear_group must equal separate dsv4_cuda_linear calls bit for bit. */
static void t_group(int nw, const int64_t *R, int64_t K, int n) {
    dsv4_err err = {0};
    host_lin h[4];
    dsv4_cuda_weight w[4];
    const dsv4_cuda_weight *wp[4];
    float *dy[4], *yg[4], *ys[4];
    float *x = malloc((size_t)n * K * 4);
    fill_act(x, (size_t)n * K, (int)K);
    float *dx = dup_up(x, (size_t)n * K * 4);
    size_t bad = 0, tot = 0;
    for (int i = 0; i < nw; i++) {
        make_lin(&h[i], DSV4_DT_F8_E4M3, R[i], K);
        DIE_IF(dsv4_cuda_weight_upload(G, &h[i].lin, &w[i], &err), err);
        wp[i] = &w[i];
        dy[i] = dalloc((size_t)n * R[i] * 4);
        ys[i] = malloc((size_t)n * R[i] * 4);
        yg[i] = malloc((size_t)n * R[i] * 4);
        DIE_IF(dsv4_cuda_linear(G, &w[i], dx, n, dy[i], DSV4_CUDA_OUT_BF16, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(ys[i], dy[i], (size_t)n * R[i] * 4);
        poison(dy[i], (size_t)n * R[i] * 4);
    }
    DIE_IF(dsv4_cuda_linear_group(G, nw, wp, dx, n, dy, DSV4_CUDA_OUT_BF16, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    for (int i = 0; i < nw; i++) {
        down(yg[i], dy[i], (size_t)n * R[i] * 4);
        for (size_t j = 0; j < (size_t)n * R[i]; j++) bad += memcmp(&yg[i][j], &ys[i][j], 4) != 0;
        tot += (size_t)n * R[i];
        dsv4_cuda_weight_free(G, &w[i]);
        dsv4_cuda_free(G, dy[i]);
        free(ys[i]); free(yg[i]);
        free_lin(&h[i]);
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%d fp8 weights x%lld n=%d", nw, (long long)K, n);
    int ok = bad == 0;
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %-34s %zu of %zu outputs differ from separate calls (bit-exact required)\n",
           ok ? "ok" : "FAIL", "linear_group", shape, bad, tot);
    dsv4_cuda_free(G, dx);
    free(x);
}

static void t_errors(void) {
    /* a scale of the wrong shape must be refused, naming the tensor */
    host_lin h;
    make_lin(&h, DSV4_DT_F8_E4M3, 256, 256);
    h.lin.w.name = "layers.0.attn.wq_a.weight";
    h.lin.scale.shape[1] = 3;
    dsv4_cuda_weight w;
    dsv4_err err = {0};
    int rc = dsv4_cuda_weight_upload(G, &h.lin, &w, &err);
    int ok = rc == DSV4_EINVAL && strstr(err.msg, "scale");
    ok ? n_pass++ : n_fail++;
    printf("%-5s %-14s %-34s rc=%d \"%s\"\n", ok ? "ok" : "FAIL", "upload_error", "fp8 bad scale shape", rc, err.msg);
    free_lin(&h);
}

/* ------------------------------------------------------------------- perf */

static double g_read_gbs, g_copy_gbs;

typedef int (*op_fn)(int rep, void *arg, dsv4_err *err);

/* Capture `reps` calls in one graph; replay it and return µs per call. */
static double time_graph(op_fn fn, void *arg, int reps) {
    dsv4_err err = {0};
    cudaStream_t st = (cudaStream_t)dsv4_cuda_stream(G);
    for (int r = 0; r < 2; r++) DIE_IF(fn(r, arg, &err), err); /* warm, sizes the workspace */
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) exit(3);
    for (int r = 0; r < reps; r++) DIE_IF(fn(r, arg, &err), err);
    if (cudaStreamEndCapture(st, &graph) != cudaSuccess) exit(3);
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exit(3);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int it = 0; it < 4; it++) {
        cudaEventRecord(e0, st);
        cudaGraphLaunch(exec, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (it > 0 && ms < best) best = ms;
    }
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) {
        fprintf(stderr, "graph replay: %s\n", cudaGetErrorString(ce));
        exit(3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return best * 1e3 / reps;
}

typedef struct {
    dsv4_cuda_weight *w;
    int ncopies, n;
    float *x, *y;
} lin_arg;

static int op_linear(int rep, void *a_, dsv4_err *err) {
    lin_arg *a = a_;
    return dsv4_cuda_linear(G, &a->w[rep % a->ncopies], a->x, a->n, a->y, DSV4_CUDA_OUT_BF16, err);
}

static void print_perf(const char *op, const char *shape, int n, double us, double bytes, double flops) {
    double gbs = bytes / (us * 1e-6) / 1e9;
    printf("%-10s %-24s n=%-3d %9.2f us  %8.1f MB  %7.0f GB/s  %5.1f%% of read BW  %6.1f TFLOP/s\n", op,
           shape, n, us, bytes / 1e6, gbs, 100.0 * gbs / g_read_gbs, flops / (us * 1e-6) / 1e12);
    fflush(stdout);
}

static void perf_linear(const char *label, dsv4_dtype dt, int64_t R, int64_t K) {
    host_lin h;
    make_lin(&h, dt, R, K);
    size_t wb = h.lin.w.nbytes + h.lin.scale.nbytes;
    int copies = (int)((512u << 20) / wb) + 1;
    if (copies > 32) copies = 32;
    if (copies < 2) copies = 2;
    lin_arg a;
    a.w = calloc(copies, sizeof *a.w);
    a.ncopies = copies;
    dsv4_err err = {0};
    for (int i = 0; i < copies; i++) DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, &a.w[i], &err), err);
    const int ns[] = {1, 2, 4, 8, 16, 32, 64};
    float *x = malloc((size_t)64 * K * 4);
    fill_act(x, (size_t)64 * K, (int)K);
    a.x = dup_up(x, (size_t)64 * K * 4);
    a.y = dalloc((size_t)64 * R * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld", label, (long long)R, (long long)K);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        a.n = ns[i];
        double us = time_graph(op_linear, &a, 2 * copies > 20 ? 2 * copies : 20);
        double bytes = (double)wb + (double)a.n * (K * 4 + R * 4);
        print_perf(dt == DSV4_DT_F8_E4M3 ? "fp8" : dt == DSV4_DT_I8 ? "fp4" : "bf16", shape, a.n, us,
                   bytes, 2.0 * a.n * R * K);
    }
    for (int i = 0; i < copies; i++) dsv4_cuda_weight_free(G, &a.w[i]);
    free(a.w);
    dsv4_cuda_free(G, a.x);
    dsv4_cuda_free(G, a.y);
    free(x);
    free_lin(&h);
}

typedef struct {
    moe_set *m;
    int n, topk, nsets;
    float *x, *y, *w;
    int *ids; /* nsets routing sets */
} moe_arg;

static int op_moe(int rep, void *a_, dsv4_err *err) {
    moe_arg *a = a_;
    int s = rep % a->nsets;
    return dsv4_cuda_moe(G, &a->m->dev, a->x, a->n, a->ids + (size_t)s * a->n * a->topk,
                         a->w + (size_t)s * a->n * a->topk, a->topk, NULL, a->y, DSV4_CUDA_OUT_BF16, err);
}

/* --moe: time (and check) both forms of the expert kernels, DSV4_CUDA_MOE_F16 = 0 and 1 */
static int g_f16_ab = 0;
/* --moe-wg: DSV4_CUDA_MOE_WG = 0 (k_moe_gemm), 1..6 (k_moe_wg variants, cuda_moe.cu moe_wg_variant) */
static int g_wg_ab = 0;
#define WG_VARIANTS 6
static const char *const wg_name[WG_VARIANTS + 1] = {"k_moe_gemm",   "wgmma fp8 64",  "wgmma fp8 128",
                                                     "wgmma f16 64", "wgmma f16 128", "wgmma fp8 64 pipe",
                                                     "wgmma f16 64 pipe"};
static void set_wg(int v) {
    char b[8];
    snprintf(b, sizeof b, "%d", v);
    setenv("DSV4_CUDA_MOE_WG", b, 1);
}

static void perf_moe(moe_set *m) {
    const int ns[] = {1, 2, 4, 6, 8, 16, 32, 64};
    const int topk = 6, nsets = 16;
    moe_arg a;
    a.m = m;
    a.topk = topk;
    a.nsets = nsets;
    float *x = malloc((size_t)64 * m->dm * 4);
    fill_act(x, (size_t)64 * m->dm, (int)m->dm);
    a.x = dup_up(x, (size_t)64 * m->dm * 4);
    a.y = dalloc((size_t)64 * m->dm * 4);
    int *ids = malloc((size_t)nsets * 64 * topk * 4);
    float *wts = malloc((size_t)nsets * 64 * topk * 4);
    double per_expert = 3.0 * (m->dm * m->dff / 2 + m->dm * m->dff / 32);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        a.n = ns[i];
        double distinct = 0;
        for (int s = 0; s < nsets; s++) {
            pick_ids(ids + (size_t)s * a.n * topk, wts + (size_t)s * a.n * topk, a.n, topk, m->E);
            char seen[1024] = {0};
            for (int j = 0; j < a.n * topk; j++) {
                int v = ids[(size_t)s * a.n * topk + j];
                if (!seen[v]) { seen[v] = 1; distinct++; }
            }
        }
        distinct /= nsets;
        a.ids = dup_up(ids, (size_t)nsets * a.n * topk * 4);
        a.w = dup_up(wts, (size_t)nsets * a.n * topk * 4);
        for (int v = g_f16_ab ? 0 : -1; v <= (g_f16_ab ? 1 : -1); v++) { /* --moe: FP8 mma, FP16 mma */
            if (v >= 0) setenv("DSV4_CUDA_MOE_F16", v ? "1" : "0", 1);
            double us = time_graph(op_moe, &a, 32);
            char shape[64];
            snprintf(shape, sizeof shape, "E=%d top%d (%.1f exp)%s", m->E, topk, distinct,
                     v < 0 ? "" : v ? " f16" : " fp8");
            print_perf("moe_fp4", shape, a.n, us, distinct * per_expert,
                       2.0 * 3 * a.n * topk * (double)m->dm * m->dff);
        }
        if (g_f16_ab) unsetenv("DSV4_CUDA_MOE_F16");
        dsv4_cuda_free(G, a.ids);
        dsv4_cuda_free(G, a.w);
    }
    dsv4_cuda_free(G, a.x);
    dsv4_cuda_free(G, a.y);
    free(x); free(ids); free(wts);
}

/*
 * A chain shaped like the weight-streaming part of one decode layer
 * (spec/MODEL.md §3.7): attn_norm, wq_a, q_norm, wq_b, wkv, wo_b, ffn_norm,
 * shared expert w1/w3/w2, routed MoE (top-6 of 256). Attention itself, wo_a,
 * HC and the compressors are left out. Each rep uses its own copy of the
 * dense weights and its own routing, so nothing is served from L2: the
 * chain's time against its bytes is the per-layer roofline ratio, and the
 * kernel-to-kernel gaps show up in it.
 */
typedef struct {
    dsv4_cuda_weight wq_a, wq_b, wkv, wo_b, sw1, sw3, sw2;
} layer_w;

typedef struct {
    layer_w *L;
    int ncopies, n, shared_q;
    uint8_t *q0;
    float *s0;
    moe_arg *moe;
    uint16_t *nw; /* norm weight bf16 [4096] */
    float *x, *t0, *t1, *t2, *t3, *t4;
} chain_arg;

/* The same chain quantising each shared input once (act_quant + linear_q /
 * moe_q): attn_norm output feeds wq_a and wkv, ffn_norm output feeds shared
 * w1, w3 and the routed experts. */
static int op_chain_q(int rep, chain_arg *a, dsv4_err *err) {
    layer_w *L = &a->L[rep % a->ncopies];
    int n = a->n, rc = 0, F = DSV4_CUDA_OUT_BF16;
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->x, a->nw, n, 4096, 1e-6f, a->t0, F, err);
    if (!rc) rc = dsv4_cuda_act_quant(G, a->t0, n, 4096, a->q0, a->s0, err);
    if (!rc) rc = dsv4_cuda_linear_q(G, &L->wq_a, a->q0, a->s0, n, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t1, a->nw, n, 1024, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wq_b, a->t1, n, a->t2, F, err);
    if (!rc) rc = dsv4_cuda_linear_q(G, &L->wkv, a->q0, a->s0, n, a->t3, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wo_b, a->t2, n, a->t0, F, err);
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t0, a->nw, n, 4096, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_act_quant(G, a->t1, n, 4096, a->q0, a->s0, err);
    if (!rc) rc = dsv4_cuda_linear_q(G, &L->sw1, a->q0, a->s0, n, a->t3, F, err);
    if (!rc) rc = dsv4_cuda_linear_q(G, &L->sw3, a->q0, a->s0, n, a->t4, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->sw2, a->t3, n, a->t2, F, err);
    if (!rc) {
        moe_arg *m = a->moe;
        int s = rep % m->nsets;
        rc = dsv4_cuda_moe_q(G, &m->m->dev, a->t1, a->q0, a->s0, n, m->ids + (size_t)s * n * m->topk,
                             m->w + (size_t)s * n * m->topk, m->topk, a->t2, a->x, F, err);
    }
    return rc;
}

/* The chain with grouped launches: wq_a + wkv in one, shared w1 + w3 in one. */
static int op_chain_g(int rep, chain_arg *a, dsv4_err *err) {
    layer_w *L = &a->L[rep % a->ncopies];
    int n = a->n, rc = 0, F = DSV4_CUDA_OUT_BF16;
    const dsv4_cuda_weight *g1[2] = {&L->wq_a, &L->wkv}, *g2[2] = {&L->sw1, &L->sw3};
    float *y1[2] = {a->t1, a->t3}, *y2[2] = {a->t3, a->t4};
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->x, a->nw, n, 4096, 1e-6f, a->t0, F, err);
    if (!rc) rc = dsv4_cuda_linear_group(G, 2, g1, a->t0, n, y1, F, err);
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t1, a->nw, n, 1024, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wq_b, a->t1, n, a->t2, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wo_b, a->t2, n, a->t0, F, err);
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t0, a->nw, n, 4096, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_linear_group(G, 2, g2, a->t1, n, y2, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->sw2, a->t3, n, a->t2, F, err);
    if (!rc) {
        moe_arg *m = a->moe;
        int s = rep % m->nsets;
        rc = dsv4_cuda_moe(G, &m->m->dev, a->t1, n, m->ids + (size_t)s * n * m->topk,
                           m->w + (size_t)s * n * m->topk, m->topk, a->t2, a->x, F, err);
    }
    return rc;
}

static int op_chain(int rep, void *a_, dsv4_err *err) {
    chain_arg *a = a_;
    if (a->shared_q == 1) return op_chain_q(rep, a, err);
    if (a->shared_q == 2) return op_chain_g(rep, a, err);
    layer_w *L = &a->L[rep % a->ncopies];
    int n = a->n, rc = 0, F = DSV4_CUDA_OUT_BF16;
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->x, a->nw, n, 4096, 1e-6f, a->t0, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wq_a, a->t0, n, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t1, a->nw, n, 1024, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wq_b, a->t1, n, a->t2, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wkv, a->t0, n, a->t3, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->wo_b, a->t2, n, a->t0, F, err); /* t2 stands in for wo_a's output */
    if (!rc) rc = dsv4_cuda_rmsnorm(G, a->t0, a->nw, n, 4096, 1e-6f, a->t1, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->sw1, a->t1, n, a->t3, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->sw3, a->t1, n, a->t4, F, err);
    if (!rc) rc = dsv4_cuda_linear(G, &L->sw2, a->t3, n, a->t2, F, err); /* (SwiGLU omitted) */
    if (!rc) {
        moe_arg *m = a->moe;
        int s = rep % m->nsets;
        rc = dsv4_cuda_moe(G, &m->m->dev, a->t1, n, m->ids + (size_t)s * n * m->topk,
                           m->w + (size_t)s * n * m->topk, m->topk, a->t2, a->x, F, err);
    }
    return rc;
}

static void perf_chain(moe_set *m) {
    const int copies = 6, topk = 6, nsets = 16;
    chain_arg a;
    memset(&a, 0, sizeof a);
    a.L = calloc(copies, sizeof *a.L);
    a.ncopies = copies;
    struct { dsv4_dtype dt; int64_t o, i; size_t off; } sh[] = {
        {DSV4_DT_F8_E4M3, 1024, 4096, offsetof(layer_w, wq_a)}, {DSV4_DT_F8_E4M3, 32768, 1024, offsetof(layer_w, wq_b)},
        {DSV4_DT_F8_E4M3, 512, 4096, offsetof(layer_w, wkv)},   {DSV4_DT_F8_E4M3, 4096, 8192, offsetof(layer_w, wo_b)},
        {DSV4_DT_F8_E4M3, 2048, 4096, offsetof(layer_w, sw1)},  {DSV4_DT_F8_E4M3, 2048, 4096, offsetof(layer_w, sw3)},
        {DSV4_DT_F8_E4M3, 4096, 2048, offsetof(layer_w, sw2)}};
    double dense = 0;
    dsv4_err err = {0};
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++) {
        host_lin h;
        make_lin(&h, sh[k].dt, sh[k].o, sh[k].i);
        dense += (double)(h.lin.w.nbytes + h.lin.scale.nbytes);
        for (int c = 0; c < copies; c++)
            DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, (dsv4_cuda_weight *)((char *)&a.L[c] + sh[k].off), &err), err);
        free_lin(&h);
    }
    uint16_t nw[4096];
    for (int i = 0; i < 4096; i++) nw[i] = 0x3f80; /* 1.0 */
    a.nw = dup_up(nw, sizeof nw);
    float *x = malloc((size_t)64 * 32768 * 4);
    fill_act(x, (size_t)64 * 32768, 4096);
    a.x = dup_up(x, (size_t)64 * 4096 * 4);
    a.t0 = dup_up(x, (size_t)64 * 8192 * 4);
    a.t1 = dup_up(x, (size_t)64 * 4096 * 4);
    a.t2 = dup_up(x, (size_t)64 * 32768 * 4);
    a.t3 = dup_up(x, (size_t)64 * 4096 * 4);
    a.t4 = dup_up(x, (size_t)64 * 4096 * 4);
    a.q0 = dalloc((size_t)64 * 8192);
    a.s0 = dalloc((size_t)64 * 64 * 4);
    moe_arg ma;
    memset(&ma, 0, sizeof ma);
    ma.m = m;
    ma.topk = topk;
    ma.nsets = nsets;
    a.moe = &ma;
    int *ids = malloc((size_t)nsets * 64 * topk * 4);
    float *wts = malloc((size_t)nsets * 64 * topk * 4);
    double per_expert = 3.0 * (m->dm * m->dff / 2 + m->dm * m->dff / 32);
    const int ns[] = {1, 2, 4, 6, 8, 16};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        a.n = ma.n = ns[i];
        double distinct = 0;
        for (int s = 0; s < nsets; s++) {
            pick_ids(ids + (size_t)s * a.n * topk, wts + (size_t)s * a.n * topk, a.n, topk, m->E);
            char seen[1024] = {0};
            for (int j = 0; j < a.n * topk; j++) {
                int v = ids[(size_t)s * a.n * topk + j];
                if (!seen[v]) { seen[v] = 1; distinct++; }
            }
        }
        distinct /= nsets;
        ma.ids = dup_up(ids, (size_t)nsets * a.n * topk * 4);
        ma.w = dup_up(wts, (size_t)nsets * a.n * topk * 4);
        for (int v = 0; v < 3; v++) {
            a.shared_q = v;
            double us = time_graph(op_chain, &a, 24);
            char shape[64];
            snprintf(shape, sizeof shape, "layer (%.1f experts)", distinct);
            double bytes = dense + distinct * per_expert;
            print_perf(v == 0 ? "chain" : v == 1 ? "chain_q" : "chain_g", shape, a.n, us, bytes, 0);
            printf("           -> %.2fx the HBM roofline (%.2f us at %.0f GB/s); x43 layers = %.2f ms\n",
                   us / (bytes / g_read_gbs / 1e3), bytes / g_read_gbs / 1e3, g_read_gbs, 43 * us / 1e3);
        }
        dsv4_cuda_free(G, ma.ids);
        dsv4_cuda_free(G, ma.w);
    }
    for (int c = 0; c < copies; c++) {
        dsv4_cuda_weight *ws[] = {&a.L[c].wq_a, &a.L[c].wq_b, &a.L[c].wkv, &a.L[c].wo_b, &a.L[c].sw1, &a.L[c].sw3, &a.L[c].sw2};
        for (size_t k = 0; k < 7; k++) dsv4_cuda_weight_free(G, ws[k]);
    }
    free(a.L);
    float *bufs[] = {a.x, a.t0, a.t1, a.t2, a.t3, a.t4};
    for (int k = 0; k < 6; k++) dsv4_cuda_free(G, bufs[k]);
    dsv4_cuda_free(G, a.nw);
    dsv4_cuda_free(G, a.q0);
    dsv4_cuda_free(G, a.s0);
    free(x); free(ids); free(wts);
}

typedef struct {
    uint8_t *buf;
    size_t bytes;
    int copies;
} read_arg;

static int op_read(int rep, void *a_, dsv4_err *err) {
    read_arg *a = a_;
    return dsv4_cuda_read_bytes(G, a->buf + (size_t)(rep % a->copies) * a->bytes, a->bytes, err);
}

/* Speed of light for a kernel of the same size: one plain streaming read of
 * those bytes, timed the same way (graph replay, rotated buffers). */
static void perf_read(void) {
    const double mb[] = {4.2, 8.4, 33.6, 80.2, 1059.6};
    for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++) {
        read_arg a;
        a.bytes = ((size_t)(mb[i] * 1e6)) & ~(size_t)4095;
        a.copies = (int)((512u << 20) / a.bytes) + 1;
        if (a.copies < 2) a.copies = 2;
        a.buf = dalloc(a.bytes * a.copies);
        double us = time_graph(op_read, &a, a.copies * 2 > 20 ? a.copies * 2 : 20);
        char shape[64];
        snprintf(shape, sizeof shape, "plain read %.1f MB", mb[i]);
        print_perf("read", shape, 0, us, (double)a.bytes, 0);
        dsv4_cuda_free(G, a.buf);
    }
}

/* ------------------------------------------------- prefill sizes (issue 7) */

/*
 * Routing with a skewed expert popularity (log-normal, sigma 1: the most
 * popular experts get ~5x the average rows, some get few), closer to a real
 * router than uniform picks; distinct experts per token.
 */
static void pick_ids_skewed(int *ids, float *wts, int n, int topk, int E) {
    double *cdf = malloc((size_t)E * sizeof *cdf), tot = 0;
    for (int e = 0; e < E; e++) cdf[e] = tot += exp(1.0 * nrand());
    for (int t = 0; t < n; t++) {
        double sum = 0;
        for (int k = 0; k < topk; k++) {
            int v, dup;
            do {
                const double u = urand() * tot;
                int lo = 0, hi = E - 1;
                while (lo < hi) {
                    const int mid = (lo + hi) / 2;
                    if (cdf[mid] < u) lo = mid + 1;
                    else hi = mid;
                }
                v = lo;
                dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * topk + j] == v;
            } while (dup);
            ids[t * topk + k] = v;
            wts[t * topk + k] = (float)(0.2 + urand());
            sum += wts[t * topk + k];
        }
        for (int k = 0; k < topk; k++) wts[t * topk + k] = (float)(wts[t * topk + k] / sum * 1.5);
    }
    free(cdf);
}

/* Which kernels the library picks (cuda_gemm.cuh thresholds, read per call):
 * 0 the decode-tuned kernels, 1 the tiled GEMMs, 2 the library default but
 * without cuBLASLt for FP8 (cuda_fp8_lt.cu: on by default for eager prefill;
 * the checks below turn it on explicitly, with its own tolerance);
 * cfg 1..: force that GEMM tile shape (DSV4_CUDA_{MOE,FP8}_GEMM_CFG), 0 default. */
#define MOE_CFGS 5
#define FP8_CFGS 4
static void set_paths_cfg(int mode, int cfg) {
    char b[16];
    snprintf(b, sizeof b, "%d", cfg);
    setenv("DSV4_CUDA_MOE_GEMM_CFG", b, 1);
    setenv("DSV4_CUDA_FP8_GEMM_CFG", b, 1);
    setenv("DSV4_CUDA_FP8_LT", "0", 1);
    if (mode == 2) {
        unsetenv("DSV4_CUDA_MOE_GEMM_MIN");
        unsetenv("DSV4_CUDA_FP8_GEMM_MIN");
        return;
    }
    setenv("DSV4_CUDA_MOE_GEMM_MIN", mode ? "0" : "1000000", 1);
    setenv("DSV4_CUDA_FP8_GEMM_MIN", mode ? "9" : "1000000", 1);
}
static void set_paths(int mode) { set_paths_cfg(mode, 0); }

/* MoE at a prefill size: GEMM vs the decode kernels (same numerics up to
 * the fp32 summation order), then sampled tokens against the reference. */
static void t_moe_prefill(moe_set *m, int n) {
    const int topk = 6;
    int64_t dm = m->dm;
    size_t nx = (size_t)n * dm;
    float *x = malloc(nx * 4), *y1 = malloc(nx * 4), *y2 = malloc(nx * 4);
    int *ids = malloc((size_t)n * topk * 4);
    float *wts = malloc((size_t)n * topk * 4);
    fill_act(x, nx, (int)dm);
    pick_ids_skewed(ids, wts, n, topk, m->E);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(nx * 4), *dw = dup_up(wts, (size_t)n * topk * 4);
    int *dids = dup_up(ids, (size_t)n * topk * 4);
    dsv4_err err = {0};
    char shape[96];
    for (int cfg = 0; cfg <= MOE_CFGS; cfg++) {
        set_paths_cfg(cfg ? 1 : 0, cfg);
        poison(dy, nx * 4);
        DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(cfg ? y2 : y1, dy, nx * 4);
        if (!cfg) continue;
        snprintf(shape, sizeof shape, "flash top6 skewed n=%d gemm cfg %d vs k_fp4", n, cfg);
        /* Not bit-equal: g and u differ in the fp32 order of the 128-column
         * chunk sums (~1e-7), and the few h values that sit at an E4M3
         * rounding boundary of the second quantisation flip by one E4M3 step;
         * measured 2.6e-5..6.3e-5 on H200 (the FP8 linear, with no second
         * quantisation, differs by 1.7e-7). A wrong tile, row or scale is
         * 1e-2 or more. */
        report("moe_prefill", shape, y2, y1, nx, 2e-4);
    }
    /* reference (official bf16 storage, as t_moe) on the first and last 3 tokens */
    set_paths(2);
    poison(dy, nx * 4);
    DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, NULL, dy, DSV4_CUDA_MOE_BF16, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(y2, dy, nx * 4);
    for (int part = 0; part < 2; part++) {
        const int t0 = part ? n - 3 : 0;
        float *ref = malloc((size_t)3 * dm * 4);
        ref_moe(m, x + (size_t)t0 * dm, 3, ids + t0 * topk, wts + t0 * topk, topk, NULL, ref);
        snprintf(shape, sizeof shape, "flash n=%d (default path) rows %d..%d", n, t0, t0 + 2);
        report("moe_prefill", shape, y2 + (size_t)t0 * dm, ref, (size_t)3 * dm, 5e-3);
        free(ref);
    }
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, dw); dsv4_cuda_free(G, dids);
    free(x); free(y1); free(y2); free(ids); free(wts);
}

/* FP8 linear at a prefill size: GEMM vs k_fp8_linear, then 2 rows vs the reference. */
static void t_linear_prefill(const char *label, int64_t R, int64_t K, int n) {
    host_lin h;
    make_lin(&h, DSV4_DT_F8_E4M3, R, K);
    size_t nx = (size_t)n * K, ny = (size_t)n * R;
    float *x = malloc(nx * 4), *y1 = malloc(ny * 4), *y2 = malloc(ny * 4), *ref = malloc((size_t)2 * R * 4);
    fill_act(x, nx, (int)K);
    dsv4_err err = {0};
    dsv4_cuda_weight w;
    DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, &w, &err), err);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(ny * 4);
    char shape[96];
    for (int cfg = 0; cfg <= FP8_CFGS; cfg++) {
        set_paths_cfg(cfg ? 1 : 0, cfg);
        poison(dy, ny * 4);
        DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(cfg ? y2 : y1, dy, ny * 4);
        if (!cfg) continue;
        snprintf(shape, sizeof shape, "%s %lldx%lld n=%d cfg %d vs old", label, (long long)R, (long long)K, n, cfg);
        report("fp8_prefill", shape, y2, y1, ny, 1e-5);
    }
    set_paths(2); /* last rows: the default path */
    poison(dy, ny * 4);
    DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, 0, &err), err);
    DIE_IF(dsv4_cuda_sync(G, &err), err);
    down(y2, dy, ny * 4);
    snprintf(shape, sizeof shape, "%s %lldx%lld n=%d default vs old", label, (long long)R, (long long)K, n);
    report("fp8_prefill", shape, y2, y1, ny, 1e-5);
    ref_linear(&h, x + (size_t)(n - 2) * K, 2, ref);
    /* cuBLASLt's block-scaled GEMM (cuda_fp8_lt.cu, default for eager prefill): every row
     * against the old kernel. A wrong scale layout is O(1); Hopper's FP8
     * wgmma accumulation inside a 128-column block measured 2.3e-4 on H200
     * (DSV4_CUDA_FP8_LT_LAYOUT=0; the other three layouts 1.1..1.3). */
    if (n >= 256) {
        float *y3 = malloc(ny * 4);
        setenv("DSV4_CUDA_FP8_LT", "1", 1);
        poison(dy, ny * 4);
        DIE_IF(dsv4_cuda_linear(G, &w, dx, n, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(y3, dy, ny * 4);
        setenv("DSV4_CUDA_FP8_LT", "0", 1);
        snprintf(shape, sizeof shape, "%s %lldx%lld n=%d cublasLt vs old", label, (long long)R, (long long)K, n);
        report("fp8_prefill", shape, y3, y1, ny, 1e-3);
        snprintf(shape, sizeof shape, "%s n=%d cublasLt last 2 rows vs ref", label, n);
        report("fp8_prefill", shape, y3 + (size_t)(n - 2) * R, ref, (size_t)2 * R, 1e-3);
        free(y3);
    }
    snprintf(shape, sizeof shape, "%s n=%d last 2 rows vs ref", label, n);
    report("fp8_prefill", shape, y2 + (size_t)(n - 2) * R, ref, (size_t)2 * R, 1e-3);
    dsv4_cuda_weight_free(G, &w);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy);
    free(x); free(y1); free(y2); free(ref);
    free_lin(&h);
}

/*
 * --moe: the FP16-mma expert kernels (DSV4_CUDA_MOE_F16=1, default) against
 * their FP8-mma form (=0) on the same input: the same HMMA inputs in the same
 * k split, so the outputs must be equal bit for bit (tolerance 0). cfg -1:
 * the decode kernel k_fp4; 0: the default choice; 1..: a forced GEMM shape.
 */
static void t_moe_f16(moe_set *m, int n, int cfg) {
    const int topk = 6;
    size_t nx = (size_t)n * m->dm;
    float *x = malloc(nx * 4), *y0 = malloc(nx * 4), *y1 = malloc(nx * 4);
    int *ids = malloc((size_t)n * topk * 4);
    float *wts = malloc((size_t)n * topk * 4);
    fill_act(x, nx, (int)m->dm);
    pick_ids_skewed(ids, wts, n, topk, m->E);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(nx * 4), *dw = dup_up(wts, (size_t)n * topk * 4);
    int *dids = dup_up(ids, (size_t)n * topk * 4);
    dsv4_err err = {0};
    set_paths_cfg(cfg < 0 ? 0 : cfg == 0 ? 2 : 1, cfg < 0 ? 0 : cfg);
    for (int v = 0; v < 2; v++) {
        setenv("DSV4_CUDA_MOE_F16", v ? "1" : "0", 1);
        poison(dy, nx * 4);
        DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(v ? y1 : y0, dy, nx * 4);
    }
    unsetenv("DSV4_CUDA_MOE_F16");
    set_paths(2);
    size_t ndiff = 0;
    for (size_t i = 0; i < nx; i++) ndiff += memcmp(&y0[i], &y1[i], 4) != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "n=%d %s%d f16==fp8 (%zu differ)", n, cfg < 0 ? "k_fp4" : "cfg ",
             cfg < 0 ? 0 : cfg, ndiff);
    report("moe_f16", shape, y1, y0, nx, ndiff ? -1.0 : 0.0);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, dw); dsv4_cuda_free(G, dids);
    free(x); free(y0); free(y1); free(ids); free(wts);
}

/*
 * --moe-wg: the warpgroup-MMA grouped GEMM (k_moe_wg, DSV4_CUDA_MOE_WG = 1:
 * 64 token rows per tile, 2: 128) against k_moe_gemm (= 0) on the same
 * input, every size forced onto the grouped GEMM. Not bit-equal (the fp32
 * order of the k32 partial sums differs, and h values at an E4M3 rounding
 * boundary of the second quantisation flip by one step), so by normalised
 * error with t_moe_prefill's tolerance; then the first and last 3 tokens
 * against the reference. A wrong fragment, swizzle or scale is 1e-2 or more.
 */
static void t_moe_wg(moe_set *m, int n) {
    const int topk = 6;
    size_t nx = (size_t)n * m->dm;
    float *x = malloc(nx * 4), *y0 = malloc(nx * 4), *y1 = malloc(nx * 4);
    int *ids = malloc((size_t)n * topk * 4);
    float *wts = malloc((size_t)n * topk * 4);
    fill_act(x, nx, (int)m->dm);
    pick_ids_skewed(ids, wts, n, topk, m->E);
    float *dx = dup_up(x, nx * 4), *dy = dalloc(nx * 4), *dw = dup_up(wts, (size_t)n * topk * 4);
    int *dids = dup_up(ids, (size_t)n * topk * 4);
    dsv4_err err = {0};
    char shape[96];
    set_paths_cfg(1, 0);
    setenv("DSV4_CUDA_MOE_WG_MIN", "0", 1);
    for (int v = 0; v <= WG_VARIANTS; v++) {
        set_wg(v);
        poison(dy, nx * 4);
        DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(v ? y1 : y0, dy, nx * 4);
        if (!v) continue;
        size_t ndiff = 0;
        for (size_t i = 0; i < nx; i++) ndiff += memcmp(&y0[i], &y1[i], 4) != 0;
        snprintf(shape, sizeof shape, "n=%d %s vs k_moe_gemm (%zu differ)", n, wg_name[v], ndiff);
        report("moe_wg", shape, y1, y0, nx, 2e-4);
    }
    float *ref = malloc((size_t)6 * m->dm * 4); /* tokens 0..2 and n-3..n-1 */
    ref_moe(m, x, 3, ids, wts, topk, NULL, ref);
    ref_moe(m, x + (size_t)(n - 3) * m->dm, 3, ids + (n - 3) * topk, wts + (n - 3) * topk, topk, NULL, ref + 3 * m->dm);
    for (int v = 0; v <= WG_VARIANTS; v++) { /* 0: k_moe_gemm's distance, for comparison */
        set_wg(v);
        poison(dy, nx * 4);
        DIE_IF(dsv4_cuda_moe(G, &m->dev, dx, n, dids, dw, topk, NULL, dy, DSV4_CUDA_MOE_BF16, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        down(y1, dy, nx * 4);
        for (int part = 0; part < 2; part++) {
            const int t0 = part ? n - 3 : 0;
            snprintf(shape, sizeof shape, "n=%d %s vs ref rows %d..%d", n, wg_name[v], t0, t0 + 2);
            report("moe_wg", shape, y1 + (size_t)t0 * m->dm, ref + (size_t)part * 3 * m->dm, (size_t)3 * m->dm, 5e-3);
        }
    }
    free(ref);
    unsetenv("DSV4_CUDA_MOE_WG");
    unsetenv("DSV4_CUDA_MOE_WG_MIN");
    set_paths(2);
    dsv4_cuda_free(G, dx); dsv4_cuda_free(G, dy); dsv4_cuda_free(G, dw); dsv4_cuda_free(G, dids);
    free(x); free(y0); free(y1); free(ids); free(wts);
}

static void perf_moe_prefill(moe_set *m) {
    const int ns[] = {256, 512, 1365, 4096, 8192};
    const int topk = 6, nsets = 2, nmax = 8192;
    moe_arg a;
    a.m = m;
    a.topk = topk;
    a.nsets = nsets;
    float *x = malloc((size_t)nmax * m->dm * 4);
    fill_act(x, (size_t)nmax * m->dm, (int)m->dm);
    a.x = dup_up(x, (size_t)nmax * m->dm * 4);
    a.y = dalloc((size_t)nmax * m->dm * 4);
    int *ids = malloc((size_t)nsets * nmax * topk * 4);
    float *wts = malloc((size_t)nsets * nmax * topk * 4);
    /* bytes: all experts' weights (every expert is chosen at these sizes) */
    const double all_bytes = (double)m->E * 3.0 * (m->dm * m->dff / 2 + m->dm * m->dff / 32);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        a.n = ns[i];
        for (int s = 0; s < nsets; s++)
            pick_ids_skewed(ids + (size_t)s * a.n * topk, wts + (size_t)s * a.n * topk, a.n, topk, m->E);
        a.ids = dup_up(ids, (size_t)nsets * a.n * topk * 4);
        a.w = dup_up(wts, (size_t)nsets * a.n * topk * 4);
        const double flops = 2.0 * 3 * a.n * topk * (double)m->dm * m->dff;
        for (int cfg = -1; cfg <= MOE_CFGS; cfg++) { /* -1 k_fp4, 0 default, 1.. forced GEMM shape */
            if (g_wg_ab && cfg != 0) continue;
            set_paths_cfg(cfg < 0 ? 0 : cfg == 0 ? 2 : 1, cfg < 0 ? 0 : cfg);
            if (g_wg_ab) { /* every size on the grouped GEMM, so that all three run */
                setenv("DSV4_CUDA_MOE_GEMM_MIN", "0", 1);
                setenv("DSV4_CUDA_MOE_WG_MIN", "0", 1);
            }
            for (int v = g_f16_ab || g_wg_ab ? 0 : -1; v <= (g_f16_ab ? 1 : g_wg_ab ? WG_VARIANTS : -1); v++) {
                if (g_wg_ab) {
                    set_wg(v);
                    double us = time_graph(op_moe, &a, a.n >= 4096 ? 3 : 8);
                    char shape[64];
                    snprintf(shape, sizeof shape, "skewed top6 %s", wg_name[v]);
                    print_perf("moe_pf", shape, a.n, us, all_bytes, flops);
                    continue;
                }
                if (v >= 0) setenv("DSV4_CUDA_MOE_F16", v ? "1" : "0", 1);
                double us = time_graph(op_moe, &a, a.n >= 4096 ? 3 : 8);
                const char *vs = v < 0 ? "" : v ? " f16" : " fp8";
                char shape[64];
                if (cfg < 0) snprintf(shape, sizeof shape, "skewed top6 k_fp4%s", vs);
                else if (cfg == 0) snprintf(shape, sizeof shape, "skewed top6 default%s", vs);
                else snprintf(shape, sizeof shape, "skewed top6 gemm cfg %d%s", cfg, vs);
                print_perf("moe_pf", shape, a.n, us, all_bytes, flops);
            }
            if (g_f16_ab) unsetenv("DSV4_CUDA_MOE_F16");
            if (g_wg_ab) {
                unsetenv("DSV4_CUDA_MOE_WG");
                unsetenv("DSV4_CUDA_MOE_WG_MIN");
            }
        }
        dsv4_cuda_free(G, a.ids);
        dsv4_cuda_free(G, a.w);
    }
    set_paths(2);
    dsv4_cuda_free(G, a.x);
    dsv4_cuda_free(G, a.y);
    free(x); free(ids); free(wts);
}

static void perf_linear_prefill(const char *label, int64_t R, int64_t K) {
    host_lin h;
    make_lin(&h, DSV4_DT_F8_E4M3, R, K);
    const int ns[] = {64, 128, 512, 4096};
    const int nmax = 4096;
    lin_arg a;
    a.ncopies = 2;
    a.w = calloc(2, sizeof *a.w);
    dsv4_err err = {0};
    for (int i = 0; i < 2; i++) DIE_IF(dsv4_cuda_weight_upload(G, &h.lin, &a.w[i], &err), err);
    float *x = malloc((size_t)nmax * K * 4);
    fill_act(x, (size_t)nmax * K, (int)K);
    a.x = dup_up(x, (size_t)nmax * K * 4);
    a.y = dalloc((size_t)nmax * R * 4);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        a.n = ns[i];
        for (int cfg = -1; cfg <= FP8_CFGS; cfg++) { /* -1 k_fp8_linear, 0 default, 1.. forced GEMM shape */
            set_paths_cfg(cfg < 0 ? 0 : cfg == 0 ? 2 : 1, cfg < 0 ? 0 : cfg);
            double us = time_graph(op_linear, &a, a.n >= 4096 ? 6 : 20);
            char shape[64];
            if (cfg < 0) snprintf(shape, sizeof shape, "%s old", label);
            else if (cfg == 0) snprintf(shape, sizeof shape, "%s default", label);
            else snprintf(shape, sizeof shape, "%s cfg %d", label, cfg);
            print_perf("fp8_pf", shape, a.n, us, (double)h.lin.w.nbytes + (double)a.n * (K * 4 + R * 4),
                       2.0 * a.n * R * K);
        }
        if (a.n >= 256) { /* cuBLASLt block-scaled FP8 (cuda_fp8_lt.cu, default for eager prefill) */
            set_paths(2);
            setenv("DSV4_CUDA_FP8_LT", "1", 1);
            double us = time_graph(op_linear, &a, a.n >= 4096 ? 6 : 20);
            setenv("DSV4_CUDA_FP8_LT", "0", 1);
            char shape[64];
            snprintf(shape, sizeof shape, "%s cublasLt", label);
            print_perf("fp8_pf", shape, a.n, us, (double)h.lin.w.nbytes + (double)a.n * (K * 4 + R * 4),
                       2.0 * a.n * R * K);
        }
    }
    set_paths(2);
    for (int i = 0; i < 2; i++) dsv4_cuda_weight_free(G, &a.w[i]);
    free(a.w);
    dsv4_cuda_free(G, a.x);
    dsv4_cuda_free(G, a.y);
    free(x);
    free_lin(&h);
}

/* -------------------------------------------------------------------- main */

int main(int argc, char **argv) {
    int perf = 0, correct = 1, tiny_only = 0, profile = 0, prefill = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf")) perf = 1;
        else if (!strcmp(argv[i], "--perf-only")) perf = 1, correct = 0;
        else if (!strcmp(argv[i], "--tiny")) tiny_only = 1; /* quick, e.g. under compute-sanitizer */
        else if (!strcmp(argv[i], "--profile")) profile = 1;  /* a few launches, for ncu */
        else if (!strcmp(argv[i], "--prefill")) prefill = 1, correct = 0; /* prefill sizes only */
        else if (!strcmp(argv[i], "--prefill-check")) prefill = 2, correct = 0; /* the same, no timings */
        else if (!strcmp(argv[i], "--prefill-linear")) prefill = 3, correct = 0; /* FP8 linear timings only */
        else if (!strcmp(argv[i], "--moe")) g_f16_ab = 1, correct = 0; /* MoE: FP16 vs FP8 mma, checks + timings */
        else if (!strcmp(argv[i], "--moe-wg")) g_wg_ab = 1, correct = 0; /* MoE: wgmma vs k_moe_gemm */
        else {
            fprintf(stderr, "usage: %s [--tiny] [--perf | --perf-only | --prefill | --moe [--perf] | --moe-wg [--perf]]\n",
                    argv[0]);
            return 2;
        }
    }
    init_tables();
    dsv4_err err = {0};
    DIE_IF(dsv4_cuda_ctx_create(0, &G, &err), err);
    printf("device: %s, %d SMs\n", dsv4_cuda_device_name(G), dsv4_cuda_sm_count(G));
    if (!tiny_only) DIE_IF(dsv4_cuda_measure_hbm(G, (size_t)4 << 30, &g_read_gbs, &g_copy_gbs, &err), err);
    printf("measured: HBM streaming read %.0f GB/s, device-to-device copy %.0f GB/s (read+write)\n\n",
           g_read_gbs, g_copy_gbs);
    moe_set flash = {0};
    int have_flash = 0;
    if (profile) { /* one call each at decode shapes: run under ncu */
        host_lin h1, h2;
        make_lin(&h1, DSV4_DT_F8_E4M3, 32768, 1024);
        make_lin(&h2, DSV4_DT_F8_E4M3, 4096, 8192);
        dsv4_cuda_weight w1, w2;
        DIE_IF(dsv4_cuda_weight_upload(G, &h1.lin, &w1, &err), err);
        DIE_IF(dsv4_cuda_weight_upload(G, &h2.lin, &w2, &err), err);
        float *hx = malloc((size_t)8 * 8192 * 4);
        fill_act(hx, (size_t)8 * 8192, 8192);
        float *dx = dup_up(hx, (size_t)8 * 8192 * 4), *dy = dalloc((size_t)8 * 32768 * 4);
        DIE_IF(dsv4_cuda_linear(G, &w1, dx, 1, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_linear(G, &w2, dx, 1, dy, 0, &err), err);
        moe_make(&flash, 256, 4096, 2048);
        int ids[36];
        float wts[36];
        pick_ids(ids, wts, 6, 6, 256);
        int *di = dup_up(ids, sizeof ids);
        float *dw = dup_up(wts, sizeof wts);
        DIE_IF(dsv4_cuda_moe(G, &flash.dev, dx, 1, di, dw, 6, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_moe(G, &flash.dev, dx, 6, di, dw, 6, NULL, dy, 0, &err), err);
        DIE_IF(dsv4_cuda_sync(G, &err), err);
        printf("profile launches done\n");
        return 0;
    }
    if (g_wg_ab) {
        printf("== MoE grouped GEMM: warpgroup MMA (DSV4_CUDA_MOE_WG=1/2) vs k_moe_gemm and the reference\n");
        moe_make(&flash, 256, 4096, 2048);
        have_flash = 1;
        const int ns[] = {64, 300, 1365, 4096, 8192};
        for (int i = 0; i < (tiny_only ? 2 : 5); i++) t_moe_wg(&flash, ns[i]); /* --tiny: for compute-sanitizer */
        printf("\nmoe wgmma correctness: %d passed, %d failed\n", n_pass, n_fail);
        if (perf) {
            printf("\n== MoE timings: k_moe_gemm, wgmma 64, wgmma 128 (graph replay)\n");
            perf_moe_prefill(&flash);
        }
        goto out;
    }
    if (g_f16_ab) {
        printf("== MoE expert kernels: FP16 mma (DSV4_CUDA_MOE_F16=1) vs FP8 mma (=0), bit for bit\n");
        moe_make(&flash, 256, 4096, 2048);
        have_flash = 1;
        const int dec[] = {1, 6, 64, 300};
        for (int i = 0; i < 4; i++) t_moe_f16(&flash, dec[i], -1);
        for (int cfg = 0; cfg <= MOE_CFGS; cfg++) t_moe_f16(&flash, 1365, cfg);
        t_moe_f16(&flash, 4096, 0);
        t_moe_f16(&flash, 8192, 0);
        printf("\nmoe f16 correctness: %d passed, %d failed\n", n_pass, n_fail);
        if (perf) {
            printf("\n== MoE timings, both forms (graph replay)\n");
            perf_moe(&flash);
            perf_moe_prefill(&flash);
        }
        goto out;
    }
    if (correct) {
        printf("== correctness: tiny shapes\n");
        t_act_quant(3, 256);
        t_act_quant(7, 4096);
        t_errors();
        t_linear("tiny", DSV4_DT_F8_E4M3, 128, 128, 1, 1e-3);
        t_linear("tiny", DSV4_DT_F8_E4M3, 256, 384, 3, 1e-3);
        t_linear("tiny", DSV4_DT_F8_E4M3, 128, 256, 13, 1e-3);
        t_linear("tiny", DSV4_DT_F8_E4M3, 128, 384, 8, 1e-3);
        t_linear("tiny", DSV4_DT_F8_E4M3, 384, 1024, 2, 1e-3);
        t_linear("tiny", DSV4_DT_F8_E4M3, 256, 512, 70, 1e-3);
        t_linear("tiny", DSV4_DT_I8, 16, 128, 1, 1e-3);
        t_linear("tiny", DSV4_DT_I8, 48, 256, 5, 1e-3);
        t_linear("tiny", DSV4_DT_I8, 32, 384, 20, 1e-3);
        t_linear("tiny", DSV4_DT_I8, 64, 128, 70, 1e-3);
        t_linear("tiny", DSV4_DT_BF16, 8, 16, 1, 1e-5);
        t_linear("tiny", DSV4_DT_BF16, 33, 64, 3, 1e-5);
        t_linear("tiny", DSV4_DT_BF16, 64, 128, 9, 1e-4);
        t_rmsnorm(3, 4096, 1);
        t_rmsnorm(2, 512, 0);
        moe_set tiny;
        moe_make(&tiny, 8, 256, 128);
        t_moe(&tiny, "tiny", 1, 3, 0, 5e-3);
        t_moe(&tiny, "tiny", 5, 3, 1, 5e-3);
        t_moe(&tiny, "tiny", 17, 3, 0, 5e-3);
        t_shared_quant(DSV4_DT_F8_E4M3, 256, 512, 3, NULL);
        t_shared_quant(DSV4_DT_F8_E4M3, 256, 512, 12, NULL);
        t_shared_quant(DSV4_DT_I8, 64, 256, 5, NULL);
        { const int64_t R3[3] = {128, 256, 384}; t_group(3, R3, 256, 3); t_group(3, R3, 256, 8); }
        moe_free(&tiny);
        if (tiny_only) goto done;

        printf("\n== correctness: Flash shapes (spec/MODEL.md §2.2)\n");
        t_linear("wq_b", DSV4_DT_F8_E4M3, 32768, 1024, 1, 1e-3);
        t_linear("wq_b", DSV4_DT_F8_E4M3, 32768, 1024, 6, 1e-3);
        t_linear("wo_b", DSV4_DT_F8_E4M3, 4096, 8192, 1, 1e-3);
        t_linear("wo_b", DSV4_DT_F8_E4M3, 4096, 8192, 64, 1e-3);
        t_linear("wq_a", DSV4_DT_F8_E4M3, 1024, 4096, 2, 1e-3);
        t_linear("wkv", DSV4_DT_F8_E4M3, 512, 4096, 1, 1e-3);
        t_linear("expert_w1", DSV4_DT_I8, 2048, 4096, 1, 1e-3);
        t_linear("expert_w2", DSV4_DT_I8, 4096, 2048, 6, 1e-3);
        t_linear("expert_w2", DSV4_DT_I8, 4096, 2048, 3, 1e-3);
        t_linear("shared_w2", DSV4_DT_F8_E4M3, 4096, 2048, 4, 1e-3);
        t_linear("cmp_wkv", DSV4_DT_BF16, 1024, 4096, 1, 1e-5);
        t_linear("cmp_wkv", DSV4_DT_BF16, 1024, 4096, 16, 1e-4);
        t_linear("head", DSV4_DT_BF16, 129280, 4096, 1, 1e-5);
        t_rmsnorm(6, 4096, 1);
        t_rmsnorm(64, 16384, 0);
        moe_make(&flash, 256, 4096, 2048);
        have_flash = 1;
        t_moe(&flash, "flash", 1, 6, 0, 5e-3);
        t_moe(&flash, "flash", 6, 6, 1, 5e-3);
        t_shared_quant(DSV4_DT_F8_E4M3, 1024, 4096, 1, NULL);
        { const int64_t R2[2] = {1024, 512}; t_group(2, R2, 4096, 1); t_group(2, R2, 4096, 6); }
        t_shared_quant(DSV4_DT_F8_E4M3, 0, 0, 6, &flash);
        printf("\ncorrectness: %d passed, %d failed\n", n_pass, n_fail);
    }
done:
    if (prefill) {
        printf("\n== prefill sizes: tiled GEMMs vs the decode kernels (correctness, then timings)\n");
        if (prefill == 3) goto linear_perf;
        if (!have_flash) {
            moe_make(&flash, 256, 4096, 2048);
            have_flash = 1;
        }
        t_linear_prefill("wo_b", 4096, 8192, 4096);
        t_linear_prefill("wq_a", 1024, 4096, 200);
        t_linear_prefill("wkv", 512, 4096, 77);
        t_linear_prefill("wq_b", 32768, 1024, 1000); /* cuBLASLt on 992 rows, the old kernel on 8 */
        t_moe_prefill(&flash, 1365);
        t_moe_prefill(&flash, 4096);
        t_moe_prefill(&flash, 8192);
        printf("\nprefill correctness: %d passed, %d failed\n\n", n_pass, n_fail);
        if (prefill == 2) goto out; /* --prefill-check: correctness only */
    linear_perf:
        perf_linear_prefill("wq_b 32768x1024", 32768, 1024);
        perf_linear_prefill("wo_b 4096x8192", 4096, 8192);
        perf_linear_prefill("wq_a 1024x4096", 1024, 4096);
        perf_linear_prefill("sh_w1 2048x4096", 2048, 4096);
        if (prefill == 3) goto out;
        perf_moe_prefill(&flash);
    }
    if (perf && !tiny_only) {
        printf("\n== perf: Flash shapes, CUDA-graph replay, weights rotated over copies (> L2)\n");
        printf("   bytes = weights (+scales) + activations in/out; %% of the measured streaming read\n");
        perf_read();
        perf_linear("wq_b", DSV4_DT_F8_E4M3, 32768, 1024);
        perf_linear("wo_b", DSV4_DT_F8_E4M3, 4096, 8192);
        perf_linear("wq_a", DSV4_DT_F8_E4M3, 1024, 4096);
        perf_linear("shared_w1", DSV4_DT_F8_E4M3, 2048, 4096);
        perf_linear("expert_w1", DSV4_DT_I8, 2048, 4096);
        perf_linear("cmp_wkv", DSV4_DT_BF16, 1024, 4096);
        perf_linear("head", DSV4_DT_BF16, 129280, 4096);
        if (!have_flash) {
            moe_make(&flash, 256, 4096, 2048);
            have_flash = 1;
        }
        perf_moe(&flash);
        printf("\n== perf: one decode layer's weight-streaming chain (11 ops, graph replay)\n");
        perf_chain(&flash);
    }
out:
    if (have_flash) moe_free(&flash);
    dsv4_cuda_ctx_free(G);
    printf("\n%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
