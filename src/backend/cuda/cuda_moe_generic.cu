/*
 * cuda_moe_generic.cu — routed experts with BF16 weights (the dequantised
 * tiny checkpoints models/tiny-*-bf16), spec/MODEL.md §3.5; interface in
 * cuda_subtile.cuh.
 *
 * Why a plain kernel: the grouped MoE of cuda_moe.cu is built around FP4
 * tiles and the FP8 mma (activations quantised to E4M3). BF16 experts exist
 * only in small models, where the step is launch-bound, so this path is two
 * launches of one warp per output value, with the CPU reference's numerics:
 * fp32 dot products of fp32 x with the exact bf16 weights (no activation
 * quantisation: the CPU applies W8A8 to quantised weights only), SwiGLU with
 * the clamp and the routing weight as dsv4_cpu_swiglu1 then × w, and the
 * expert outputs of a row summed in ascending expert order, as the CPU's
 * per-expert loop adds them. Deterministic: no atomics.
 */
#include "backend/cuda/cuda_subtile.cuh"

#define MOE_GENERIC_KMAX 16

__device__ __forceinline__ float bf16_at(const void *p, int64_t i) {
    return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
}

/* One warp per (row t, slot j, intermediate f): h[t·k+j][f]. */
__global__ void k_moe_gen_h(const void *const *w1p, const void *const *w3p, int n_exp, const float *x, int64_t T,
                            int64_t d, int64_t F, const int32_t *ids, const float *wts, int k, float limit, float *h) {
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= T * k * F) return;
    const int64_t tj = wid / F, f = wid % F, t = tj / k;
    const int e = ids[tj];
    const bool ok = e >= 0 && e < n_exp;
    float g = 0.f, u = 0.f;
    if (ok) {
        const void *a = w1p[e], *b = w3p[e];
        const float *xr = x + t * d;
        for (int64_t i = lane; i < d; i += 32) {
            const float xv = xr[i];
            g += xv * bf16_at(a, f * d + i);
            u += xv * bf16_at(b, f * d + i);
        }
    }
#pragma unroll
    for (int s = 16; s; s >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, s);
        u += __shfl_xor_sync(0xffffffffu, u, s);
    }
    if (lane) return;
    float hv = 0.f;
    if (ok) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        hv = wts[tj] * (g / (1.0f + expf(-g)) * u);
    }
    h[tj * F + f] = hv;
}

/* One warp per (row t, output c): y[t][c] = Σ_j W2[e_j][c]·h[t·k+j], ascending e_j. */
__global__ void k_moe_gen_y(const void *const *w2p, int n_exp, const float *h, int64_t T, int64_t d, int64_t F,
                            const int32_t *ids, int k, float *y) {
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= T * d) return;
    const int64_t t = wid / d, c = wid % d;
    float o[MOE_GENERIC_KMAX];
    int ex[MOE_GENERIC_KMAX];
    for (int j = 0; j < k; j++) {
        const int e = ids[t * k + j];
        float acc = 0.f;
        if (e >= 0 && e < n_exp) {
            const void *w = w2p[e];
            const float *hr = h + (t * k + j) * F;
            for (int64_t i = lane; i < F; i += 32) acc += bf16_at(w, c * F + i) * hr[i];
        }
#pragma unroll
        for (int s = 16; s; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        o[j] = acc;
        ex[j] = e >= 0 && e < n_exp ? e : -1;
    }
    if (lane) return;
    /* ascending expert order (insertion sort of at most 16) */
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && ex[b - 1] > ex[b]; b--) {
            const int te = ex[b];
            ex[b] = ex[b - 1];
            ex[b - 1] = te;
            const float tv = o[b];
            o[b] = o[b - 1];
            o[b - 1] = tv;
        }
    float s = 0.f;
    for (int j = 0; j < k; j++)
        if (ex[j] >= 0) s += o[j];
    y[t * d + c] = s;
}

int cu_moe_generic_bf16(dsv4_cuda_ctx *c, const void *const *w1p, const void *const *w3p, const void *const *w2p,
                        int n_exp, const float *x, int64_t T, int64_t d, int64_t F, const int32_t *ids,
                        const float *wts, int k, float limit, float *y, dsv4_err *err) {
    if (T <= 0) return DSV4_OK;
    if (k <= 0 || k > MOE_GENERIC_KMAX)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_experts (BF16 experts): top-%d (at most %d)", k,
                      MOE_GENERIC_KMAX);
    cudaStream_t st = c->stream;
    void *h = NULL;
    CU_TRY(cudaMallocAsync(&h, (size_t)(T * k * F) * 4, st), err, "moe (BF16 experts): h scratch");
    const int64_t w1n = T * k * F, w2n = T * d;
    k_moe_gen_h<<<(unsigned)((w1n * 32 + 255) / 256), 256, 0, st>>>(w1p, w3p, n_exp, x, T, d, F, ids, wts, k,
                                                                     limit, (float *)h);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        k_moe_gen_y<<<(unsigned)((w2n * 32 + 255) / 256), 256, 0, st>>>(w2p, n_exp, (const float *)h, T, d, F, ids,
                                                                         k, y);
        e = cudaGetLastError();
    }
    cudaFreeAsync(h, st);
    if (e != cudaSuccess)
        return cu_err(err, DSV4_EBACKEND, "cuda: moe_experts (BF16 experts): %s", cudaGetErrorString(e));
    return DSV4_OK;
}
