/*
 * cuda_be_ops.cu — the small ops of the CUDA op table: embedding, add,
 * RMSNorm (grouped, F32/BF16/no weight), RoPE, the QAT round-trips, clamped
 * SwiGLU, the hyper-connection mixes (pre / post / head), the window-ring
 * store and the router's tail (spec/MODEL.md §0, §3.1-3.6, §3.4.2-3.4.6).
 *
 * Why plain kernels: these ops move a few rows per step; they follow the
 * CPU reference (src/backend/cpu/) operation for operation so the
 * conformance harness can compare them at ~1e-7, and are written for
 * clarity, not speed (fusing them into the linears comes later,
 * bench/results/2026-11-30-gpu-ops-h200.md "What is still slow").
 */
#include "backend/cuda/cuda_be_internal.cuh"

#include <math.h>

#define LAUNCHED(what) CU_TRY(cudaGetLastError(), err, what)

static unsigned nblk(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

/* ------------------------------------------------------------------ embed */

__global__ void k_embed(const void *table, int bf16, int64_t d, int n_copies, const int32_t *tok,
                        float *out) {
    const int t = blockIdx.x;
    const int64_t row = tok[t];
    float *o = out + (int64_t)t * d * n_copies;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = cu_ldf(table, bf16, row * d + i);
        for (int c = 0; c < n_copies; c++) o[c * d + i] = v;
    }
}

int cu_be_embed(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                dsv4_buf *out, dsv4_err *err) {
    if (!table || !table->data || table->ndim != 2 ||
        (table->dtype != DSV4_DT_BF16 && table->dtype != DSV4_DT_F32) || n_copies < 1)
        return cu_err(err, DSV4_EINVAL, "cuda: embed: table must be BF16/F32 [V][d]");
    int64_t V = table->shape[0], d = table->shape[1];
    int rc = cu_be_check(out, DSV4_DT_F32, b->n_rows, d * n_copies, "embed out", err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++)
        if (b->token[t] < 0 || b->token[t] >= V)
            return cu_err(err, DSV4_EINVAL, "embed: token id %d at row %d outside vocabulary [0,%lld)",
                          b->token[t], t, (long long)V);
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    if (!b->n_rows) return DSV4_OK;
    k_embed<<<b->n_rows, 256, 0, cube(be)->ctx->stream>>>(table->data, table->dtype == DSV4_DT_BF16, d,
                                                          n_copies, tok, (float *)out->data);
    LAUNCHED("embed");
    return DSV4_OK;
}

/* -------------------------------------------------------------- add, swiglu */

__global__ void k_add(const float *a, const float *b, float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

int cu_be_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(a, DSV4_DT_F32, -1, -1, "add a", err);
    if (!rc) rc = cu_be_check(b, DSV4_DT_F32, a->rows, a->cols, "add b", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, a->rows, a->cols, "add y", err);
    if (rc) return rc;
    int64_t n = a->rows * a->cols;
    if (!n) return DSV4_OK;
    k_add<<<nblk(n, 256), 256, 0, cube(be)->ctx->stream>>>((const float *)a->data, (const float *)b->data,
                                                          (float *)y->data, n);
    LAUNCHED("add");
    return DSV4_OK;
}

__global__ void k_swiglu(const float *g, const float *u, float limit, float *h, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gv = fminf(g[i], limit), uv = fminf(fmaxf(u[i], -limit), limit);
    h[i] = gv / (1.0f + expf(-gv)) * uv;
}

int cu_be_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit, dsv4_buf *h,
                 dsv4_err *err) {
    int rc = cu_be_check(g, DSV4_DT_F32, -1, -1, "swiglu g", err);
    if (!rc) rc = cu_be_check(u, DSV4_DT_F32, g->rows, g->cols, "swiglu u", err);
    if (!rc) rc = cu_be_check(h, DSV4_DT_F32, g->rows, g->cols, "swiglu h", err);
    if (rc) return rc;
    int64_t n = g->rows * g->cols;
    if (!n) return DSV4_OK;
    k_swiglu<<<nblk(n, 256), 256, 0, cube(be)->ctx->stream>>>((const float *)g->data, (const float *)u->data,
                                                             limit, (float *)h->data, n);
    LAUNCHED("swiglu");
    return DSV4_OK;
}

/* ----------------------------------------------------------------- rmsnorm */

/* Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __syncthreads(); /* part[] may still be read from a previous call */
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i];
    return s;
}

