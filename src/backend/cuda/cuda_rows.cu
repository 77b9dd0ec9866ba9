/*
 * cuda_rows.cu — linears on fp32 activations without activation
 * quantisation: linear_grouped (wo_a, spec/MODEL.md §3.4.8: FP8 weights
 * dequantised, x kept in full precision), F32-weight linears and the router
 * gate logits (§3.5, fp32). Interface and numerics: cuda_rows.cuh.
 *
 * Why not one warp per (row, output) any more: that did a GEMM as T·out
 * independent dot products with byte-wide strided loads and no weight reuse
 * (4096-token prefill: 69 % of all kernel time; decode: 29 us for 32 MB of
 * wo_a that streams in ~8 us). Now, by the number of rows T:
 *
 *  - FP8, T <= 64: k_rows_mma2 (k_rows_mma where out_g % 128 != 0) streams
 *    the weight with 16-byte loads, once per slab of up to 48 tokens;
 *    16 output rows per warp tile (the mma M side), the T tokens the N side,
 *    so one weight load serves every token. The bytes become bf16 exactly
 *    (E4M3 -> f16 -> f32 -> bf16, all exact) and the 128x128 block scale (a
 *    power of two) multiplies the block's fp32 partial sum, which is exact;
 *    x is split into bf16 hi + mid + lo in registers, all three go through
 *    the mma. In k_rows_mma each part starts from a zero accumulator and the
 *    sums are added on the CUDA cores (round to nearest); k_rows_mma2 (the
 *    real wo_a) chains them for speed (see launch_mma2). Chaining the 24 mma of a block through one
 *    accumulator lets the tensor core's own alignment and truncation of every
 *    add into the running sum dominate the error: on tiny-flash that moved
 *    4 of 34 positions to 3e-3..1.1e-2 x rms logit differences against the CPU
 *    (an E4M3 rounding of the next linear's input flipping), independent of
 *    the x split (DSV4_CUDA_ROWS_MMA_CHAIN=1 restores it for A/B).
 *    As in cuda_linear.cu, the order of the columns inside a 64-column chunk
 *    does not matter, so each lane takes 16 contiguous bytes of its two rows
 *    and the matching 16 floats of x, and the 4 mma steps walk them.
 *  - FP8, T > 64: the weight is dequantised once into a bf16 scratch copy
 *    (exact), x split into hi / mid / lo bf16, and three cuBLAS strided-
 *    batched GEMMs (one batch entry per group) accumulate in fp32 — tensor-core
 *    speed for prefill chunks.
 *  - F32 / BF16 weights (the router gate, tiny-checkpoint F32 linears):
 *    exact fp32 math. T <= 16: a GEMV, one block per output row, 256
 *    threads striding the row with 16-byte loads, every token per load.
 *    T > 16: cuBLAS SGEMM (BF16 weights widened to an F32 scratch copy).
 */
#include "backend/cuda/cuda_rows.cuh"

#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_MMA_SLAB 48    /* FP8: tokens per mma launch (6 n-tiles: 168 registers; 8 spill) */
#define ROWS_MMA_MAX_T 64   /* FP8: mma slabs up to here, cuBLAS above (measured crossover between 64
                               and 96 rows on H200); DSV4_CUDA_ROWS_MMA_MAX overrides */
#define ROWS_GEMV_MAX_T 16  /* F32 / BF16: GEMV up to here, SGEMM above */
#define ROWS_MMA_NW 4       /* warps per 16-row tile: they split the 128-column blocks */
#define ROWS_SMALL_WEIGHTS ((int64_t)1 << 20) /* BF16/F32 out·in below this: the per-output kernel (see dispatch) */
#define ROWS_SPLIT_BYTES ((size_t)192 << 20) /* hi + mid + lo scratch per chunk of rows (T > 64) */

/* ------------------------------------------------------ generic fallback */

/* y[t][o] = Σ_k x[t][xoff(o) + k]·W[o][k], fp32; one warp per (t, o). Any
 * shape or alignment; only for what the fast paths do not take. */
__global__ void k_dot_rows(const float *x, int64_t xstride, const void *W, int kind, const uint8_t *ws,
                           int64_t wsc, int64_t T, int64_t out, int64_t out_g, int64_t in_g, float *y) {
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (wid >= T * out) return;
    const int64_t t = wid / out, o = wid % out, g = o / out_g;
    const float *xr = x + t * xstride + g * in_g;
    float acc = 0.f;
    for (int64_t k = lane; k < in_g; k += 32) {
        float w;
        if (kind == CU_ROWS_F32) {
            w = ((const float *)W)[o * in_g + k];
        } else if (kind == CU_ROWS_BF16) {
            w = __uint_as_float((uint32_t)((const uint16_t *)W)[o * in_g + k] << 16);
        } else {
            __nv_fp8_e4m3 q;
            q.__x = ((const uint8_t *)W)[o * in_g + k];
            w = float(q) * e8m0_to_f32(ws[(o / 128) * wsc + k / 128]);
        }
        acc += xr[k] * w;
    }
    for (int s = 16; s; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (lane == 0) y[t * out + o] = acc;
}

static unsigned nblk(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

/* ------------------------------------------------------- number helpers */

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&b);
}

/* Two E4M3 bytes (the low 16 bits of v, first byte first) -> two floats, exact. */
__device__ __forceinline__ float2 e4m3x2_to_f2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(h));
}

