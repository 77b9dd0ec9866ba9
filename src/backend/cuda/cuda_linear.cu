/*
 * cuda_linear.cu — W8A8 activation quantiser and the FP8 block-scaled linear
 * (spec/MODEL.md §2.4), plus the dispatcher dsv4_cuda_linear.
 *
 * Why tensor-core mma.sync for a GEMV: at decode the FP8 linears stream
 * ~4.6 GB of weights per step (spec/PERFORMANCE.md §2) and must run at HBM
 * speed. Decoding E4M3 to fp32 on the CUDA cores costs conversions at a
 * quarter rate; the FP8 mma consumes the bytes as stored, so the kernel is
 * only a stream of 16-byte loads. Weights are the M side (16 rows per
 * warp tile), tokens the N side (8 per mma, NT n-tiles per warp), so one
 * weight read serves up to 8·NT tokens — the verify / batched-decode rows.
 *
 * Within one 128-column block every product shares the weight-block and
 * activation-block scales, so the order of columns inside the block does
 * not matter: each lane takes 32 contiguous bytes of its two rows and the
 * matching 32 activation bytes, and the 4 mma steps walk them; no shuffles,
 * no repacking of the stored weight.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_gemm.cuh"

/* ---------------------------------------------------------------- act quant */

/* One warp per (row, 128-block); each lane quantises 4 consecutive values. */
/* u != NULL: x is g and the values quantised are h = cu_swiglu1(g, u, limit) (the shared expert's w2 input). */
__global__ void k_act_quant(const float *__restrict__ x, int n, int dim, uint8_t *__restrict__ q,
                            float *__restrict__ s, const float *__restrict__ u, float limit) {
    pdl_trigger();
    pdl_wait();
    int wid = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31, nb = dim >> 7;
    if (wid >= n * nb) return;
    int r = wid / nb, b = wid % nb;
    float4 v = ((const float4 *)(x + (size_t)r * dim + b * 128))[lane];
    if (u) {
        const float4 uv = ((const float4 *)(u + (size_t)r * dim + b * 128))[lane];
        v = make_float4(cu_swiglu1(v.x, uv.x, limit), cu_swiglu1(v.y, uv.y, limit), cu_swiglu1(v.z, uv.z, limit),
                        cu_swiglu1(v.w, uv.w, limit));
    }
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    amax = fmaxf(amax, 1e-4f);
    const float sc = pow2_ceil(amax / 448.0f);
    const float inv = 1.0f / sc; /* exact: sc is a power of two in the normal range */
    const uint32_t p = pack_e4m3x4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    ((uint32_t *)(q + (size_t)r * dim + b * 128))[lane] = p;
    if (lane == 0) s[(size_t)r * nb + b] = sc;
}

int cu_act_quant(dsv4_cuda_ctx *c, const float *x, int n, int dim, uint8_t *q, float *s,
                 dsv4_err *err, const float *u, float limit) {
    if (n <= 0) return DSV4_OK;
    size_t warps = (size_t)n * (dim / 128);
    unsigned blocks = (unsigned)((warps * 32 + 255) / 256);
    CU_TRY(cu_launch(c, k_act_quant, dim3(blocks), dim3(256), 0, x, n, dim, q, s, u, limit), err, "act_quant");
    return DSV4_OK;
}