/* One block per group of `group` elements. */
__global__ void k_rmsnorm_g(const float *x, const void *w, int wbf16, int group, float eps, float *y) {
    const int64_t g0 = (int64_t)blockIdx.x * group;
    float ss = 0.f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += x[g0 + i] * x[g0 + i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) {
        float v = x[g0 + i] * r;
        y[g0 + i] = w ? v * cu_ldf(w, wbf16, i) : v;
    }
}

int cu_be_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group, float eps,
                  dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "rmsnorm x", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, x->rows, x->cols, "rmsnorm y", err);
    if (!rc && (group <= 0 || x->cols % group))
        rc = cu_err(err, DSV4_EINVAL, "cuda: rmsnorm: group %d does not divide %lld", group, (long long)x->cols);
    if (!rc && weight) rc = cu_be_check_vec(weight, group, "rmsnorm weight", err);
    if (rc) return rc;
    int64_t ng = x->rows * (x->cols / group);
    if (!ng) return DSV4_OK;
    int th = group >= 1024 ? 1024 : group >= 256 ? 256 : 128;
    k_rmsnorm_g<<<(unsigned)ng, th, 0, cube(be)->ctx->stream>>>(
        (const float *)x->data, weight ? weight->data : NULL, weight && weight->dtype == DSV4_DT_BF16, group, eps,
        (float *)y->data);
    LAUNCHED("rmsnorm");
    return DSV4_OK;
}

/* -------------------------------------------------------------------- rope */

/* One block per (row, head); thread i rotates pair i of the last rope_dim dims. */
__global__ void k_rope(float *x, int head_dim, int nh, dsv4_rope r, const int32_t *pos, int inverse) {
    const int t = blockIdx.x / nh;
    float *h = x + (int64_t)blockIdx.x * head_dim + head_dim - r.rope_dim;
    const int i = threadIdx.x;
    if (i >= r.rope_dim / 2) return;
    const float ang = (float)pos[t] * r.freq[i];
    const float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
    const float a = h[2 * i], b = h[2 * i + 1];
    h[2 * i] = a * c - b * s;
    h[2 * i + 1] = a * s + b * c;
}

int cu_be_rope(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope, const dsv4_batch *b,
               int inverse, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, b->n_rows, -1, "rope x", err);
    if (!rc && (!rope || head_dim <= 0 || x->cols % head_dim || rope->rope_dim > head_dim || rope->rope_dim <= 0 ||
                rope->rope_dim % 2 || rope->rope_dim > 2 * DSV4_ROPE_MAX_PAIRS))
        rc = cu_err(err, DSV4_EINVAL, "cuda: rope: head_dim %d vs cols %lld / rope_dim %d", head_dim,
                    (long long)x->cols, rope ? rope->rope_dim : -1);
    if (rc) return rc;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    int nh = (int)(x->cols / head_dim);
    if (!b->n_rows || !nh) return DSV4_OK;
    k_rope<<<(unsigned)(b->n_rows * nh), 64, 0, cube(be)->ctx->stream>>>((float *)x->data, head_dim, nh, *rope,
                                                                         pos, inverse);
    LAUNCHED("rope");
    return DSV4_OK;
}

/* -------------------------------------------------------------------- QAT */

/* One thread per block of `block` values: FP8 round-trip with a pow2 scale. */
__global__ void k_qat_fp8(float *x, int head_dim, int n_quant, int block, int64_t nblocks) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nblocks) return;
    const int per_head = n_quant / block;
    float *p = x + (i / per_head) * head_dim + (i % per_head) * block;
    float amax = 0.f;
    for (int k = 0; k < block; k++) amax = fmaxf(amax, fabsf(p[k]));
    const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
    for (int k = 0; k < block; k++) p[k] = e4m3_round(p[k] / s) * s;
}

int cu_be_qat_fp8(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "qat_fp8 x", err);
    if (!rc && (head_dim <= 0 || x->cols % head_dim || block <= 0 || n_quant % block || n_quant > head_dim))
        rc = cu_err(err, DSV4_EINVAL, "cuda: qat_fp8: head_dim %d, n_quant %d, block %d", head_dim, n_quant, block);
    if (rc) return rc;
    int64_t nb = x->rows * (x->cols / head_dim) * (n_quant / block);
    if (!nb) return DSV4_OK;
    k_qat_fp8<<<nblk(nb, 128), 128, 0, cube(be)->ctx->stream>>>((float *)x->data, head_dim, n_quant, block, nb);
    LAUNCHED("qat_fp8");
    return DSV4_OK;
}