/* Two E4M3 bytes -> bf16x2 (exact: 4 significant bits, exponents within bf16's range). */
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v) {
    const float2 f = e4m3x2_to_f2(v);
    return bf16x2_bits(f.x, f.y);
}

/* (a, b) -> three bf16 pairs with a = h + m + l up to ~2^-27·|a| (below fp32's own rounding):
 * h = bf16(a), m = bf16(a - h), l = bf16(a - h - m); each difference is exact in fp32. Two
 * parts (2^-17) were measured too coarse: the E4M3 activation quantisation of the next linear
 * turned them into 1e-2·rms logit differences on the tiny checkpoint (test_device_equiv). */
__device__ __forceinline__ void split3(float a, float b, uint32_t &h, uint32_t &m, uint32_t &l) {
    const __nv_bfloat162 hh = __floats2bfloat162_rn(a, b);
    const float2 hf = __bfloat1622float2(hh);
    const float ra = a - hf.x, rb = b - hf.y;
    const __nv_bfloat162 mm = __floats2bfloat162_rn(ra, rb);
    const float2 mf = __bfloat1622float2(mm);
    h = *reinterpret_cast<const uint32_t *>(&hh);
    m = *reinterpret_cast<const uint32_t *>(&mm);
    l = bf16x2_bits(ra - mf.x, rb - mf.y);
}

/* D += A·B, m16n8k16, bf16 x bf16 -> fp32 (PTX ISA "mma.m16n8k16"): lane = 4·g + t holds
 * A rows g, g+8 at k = 2t, 2t+1 (regs 0, 1) and 2t+8, 2t+9 (regs 2, 3); B column g at the same
 * k (regs 0, 1); D rows g, g+8 at columns 2t, 2t+1. */
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ------------------------------------------- FP8, T <= 64: tensor-core GEMV */

/* One 128-column block of a lane's two rows: [chunk 0 row g, chunk 0 row g+8, chunk 1 row g, chunk 1 row g+8]. */
__device__ __forceinline__ void ld_blk(uint4 (&F)[4], const uint8_t *w0, const uint8_t *w1, int kb) {
    F[0] = ld_stream(w0 + (size_t)kb * 128);
    F[1] = ld_stream(w1 + (size_t)kb * 128);
    F[2] = ld_stream(w0 + (size_t)kb * 128 + 64);
    F[3] = ld_stream(w1 + (size_t)kb * 128 + 64);
}

/*
 * acc += scale · Σ over the block's 128 columns. Lane (g, t) owns, in 64-column chunk c, the
 * columns c·64 + 16t .. +15 of rows g and g+8 (16 bytes each) and of token rows nt·8 + g; mma
 * step s pairs its columns 16t + 4s + {0,1} with logical k {2t, 2t+1} and 16t + 4s + {2,3}
 * with {2t+8, 2t+9}, the same map on the A and the B side, so the 4 steps cover the chunk.
 */
