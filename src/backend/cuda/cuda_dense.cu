/*
 * cuda_dense.cu — BF16 linears (compressors, indexer weights_proj, router
 * gate, LM head: spec/MODEL.md §2.4 "plain matmuls ... in fp32, weights
 * upcast") and RMSNorm (§3.10).
 *
 * BF16 weights against fp32 activations: for a few rows a warp-per-row GEMV
 * reads the weights once and is exact fp32 math. For more rows cuBLAS runs
 * two bf16 GEMMs with fp32 accumulation on x = hi + lo (both bf16): the
 * weights are exactly bf16, so the product differs from the fp32 reference
 * only by the ~2^-17 relative part of x that hi + lo does not hold.
 */
#include "backend/cuda/cuda_internal.cuh"

#define BF16_GEMV_MAX 4

template <int NTOK>
__global__ void __launch_bounds__(256) k_bf16_gemv(const uint16_t *__restrict__ W,
                                                   const float *__restrict__ x, int R, int K,
                                                   float *__restrict__ y, int flags) {
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= R) return;
    const uint16_t *wr = W + (size_t)row * K;
    float acc[NTOK];
#pragma unroll
    for (int i = 0; i < NTOK; i++) acc[i] = 0.f;
    for (int k = lane * 8; k < K; k += 32 * 8) {
        const uint4 wv = ld_stream(wr + k);
        const uint32_t ww[4] = {wv.x, wv.y, wv.z, wv.w};
        float wf[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wf[2 * j] = __uint_as_float(ww[j] << 16);
            wf[2 * j + 1] = __uint_as_float(ww[j] & 0xffff0000u);
        }
#pragma unroll
        for (int i = 0; i < NTOK; i++) {
            const float4 a = __ldg((const float4 *)(x + (size_t)i * K + k));
            const float4 b = __ldg((const float4 *)(x + (size_t)i * K + k + 4));
            acc[i] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                      wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
        }
    }
#pragma unroll
    for (int i = 0; i < NTOK; i++) {
        float v = acc[i];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[(size_t)i * R + row] = (flags & DSV4_CUDA_OUT_BF16) ? round_bf16(v) : v;
    }
}

/* x fp32 -> hi = bf16(x), lo = bf16(x - hi) */
__global__ void k_split_bf16(const float *__restrict__ x, size_t n, __nv_bfloat16 *hi,
                             __nv_bfloat16 *lo) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
}

__global__ void k_round_bf16(float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = round_bf16(y[i]);
}

/*
 * The same GEMV for up to BF16_GROUP_MAX weights that read one x, in one
 * launch (issue 7: at decode a ratio-4 layer ran five k_bf16_gemv, the
 * compressor's and the indexer's wkv / wgate and weights_proj, each a
 * latency chain of 2-10 µs with 8-128 blocks on 132 SMs). Block b serves
 * the weight i with blk0[i] <= b < blk0[i+1], one warp per output row, as
 * k_bf16_gemv. Each lane issues BF16_GEMV_U weight loads before using any
 * (the old kernel had one 16-byte load in flight per lane), the first
 * BF16_GEMV_U before griddepcontrol.wait (weights never depend on the
 * previous kernel). Per row the products and sums are k_bf16_gemv's, in the
 * same order: every output is bit-identical to it.
 */
#define BF16_GROUP_MAX 8
#define BF16_GEMV_U 8

struct Bf16Group {
    const uint16_t *W[BF16_GROUP_MAX];
    float *y[BF16_GROUP_MAX];
    int R[BF16_GROUP_MAX];
    int blk0[BF16_GROUP_MAX + 1];
    int nw;
};

template <int NTOK>
__global__ void __launch_bounds__(256) k_bf16_gemv_g(const Bf16Group g, const float *__restrict__ x, int K,
                                                     int flags) {
    pdl_trigger();
    int wi = 0;
    while (wi + 1 < g.nw && (int)blockIdx.x >= g.blk0[wi + 1]) wi++;
    const int lane = threadIdx.x & 31;
    const int R = g.R[wi];
    const int row = ((int)blockIdx.x - g.blk0[wi]) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= R) {
        pdl_wait();
        return;
    }
    const uint16_t *wr = g.W[wi] + (size_t)row * K;
    float acc[NTOK];