/* One block of head_dim threads per head: Sylvester Hadamard (same butterfly
 * order and scaling as the CPU reference), then FP4 round-trip per 32 (one warp). */
__global__ void k_qat_hadamard_fp4(float *x, int n) {
    extern __shared__ float v[];
    float *p = x + (int64_t)blockIdx.x * n;
    const int i = threadIdx.x;
    v[i] = p[i];
    __syncthreads();
    for (int h = 1; h < n; h *= 2) {
        /* thread i owns the pair (j, j+h) with j = (i / h)·2h + i % h, for i < n/2 */
        float a = 0.f, b = 0.f;
        int j = 0;
        if (i < n / 2) {
            j = (i / h) * 2 * h + i % h;
            a = v[j];
            b = v[j + h];
        }
        __syncthreads();
        if (i < n / 2) {
            v[j] = a + b;
            v[j + h] = a - b;
        }
        __syncthreads();
    }
    const float s = 1.0f / sqrtf((float)n);
    float val = v[i] * s;
    float amax = fabsf(val);
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = pow2_ceil(fmaxf(amax, 6.0f * 1.1754943508222875e-38f) / 6.0f);
    p[i] = e2m1_round(val / sc) * sc;
}

int cu_be_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "qat_hadamard_fp4 x", err);
    if (!rc && (head_dim < 32 || head_dim > 1024 || (head_dim & (head_dim - 1)) || x->cols % head_dim))
        rc = cu_err(err, DSV4_EINVAL, "cuda: qat_hadamard_fp4: head_dim %d not a power of two in [32,1024]",
                    head_dim);
    if (rc) return rc;
    int64_t nh = x->rows * (x->cols / head_dim);
    if (!nh) return DSV4_OK;
    k_qat_hadamard_fp4<<<(unsigned)nh, head_dim, head_dim * sizeof(float), cube(be)->ctx->stream>>>(
        (float *)x->data, head_dim);
    LAUNCHED("qat_hadamard_fp4");
    return DSV4_OK;
}

/* ------------------------------------------------------- hyper-connections */

#define HC_MAXM 24 /* n_hc*(2+n_hc) for n_hc <= 4 (Flash: 4) */

/* m[k] = (fn[k]·x)·(mean(x²)+eps)^-½ for k < n_out, into shared m[]; one block per row. */
__device__ void hc_mixes(const float *x, int64_t n, const void *fn, int fbf16, int n_out, float eps, float *m) {
    float acc[HC_MAXM], ss = 0.f;
#pragma unroll
    for (int k = 0; k < HC_MAXM; k++) acc[k] = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float xi = x[i];
        ss += xi * xi;
#pragma unroll
        for (int k = 0; k < HC_MAXM; k++)
            if (k < n_out) acc[k] += cu_ldf(fn, fbf16, (int64_t)k * n + i) * xi;
    }
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int k = 0; k < n_out; k++) {
        const float s = block_sum(acc[k]);
        if (threadIdx.x == 0) m[k] = s * r;
    }
    __syncthreads();
}

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void k_hc_pre(const float *X, int64_t n, int n_hc, const void *fn, int fbf16, const void *base,
                         int bbf16, const void *scale, int sbf16, int iters, float eps, float *y, float *post,
                         float *comb) {
    __shared__ float m[HC_MAXM], pre[4];
    const int t = blockIdx.x;
    const float *x = X + (int64_t)t * n;
    const int nm = n_hc * (2 + n_hc);
    const int64_t d = n / n_hc;
    hc_mixes(x, n, fn, fbf16, nm, eps, m);
    if (threadIdx.x == 0) {
        const float s0 = cu_ldf(scale, sbf16, 0), s1 = cu_ldf(scale, sbf16, 1), s2 = cu_ldf(scale, sbf16, 2);
        float *po = post + (int64_t)t * n_hc, *C = comb + (int64_t)t * n_hc * n_hc;
        for (int h = 0; h < n_hc; h++) {
            pre[h] = sigm(m[h] * s0 + cu_ldf(base, bbf16, h)) + eps;
            po[h] = 2.0f * sigm(m[n_hc + h] * s1 + cu_ldf(base, bbf16, n_hc + h));
        }
        float c[16];
        for (int k = 0; k < n_hc * n_hc; k++) c[k] = m[2 * n_hc + k] * s2 + cu_ldf(base, bbf16, 2 * n_hc + k);
        /* Sinkhorn (§3.2.4): row softmax + eps, then column / (row, column) passes */
        for (int i = 0; i < n_hc; i++) {
            float mx = -INFINITY, s = 0.f;
            for (int j = 0; j < n_hc; j++) mx = fmaxf(mx, c[i * n_hc + j]);
            for (int j = 0; j < n_hc; j++) s += c[i * n_hc + j] = expf(c[i * n_hc + j] - mx);
            for (int j = 0; j < n_hc; j++) c[i * n_hc + j] = c[i * n_hc + j] / s + eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0)
                for (int i = 0; i < n_hc; i++) {
                    float s = 0.f;
                    for (int j = 0; j < n_hc; j++) s += c[i * n_hc + j];
                    for (int j = 0; j < n_hc; j++) c[i * n_hc + j] /= s + eps;
                }
            for (int j = 0; j < n_hc; j++) {
                float s = 0.f;
                for (int i = 0; i < n_hc; i++) s += c[i * n_hc + j];
                for (int i = 0; i < n_hc; i++) c[i * n_hc + j] /= s + eps;
            }
        }
        for (int k = 0; k < n_hc * n_hc; k++) C[k] = c[k];
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.f;
        for (int h = 0; h < n_hc; h++) acc += pre[h] * x[h * d + i];
        y[(int64_t)t * d + i] = acc;
    }
}