extern "C" int dsv4_cuda_act_quant(dsv4_cuda_ctx *c, const float *x, int n, int dim, uint8_t *q,
                                   float *s, dsv4_err *err) {
    if (!c || n < 0 || (n && (!x || !q || !s)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_act_quant: bad argument");
    if (dim <= 0 || dim % 128)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_act_quant: dim %d is not a multiple of 128", dim);
    return cu_act_quant(c, x, n, dim, q, s, err);
}

/* -------------------------------------------------------------- FP8 linear */

struct Frag8 {
    uint4 a0, a0b, a1, a1b; /* rows g and g+8: 32 bytes each */
};

__device__ __forceinline__ void load_frag8(Frag8 &f, const uint8_t *w0, const uint8_t *w1, int c) {
    f.a0 = ld_stream(w0 + (size_t)c * 128);
    f.a0b = ld_stream(w0 + (size_t)c * 128 + 16);
    f.a1 = ld_stream(w1 + (size_t)c * 128);
    f.a1b = ld_stream(w1 + (size_t)c * 128 + 16);
}

/*
 * Block = KW warps on one 16-row tile (blockIdx.x), splitting its 128-column
 * chunks; blockIdx.y selects 8·NT tokens. Partial sums meet in shared
 * memory, so the result is deterministic (no atomics).
 */
template <int NT, bool FQ>
__global__ void __launch_bounds__(512) k_fp8_linear(const uint8_t *__restrict__ W,
                                                    const uint8_t *__restrict__ WS,
                                                    const float *__restrict__ x,
                                                    const uint8_t *__restrict__ xq,
                                                    const float *__restrict__ xs, int n, int R,
                                                    int K, float *__restrict__ y, int flags) {
    /* FQ: quantise x in the kernel (few rows); else read xq/xs from act_quant */
    extern __shared__ float red[]; /* [KW][32][4] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, KW = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, C = K >> 7;
    const int tok0 = blockIdx.y * 8 * NT;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const uint8_t *w0 = W + (size_t)(row0 + g) * K + 32 * t;
    const uint8_t *w1 = w0 + (size_t)8 * K;
    const uint8_t *wsr = WS + (size_t)(row0 >> 7) * C;

    pdl_trigger();
    Frag8 nxt;
    int c = warp;
    if (c < C) load_frag8(nxt, w0, w1, c); /* weights: before waiting on the producer of x */
    pdl_wait();
    for (; c < C; c += KW) {
        const Frag8 f = nxt;
        if (c + KW < C) load_frag8(nxt, w0, w1, c + KW); /* two chunks in flight */
        const float wsc = e8m0_to_f32(wsr[c]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int tb = tok0 + nt * 8;
            if (tb >= n) break;
            const int tk = tb + g;
            uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
            float s0, s1;
            const int t0 = tb + 2 * t;
            if (FQ) {
                float v[32];
                if (tk < n) {
                    const float4 *p = (const float4 *)(x + (size_t)tk * K + (size_t)c * 128 + 32 * t);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const float4 f4 = __ldg(p + i);
                        v[4 * i] = f4.x; v[4 * i + 1] = f4.y; v[4 * i + 2] = f4.z; v[4 * i + 3] = f4.w;
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; i++) v[i] = 0.f;
                }
                uint32_t q[8];
                const float sc = quant_quad(v, q, tk < n);
                b0 = make_uint4(q[0], q[1], q[2], q[3]);
                b1 = make_uint4(q[4], q[5], q[6], q[7]);
                /* scales of mma columns 2t, 2t+1 live in quads 2t, 2t+1 */
                s0 = __shfl_sync(0xffffffffu, sc, 8 * t) * wsc;
                s1 = __shfl_sync(0xffffffffu, sc, 8 * t + 4) * wsc;
                if (t0 >= n) s0 = 0.f;
                if (t0 + 1 >= n) s1 = 0.f;
            } else {
                if (tk < n) {
                    const uint4 *p = (const uint4 *)(xq + (size_t)tk * K + (size_t)c * 128 + 32 * t);
                    b0 = __ldg(p);
                    b1 = __ldg(p + 1);
                }
                s0 = t0 < n ? __ldg(xs + (size_t)t0 * C + c) * wsc : 0.f;
                s1 = t0 + 1 < n ? __ldg(xs + (size_t)(t0 + 1) * C + c) * wsc : 0.f;
            }
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            mma_e4m3(d, f.a0.x, f.a1.x, f.a0.y, f.a1.y, b0.x, b0.y);
            mma_e4m3(d, f.a0.z, f.a1.z, f.a0.w, f.a1.w, b0.z, b0.w);
            mma_e4m3(d, f.a0b.x, f.a1b.x, f.a0b.y, f.a1b.y, b1.x, b1.y);
            mma_e4m3(d, f.a0b.z, f.a1b.z, f.a0b.w, f.a1b.w, b1.z, b1.w);
            acc[nt][0] += d[0] * s0;
            acc[nt][1] += d[1] * s1;
            acc[nt][2] += d[2] * s0;
            acc[nt][3] += d[3] * s1;
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int tb = tok0 + nt * 8;
        if (tb >= n) break; /* block-uniform */
        float v[4] = {acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]};
        if (KW > 1) {
            float4 *rp = (float4 *)red;
            rp[warp * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
            __syncthreads();
            if (warp == 0) {
                for (int w = 1; w < KW; w++) {
                    float4 o = rp[w * 32 + lane];
                    v[0] += o.x; v[1] += o.y; v[2] += o.z; v[3] += o.w;
                }
            }
            __syncthreads();
        }
        if (warp == 0) {
            const int t0 = tb + 2 * t;
            if (flags & DSV4_CUDA_OUT_BF16)
                for (int i = 0; i < 4; i++) v[i] = round_bf16(v[i]);
            const int r0 = row0 + g, r1 = r0 + 8;
            if (t0 < n) {
                y[(size_t)t0 * R + r0] = v[0];
                y[(size_t)t0 * R + r1] = v[2];
            }
            if (t0 + 1 < n) {
                y[(size_t)(t0 + 1) * R + r0] = v[1];
                y[(size_t)(t0 + 1) * R + r1] = v[3];
            }
        }
    }
}

/*
 * Small-n FP8 linear (n <= 8: decode, one request's verify rows). Persistent
 * blocks of KW warps walk the row tiles blockIdx.x, +gridDim.x, ...; the
 * warps split each tile's 128-column chunks (C % KW == 0, so every warp
 * reaches the per-tile reduction on the same iteration) and keep the next
 * chunk's weights in flight across tile boundaries, so a warp streams
 * without gaps. The n activation rows are staged once per block in shared
 * memory: quantised there (FQ) or copied from act_quant's output. Rows are
 * padded by 16 bytes so the 8 rows of an mma fragment hit different banks.
 */
#define XQ_PAD 16
#define FP8_GROUP_MAX 4
/* Up to FP8_GROUP_MAX FP8 weights with the same in-dim and input, streamed
 * by one launch: their row tiles are numbered one after another (tile0). */
struct Fp8Group {
    int nw;
    const uint8_t *W[FP8_GROUP_MAX], *WS[FP8_GROUP_MAX];
    float *y[FP8_GROUP_MAX];
    int R[FP8_GROUP_MAX];
    int tile0[FP8_GROUP_MAX + 1];
};

__device__ __forceinline__ int group_of(const Fp8Group &G8, int tg) {
    int i = 0;
    while (i + 1 < G8.nw && tg >= G8.tile0[i + 1]) i++;
    return i;
}

template <bool FQ, bool GROUP>
__global__ void __launch_bounds__(512, 2) k_fp8_small(const Fp8Group G8, const float *__restrict__ x,
                                                   const uint8_t *__restrict__ xq,
                                                   const float *__restrict__ xs, int n, int K,
                                                   int flags) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, KW = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int C = K >> 7, T = G8.tile0[G8.nw], ld = K + XQ_PAD;
    float *red = (float *)sm;         /* [KW][32][4] */
    float *sxs = red + KW * 128;      /* [n][C]      */
    uint8_t *sxq = sm + ((KW * 512 + n * C * 4 + 15) & ~15); /* [n][ld] */
    pdl_trigger();
    int tile = blockIdx.x, c = warp;
    Frag8 nxt;
    if (tile < T) {
        const int wi = GROUP ? group_of(G8, tile) : 0;
        const uint8_t *w0 = G8.W[wi] + (size_t)((tile - G8.tile0[wi]) * 16 + g) * K + 32 * t;
        load_frag8(nxt, w0, w0 + (size_t)8 * K, c); /* before waiting on x's producer */
    }
    pdl_wait();
    if (FQ) {
        for (int task = warp; task < n * C; task += KW) {
            const int r = task / C, b = task % C;
            const float4 v = __ldg((const float4 *)(x + (size_t)r * K + b * 128) + lane);
            float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
            for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            amax = fmaxf(amax, 1e-4f);
            const float sc = pow2_ceil(amax / 448.0f), inv = 1.0f / sc;
            *(uint32_t *)(sxq + r * ld + b * 128 + 4 * lane) =
                pack_e4m3x4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
            if (lane == 0) sxs[r * C + b] = sc;
        }
    } else {
        const int k16 = K >> 4;
        for (int i = threadIdx.x; i < n * k16; i += blockDim.x) {
            const int r = i / k16, j = i % k16;
            *(uint4 *)(sxq + r * ld + 16 * j) = __ldg((const uint4 *)(xq + (size_t)r * K) + j);
        }
        for (int i = threadIdx.x; i < n * C; i += blockDim.x) sxs[i] = __ldg(xs + i);
    }
    __syncthreads();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const int t0 = 2 * t;
    while (tile < T) {
        const Frag8 f = nxt;
        const int tt = tile, cc = c;
        c += KW;
        if (c >= C) {
            c = warp;
            tile += gridDim.x;
        }
        if (tile < T) {
            const int wi = GROUP ? group_of(G8, tile) : 0;
            const uint8_t *w0 = G8.W[wi] + (size_t)((tile - G8.tile0[wi]) * 16 + g) * K + 32 * t;
            load_frag8(nxt, w0, w0 + (size_t)8 * K, c);
        }
        const int wt = GROUP ? group_of(G8, tt) : 0, lt = tt - G8.tile0[wt];
        const float wsc = e8m0_to_f32(G8.WS[wt][(size_t)(lt >> 3) * C + cc]);
        uint4 b0 = make_uint4(0, 0, 0, 0), b1 = b0;
        if (g < n) {
            const uint4 *p = (const uint4 *)(sxq + g * ld + cc * 128 + 32 * t);
            b0 = p[0];
            b1 = p[1];
        }
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        mma_e4m3(d, f.a0.x, f.a1.x, f.a0.y, f.a1.y, b0.x, b0.y);
        mma_e4m3(d, f.a0.z, f.a1.z, f.a0.w, f.a1.w, b0.z, b0.w);
        mma_e4m3(d, f.a0b.x, f.a1b.x, f.a0b.y, f.a1b.y, b1.x, b1.y);
        mma_e4m3(d, f.a0b.z, f.a1b.z, f.a0b.w, f.a1b.w, b1.z, b1.w);
        const float s0 = t0 < n ? sxs[t0 * C + cc] * wsc : 0.f;
        const float s1 = t0 + 1 < n ? sxs[(t0 + 1) * C + cc] * wsc : 0.f;
        acc[0] += d[0] * s0;
        acc[1] += d[1] * s1;
        acc[2] += d[2] * s0;
        acc[3] += d[3] * s1;
        if (cc + KW >= C) { /* this tile is done in every warp: reduce, write */
            float v[4] = {acc[0], acc[1], acc[2], acc[3]};
            if (KW > 1) {
                float4 *rp = (float4 *)red;
                rp[warp * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
                __syncthreads();
                if (warp == 0)
                    for (int w = 1; w < KW; w++) {
                        const float4 o = rp[w * 32 + lane];
                        v[0] += o.x; v[1] += o.y; v[2] += o.z; v[3] += o.w;
                    }
                __syncthreads();
            }
            if (warp == 0) {
                if (flags & DSV4_CUDA_OUT_BF16)
                    for (int i = 0; i < 4; i++) v[i] = round_bf16(v[i]);
                float *y = G8.y[wt];
                const int R = G8.R[wt], r0 = lt * 16 + g, r1 = r0 + 8;
                if (flags & CU_LIN_ADD_OUT) { /* y += W·x: y's old value + this sum, as k_add (a + b) */
                    if (t0 < n) {
                        v[0] = y[(size_t)t0 * R + r0] + v[0];
                        v[2] = y[(size_t)t0 * R + r1] + v[2];
                    }
                    if (t0 + 1 < n) {
                        v[1] = y[(size_t)(t0 + 1) * R + r0] + v[1];
                        v[3] = y[(size_t)(t0 + 1) * R + r1] + v[3];
                    }
                }
                if (t0 < n) {
                    y[(size_t)t0 * R + r0] = v[0];
                    y[(size_t)t0 * R + r1] = v[2];
                }
                if (t0 + 1 < n) {
                    y[(size_t)(t0 + 1) * R + r0] = v[1];
                    y[(size_t)(t0 + 1) * R + r1] = v[3];
                }
            }
            acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
        }
    }
}

template <bool FQ, bool GROUP>
static int launch_fp8_small(dsv4_cuda_ctx *c, const Fp8Group &G8, int K, const float *x,
                            const uint8_t *xq, const float *xs, int n, int flags, dsv4_err *err) {
    const int C = K / 128, T = G8.tile0[G8.nw];
    int kw = 1; /* a power of two dividing C, leaving >= 4 chunks per warp and tile */
    while (kw < 16 && C % (kw * 2) == 0 && C / (kw * 2) >= 4) kw *= 2;
    size_t smem = (((size_t)kw * 512 + (size_t)n * C * 4 + 15) & ~(size_t)15) +
                  (size_t)n * (size_t)(K + XQ_PAD);
    if (smem > 48 * 1024)
        CU_TRY(cudaFuncSetAttribute(k_fp8_small<FQ, GROUP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem),
               err, "fp8 linear (shared memory)");
    int per_sm = 0;
    CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_fp8_small<FQ, GROUP>, kw * 32, smem),
           err, "fp8 linear (occupancy)");
    if (per_sm < 1) per_sm = 1;
    int gx = per_sm * c->prop.multiProcessorCount;
    if (gx > T) gx = T;
    CU_TRY(cu_launch(c, k_fp8_small<FQ, GROUP>, dim3((unsigned)gx), dim3(kw * 32), smem, G8, x, xq, xs, n,
                     K, flags),
           err, "fp8 linear (small n)");
    return DSV4_OK;
}