#pragma unroll
    for (int i = 0; i < NTOK; i++) acc[i] = 0.f;
    uint4 wv[BF16_GEMV_U];
#pragma unroll
    for (int u = 0; u < BF16_GEMV_U; u++) {
        const int k = lane * 8 + u * 32 * 8;
        wv[u] = k < K ? ld_stream(wr + k) : make_uint4(0u, 0u, 0u, 0u);
    }
    pdl_wait();
    for (int k0 = lane * 8; k0 < K; k0 += BF16_GEMV_U * 32 * 8) {
        if (k0 != lane * 8) {
#pragma unroll
            for (int u = 0; u < BF16_GEMV_U; u++) {
                const int k = k0 + u * 32 * 8;
                wv[u] = k < K ? ld_stream(wr + k) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < BF16_GEMV_U; u++) {
            const int k = k0 + u * 32 * 8;
            if (k >= K) break;
            const uint32_t ww[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
            float wf[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                wf[2 * j] = __uint_as_float(ww[j] << 16);
                wf[2 * j + 1] = __uint_as_float(ww[j] & 0xffff0000u);
            }
#pragma unroll
            for (int i = 0; i < NTOK; i++) {
                const float4 a = __ldg((const float4 *)(x + (size_t)i * K + k));
                const float4 b = __ldg((const float4 *)(x + (size_t)i * K + k + 4));
                acc[i] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                          wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
            }
        }
    }
    float *y = g.y[wi];
#pragma unroll
    for (int i = 0; i < NTOK; i++) {
        float v = acc[i];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[(size_t)i * R + row] = (flags & DSV4_CUDA_OUT_BF16) ? round_bf16(v) : v;
    }
}

/* The old one-launch-per-weight GEMV (DSV4_CUDA_BF16_GEMV=0). */
static int bf16_gemv_old(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, int n, float *y, int flags,
                         dsv4_err *err) {
    const int R = (int)w->out, K = (int)w->in;
    for (int t0 = 0; t0 < n; t0 += BF16_GEMV_MAX) {
        const int nn = n - t0 < BF16_GEMV_MAX ? n - t0 : BF16_GEMV_MAX;
        dim3 grid((unsigned)((R + 7) / 8));
        const float *xx = x + (size_t)t0 * K;
        float *yy = y + (size_t)t0 * R;
        const uint16_t *W = (const uint16_t *)w->w;
        cudaError_t e;
        switch (nn) {
        case 1: e = cu_launch(c, k_bf16_gemv<1>, grid, dim3(256), 0, W, xx, R, K, yy, flags); break;
        case 2: e = cu_launch(c, k_bf16_gemv<2>, grid, dim3(256), 0, W, xx, R, K, yy, flags); break;
        case 3: e = cu_launch(c, k_bf16_gemv<3>, grid, dim3(256), 0, W, xx, R, K, yy, flags); break;
        default: e = cu_launch(c, k_bf16_gemv<4>, grid, dim3(256), 0, W, xx, R, K, yy, flags); break;
        }
        CU_TRY(e, err, "bf16 gemv");
    }
    return DSV4_OK;
}

/* nw (<= BF16_GROUP_MAX) weights of in-dim K against n (<= BF16_GEMV_MAX) rows of x: one launch per
 * BF16_GEMV_MAX rows. */
static int bf16_gemv_group(dsv4_cuda_ctx *c, int nw, const dsv4_cuda_weight *const *w, const float *x, int n,
                           float *const *y, int flags, dsv4_err *err) {
    const int K = (int)w[0]->in;
    for (int t0 = 0; t0 < n; t0 += BF16_GEMV_MAX) {
        const int nn = n - t0 < BF16_GEMV_MAX ? n - t0 : BF16_GEMV_MAX;
        Bf16Group g;
        memset(&g, 0, sizeof g);
        g.nw = nw;
        for (int i = 0; i < nw; i++) {
            g.W[i] = (const uint16_t *)w[i]->w;
            g.R[i] = (int)w[i]->out;
            g.y[i] = y[i] + (size_t)t0 * w[i]->out;
            g.blk0[i + 1] = g.blk0[i] + (g.R[i] + 7) / 8;
        }
        const dim3 grid((unsigned)g.blk0[nw]);
        const float *xx = x + (size_t)t0 * K;
        cudaError_t e;
        switch (nn) {
        case 1: e = cu_launch(c, k_bf16_gemv_g<1>, grid, dim3(256), 0, g, xx, K, flags); break;
        case 2: e = cu_launch(c, k_bf16_gemv_g<2>, grid, dim3(256), 0, g, xx, K, flags); break;
        case 3: e = cu_launch(c, k_bf16_gemv_g<3>, grid, dim3(256), 0, g, xx, K, flags); break;
        default: e = cu_launch(c, k_bf16_gemv_g<4>, grid, dim3(256), 0, g, xx, K, flags); break;
        }
        CU_TRY(e, err, "bf16 gemv (group)");
    }
    return DSV4_OK;
}

/* x [n][K] -> hi, lo bf16 parts in the context's workspace. */
static int bf16_split(dsv4_cuda_ctx *c, const float *x, int n, int K, __nv_bfloat16 **hi, __nv_bfloat16 **lo,
                      dsv4_err *err) {
    const size_t ne = (size_t)n * K;
    void *ws = NULL;
    int rc = cu_workspace(c, 2 * cu_align(ne * 2), &ws, err);
    if (rc) return rc;
    *hi = (__nv_bfloat16 *)ws;
    *lo = (__nv_bfloat16 *)((uint8_t *)ws + cu_align(ne * 2));
    k_split_bf16<<<(unsigned)((ne + 255) / 256), 256, 0, c->stream>>>(x, ne, *hi, *lo);
    CU_LAUNCHED(err, "bf16 split");
    return DSV4_OK;
}

/* y = W·x (beta 0) or y += W·x (beta 1) for bf16 x [n][K], fp32 out, through cu_lt_gemm (bucketed
 * algorithm: no per-exact-n first-use cost). DSV4_EUNSUPPORTED, nothing launched: use cublasGemmEx. */
static int bf16_lt(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const __nv_bfloat16 *x, int n, float *y,
                   float beta) {
    const int R = (int)w->out, K = (int)w->in;
    const cu_lt_shape sh = {CU_LT_BF16, R, K, CUDA_R_16BF, CUDA_R_32F, K, R, 1, 0, 0};
    return cu_lt_gemm(c, &sh, K, 0, w->w, x, n, beta, y);
}

/* y = W·(hi + lo) as two bf16 GEMMs with fp32 accumulation (hi, lo from bf16_split): cuBLASLt with
 * bucketed algorithms (bf16_lt), else cublasGemmEx. */
static int bf16_gemm_split(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const __nv_bfloat16 *hi,
                           const __nv_bfloat16 *lo, int n, float *y, int flags, dsv4_err *err) {
    const int R = (int)w->out, K = (int)w->in;
    /* column-major view: yᵀ [R, n] = W(as [K, R])ᵀ · xᵀ [K, n] */
    const float one = 1.f, zero = 0.f;
    if (bf16_lt(c, w, hi, n, y, 0.f) != DSV4_OK || bf16_lt(c, w, lo, n, y, 1.f) != DSV4_OK) {
        CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, R, n, K, &one, w->w, CUDA_R_16BF, K,
                                hi, CUDA_R_16BF, K, &zero, y, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   err, "bf16 linear (hi)");
        CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, R, n, K, &one, w->w, CUDA_R_16BF, K,
                                lo, CUDA_R_16BF, K, &one, y, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   err, "bf16 linear (lo)");
    }
    if (flags & DSV4_CUDA_OUT_BF16) {
        size_t ny = (size_t)n * R;
        k_round_bf16<<<(unsigned)((ny + 255) / 256), 256, 0, c->stream>>>(y, ny);
        CU_LAUNCHED(err, "bf16 round");
    }
    return DSV4_OK;
}

