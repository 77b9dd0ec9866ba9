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

int cu_bf16_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, int n, float *y,
                   int flags, dsv4_err *err) {
    const int R = (int)w->out, K = (int)w->in;
    if (n <= BF16_GEMV_MAX && K % 8 == 0) {
        /* up to 4 rows per launch, in steps */
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
    size_t ne = (size_t)n * K;
    void *ws = NULL;
    int rc = cu_workspace(c, 2 * cu_align(ne * 2), &ws, err);
    if (rc) return rc;
    __nv_bfloat16 *hi = (__nv_bfloat16 *)ws, *lo = (__nv_bfloat16 *)((uint8_t *)ws + cu_align(ne * 2));
    k_split_bf16<<<(unsigned)((ne + 255) / 256), 256, 0, c->stream>>>(x, ne, hi, lo);
    CU_LAUNCHED(err, "bf16 split");
    /* column-major view: yᵀ [R, n] = W(as [K, R])ᵀ · xᵀ [K, n] */
    const float one = 1.f, zero = 0.f;
    CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, R, n, K, &one, w->w, CUDA_R_16BF, K,
                            hi, CUDA_R_16BF, K, &zero, y, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               err, "bf16 linear (hi)");
    CUBLAS_TRY(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, R, n, K, &one, w->w, CUDA_R_16BF, K,
                            lo, CUDA_R_16BF, K, &one, y, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               err, "bf16 linear (lo)");
    if (flags & DSV4_CUDA_OUT_BF16) {
        size_t ny = (size_t)n * R;
        k_round_bf16<<<(unsigned)((ny + 255) / 256), 256, 0, c->stream>>>(y, ny);
        CU_LAUNCHED(err, "bf16 round");
    }
    return DSV4_OK;
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