template <bool FQ>
static int launch_fp8_small(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x,
                            const uint8_t *xq, const float *xs, int n, float *y, int flags,
                            dsv4_err *err) {
    Fp8Group G8;
    memset(&G8, 0, sizeof G8);
    G8.nw = 1;
    G8.W[0] = (const uint8_t *)w->w;
    G8.WS[0] = (const uint8_t *)w->scale;
    G8.y[0] = y;
    G8.R[0] = (int)w->out;
    G8.tile0[1] = (int)(w->out / 16);
    return launch_fp8_small<FQ, false>(c, G8, (int)w->in, x, xq, xs, n, flags, err);
}

template <int NT, bool FQ>
static int launch_fp8(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x,
                      const uint8_t *xq, const float *xs, int n, float *y, int flags, int kw,
                      dsv4_err *err) {
    dim3 grid((unsigned)(w->out / 16), (unsigned)((n + 8 * NT - 1) / (8 * NT)));
    size_t smem = (size_t)kw * 32 * 4 * sizeof(float);
    CU_TRY(cu_launch(c, k_fp8_linear<NT, FQ>, grid, dim3(kw * 32), smem, (const uint8_t *)w->w,
                     (const uint8_t *)w->scale, x, xq, xs, n, (int)w->out, (int)w->in, y, flags),
           err, "fp8 linear");
    return DSV4_OK;
}