template <int NT, bool CHAIN>
__device__ __forceinline__ void mma_blk(float (&acc)[NT][4], const uint4 (&F)[4], float scale, const float *xk,
                                        int64_t xstride, int T, int g) {
    float d[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.f;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const uint32_t r0[4] = {F[2 * c].x, F[2 * c].y, F[2 * c].z, F[2 * c].w};
        const uint32_t r1[4] = {F[2 * c + 1].x, F[2 * c + 1].y, F[2 * c + 1].z, F[2 * c + 1].w};
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint32_t a0 = e4m3x2_to_bf16x2(r0[s]), a2 = e4m3x2_to_bf16x2(r0[s] >> 16);
            const uint32_t a1 = e4m3x2_to_bf16x2(r1[s]), a3 = e4m3x2_to_bf16x2(r1[s] >> 16);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tok = nt * 8 + g;
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (tok < T) v = __ldg((const float4 *)(xk + (size_t)tok * xstride + c * 64 + 4 * s));
                uint32_t h0, m0, l0, h1, m1, l1;
                split3(v.x, v.y, h0, m0, l0);
                split3(v.z, v.w, h1, m1, l1);
                if (CHAIN) { /* the 24 mma of a block chained through one accumulator */
                    mma_bf16(d[nt], a0, a1, a2, a3, h0, h1);
                    mma_bf16(d[nt], a0, a1, a2, a3, m0, m1);
                    mma_bf16(d[nt], a0, a1, a2, a3, l0, l1);
                } else { /* each part from zero, added on the CUDA cores (round to nearest) */
                    float ph[4] = {0.f, 0.f, 0.f, 0.f}, pm[4] = {0.f, 0.f, 0.f, 0.f}, pl[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_bf16(ph, a0, a1, a2, a3, h0, h1);
                    mma_bf16(pm, a0, a1, a2, a3, m0, m1);
                    mma_bf16(pl, a0, a1, a2, a3, l0, l1);
#pragma unroll
                    for (int i = 0; i < 4; i++) d[nt][i] += ph[i] + (pm[i] + pl[i]);
                }
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = fmaf(scale, d[nt][i], acc[nt][i]);
}

/* Block = one 16-row tile (inside one group), ROWS_MMA_NW warps taking its 128-column blocks
 * in turn, two blocks of weight loads in flight per lane; the warps' sums meet in shared memory.
 * Needs in % 128 == 0, out_g % 16 == 0, x 16-byte aligned, xstride % 4 == 0, T <= 8·NT. */
template <int NT, bool CHAIN>
__global__ void __launch_bounds__(ROWS_MMA_NW * 32) k_rows_mma(const uint8_t *__restrict__ W,
                                                              const uint8_t *__restrict__ ws, int64_t wsc,
                                                              const float *__restrict__ x, int64_t xstride, int T,
                                                              int out, int out_g, int in, float *__restrict__ y) {
    __shared__ float4 red[ROWS_MMA_NW][NT][32];
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, nkb = in >> 7;
    const uint8_t *w0 = W + (size_t)(row0 + g) * in + 16 * t, *w1 = w0 + (size_t)8 * in;
    const uint8_t *srow = ws + (size_t)(row0 >> 7) * wsc;
    const float *xg = x + (size_t)(row0 / out_g) * in + 16 * t;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    uint4 A[4], B[4];
    int kb = warp;
    /* weights never depend on the previous kernel: their first loads go out before the wait */
    if (kb < nkb) ld_blk(A, w0, w1, kb);
    if (kb + ROWS_MMA_NW < nkb) ld_blk(B, w0, w1, kb + ROWS_MMA_NW);
    pdl_wait();
    while (kb < nkb) {
        mma_blk<NT, CHAIN>(acc, A, e8m0_to_f32(srow[kb]), xg + (size_t)kb * 128, xstride, T, g);
        if (kb + 2 * ROWS_MMA_NW < nkb) ld_blk(A, w0, w1, kb + 2 * ROWS_MMA_NW);
        kb += ROWS_MMA_NW;
        if (kb >= nkb) break;
        mma_blk<NT, CHAIN>(acc, B, e8m0_to_f32(srow[kb]), xg + (size_t)kb * 128, xstride, T, g);
        if (kb + 2 * ROWS_MMA_NW < nkb) ld_blk(B, w0, w1, kb + 2 * ROWS_MMA_NW);
        kb += ROWS_MMA_NW;
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) red[warp][nt][lane] = make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
    __syncthreads();
    for (int nt = warp; nt < NT; nt += ROWS_MMA_NW) {
        float4 s = red[0][nt][lane];
        for (int w = 1; w < ROWS_MMA_NW; w++) {
            const float4 o = red[w][nt][lane];
            s.x += o.x;
            s.y += o.y;
            s.z += o.z;
            s.w += o.w;
        }
        const int t0 = nt * 8 + 2 * t, r0 = row0 + g, r1 = r0 + 8;
        if (t0 < T) {
            y[(size_t)t0 * out + r0] = s.x;
            y[(size_t)t0 * out + r1] = s.z;
        }
        if (t0 + 1 < T) {
            y[(size_t)(t0 + 1) * out + r0] = s.y;
            y[(size_t)(t0 + 1) * out + r1] = s.w;
        }
    }
}

template <int NT>
static cudaError_t launch_mma(dsv4_cuda_ctx *c, const uint8_t *W, const uint8_t *ws, int64_t wsc, const float *x,
                              int64_t xstride, int T, int out, int out_g, int in, float *y) {
    /* DSV4_CUDA_ROWS_MMA_CHAIN=1: the former chained accumulation (A/B of the tiny-checkpoint difference) */
    if (getenv("DSV4_CUDA_ROWS_MMA_CHAIN"))
        return cu_launch(c, k_rows_mma<NT, true>, dim3((unsigned)(out / 16)), dim3(ROWS_MMA_NW * 32), 0, W, ws, wsc,
                         x, xstride, T, out, out_g, in, y);
    return cu_launch(c, k_rows_mma<NT, false>, dim3((unsigned)(out / 16)), dim3(ROWS_MMA_NW * 32), 0, W, ws, wsc, x,
                     xstride, T, out, out_g, in, y);
}

/*
 * The same products, organised for HBM speed at the real shapes (k_rows_mma re-reads x from L2
 * for every 16-row tile, T/4 bytes per weight byte: 133 us at T = 48): a block owns 128 rows
 * (8 warps of 16, one scale row-block) and a range of kbl 128-column blocks (grid.y splits the
 * columns so the grid fills the GPU); it stages its x columns once in shared memory in mma
 * fragment order (float4 per lane and mma step, read back conflict-free), and every warp then
 * only streams its weights (two blocks of loads in flight). With grid.y > 1 each block writes
 * its partial sums to part[blockIdx.y] and k_rows_reduce adds them in a fixed order: the result
 * does not depend on scheduling. Needs out_g % 128 == 0 and the k_rows_mma conditions.
 */
#define R2_NW 8
#define R2_SMEM_MAX (96 * 1024)

template <int NT, bool CHAIN>
__device__ __forceinline__ void mma_blk2(float (&acc)[NT][4], const uint4 (&F)[4], float scale,
                                         const float4 *__restrict__ xs, int lane) {
    float d[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.f;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const uint32_t r0[4] = {F[2 * c].x, F[2 * c].y, F[2 * c].z, F[2 * c].w};
        const uint32_t r1[4] = {F[2 * c + 1].x, F[2 * c + 1].y, F[2 * c + 1].z, F[2 * c + 1].w};
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint32_t a0 = e4m3x2_to_bf16x2(r0[s]), a2 = e4m3x2_to_bf16x2(r0[s] >> 16);
            const uint32_t a1 = e4m3x2_to_bf16x2(r1[s]), a3 = e4m3x2_to_bf16x2(r1[s] >> 16);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float4 v = xs[((nt * 2 + c) * 4 + s) * 32 + lane];
                uint32_t h0, m0, l0, h1, m1, l1;
                split3(v.x, v.y, h0, m0, l0);
                split3(v.z, v.w, h1, m1, l1);
                if (CHAIN) {
                    mma_bf16(d[nt], a0, a1, a2, a3, h0, h1);
                    mma_bf16(d[nt], a0, a1, a2, a3, m0, m1);
                    mma_bf16(d[nt], a0, a1, a2, a3, l0, l1);
                } else { /* as mma_blk (DSV4_CUDA_ROWS_MMA2_UNCHAINED=1) */
                    float ph[4] = {0.f, 0.f, 0.f, 0.f}, pm[4] = {0.f, 0.f, 0.f, 0.f}, pl[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_bf16(ph, a0, a1, a2, a3, h0, h1);
                    mma_bf16(pm, a0, a1, a2, a3, m0, m1);
                    mma_bf16(pl, a0, a1, a2, a3, l0, l1);
#pragma unroll
                    for (int i = 0; i < 4; i++) d[nt][i] += ph[i] + (pm[i] + pl[i]);
                }
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = fmaf(scale, d[nt][i], acc[nt][i]);
}

template <int NT, bool CHAIN>
__global__ void __launch_bounds__(R2_NW * 32) k_rows_mma2(const uint8_t *__restrict__ W,
                                                         const uint8_t *__restrict__ ws, int64_t wsc,
                                                         const float *__restrict__ x, int64_t xstride, int T,
                                                         int out, int out_g, int in, int kbl, float *__restrict__ y,
                                                         float *__restrict__ part) {
    extern __shared__ float4 xs[]; /* [kbl][NT][2][4][32] */
    pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 128, rw = row0 + 16 * warp, kb0 = blockIdx.y * kbl;
    const uint8_t *w0 = W + (size_t)(rw + g) * in + 16 * t, *w1 = w0 + (size_t)8 * in;
    uint4 A[4], B[4];
    /* weights never depend on the previous kernel: their first loads go out before the wait */
    ld_blk(A, w0, w1, kb0);
    if (kbl > 1) ld_blk(B, w0, w1, kb0 + 1);
    pdl_wait();
    /* stage x: thread i -> (q = kbi·NT + nt, token row g', chunk c, lane column t', step s), s fastest,
     * so a warp reads 512 contiguous bytes of one token row */
    const float *xg = x + (size_t)(row0 / out_g) * in + (size_t)kb0 * 128;
    const int nst = kbl * NT * 256;
    for (int i = threadIdx.x; i < nst; i += R2_NW * 32) {
        const int s = i & 3, tt = (i >> 2) & 3, c = (i >> 4) & 1, gg = (i >> 5) & 7, q = i >> 8;
        const int nt = q % NT, kbi = q / NT, tok = nt * 8 + gg;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (tok < T) v = __ldg((const float4 *)(xg + (size_t)tok * xstride + kbi * 128 + c * 64 + 16 * tt + 4 * s));
        xs[((q * 2 + c) * 4 + s) * 32 + gg * 4 + tt] = v;
    }
    __syncthreads();
    const uint8_t *srow = ws + (size_t)(row0 >> 7) * wsc + kb0;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int kbi = 0; kbi < kbl;) {
        mma_blk2<NT, CHAIN>(acc, A, e8m0_to_f32(srow[kbi]), xs + (size_t)kbi * NT * 256, lane);
        if (kbi + 2 < kbl) ld_blk(A, w0, w1, kb0 + kbi + 2);
        if (++kbi >= kbl) break;
        mma_blk2<NT, CHAIN>(acc, B, e8m0_to_f32(srow[kbi]), xs + (size_t)kbi * NT * 256, lane);
        if (kbi + 2 < kbl) ld_blk(B, w0, w1, kb0 + kbi + 2);
        ++kbi;
    }
    float *dst = gridDim.y > 1 ? part + (size_t)blockIdx.y * T * out : y;
    const int r0 = rw + g, r1 = r0 + 8;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int t0 = nt * 8 + 2 * t;
        if (t0 < T) {
            dst[(size_t)t0 * out + r0] = acc[nt][0];
            dst[(size_t)t0 * out + r1] = acc[nt][2];
        }
        if (t0 + 1 < T) {
            dst[(size_t)(t0 + 1) * out + r0] = acc[nt][1];
            dst[(size_t)(t0 + 1) * out + r1] = acc[nt][3];
        }
    }
}

/* y[i] = Σ_j part[j][i] for j = 0 .. ks-1 in order; n4 float4s. */
__global__ void k_rows_reduce(const float4 *__restrict__ part, int ks, size_t n4, float4 *__restrict__ y) {
    pdl_trigger();
    pdl_wait();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 s = part[i];
    for (int j = 1; j < ks; j++) {
        const float4 o = part[(size_t)j * n4 + i];
        s.x += o.x;
        s.y += o.y;
        s.z += o.z;
        s.w += o.w;
    }
    y[i] = s;
}

/* The column split of k_rows_mma2: the smallest power of two that fills the GPU (>= 1.5 blocks
 * per SM) and fits the x stage in R2_SMEM_MAX; 0 when none fits. */
static int mma2_split(const dsv4_cuda_ctx *c, int NT, int64_t out, int64_t in) {
    const int64_t nrb = out / 128, nkb = in / 128;
    int ks = 1;
    while (nkb % (2 * ks) == 0 &&
           (nrb * ks * 2 < 3 * (int64_t)c->prop.multiProcessorCount || (size_t)NT * 4096 * (nkb / ks) > R2_SMEM_MAX))
        ks *= 2;
    return (size_t)NT * 4096 * (nkb / ks) <= R2_SMEM_MAX ? ks : 0;
}

template <int NT, bool CHAIN>
static int launch_mma2_k(dsv4_cuda_ctx *c, const uint8_t *W, const uint8_t *ws, int64_t wsc, const float *x,
                       int64_t xstride, int T, int out, int out_g, int in, int ks, float *y, dsv4_err *err) {
    const int kbl = in / 128 / ks;
    const size_t smem = (size_t)NT * 4096 * kbl;
    /* the opt-in above 48 KB, per call: it is per device (cf. launch_fp8_small) */
    if (smem > 48 * 1024)
        CU_TRY(cudaFuncSetAttribute(k_rows_mma2<NT, CHAIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "linear_grouped (fp8 rows, shared memory)");
    float *part = NULL;
    if (ks > 1) {
        int rc = cu_arena_alloc(c, (size_t)ks * T * out * 4, (void **)&part, err);
        if (rc) return rc;
    }
    cudaError_t e = cu_launch(c, k_rows_mma2<NT, CHAIN>, dim3((unsigned)(out / 128), (unsigned)ks), dim3(R2_NW * 32), smem,
                              W, ws, wsc, x, xstride, T, out, out_g, in, kbl, y, part);
    if (e == cudaSuccess && ks > 1) {
        const size_t n4 = (size_t)T * out / 4;
        e = cu_launch(c, k_rows_reduce, dim3(nblk(n4, 256)), dim3(256), 0, (const float4 *)part, ks, n4, (float4 *)y);
    }
    cu_arena_free(c, part);
    CU_TRY(e, err, "linear_grouped (fp8 rows, mma2)");
    return DSV4_OK;
}

/* Chained accumulation by default here, unlike k_rows_mma: at the real wo_a shape (8x[1024x4096])
 * the zero-accumulator parts cost 27.1 vs 17.8 us at T = 1 and 86 vs 67 us at T = 48 for a
 * normalised error of 4.1e-7 vs 5.8e-7 (H200, bench/results/2026-12-01-tiny-tp2-cuda-h200x2.md);
 * whether that error matters end to end on Flash is not measured. DSV4_CUDA_ROWS_MMA2_UNCHAINED=1
 * selects the parts (A/B); DSV4_CUDA_ROWS_MMA_CHAIN=1 forces the chain in both kernels. */
template <int NT>
static int launch_mma2(dsv4_cuda_ctx *c, const uint8_t *W, const uint8_t *ws, int64_t wsc, const float *x,
                       int64_t xstride, int T, int out, int out_g, int in, int ks, float *y, dsv4_err *err) {
    if (getenv("DSV4_CUDA_ROWS_MMA2_UNCHAINED") && !getenv("DSV4_CUDA_ROWS_MMA_CHAIN"))
        return launch_mma2_k<NT, false>(c, W, ws, wsc, x, xstride, T, out, out_g, in, ks, y, err);
    return launch_mma2_k<NT, true>(c, W, ws, wsc, x, xstride, T, out, out_g, in, ks, y, err);
}

/* Equal slabs of up to 48 tokens (multiples of 8), one launch each: the weight is read once per slab. */
static int rows_mma(dsv4_cuda_ctx *c, const uint8_t *W, const uint8_t *ws, int64_t out, int64_t in,
                    const float *x, int64_t xstride, int64_t T, int64_t out_g, float *y, dsv4_err *err) {
    const int64_t wsc = (in + 127) / 128;
    const int o = (int)out, og = (int)out_g, k = (int)in;
    const int64_t ns = (T + ROWS_MMA_SLAB - 1) / ROWS_MMA_SLAB, per = ((T + ns - 1) / ns + 7) / 8 * 8;
    for (int64_t t0 = 0; t0 < T; t0 += per) {
        const int n = (int)(T - t0 < per ? T - t0 : per);
        const float *xs = x + t0 * xstride;
        float *ys = y + t0 * out;
        const int nt = (n + 7) / 8 == 5 ? 6 : (n + 7) / 8;
        const int ks = out_g % 128 == 0 && !getenv("DSV4_CUDA_ROWS_MMA1") ? mma2_split(c, nt, out, in) : 0;
        if (ks) {
            int rc;
            switch (nt) {
            case 1: rc = launch_mma2<1>(c, W, ws, wsc, xs, xstride, n, o, og, k, ks, ys, err); break;
            case 2: rc = launch_mma2<2>(c, W, ws, wsc, xs, xstride, n, o, og, k, ks, ys, err); break;
            case 3: rc = launch_mma2<3>(c, W, ws, wsc, xs, xstride, n, o, og, k, ks, ys, err); break;
            case 4: rc = launch_mma2<4>(c, W, ws, wsc, xs, xstride, n, o, og, k, ks, ys, err); break;
            default: rc = launch_mma2<6>(c, W, ws, wsc, xs, xstride, n, o, og, k, ks, ys, err); break;
            }
            if (rc) return rc;
            continue;
        }
        cudaError_t e;
        switch ((n + 7) / 8) {
        case 1: e = launch_mma<1>(c, W, ws, wsc, xs, xstride, n, o, og, k, ys); break;
        case 2: e = launch_mma<2>(c, W, ws, wsc, xs, xstride, n, o, og, k, ys); break;
        case 3: e = launch_mma<3>(c, W, ws, wsc, xs, xstride, n, o, og, k, ys); break;
        case 4: e = launch_mma<4>(c, W, ws, wsc, xs, xstride, n, o, og, k, ys); break;
        default: e = launch_mma<6>(c, W, ws, wsc, xs, xstride, n, o, og, k, ys); break;
        }
        CU_TRY(e, err, "linear_grouped (fp8 rows, mma)");
    }
    return DSV4_OK;
}

/* ------------------------------------ FP8, T > 64: bf16 GEMMs on hi + mid + lo */

/* W E4M3 [rows][in] with 128x128 scales -> bf16 (exact in bf16's normal range); 16 bytes a thread. */
__global__ void k_rows_fp8_to_bf16(const uint8_t *__restrict__ W, const uint8_t *__restrict__ ws, int64_t wsc,
                                   int64_t in, size_t n16, uint4 *__restrict__ Wb) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n16) return;
    const size_t e = i * 16, r = e / (size_t)in, k = e % (size_t)in;
    const float sc = e8m0_to_f32(ws[(r >> 7) * (size_t)wsc + (k >> 7)]);
    const uint4 v = ld_stream(W + e);
    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 a = e4m3x2_to_f2(wd[j]), b = e4m3x2_to_f2(wd[j] >> 16);
        o[2 * j] = bf16x2_bits(a.x * sc, a.y * sc);
        o[2 * j + 1] = bf16x2_bits(b.x * sc, b.y * sc);
    }
    Wb[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
    Wb[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* x fp32 -> hi, mid, lo bf16 (split3), 4 values a thread. */
__global__ void k_rows_split(const float4 *__restrict__ x, size_t n4, uint2 *__restrict__ hi, uint2 *__restrict__ mid,
                             uint2 *__restrict__ lo) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const float4 v = x[i];
    uint32_t h0, m0, l0, h1, m1, l1;
    split3(v.x, v.y, h0, m0, l0);
    split3(v.z, v.w, h1, m1, l1);
    hi[i] = make_uint2(h0, h1);
    mid[i] = make_uint2(m0, m1);
    lo[i] = make_uint2(l0, l1);
}

/* BF16 [n] -> F32 (exact). */
__global__ void k_rows_bf16_to_f32(const uint16_t *__restrict__ w, size_t n, float *__restrict__ o) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = __uint_as_float((uint32_t)w[i] << 16);
}

/* rows_gemm through cuBLASLt with the algorithm of n's row bucket (cu_lt_gemm): DSV4_OK, or
 * DSV4_EUNSUPPORTED with nothing launched (the caller uses cublasGemmStridedBatchedEx). */
static int rows_gemm_lt(dsv4_cuda_ctx *c, cudaDataType_t dt, const void *A, const void *B, int64_t ldb, int64_t n,
                        int64_t out, int64_t in, int64_t out_g, float beta, float *y) {
    const cu_lt_shape sh = {CU_LT_ROWS, (int)out_g, (int)in, dt, CUDA_R_32F, ldb, out, (int)(out / out_g), in, out_g};
    return cu_lt_gemm(c, &sh, in, out_g * in, A, B, (int)n, beta, y);
}

/* One GEMM per group g (a strided batch): y[r][g·out_g + i] (+)= Σ_k B[r·ldb + g·in + k]·A[(g·out_g + i)·in + k],
 * in the column-major view yᵀ = Aᵀ·Bᵀ; cuBLASLt with bucketed algorithms, else cublasGemmStridedBatchedEx. */
static int rows_gemm(dsv4_cuda_ctx *c, cudaDataType_t dt, const void *A, const void *B, int64_t ldb, int64_t n,
                     int64_t out, int64_t in, int64_t out_g, float beta, float *y, const char *what, dsv4_err *err) {
    const float one = 1.f;
    const int groups = (int)(out / out_g);
    if (rows_gemm_lt(c, dt, A, B, ldb, n, out, in, out_g, beta, y) == DSV4_OK) return DSV4_OK;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out_g, (int)n, (int)in, &one, A,
                                          dt, (int)in, (long long)(out_g * in), B, dt, (int)ldb, (long long)in,
                                          &beta, y, CUDA_R_32F, (int)out, (long long)out_g, groups,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               err, what);
    return DSV4_OK;
}