static int vec_bf16(const dsv4_tview *v) { return v->dtype == DSV4_DT_BF16; }

int cu_be_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                 const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y, dsv4_buf *post,
                 dsv4_buf *comb, dsv4_err *err) {
    if (n_hc <= 0 || n_hc > 16 || iters < 1)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_pre: n_hc %d / iters %d", n_hc, iters);
    if (n_hc > 4)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: hc_pre: n_hc %d > 4 not implemented", n_hc);
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_pre X", err);
    if (!rc && X->cols % n_hc) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_pre: cols %% n_hc");
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc, nm = n_hc * (2 + n_hc);
    if (!rc) rc = cu_be_check_vec(fn, nm * n, "hc fn", err);
    if (!rc) rc = cu_be_check_vec(base, nm, "hc base", err);
    if (!rc) rc = cu_be_check_vec(scale, 3, "hc scale", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "hc_pre y", err);
    if (!rc) rc = cu_be_check(post, DSV4_DT_F32, T, n_hc, "hc_pre post", err);
    if (!rc) rc = cu_be_check(comb, DSV4_DT_F32, T, n_hc * n_hc, "hc_pre comb", err);
    if (rc) return rc;
    if (!T) return DSV4_OK;
    k_hc_pre<<<(unsigned)T, 256, 0, cube(be)->ctx->stream>>>(
        (const float *)X->data, n, n_hc, fn->data, vec_bf16(fn), base->data, vec_bf16(base), scale->data,
        vec_bf16(scale), iters, eps, (float *)y->data, (float *)post->data, (float *)comb->data);
    LAUNCHED("hc_pre");
    return DSV4_OK;
}

__global__ void k_hc_post(const float *X, const float *f, const float *post, const float *comb, int n_hc,
                          int64_t d, int64_t total, float *Xo) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    const int64_t t = e / (n_hc * d), r = e % (n_hc * d);
    const int j = (int)(r / d);
    const int64_t k = r % d;
    const float *x = X + t * n_hc * d, *C = comb + t * n_hc * n_hc;
    float acc = post[t * n_hc + j] * f[t * d + k];
    for (int i = 0; i < n_hc; i++) acc += C[i * n_hc + j] * x[i * d + k];
    Xo[e] = acc;
}