/*
 * Many-row FP8 linear (prefill chunks, n >= DSV4_CUDA_FP8_GEMM_MIN rows).
 * Why: the kernels above hold one 16-row weight tile per warp and walk the
 * tokens 8·NT at a time, so every 64 tokens re-read the weights and every
 * weight tile re-reads the activations (~110 TFLOP/s at n = 64, and no
 * better at n = 4096). Here a block of 4 warps owns a 128-row x BN-token
 * output tile; both operands go through shared memory in 128-column chunks
 * (FP8_STAGES deep, cp.async), each warp computes 64 rows x BN/2 tokens with
 * m16n8k32 FP8 mma.
 *
 * Numerics are today's (spec/MODEL.md §2.4): per 128-column chunk the four
 * mma steps accumulate from zero on the tensor cores, then acc += d ·
 * (x scale · weight-block scale) in fp32; only the order of the chunk sums
 * differs from k_fp8_linear (which splits chunks over warps).
 * Shared rows are padded to 144 bytes: the 8 rows of a fragment load then
 * fall in different banks.
 */
#define G8_LD 144
#define FP8_STAGES 3

template <int NTW, int WN>
__global__ void __launch_bounds__(64 * WN) k_fp8_gemm(const uint8_t *__restrict__ W,
                                                  const uint8_t *__restrict__ WS,
                                                  const uint8_t *__restrict__ xq,
                                                  const float *__restrict__ xs, int n, int R, int K,
                                                  float *__restrict__ y, int flags) {
    constexpr int NTH = 64 * WN, BN = 8 * NTW * WN;  /* threads; tokens per block */
    constexpr int SA = 128 * G8_LD, SB = BN * G8_LD;  /* bytes per stage */
    constexpr int STAGE = SA + SB + BN * 4;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * 128, tok0 = blockIdx.y * BN, C = K >> 7;
    pdl_trigger();
    pdl_wait();
    /* this thread's copies (16 B each): 1024 / NTH weight pieces, NTW activation pieces */
    const int pc = tid & 7, prow = tid >> 3;
    auto load = [&](int st, int c) {
        uint8_t *base = sm + st * STAGE;
#pragma unroll
        for (int j = 0; j < 1024 / NTH; j++) {
            const int row = prow + (NTH / 8) * j;
            const bool ok = r0 + row < R;
            cp_async16(base + row * G8_LD + pc * 16, W + (size_t)(ok ? r0 + row : 0) * K + (size_t)c * 128 + pc * 16, ok);
        }
#pragma unroll
        for (int j = 0; j < NTW; j++) {
            const int tk = prow + (NTH / 8) * j;
            const bool ok = tok0 + tk < n;
            cp_async16(base + SA + tk * G8_LD + pc * 16, xq + (size_t)(ok ? tok0 + tk : 0) * K + (size_t)c * 128 + pc * 16, ok);
        }
        if (tid < BN) {
            const bool ok = tok0 + tid < n;
            cp_async4(base + SA + SB + tid * 4, xs + (size_t)(ok ? tok0 + tid : 0) * C + c, ok);
        }
    };
    float acc[4][NTW][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll
    for (int st = 0; st < FP8_STAGES - 1; st++) {
        if (st < C) load(st, st);
        cp_commit();
    }
    const uint8_t *wsr = WS + (size_t)(r0 >> 7) * C;
    for (int c = 0; c < C; c++) {
        cp_wait<FP8_STAGES - 2>();
        __syncthreads();
        if (c + FP8_STAGES - 1 < C) load((c + FP8_STAGES - 1) % FP8_STAGES, c + FP8_STAGES - 1);
        cp_commit();
        const uint8_t *base = sm + (c % FP8_STAGES) * STAGE;
        const float wsc = e8m0_to_f32(__ldg(wsr + c));
        /* all BN/2 token fragments of this warp, then one weight tile at a time */
        uint4 bf[NTW][2];
        float s0[NTW], s1[NTW];
        const float *sx = (const float *)(base + SA + SB);
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) {
            const int tl = wn * (NTW * 8) + nt * 8;
            const uint8_t *pb = base + SA + (tl + g) * G8_LD + 32 * t;
            bf[nt][0] = *(const uint4 *)pb;
            bf[nt][1] = *(const uint4 *)(pb + 16);
            s0[nt] = sx[tl + 2 * t] * wsc;
            s1[nt] = sx[tl + 2 * t + 1] * wsc;
        }
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            const uint8_t *p0 = base + (wm * 64 + mt * 16 + g) * G8_LD + 32 * t;
            Frag8 f;
            f.a0 = *(const uint4 *)p0;
            f.a0b = *(const uint4 *)(p0 + 16);
            f.a1 = *(const uint4 *)(p0 + 8 * G8_LD);
            f.a1b = *(const uint4 *)(p0 + 8 * G8_LD + 16);
#pragma unroll
            for (int nt = 0; nt < NTW; nt++) {
                const uint4 b0 = bf[nt][0], b1 = bf[nt][1];
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                mma_e4m3(d, f.a0.x, f.a1.x, f.a0.y, f.a1.y, b0.x, b0.y);
                mma_e4m3(d, f.a0.z, f.a1.z, f.a0.w, f.a1.w, b0.z, b0.w);
                mma_e4m3(d, f.a0b.x, f.a1b.x, f.a0b.y, f.a1b.y, b1.x, b1.y);
                mma_e4m3(d, f.a0b.z, f.a1b.z, f.a0b.w, f.a1b.w, b1.z, b1.w);
                acc[mt][nt][0] += d[0] * s0[nt];
                acc[mt][nt][1] += d[1] * s1[nt];
                acc[mt][nt][2] += d[2] * s0[nt];
                acc[mt][nt][3] += d[3] * s1[nt];
            }
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
        const int ra = r0 + wm * 64 + mt * 16 + g;
        if (ra >= R) continue; /* R % 16 == 0: rows g and g+8 go together */
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) {
            const int tk = tok0 + wn * (NTW * 8) + nt * 8 + 2 * t;
            float v[4] = {acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]};
            if (flags & DSV4_CUDA_OUT_BF16)
                for (int i = 0; i < 4; i++) v[i] = round_bf16(v[i]);
            if (tk < n) {
                y[(size_t)tk * R + ra] = v[0];
                y[(size_t)tk * R + ra + 8] = v[2];
            }
            if (tk + 1 < n) {
                y[(size_t)(tk + 1) * R + ra] = v[1];
                y[(size_t)(tk + 1) * R + ra + 8] = v[3];
            }
        }
    }
}