static int rows_fp8_gemm(dsv4_cuda_ctx *c, const uint8_t *W, const uint8_t *ws, int64_t out, int64_t in,
                         const float *x, int64_t xstride, int64_t T, int64_t out_g, float *y, dsv4_err *err) {
    cudaStream_t st = c->stream;
    int64_t tc = (int64_t)(ROWS_SPLIT_BYTES / ((size_t)xstride * 6));
    if (tc < 1) tc = 1;
    if (tc > T) tc = T;
    const size_t wb = cu_align((size_t)(out * in) * 2), xb = cu_align((size_t)(tc * xstride) * 2);
    void *p = NULL;
    /* stream-ordered scratch (no synchronisation; capturable) */
    int rc = cu_arena_alloc(c, wb + 3 * xb, &p, err);
    if (rc) return rc;
    uint8_t *Wb = (uint8_t *)p, *hi = Wb + wb, *mid = hi + xb, *lo = mid + xb;
    const size_t n16 = (size_t)(out * in) / 16;
    k_rows_fp8_to_bf16<<<nblk(n16, 256), 256, 0, st>>>(W, ws, (in + 127) / 128, in, n16, (uint4 *)Wb);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) rc = cu_err(err, DSV4_EBACKEND, "cuda: linear_grouped (fp8 dequant): %s", cudaGetErrorString(e));
    for (int64_t r0 = 0; !rc && r0 < T; r0 += tc) {
        const int64_t n = T - r0 < tc ? T - r0 : tc;
        const size_t n4 = (size_t)(n * xstride) / 4;
        k_rows_split<<<nblk(n4, 256), 256, 0, st>>>((const float4 *)(x + r0 * xstride), n4, (uint2 *)hi,
                                                     (uint2 *)mid, (uint2 *)lo);
        e = cudaGetLastError();
        if (e != cudaSuccess) rc = cu_err(err, DSV4_EBACKEND, "cuda: linear_grouped (split): %s", cudaGetErrorString(e));
        if (!rc) rc = rows_gemm(c, CUDA_R_16BF, Wb, hi, xstride, n, out, in, out_g, 0.f, y + r0 * out,
                                "linear_grouped (fp8 rows, hi)", err);
        if (!rc) rc = rows_gemm(c, CUDA_R_16BF, Wb, mid, xstride, n, out, in, out_g, 1.f, y + r0 * out,
                                "linear_grouped (fp8 rows, mid)", err);
        if (!rc) rc = rows_gemm(c, CUDA_R_16BF, Wb, lo, xstride, n, out, in, out_g, 1.f, y + r0 * out,
                                "linear_grouped (fp8 rows, lo)", err);
    }
    cu_arena_free(c, p);
    return rc;
}