int cu_be_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                  const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_post X", err);
    if (!rc && (n_hc <= 0 || X->cols % n_hc)) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post: n_hc %d", n_hc);
    if (rc) return rc;
    int64_t T = X->rows, d = X->cols / n_hc;
    rc = cu_be_check(f, DSV4_DT_F32, T, d, "hc_post f", err);
    if (!rc) rc = cu_be_check(post, DSV4_DT_F32, T, n_hc, "hc_post post", err);
    if (!rc) rc = cu_be_check(comb, DSV4_DT_F32, T, n_hc * n_hc, "hc_post comb", err);
    if (!rc) rc = cu_be_check(Xout, DSV4_DT_F32, T, X->cols, "hc_post Xout", err);
    if (!rc && Xout->data == X->data) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post: Xout aliases X");
    if (rc) return rc;
    int64_t total = T * X->cols;
    if (!total) return DSV4_OK;
    k_hc_post<<<nblk(total, 256), 256, 0, cube(be)->ctx->stream>>>(
        (const float *)X->data, (const float *)f->data, (const float *)post->data, (const float *)comb->data, n_hc,
        d, total, (float *)Xout->data);
    LAUNCHED("hc_post");
    return DSV4_OK;
}

__global__ void k_hc_head(const float *X, int64_t n, int n_hc, const void *fn, int fbf16, const void *base,
                          int bbf16, const void *scale, int sbf16, float eps, float *y) {
    __shared__ float m[HC_MAXM], pre[16];
    const int t = blockIdx.x;
    const float *x = X + (int64_t)t * n;
    const int64_t d = n / n_hc;
    hc_mixes(x, n, fn, fbf16, n_hc, eps, m);
    if (threadIdx.x == 0) {
        const float s0 = cu_ldf(scale, sbf16, 0);
        for (int h = 0; h < n_hc; h++) pre[h] = sigm(m[h] * s0 + cu_ldf(base, bbf16, h)) + eps;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.f;
        for (int h = 0; h < n_hc; h++) acc += pre[h] * x[h * d + i];
        y[(int64_t)t * d + i] = acc;
    }
}

int cu_be_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                  const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_head X", err);
    if (!rc && (n_hc <= 0 || n_hc > 16 || X->cols % n_hc)) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_head: n_hc %d", n_hc);
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc;
    rc = cu_be_check_vec(fn, n_hc * n, "hc_head fn", err);
    if (!rc) rc = cu_be_check_vec(base, n_hc, "hc_head base", err);
    if (!rc) rc = cu_be_check_vec(scale, 1, "hc_head scale", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "hc_head y", err);
    if (rc) return rc;
    if (!T) return DSV4_OK;
    k_hc_head<<<(unsigned)T, 256, 0, cube(be)->ctx->stream>>>((const float *)X->data, n, n_hc, fn->data, vec_bf16(fn),
                                                              base->data, vec_bf16(base), scale->data,
                                                              vec_bf16(scale), eps, (float *)y->data);
    LAUNCHED("hc_head");
    return DSV4_OK;
}

/* --------------------------------------------------------------- win_store */

/* One block per row. A chunk longer than the ring writes a ring row more than
 * once; the reference's row order keeps the last, so only the last `cap` rows
 * of a segment write (no two blocks race on a ring row). */
__global__ void k_win_store(float *rows, const float *kv, int64_t hd, int cap, const int32_t *pos,
                            const int32_t *slot, const int32_t *r1) {
    const int t = blockIdx.x;
    if (t + cap < r1[t]) return;
    const int64_t r = (int64_t)slot[t] * cap + pos[t] % cap;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) rows[r * hd + i] = kv[(int64_t)t * hd + i];
}

int cu_be_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                    dsv4_err *err) {
    int rc = cu_be_check(kv, DSV4_DT_F32, b->n_rows, -1, "win_store kv", err);
    if (!rc && (!ws || ws->cap <= 0))
        rc = cu_err(err, DSV4_EINVAL, "cuda: win_store: no window state");
    if (!rc && ws->rows.dtype != DSV4_DT_F32)
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: win_store: window ring dtype %d (only F32 rings implemented)",
                    (int)ws->rows.dtype);
    if (!rc) rc = cu_be_check(&ws->rows, DSV4_DT_F32, (int64_t)ws->n_slots * ws->cap, kv->cols, "window ring", err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++)
        if (b->slot[t] < 0 || b->slot[t] >= ws->n_slots || b->pos[t] < 0)
            return cu_err(err, DSV4_EINVAL, "win_store: slot %d / position %d of row %d out of range", b->slot[t],
                          b->pos[t], t);
    const int32_t *tok, *pos, *slot, *p0, *r0, *r1;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err)) || (rc = cu_be_batch_seg(be, b, &p0, &r0, &r1, err)))
        return rc;
    if (!b->n_rows) return DSV4_OK;
    k_win_store<<<b->n_rows, 128, 0, cube(be)->ctx->stream>>>((float *)ws->rows.data, (const float *)kv->data,
                                                              kv->cols, ws->cap, pos, slot, r1);
    LAUNCHED("win_store");
    return DSV4_OK;
}