template <int NTW, int WN>
static int launch_fp8_gemm(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const uint8_t *xq,
                           const float *xs, int n, float *y, int flags, dsv4_err *err) {
    constexpr int BN = 8 * NTW * WN;
    const size_t smem = (size_t)FP8_STAGES * (128 * G8_LD + BN * G8_LD + BN * 4);
    /* per device (tensor parallel: one context per GPU), so on every call */
    CU_TRY(cudaFuncSetAttribute(k_fp8_gemm<NTW, WN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
           err, "fp8 gemm (shared memory)");
    dim3 grid((unsigned)((w->out + 127) / 128), (unsigned)((n + BN - 1) / BN));
    CU_TRY(cu_launch(c, k_fp8_gemm<NTW, WN>, grid, dim3(64 * WN), smem, (const uint8_t *)w->w,
                     (const uint8_t *)w->scale, xq, xs, n, (int)w->out, (int)w->in, y, flags),
           err, "fp8 linear (gemm)");
    return DSV4_OK;
}

/*
 * Tile shapes (BN = 8·NTW·WN tokens x 128 rows, 2·WN warps);
 * DSV4_CUDA_FP8_GEMM_CFG = 1..4 forces one. Measured on H200
 * (bench/results/2026-11-30-cuda-moe-prefill-h200.md): 64 tokens x 4 warps
 * is the fastest once its grid fills the GPU twice (252-262 TFLOP/s at
 * n = 4096; 8 warps or 128 tokens per block were slower); below that 32
 * tokens (twice the blocks); below ~1.5 waves of those, k_fp8_linear, whose
 * warps split the columns (narrow weights at a few hundred rows).
 */
/* rows from which the tiled GEMM may run (fp8_gemm_pick decides by grid size) */
#define FP8_GEMM_MIN_DEFAULT 64
typedef int (*fp8_gemm_fn)(dsv4_cuda_ctx *, const dsv4_cuda_weight *, const uint8_t *, const float *, int,
                           float *, int, dsv4_err *);
static const fp8_gemm_fn fp8_gemm_cfgs[] = {
    launch_fp8_gemm<2, 2>, /* 1: 32 tokens, 4 warps */
    launch_fp8_gemm<4, 2>, /* 2: 64 tokens, 4 warps */
    launch_fp8_gemm<2, 4>, /* 3: 64 tokens, 8 warps */
    launch_fp8_gemm<4, 4>, /* 4: 128 tokens, 8 warps */
};
/* index into fp8_gemm_cfgs, or -1: not the GEMM */
static int fp8_gemm_pick(const dsv4_cuda_weight *w, int n) {
    const int f = cu_env_int("DSV4_CUDA_FP8_GEMM_CFG", 0);
    const int gmin = cu_env_int("DSV4_CUDA_FP8_GEMM_MIN", FP8_GEMM_MIN_DEFAULT);
    if (n < gmin) return -1;
    const int forced = gmin < FP8_GEMM_MIN_DEFAULT; /* tests: every n >= gmin */
    if (f >= 1 && f <= (int)(sizeof fp8_gemm_cfgs / sizeof fp8_gemm_cfgs[0])) return f - 1;
    const long long rb = (w->out + 127) / 128;
    if (rb * ((n + 63) / 64) >= 2 * 128) return 1;
    if (forced || rb * ((n + 31) / 32) >= 192) return 0;
    return -1;
}

/* Warps per tile: enough to keep the HBM busy on narrow matrices, at least
 * two 128-column chunks per warp so the double buffer has work. */
static int pick_kw(int chunks) {
    int kw = chunks / 2;
    if (kw < 1) kw = 1;
    if (kw > 16) kw = 16;
    return kw;
}


static int pick_nt(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

/* cuda_fp8_lt.cu */
int cu_fp8_lt_rows(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, int n);
int cu_fp8_lt(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const uint8_t *xq, const float *xs, int n, float *y,
              int flags, dsv4_err *err);

static int fp8_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x,
                      const uint8_t *xq, const float *xs, int n, float *y, int flags, dsv4_err *err) {
    int kw = pick_kw((int)(w->in / 128));
    if (!xq) return launch_fp8_small<true>(c, w, x, xq, xs, n, y, flags, err);
    if (n <= 8) return launch_fp8_small<false>(c, w, x, xq, xs, n, y, flags, err);
    const int gi = fp8_gemm_pick(w, n);
    /* prefill sizes: cuBLASLt's block-scaled FP8 GEMM (cuda_fp8_lt.cu) on whole
     * 16-row groups, unless a tile shape is forced (harness comparisons) */
    const int nl = gi >= 0 && cu_env_int("DSV4_CUDA_FP8_GEMM_CFG", 0) == 0 ? cu_fp8_lt_rows(c, w, n) : 0;
    if (nl > 0) {
        const int rc = cu_fp8_lt(c, w, xq, xs, nl, y, flags, err);
        if (rc == DSV4_OK) {
            if (nl == n) return DSV4_OK;
            const size_t K = (size_t)w->in;
            return fp8_linear(c, w, x ? x + (size_t)nl * K : NULL, xq + (size_t)nl * K, xs + (size_t)nl * (K / 128),
                              n - nl, y + (size_t)nl * w->out, flags, err);
        }
        if (rc != DSV4_EUNSUPPORTED) return rc;
    }
    if (gi >= 0) return fp8_gemm_cfgs[gi](c, w, xq, xs, n, y, flags, err);
    switch (pick_nt(n)) {
    case 1: return launch_fp8<1, false>(c, w, x, xq, xs, n, y, flags, kw, err);
    case 2: return launch_fp8<2, false>(c, w, x, xq, xs, n, y, flags, kw, err);
    case 4: return launch_fp8<4, false>(c, w, x, xq, xs, n, y, flags, kw, err);
    default: return launch_fp8<8, false>(c, w, x, xq, xs, n, y, flags, kw, err);
    }
}

int cu_bf16_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, int n, float *y,
                   int flags, dsv4_err *err);