/* ------------------------------------------------- F32 / BF16 weights, exact */

/* One block per output row; the 256 threads stride the row with 16-byte loads (E weights each)
 * and apply each to every token. Needs in % E == 0, x 16-byte aligned, xstride % 4 == 0. */
template <int NT, bool BF16>
__global__ void __launch_bounds__(256) k_rows_gemv(const void *__restrict__ W, const float *__restrict__ x,
                                                   int64_t xstride, int T, int out, int out_g, int in,
                                                   float *__restrict__ y) {
    constexpr int E = BF16 ? 8 : 4;
    __shared__ float red[8][NT];
    pdl_trigger();
    const int o = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nv = in / E;
    const uint4 *wr = (const uint4 *)W + (size_t)o * nv;
    const float *xg = x + (size_t)(o / out_g) * in;
    float acc[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i] = 0.f;
    int v = threadIdx.x;
    uint4 nxt = make_uint4(0, 0, 0, 0);
    if (v < nv) nxt = ld_stream(wr + v);
    pdl_wait();
    for (; v < nv; v += 256) {
        const uint4 cur = nxt;
        if (v + 256 < nv) nxt = ld_stream(wr + v + 256);
        const uint32_t u[4] = {cur.x, cur.y, cur.z, cur.w};
        float wf[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (BF16) {
                wf[2 * j] = __uint_as_float(u[j] << 16);
                wf[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
            } else {
                wf[j] = __uint_as_float(u[j]);
            }
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
            if (i < T) {
                const float4 *xr = (const float4 *)(xg + (size_t)i * xstride + (size_t)v * E);
                const float4 a = __ldg(xr);
                float s = wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w;
                if (BF16) {
                    const float4 b = __ldg(xr + 1);
                    s += wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
                acc[i] += s;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++) {
        float s = acc[i];
#pragma unroll
        for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0) red[warp][i] = s;
    }
    __syncthreads();
    if ((int)threadIdx.x < T && threadIdx.x < NT) {
        float s = 0.f;
        for (int w = 0; w < 8; w++) s += red[w][threadIdx.x];
        y[(size_t)threadIdx.x * out + o] = s;
    }
}

template <int NT, bool BF16>
static cudaError_t launch_gemv(dsv4_cuda_ctx *c, const void *W, const float *x, int64_t xstride, int T, int out,
                               int out_g, int in, float *y) {
    return cu_launch(c, k_rows_gemv<NT, BF16>, dim3((unsigned)out), dim3(256), 0, W, x, xstride, T, out, out_g, in, y);
}

template <bool BF16>
static cudaError_t launch_gemv(dsv4_cuda_ctx *c, const void *W, const float *x, int64_t xstride, int T, int out,
                               int out_g, int in, float *y) {
    if (T <= 1) return launch_gemv<1, BF16>(c, W, x, xstride, T, out, out_g, in, y);
    if (T <= 2) return launch_gemv<2, BF16>(c, W, x, xstride, T, out, out_g, in, y);
    if (T <= 4) return launch_gemv<4, BF16>(c, W, x, xstride, T, out, out_g, in, y);
    if (T <= 8) return launch_gemv<8, BF16>(c, W, x, xstride, T, out, out_g, in, y);
    return launch_gemv<16, BF16>(c, W, x, xstride, T, out, out_g, in, y);
}

static int rows_sgemm(dsv4_cuda_ctx *c, int kind, const void *W, int64_t out, int64_t in, const float *x,
                      int64_t xstride, int64_t T, int64_t out_g, float *y, dsv4_err *err) {
    cudaStream_t st = c->stream;
    void *p = NULL;
    const float *Wf = (const float *)W;
    if (kind == CU_ROWS_BF16) {
        const size_t n = (size_t)(out * in);
        int rc = cu_arena_alloc(c, n * 4, &p, err);
        if (rc) return rc;
        k_rows_bf16_to_f32<<<nblk(n, 256), 256, 0, st>>>((const uint16_t *)W, n, (float *)p);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            cu_arena_free(c, p);
            return cu_err(err, DSV4_EBACKEND, "cuda: linear (rows, widen): %s", cudaGetErrorString(e));
        }
        Wf = (const float *)p;
    }
    int rc = rows_gemm(c, CUDA_R_32F, Wf, x, xstride, T, out, in, out_g, 0.f, y, "linear (rows, sgemm)", err);
    cu_arena_free(c, p);
    return rc;
}

/* ------------------------------------------------------------- dispatch */

int cu_rows_linear(dsv4_cuda_ctx *c, int kind, const void *W, const uint8_t *ws, int64_t out, int64_t in,
                   const float *x, int64_t xstride, int64_t T, int64_t out_g, float *y, dsv4_err *err) {
    if (T <= 0 || out <= 0) return DSV4_OK;
    if (out_g <= 0 || out % out_g)
        return cu_err(err, DSV4_EINVAL, "cuda: rows linear: %lld output rows per group do not divide %lld",
                      (long long)out_g, (long long)out);
    /* DSV4_CUDA_ROWS_NAIVE=1: the one-warp-per-output kernel for every shape (A/B checks);
     * DSV4_CUDA_ROWS_MMA_MAX: FP8 rows up to which the mma slabs run (read per call: cheap) */
    /* BF16 / F32 linears under 2^20 weights (the tiny checkpoints' gate 8x256, BF16 wo_a of the
     * -bf16 copies) keep the per-output kernel: launch-bound, the fast paths buy nothing there.
     * Small FP8 linears (tiny wo_a 128x256 and its TP slices) take the fast paths like the real
     * wo_a: the 4 of 34 tiny-flash positions at 3e-3..1.1e-2 x rms that once kept them off came
     * from the chained tensor-core accumulation, fixed in mma_blk (H200: test_device_equiv
     * passes with them on, bench/results/2026-12-01-tiny-tp2-cuda-h200x2.md).
     * DSV4_CUDA_ROWS_SMALL_FAST=dense|all: the small BF16 / F32 ones take the fast paths too (A/B). */
    const char *sf = getenv("DSV4_CUDA_ROWS_SMALL_FAST");
    const int small_fast = kind == CU_ROWS_FP8 || (sf && (!strcmp(sf, "all") || !strcmp(sf, "dense")));
    const int naive = getenv("DSV4_CUDA_ROWS_NAIVE") != NULL || (out * in < ROWS_SMALL_WEIGHTS && !small_fast);
    const char *mm = getenv("DSV4_CUDA_ROWS_MMA_MAX");
    const int64_t mma_max = mm ? atoll(mm) : ROWS_MMA_MAX_T;
    const int ok32 = out < INT32_MAX / 2 && in < INT32_MAX / 2 && xstride < INT32_MAX / 2 && T < INT32_MAX / 2;
    const int aligned = ok32 && ((uintptr_t)x & 15) == 0 && xstride % 4 == 0;
    if (!naive && aligned && kind == CU_ROWS_FP8 && in % 128 == 0 && out_g % 16 == 0 && out % 16 == 0) {
        if (T <= mma_max) return rows_mma(c, (const uint8_t *)W, ws, out, in, x, xstride, T, out_g, y, err);
        return rows_fp8_gemm(c, (const uint8_t *)W, ws, out, in, x, xstride, T, out_g, y, err);
    }
    if (!naive && aligned && kind != CU_ROWS_FP8 && in % (kind == CU_ROWS_BF16 ? 8 : 4) == 0) {
        if (T <= ROWS_GEMV_MAX_T) {
            cudaError_t e = kind == CU_ROWS_BF16
                                ? launch_gemv<true>(c, W, x, xstride, (int)T, (int)out, (int)out_g, (int)in, y)
                                : launch_gemv<false>(c, W, x, xstride, (int)T, (int)out, (int)out_g, (int)in, y);
            CU_TRY(e, err, "linear (rows, gemv)");
            return DSV4_OK;
        }
        return rows_sgemm(c, kind, W, out, in, x, xstride, T, out_g, y, err);
    }
    const int64_t warps = T * out;
    k_dot_rows<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, c->stream>>>(x, xstride, W, kind, ws, (in + 127) / 128,
                                                                           T, out, out_g, in, y);
    CU_TRY(cudaGetLastError(), err, "linear (dot rows)");
    return DSV4_OK;
}