/* ------------------------------------------------------------- router tail */

/* One thread per row: a = sqrt(softplus(l)); top-k of a + bias (ties -> lower
 * id) or the hash table's ids; weights = a[ids]/Σ · route_scale. bad[0] is set
 * when a hash id is out of range. */
__global__ void k_route(const float *logits, int T, int E, const void *bias, int bbf16, const int64_t *tid2eid,
                        const int32_t *tok, int k, float route_scale, int32_t *ids, float *wts, int *bad) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *l = logits + (int64_t)t * E;
    int32_t *id = ids + (int64_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        if (tid2eid) {
            const int64_t e = tid2eid[(int64_t)tok[t] * k + j];
            if (e < 0 || e >= E) {
                atomicExch(bad, 1); /* reported by the caller; any valid id keeps the kernel in bounds */
                best = 0;
            } else {
                best = (int)e;
            }
        } else {
            float bv = -INFINITY;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int jj = 0; jj < j; jj++) taken |= id[jj] == e;
                if (taken) continue;
                const float x = l[e];
                const float a = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
                const float v = a + (bias ? cu_ldf(bias, bbf16, e) : 0.0f);
                if (best < 0 || v > bv) {
                    best = e;
                    bv = v;
                }
            }
        }
        id[j] = best;
    }
    float s = 0.f;
    for (int j = 0; j < k; j++) {
        const float x = l[id[j]];
        s += sqrtf(x > 20.0f ? x : log1pf(expf(x)));
    }
    for (int j = 0; j < k; j++) {
        const float x = l[id[j]];
        wts[(int64_t)t * k + j] = sqrtf(x > 20.0f ? x : log1pf(expf(x))) / s * route_scale;
    }
}

int cu_be_route_tail(dsv4_backend *be, const float *logits, int T, int E, const dsv4_tview *bias,
                     const dsv4_tview *tid2eid, const int32_t *d_token, int k, float route_scale, int32_t *ids,
                     float *weights, dsv4_err *err) {
    cu_be *cb = cube(be);
    /* hash routing: a bad table entry sets the backend's deferred flag, reported by `sync` */
    int *bad = tid2eid ? cb->d_flags : NULL;
    k_route<<<nblk(T, 64), 64, 0, cb->ctx->stream>>>(logits, T, E, bias ? bias->data : NULL,
                                                     bias && bias->dtype == DSV4_DT_BF16,
                                                     tid2eid ? (const int64_t *)tid2eid->data : NULL, d_token, k,
                                                     route_scale, ids, weights, bad);
    LAUNCHED("moe_route");
    return DSV4_OK;
}

/* ---------------------------------------------------------------- hc_mean */

/* y[t][col0 + k] = (Σ_h X[t][h*d + k]) / n_hc, summed in h order like the CPU path. */
__global__ void k_hc_mean(const float *X, int n_hc, int64_t d, float *y, int64_t ycols, int64_t col0) {
    const int64_t t = blockIdx.y;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d; k += (int64_t)gridDim.x * blockDim.x) {
        const float *x = X + t * n_hc * d + k;
        float acc = 0.f;
        for (int h = 0; h < n_hc; h++) acc += x[h * d];
        y[t * ycols + col0 + k] = acc / (float)n_hc;
    }
}

int cu_be_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_mean X", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, X->rows, -1, "hc_mean y", err);
    if (rc) return rc;
    if (n_hc <= 0 || X->cols % n_hc) return cu_err(err, DSV4_EINVAL, "cuda: hc_mean: %lld columns, %d streams",
                                                   (long long)X->cols, n_hc);
    int64_t d = X->cols / n_hc;
    if (col0 < 0 || col0 + d > y->cols)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_mean: columns [%lld,%lld) outside y (%lld)", (long long)col0,
                      (long long)(col0 + d), (long long)y->cols);
    if (!X->rows || !d) return DSV4_OK;
    dim3 grid((unsigned)((d + 255) / 256 < 16 ? (d + 255) / 256 : 16), (unsigned)X->rows);
    k_hc_mean<<<grid, 256, 0, cube(be)->ctx->stream>>>((const float *)X->data, n_hc, d, (float *)y->data, y->cols,
                                                       col0);
    LAUNCHED("hc_mean");
    return DSV4_OK;
}