int cu_bf16_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, int n, float *y,
                   int flags, dsv4_err *err) {
    const int K = (int)w->in;
    if (n <= BF16_GEMV_MAX && K % 8 == 0) {
        if (c->bf16_mode <= 0) return bf16_gemv_old(c, w, x, n, y, flags, err);
        return bf16_gemv_group(c, 1, &w, x, n, &y, flags, err);
    }
    __nv_bfloat16 *hi = NULL, *lo = NULL;
    int rc = bf16_split(c, x, n, K, &hi, &lo, err);
    return rc ? rc : bf16_gemm_split(c, w, hi, lo, n, y, flags, err);
}

/*
 * y[i] = cu_bf16_linear(w[i], x) for nw BF16 weights of one in-dim, each
 * output bit-identical to it: up to BF16_GEMV_MAX rows, BF16_GROUP_MAX
 * weights per k_bf16_gemv_g launch; more rows, x split into hi + lo once
 * and two cuBLAS GEMMs per weight (the same calls as one by one).
 * DSV4_CUDA_BF16_GEMV < 2: one by one.
 */
int cu_bf16_linear_group(dsv4_cuda_ctx *c, int nw, const dsv4_cuda_weight *const *w, const float *x, int n,
                         float *const *y, int flags, dsv4_err *err) {
    const int K = (int)w[0]->in;
    int grouped = c->bf16_mode >= 2;
    for (int i = 0; i < nw; i++)
        if (w[i]->kind != DSV4_CUDA_W_BF16 || (int)w[i]->in != K) grouped = 0;
    if (!grouped || (n <= BF16_GEMV_MAX && K % 8)) {
        for (int i = 0; i < nw; i++) {
            int rc = cu_bf16_linear(c, w[i], x, n, y[i], flags, err);
            if (rc) return rc;
        }
        return DSV4_OK;
    }
    if (n <= BF16_GEMV_MAX) {
        for (int i0 = 0; i0 < nw; i0 += BF16_GROUP_MAX) {
            const int m = nw - i0 < BF16_GROUP_MAX ? nw - i0 : BF16_GROUP_MAX;
            int rc = bf16_gemv_group(c, m, w + i0, x, n, y + i0, flags, err);
            if (rc) return rc;
        }
        return DSV4_OK;
    }
    __nv_bfloat16 *hi = NULL, *lo = NULL;
    int rc = bf16_split(c, x, n, K, &hi, &lo, err);
    for (int i = 0; !rc && i < nw; i++) rc = bf16_gemm_split(c, w[i], hi, lo, n, y[i], flags, err);
    return rc;
}

/* ------------------------------------------------------------------ RMSNorm */

__global__ void __launch_bounds__(256) k_rmsnorm(const float *__restrict__ x,
                                                 const uint16_t *__restrict__ w, int dim,
                                                 float eps, float *y, int flags) {
    __shared__ float part[8];
    pdl_trigger();
    pdl_wait();
    const size_t r = blockIdx.x;
    const float *xr = x + r * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += part[i];
    const float rs = rsqrtf(tot / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i] * rs;
        if (w) v *= __uint_as_float((uint32_t)w[i] << 16);
        y[r * dim + i] = (flags & DSV4_CUDA_OUT_BF16) ? round_bf16(v) : v;
    }
}

extern "C" int dsv4_cuda_rmsnorm(dsv4_cuda_ctx *c, const float *x, const uint16_t *w, int n,
                                 int dim, float eps, float *y, int flags, dsv4_err *err) {
    if (!c || n < 0 || dim <= 0 || (n && (!x || !y)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_rmsnorm: bad argument");
    if (n == 0) return DSV4_OK;
    CU_TRY(cu_launch(c, k_rmsnorm, dim3((unsigned)n), dim3(256), 0, x, w, dim, eps, y, flags), err,
           "rmsnorm");
    return DSV4_OK;
}