int cu_bf16_linear_group(dsv4_cuda_ctx *c, int nw, const dsv4_cuda_weight *const *w, const float *x, int n,
                         float *const *y, int flags, dsv4_err *err);

/* x [n][K] (or h = swiglu(x, u) when u != NULL) quantised W8A8 into the context's workspace:
 * *xq [n][K] E4M3, *xs [n][K/128] scales (valid until the next workspace user). */
static int quant_input(dsv4_cuda_ctx *c, const float *x, const float *u, float limit, int n, int K, uint8_t **xq,
                       float **xs, dsv4_err *err) {
    size_t qb = cu_align((size_t)n * K), sb = cu_align((size_t)n * (K / 128) * sizeof(float));
    void *ws = NULL;
    int rc = cu_workspace(c, qb + sb, &ws, err);
    if (rc) return rc;
    *xq = (uint8_t *)ws;
    *xs = (float *)((uint8_t *)ws + qb);
    return cu_act_quant(c, x, n, K, *xq, *xs, err, u, limit);
}

extern "C" int dsv4_cuda_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, int n,
                                float *y, int flags, dsv4_err *err) {
    if (!c || !w || n < 0 || (n && (!x || !y)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear: bad argument");
    if (n == 0) return DSV4_OK;
    if (w->kind == DSV4_CUDA_W_BF16) return cu_bf16_linear(c, w, x, n, y, flags, err);
    if (w->kind != DSV4_CUDA_W_FP8 && w->kind != DSV4_CUDA_W_FP4)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear: weight kind %d not uploaded", (int)w->kind);
    if (n <= c->fuseq_max) { /* one launch: the GEMV quantises x itself */
        if (w->kind == DSV4_CUDA_W_FP8) return fp8_linear(c, w, x, NULL, NULL, n, y, flags, err);
        return cu_fp4_linear(c, w, x, NULL, NULL, n, y, flags, err);
    }
    uint8_t *xq;
    float *xs;
    int rc = quant_input(c, x, NULL, 0.f, n, (int)w->in, &xq, &xs, err);
    if (rc) return rc;
    if (w->kind == DSV4_CUDA_W_FP8) return fp8_linear(c, w, x, xq, xs, n, y, flags, err);
    return cu_fp4_linear(c, w, x, xq, xs, n, y, flags, err);
}

/*
 * y [n][out] += W · swiglu(g, u) for n <= 8 rows and an FP8 weight
 * (the shared expert's w2 at decode, spec/MODEL.md §3.5): the activation
 * quantiser computes h = cu_swiglu1(g, u) as it reads its input and the
 * small-n GEMV adds the old y in its epilogue, so the swiglu and add kernels
 * go (~2 us each a layer at batch 1 on an H200, bench/results/2026-12-02-
 * decode-l2-prefetch-h200.md section 4). Same bits as swiglu, linear, add.
 * Returns DSV4_EUNSUPPORTED where this path does not apply (the caller
 * composes the three ops); DSV4_EINVAL on bad arguments.
 */
extern "C" int dsv4_cuda_linear_swiglu_add(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *g,
                                           const float *u, float limit, int n, float *y, int flags, dsv4_err *err) {
    if (!c || !w || n < 0 || (n && (!g || !u || !y)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear_swiglu_add: bad argument");
    if (n == 0) return DSV4_OK;
    if (w->kind != DSV4_CUDA_W_FP8 || n > 8 || w->in % 128 || w->out % 16) return DSV4_EUNSUPPORTED;
    uint8_t *xq;
    float *xs;
    int rc = quant_input(c, g, u, limit, n, (int)w->in, &xq, &xs, err);
    if (rc) return rc;
    return launch_fp8_small<false>(c, w, NULL, xq, xs, n, y, flags | CU_LIN_ADD_OUT, err);
}

extern "C" int dsv4_cuda_linear_q(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const uint8_t *xq,
                                  const float *xs, int n, float *y, int flags, dsv4_err *err) {
    if (!c || !w || n < 0 || (n && (!xq || !xs || !y)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear_q: bad argument");
    if (w->kind != DSV4_CUDA_W_FP8 && w->kind != DSV4_CUDA_W_FP4)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear_q: weight kind %d is not FP8/FP4", (int)w->kind);
    if (n == 0) return DSV4_OK;
    if (w->kind == DSV4_CUDA_W_FP8) return fp8_linear(c, w, NULL, xq, xs, n, y, flags, err);
    return cu_fp4_linear(c, w, NULL, xq, xs, n, y, flags, err);
}

extern "C" int dsv4_cuda_linear_group(dsv4_cuda_ctx *c, int nw, const dsv4_cuda_weight *const *w,
                                      const float *x, int n, float *const *y, int flags,
                                      dsv4_err *err) {
    if (!c || nw <= 0 || !w || !y || n < 0 || (n && !x))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear_group: bad argument");
    if (n == 0) return DSV4_OK;
    int grouped = n <= 8, all_bf16 = 1;
    for (int i = 0; i < nw; i++) {
        if (!w[i] || !y[i]) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_linear_group: weight/output %d is NULL", i);
        if (w[i]->kind != DSV4_CUDA_W_FP8 || w[i]->in != w[0]->in) grouped = 0;
        if (w[i]->kind != DSV4_CUDA_W_BF16) all_bf16 = 0;
    }
    /* BF16 weights (cuda_dense.cu): one GEMV launch for the group, or one x split */
    if (all_bf16) return cu_bf16_linear_group(c, nw, w, x, n, y, flags, err);
    if (!grouped) { /* one launch per weight: same results */
        for (int i = 0; i < nw; i++) {
            int rc = dsv4_cuda_linear(c, w[i], x, n, y[i], flags, err);
            if (rc) return rc;
        }
        return DSV4_OK;
    }
    const int K = (int)w[0]->in;
    /* n <= fuseq_max (DSV4_CUDA_FUSEQ_MAX): each block quantises x itself, as dsv4_cuda_linear does */
    const int fq = n <= c->fuseq_max;
    uint8_t *xq = NULL;
    float *xs = NULL;
    int rc = DSV4_OK;
    if (!fq) {
        size_t qb = cu_align((size_t)n * K), sb = cu_align((size_t)n * (K / 128) * sizeof(float));
        void *ws = NULL;
        if ((rc = cu_workspace(c, qb + sb, &ws, err))) return rc;
        xq = (uint8_t *)ws;
        xs = (float *)((uint8_t *)ws + qb);
        if ((rc = cu_act_quant(c, x, n, K, xq, xs, err))) return rc;
    }
    for (int i0 = 0; i0 < nw; i0 += FP8_GROUP_MAX) {
        Fp8Group G8;
        memset(&G8, 0, sizeof G8);
        G8.nw = nw - i0 < FP8_GROUP_MAX ? nw - i0 : FP8_GROUP_MAX;
        for (int i = 0; i < G8.nw; i++) {
            const dsv4_cuda_weight *wi = w[i0 + i];
            G8.W[i] = (const uint8_t *)wi->w;
            G8.WS[i] = (const uint8_t *)wi->scale;
            G8.y[i] = y[i0 + i];
            G8.R[i] = (int)wi->out;
            G8.tile0[i + 1] = G8.tile0[i] + (int)(wi->out / 16);
        }
        if (fq)
            rc = G8.nw == 1 ? launch_fp8_small<true, false>(c, G8, K, x, xq, xs, n, flags, err)
                            : launch_fp8_small<true, true>(c, G8, K, x, xq, xs, n, flags, err);
        else
            rc = G8.nw == 1 ? launch_fp8_small<false, false>(c, G8, K, x, xq, xs, n, flags, err)
                            : launch_fp8_small<false, true>(c, G8, K, x, xq, xs, n, flags, err);
        if (rc) return rc;
    }
    return DSV4_OK;
}
