/*
 * cuda_moe.cu — FP4 (E2M1, per-32 E8M0 scales) linears and the grouped
 * routed-expert MoE of one step (spec/MODEL.md §2.3, §2.4, §3.5).
 *
 * Why this shape: Hopper has no FP4 tensor cores, and converting E2M1 to
 * fp32 on the CUDA cores costs more integer work per byte than HBM delivers
 * bytes. E2M1 -> E4M3 is a pure bit move (cuda_internal.cuh
 * fp4x8_to_e4m3, ~1 op per value), after which the FP8 mma does the math;
 * the weights are repacked at upload (cuda_weights.cu) so each mma step sees
 * one scale group per row. On sm_90 that FP8 mma.sync is itself 2 FP16
 * HMMAs + conversions + 4 FADDs, so the expert kernels by default convert
 * E4M3 -> FP16 themselves and call the FP16 mma (fp4x8_to_f16,
 * mma_e4m3_f16; same HMMA inputs, same results bit for bit, ~6-18% fewer
 * instructions; DSV4_CUDA_MOE_F16=0 selects the FP8 form,
 * bench/results/2026-12-01-moe-f16-h200.md). DSV4_CUDA_MOE_WG=1..6 swaps
 * the prefill grouped GEMM for a warpgroup-MMA (wgmma, sm_90a) kernel
 * (cuda_moe_wg.cuh; off by default: FP8 is faster but ~1e-3 from
 * k_moe_gemm, FP16 is bit-identical but slower,
 * bench/results/2026-12-01-moe-wgmma-h200.md).
 *
 * The MoE of a step: the tokens' top-k choices are grouped by expert on the
 * device (no host round trip, so it can live in a CUDA graph), then one
 * launch walks every selected expert's w1/w3 once for all its tokens (SwiGLU
 * fused), one walks w2, and a last kernel sums the k slots per token in a
 * fixed order (deterministic; no atomics).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_gemm.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <climits>

enum { FP4_PLAIN = 0, FP4_GATEUP = 1, FP4_DOWN = 2 };

struct Fp4Args {
    const uint8_t *w1, *s1, *w3, *s3; /* w3/s3: GATEUP only */
    size_t wstride, sstride;          /* bytes per expert */
    int R, K;
    const uint8_t *xq; /* input rows [*, K] E4M3 and their scales [*, K/128] */
    const float *xs;
    const float *xf;   /* or fp32 input rows [*, K], quantised in the kernel (FQ) */
    int n; /* PLAIN: rows of x */
    const int *act_n, *act_exp, *act_off, *list;
    int topk;
    const float *wts;
    float *y; /* output rows [*, R] */
    int flags;
};

/*
 * h = silu(min(g, 10)) · clamp(u, ±10) · w_k (§3.5). Why two storages: the
 * official code keeps g, u, h and the expert outputs in bf16
 * (DSV4_CUDA_MOE_BF16); the CPU reference keeps them fp32, and by default so
 * do we — the bf16 roundings were the largest CPU/CUDA difference of a whole
 * forward (1e-2 at the op), enough to flip greedy tokens on the tiny
 * checkpoints (bench/results/2026-11-30-cuda-cpu-equality-h200.md). expf
 * (not __expf) and the CPU's operation order: dsv4_cpu_swiglu1, then × w_k.
 */
__device__ __forceinline__ float moe_h(float g, float u, float wk, int flags) {
    if (flags & DSV4_CUDA_MOE_BF16) {
        g = round_bf16(g);
        u = round_bf16(u);
    }
    g = fminf(g, 10.f);
    u = fminf(fmaxf(u, -10.f), 10.f);
    const float h = wk * (g / (1.0f + expf(-g)) * u);
    return (flags & DSV4_CUDA_MOE_BF16) ? round_bf16(h) : h;
}

/*
 * Block = KW warps on one 16-row tile (blockIdx.x). blockIdx.y is the
 * expert slot (GATEUP/DOWN) or the 8·NT-row group (PLAIN). Columns of the
 * mma are the rows of the step that chose this expert, 8·NT per pass.
 */
template <int NT, int MODE, bool FQ, int MINB = 1, bool F16 = false>
__global__ void __launch_bounds__(256, MINB) k_fp4(Fp4Args a) {
    pdl_trigger();
    pdl_wait(); /* the expert list and x come from the previous kernels */
    extern __shared__ float red[]; /* [2][KW][32][4] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, KW = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x, C = a.K >> 7;
    int e = 0, off, cnt;
    if (MODE == FP4_PLAIN) {
        off = blockIdx.y * 8 * NT;
        cnt = min(8 * NT, a.n - off);
    } else {
        const int slot = blockIdx.y;
        if (slot >= *a.act_n) return;
        e = a.act_exp[slot];
        off = a.act_off[slot];
        cnt = a.act_off[slot + 1] - off;
    }
    const uint8_t *wb1 = a.w1 + (size_t)e * a.wstride + (size_t)tile * C * 1024 + lane * 32;
    const uint8_t *sb1 = a.s1 + (size_t)e * a.sstride + (size_t)tile * C * 64 + g * 8;
    const uint8_t *wb3 = MODE == FP4_GATEUP ? a.w3 + (size_t)e * a.wstride + (size_t)tile * C * 1024 + lane * 32 : nullptr;
    const uint8_t *sb3 = MODE == FP4_GATEUP ? a.s3 + (size_t)e * a.sstride + (size_t)tile * C * 64 + g * 8 : nullptr;
    constexpr int NM = MODE == FP4_GATEUP ? 2 : 1;

    for (int j0 = 0; j0 < cnt; j0 += 8 * NT) {
        /* input row of mma column g, and of columns 2t, 2t+1 (for scales) */
        int rin[NT], rs0[NT], rs1[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int j = j0 + nt * 8 + g, ja = j0 + nt * 8 + 2 * t;
            auto src = [&](int jj) {
                if (jj >= cnt) return -1;
                return MODE == FP4_GATEUP ? a.list[off + jj] / a.topk : off + jj;
            };
            rin[nt] = src(j);
            rs0[nt] = src(ja);
            rs1[nt] = src(ja + 1);
        }
        float acc[NM][NT][4];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.f;

        /* weights of the next chunk stay in flight while this one computes */
        uint4 np[NM][2];
        uint2 nsc[NM];
        auto fetch = [&](int cc) {
            np[0][0] = ld_stream(wb1 + (size_t)cc * 1024);
            np[0][1] = ld_stream(wb1 + (size_t)cc * 1024 + 16);
            nsc[0] = __ldg((const uint2 *)(sb1 + (size_t)cc * 64));
            if (MODE == FP4_GATEUP) {
                np[NM - 1][0] = ld_stream(wb3 + (size_t)cc * 1024);
                np[NM - 1][1] = ld_stream(wb3 + (size_t)cc * 1024 + 16);
                nsc[NM - 1] = __ldg((const uint2 *)(sb3 + (size_t)cc * 64));
            }
        };
        if (warp < C) fetch(warp);
        for (int c = warp; c < C; c += KW) {
            uint4 p[NM][2];
            uint2 sc[NM];
#pragma unroll
            for (int m = 0; m < NM; m++) {
                p[m][0] = np[m][0];
                p[m][1] = np[m][1];
                sc[m] = nsc[m];
            }
            if (c + KW < C) fetch(c + KW);
            /* activations: column g's 4 steps, 8 bytes each (columns 32s+8t..+7) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (j0 + nt * 8 >= cnt) break;
                uint32_t b0[4], b1[4];
                float x0, x1;
                if (FQ) {
                    /* this lane's 32 columns: 32s+8t+0..7 for s = 0..3, ordered
                     * even columns then odd columns per step (the B layout) */
                    float v[32];
                    if (rin[nt] >= 0) {
                        const float *xr = a.xf + (size_t)rin[nt] * a.K + (size_t)c * 128 + 8 * t;
#pragma unroll
                        for (int s = 0; s < 4; s++) {
                            const float4 lo = __ldg((const float4 *)(xr + 32 * s));
                            const float4 hi = __ldg((const float4 *)(xr + 32 * s + 4));
                            v[8 * s + 0] = lo.x; v[8 * s + 1] = lo.z; v[8 * s + 2] = hi.x; v[8 * s + 3] = hi.z;
                            v[8 * s + 4] = lo.y; v[8 * s + 5] = lo.w; v[8 * s + 6] = hi.y; v[8 * s + 7] = hi.w;
                        }
                    } else {
#pragma unroll
                        for (int i = 0; i < 32; i++) v[i] = 0.f;
                    }
                    uint32_t q[8];
                    const float sc = quant_quad(v, q, rin[nt] >= 0);
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        b0[s] = q[2 * s];
                        b1[s] = q[2 * s + 1];
                    }
                    x0 = __shfl_sync(0xffffffffu, sc, 8 * t);
                    x1 = __shfl_sync(0xffffffffu, sc, 8 * t + 4);
                    if (rs0[nt] < 0) x0 = 0.f;
                    if (rs1[nt] < 0) x1 = 0.f;
                } else {
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        uint2 xv = make_uint2(0, 0);
                        if (rin[nt] >= 0)
                            xv = __ldg((const uint2 *)(a.xq + (size_t)rin[nt] * a.K + (size_t)c * 128 + 32 * s + 8 * t));
                        b0[s] = __byte_perm(xv.x, xv.y, 0x6420); /* even columns */
                        b1[s] = __byte_perm(xv.x, xv.y, 0x7531); /* odd columns  */
                    }
                    x0 = rs0[nt] >= 0 ? __ldg(a.xs + (size_t)rs0[nt] * C + c) : 0.f;
                    x1 = rs1[nt] >= 0 ? __ldg(a.xs + (size_t)rs1[nt] * C + c) : 0.f;
                }
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    const uint32_t wv[8] = {p[m][0].x, p[m][0].y, p[m][0].z, p[m][0].w,
                                            p[m][1].x, p[m][1].y, p[m][1].z, p[m][1].w};
                    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        uint32_t lo0, hi0, lo1, hi1;
                        fp4x8_to_e4m3(wv[2 * s], lo0, hi0);     /* row g   */
                        fp4x8_to_e4m3(wv[2 * s + 1], lo1, hi1); /* row g+8 */
                        float d[4] = {0.f, 0.f, 0.f, 0.f};
                        /* F16: the FP16 mma directly, without the lowering's FADDs */
                        if (F16) mma_e4m3_f16(d, lo0, lo1, hi0, hi1, b0[s], b1[s]);
                        else mma_e4m3(d, lo0, lo1, hi0, hi1, b0[s], b1[s]);
                        /* 2^6 undoes the E2M1 -> E4M3 bit move */
                        const float ws0 = e8m0_to_f32((sc[m].x >> (8 * s)) & 0xffu) * 64.f;
                        const float ws1 = e8m0_to_f32((sc[m].y >> (8 * s)) & 0xffu) * 64.f;
                        part[0] += d[0] * ws0;
                        part[1] += d[1] * ws0;
                        part[2] += d[2] * ws1;
                        part[3] += d[3] * ws1;
                    }
                    acc[m][nt][0] += part[0] * x0;
                    acc[m][nt][1] += part[1] * x1;
                    acc[m][nt][2] += part[2] * x0;
                    acc[m][nt][3] += part[3] * x1;
                }
            }
        }
        /* reduce the KW partial sums, then the epilogue in warp 0 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            if (j0 + nt * 8 >= cnt) break; /* block-uniform */
            float v[NM][4];
#pragma unroll
            for (int m = 0; m < NM; m++)
                for (int i = 0; i < 4; i++) v[m][i] = acc[m][nt][i];
            if (KW > 1) {
                float4 *rp = (float4 *)red;
#pragma unroll
                for (int m = 0; m < NM; m++)
                    rp[(m * KW + warp) * 32 + lane] = make_float4(v[m][0], v[m][1], v[m][2], v[m][3]);
                __syncthreads();
                if (warp == 0) {
#pragma unroll
                    for (int m = 0; m < NM; m++)
                        for (int w = 1; w < KW; w++) {
                            float4 o = rp[(m * KW + w) * 32 + lane];
                            v[m][0] += o.x; v[m][1] += o.y; v[m][2] += o.z; v[m][3] += o.w;
                        }
                }
                __syncthreads();
            }
            if (warp == 0) {
                const int r0 = tile * 16 + g;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = j0 + nt * 8 + 2 * t + (i & 1);
                    const int r = r0 + (i >> 1) * 8;
                    if (j >= cnt) continue;
                    float out;
                    if (MODE == FP4_GATEUP) {
                        out = moe_h(v[0][i], v[NM - 1][i], a.wts[a.list[off + j]], a.flags);
                    } else {
                        out = v[0][i];
                        if (a.flags & (MODE == FP4_DOWN ? DSV4_CUDA_MOE_BF16 : DSV4_CUDA_OUT_BF16)) out = round_bf16(out);
                    }
                    a.y[(size_t)(off + j) * a.R + r] = out;
                }
            }
        }
    }
}

/*
 * Persistent expert kernel (decode / verify steps). Why: with one block per
 * (expert, 16-row tile) the blocks are short (64 KB of weights), the grid
 * runs in ~3 ragged waves and every block pays its ramp-up and reduction;
 * measured at ~35% of HBM bandwidth. Here a grid of one wave walks the work
 * items (slot, tile) — tile-major inside an expert, so neighbouring blocks
 * stream neighbouring bytes — and, per item, passes of 8 rows; the warps of
 * a block split the 128-column chunks (C % KW == 0, so they reach each
 * pass's reduction together) and every warp keeps its next chunk's weights
 * in flight across pass and item boundaries.
 */
template <int MODE, bool FQ>
__global__ void __launch_bounds__(256) k_moe_fp4(Fp4Args a) {
    extern __shared__ float red[]; /* [2][KW][32][4] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, KW = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int C = a.K >> 7, T = a.R >> 4, CPW = C / KW;
    constexpr int NM = MODE == FP4_GATEUP ? 2 : 1;
    pdl_trigger();
    pdl_wait(); /* the expert list and x come from the previous kernels */
    const int total = *a.act_n * T;
    int wi = blockIdx.x, pass = 0, k = 0, e = 0, off = 0, cnt = 0, tile = 0;
    auto item = [&](int w) {
        const int slot = w / T;
        tile = w % T;
        e = a.act_exp[slot];
        off = a.act_off[slot];
        cnt = a.act_off[slot + 1] - off;
    };
    uint4 np[NM][2];
    uint2 nsc[NM];
    auto fetch = [&](int c) {
        const size_t wo = (size_t)e * a.wstride + ((size_t)tile * C + c) * 1024 + lane * 32;
        const size_t so = (size_t)e * a.sstride + ((size_t)tile * C + c) * 64 + g * 8;
        np[0][0] = ld_stream(a.w1 + wo);
        np[0][1] = ld_stream(a.w1 + wo + 16);
        nsc[0] = __ldg((const uint2 *)(a.s1 + so));
        if (MODE == FP4_GATEUP) {
            np[NM - 1][0] = ld_stream(a.w3 + wo);
            np[NM - 1][1] = ld_stream(a.w3 + wo + 16);
            nsc[NM - 1] = __ldg((const uint2 *)(a.s3 + so));
        }
    };
    if (wi < total) {
        item(wi);
        fetch(warp);
    }
    float acc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
    while (wi < total) {
        uint4 p[NM][2];
        uint2 sc[NM];
#pragma unroll
        for (int m = 0; m < NM; m++) {
            p[m][0] = np[m][0];
            p[m][1] = np[m][1];
            sc[m] = nsc[m];
        }
        const int c = warp + k * KW, ck = k, cpass = pass, coff = off, ccnt = cnt, ctile = tile;
        /* advance, and put the next chunk's loads in flight */
        if (++k == CPW) {
            k = 0;
            if ((pass + 1) * 8 < cnt) {
                pass++;
            } else {
                pass = 0;
                wi += gridDim.x;
                if (wi < total) item(wi);
            }
        }
        if (wi < total) fetch(warp + k * KW);

        /* activations: mma column g = row j of this pass */
        const int j = cpass * 8 + g;
        const int rin = j < ccnt ? (MODE == FP4_GATEUP ? a.list[coff + j] / a.topk : coff + j) : -1;
        uint32_t q[8];
        float x0, x1;
        if (!FQ) { /* pre-quantised rows (act_quant): 8 bytes per step */
            const int ja = cpass * 8 + 2 * t;
            auto src = [&](int jj) {
                return jj < ccnt ? (MODE == FP4_GATEUP ? a.list[coff + jj] / a.topk : coff + jj) : -1;
            };
            const int r0 = src(ja), r1 = src(ja + 1);
#pragma unroll
            for (int s = 0; s < 4; s++) {
                uint2 xv = make_uint2(0, 0);
                if (rin >= 0)
                    xv = __ldg((const uint2 *)(a.xq + (size_t)rin * a.K + (size_t)c * 128 + 32 * s + 8 * t));
                q[2 * s] = __byte_perm(xv.x, xv.y, 0x6420);
                q[2 * s + 1] = __byte_perm(xv.x, xv.y, 0x7531);
            }
            x0 = r0 >= 0 ? __ldg(a.xs + (size_t)r0 * C + c) : 0.f;
            x1 = r1 >= 0 ? __ldg(a.xs + (size_t)r1 * C + c) : 0.f;
        } else {
        float v[32];
        if (rin >= 0) {
            const float *xr = a.xf + (size_t)rin * a.K + (size_t)c * 128 + 8 * t;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const float4 lo = __ldg((const float4 *)(xr + 32 * s));
                const float4 hi = __ldg((const float4 *)(xr + 32 * s + 4));
                v[8 * s + 0] = lo.x; v[8 * s + 1] = lo.z; v[8 * s + 2] = hi.x; v[8 * s + 3] = hi.z;
                v[8 * s + 4] = lo.y; v[8 * s + 5] = lo.w; v[8 * s + 6] = hi.y; v[8 * s + 7] = hi.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = 0.f;
        }
        const float xsc = quant_quad(v, q, rin >= 0);
        x0 = __shfl_sync(0xffffffffu, xsc, 8 * t);
        x1 = __shfl_sync(0xffffffffu, xsc, 8 * t + 4);
        if (cpass * 8 + 2 * t >= ccnt) x0 = 0.f;
        if (cpass * 8 + 2 * t + 1 >= ccnt) x1 = 0.f;
        }
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint32_t wv[8] = {p[m][0].x, p[m][0].y, p[m][0].z, p[m][0].w,
                                    p[m][1].x, p[m][1].y, p[m][1].z, p[m][1].w};
            float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int s = 0; s < 4; s++) {
                uint32_t lo0, hi0, lo1, hi1;
                fp4x8_to_e4m3(wv[2 * s], lo0, hi0);
                fp4x8_to_e4m3(wv[2 * s + 1], lo1, hi1);
                float d[4] = {0.f, 0.f, 0.f, 0.f};
                mma_e4m3(d, lo0, lo1, hi0, hi1, q[2 * s], q[2 * s + 1]);
                const float ws0 = e8m0_to_f32((sc[m].x >> (8 * s)) & 0xffu) * 64.f;
                const float ws1 = e8m0_to_f32((sc[m].y >> (8 * s)) & 0xffu) * 64.f;
                part[0] += d[0] * ws0;
                part[1] += d[1] * ws0;
                part[2] += d[2] * ws1;
                part[3] += d[3] * ws1;
            }
            acc[m][0] += part[0] * x0;
            acc[m][1] += part[1] * x1;
            acc[m][2] += part[2] * x0;
            acc[m][3] += part[3] * x1;
        }
        if (ck == CPW - 1) { /* pass complete in every warp: reduce, epilogue */
            float r[NM][4];
#pragma unroll
            for (int m = 0; m < NM; m++)
                for (int i = 0; i < 4; i++) r[m][i] = acc[m][i];
            if (KW > 1) {
                float4 *rp = (float4 *)red;
#pragma unroll
                for (int m = 0; m < NM; m++)
                    rp[(m * KW + warp) * 32 + lane] = make_float4(r[m][0], r[m][1], r[m][2], r[m][3]);
                __syncthreads();
                if (warp == 0) {
#pragma unroll
                    for (int m = 0; m < NM; m++)
                        for (int w = 1; w < KW; w++) {
                            const float4 o = rp[(m * KW + w) * 32 + lane];
                            r[m][0] += o.x; r[m][1] += o.y; r[m][2] += o.z; r[m][3] += o.w;
                        }
                }
                __syncthreads();
            }
            if (warp == 0) {
                const int r0 = ctile * 16 + g;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int jj = cpass * 8 + 2 * t + (i & 1);
                    if (jj >= ccnt) continue;
                    float out;
                    if (MODE == FP4_GATEUP) {
                        out = moe_h(r[0][i], r[NM - 1][i], a.wts[a.list[coff + jj]], a.flags);
                    } else {
                        out = r[0][i];
                        if (a.flags & DSV4_CUDA_MOE_BF16) out = round_bf16(out);
                    }
                    a.y[(size_t)(coff + jj) * a.R + r0 + (i >> 1) * 8] = out;
                }
            }
#pragma unroll
            for (int m = 0; m < NM; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
        }
    }
}

template <int MODE, bool FQ>
static int launch_moe_fp4(dsv4_cuda_ctx *c, const Fp4Args &a, int slots, dsv4_err *err) {
    const int C = a.K / 128;
    int kw = 1; /* power of two dividing C, >= 4 chunks per warp */
    while (kw < 8 && C % (kw * 2) == 0 && C / (kw * 2) >= 4) kw *= 2;
    size_t smem = (size_t)2 * kw * 32 * 4 * sizeof(float);
    int per_sm = 0;
    CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_moe_fp4<MODE, FQ>, kw * 32, smem), err,
           "fp4 experts (occupancy)");
    if (per_sm < 1) per_sm = 1;
    long long items = (long long)slots * (a.R / 16), gx = (long long)per_sm * c->prop.multiProcessorCount;
    if (gx > items) gx = items;
    CU_TRY(cu_launch(c, k_moe_fp4<MODE, FQ>, dim3((unsigned)gx), dim3(kw * 32), smem, a), err,
           MODE == FP4_GATEUP ? "fp4 experts w1/w3" : "fp4 experts w2");
    return DSV4_OK;
}

/*
 * Grouped expert GEMM (prefill: many rows per expert). Why: the kernels
 * above stream an expert's weights once per 8 of its rows, with every
 * (expert, 16-row tile) block re-reading the activations; at a 4096-token
 * chunk (~96 rows per expert) that is ~60 TFLOP/s. Here a block of 2·WN
 * warps owns one (expert, BN-row group) x (128 weight rows) tile: 8 tiles of
 * the repacked FP4 weights (GATEUP: 4 of w1 and the same 4 of w3, so g and u
 * meet in one thread's registers for the SwiGLU epilogue; DOWN: 8 of w2)
 * and BN = 8·NTW·WN activation rows (gathered through the token list) go
 * through shared memory in 128-column chunks, MG_STAGES deep (cp.async).
 * Each warp converts its 4 weight tiles E2M1 -> E4M3 once per chunk and
 * multiplies them against 8·NTW rows with m16n8k32 FP8 mma (F16 = true,
 * the default: E2M1 -> E4M3 -> FP16 and the activations E4M3 -> FP16 once
 * per chunk step, two m16n8k16 FP16 mma per k32 step). Tile work items
 * (slot | row group << 16) come from k_group_scan; blocks past the count
 * exit at once (the grid is sized by an upper bound, graph-capturable).
 *
 * Numerics are k_fp4's (spec/MODEL.md §2.4, §3.5): per 32 columns an mma
 * from zero, × the weight's E8M0 scale (× 2^6 for the bit move), summed over
 * the chunk's 4 steps, × the activation block scale, added in fp32; only
 * the order of the chunk sums differs (k_fp4 splits chunks over warps).
 *
 * Shared layout per stage: weight tile i's 1024 bytes with its two 16-byte
 * halves of lane l at l*16 and 512 + l*16 (conflict-free 16-byte loads),
 * its 64 scale bytes, the BN rows at a 160-byte pitch (the 8-byte loads
 * of a half-warp fall in distinct banks), the BN row scales.
 */
#define MG_STAGES 4
#define MG_LDB 160

template <int MODE, int NTW, int WN, bool PART, bool F16>
__global__ void __launch_bounds__(64 * WN, WN == 4 && !PART ? 2 : 1) k_moe_gemm(Fp4Args a, const int *__restrict__ tiles) {
    constexpr int NTH = 64 * WN, BN = 8 * NTW * WN; /* threads; rows per tile */
    constexpr int SA = 8 * 1024, SAS = 8 * 64, SB = BN * MG_LDB;
    constexpr int STAGE = SA + SAS + SB + BN * 4;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, t = lane & 3;
    pdl_trigger();
    pdl_wait(); /* the tile list and x come from the previous kernels */
    if ((int)blockIdx.y >= tiles[0]) return;
    const int tv = tiles[1 + blockIdx.y], slot = tv & 0xffff, nb = tv >> 16;
    const int e = a.act_exp[slot], off = a.act_off[slot] + nb * BN;
    const int cnt = min(BN, a.act_off[slot + 1] - off), C = a.K >> 7;

    /* weight tile of shared slot i: GATEUP w1/w3 tiles 4bx + 2(i>>2) + (i&1), DOWN tile 8bx + i */
    auto wtile = [&](int i, const uint8_t *&W, const uint8_t *&S) {
        int tile;
        if (MODE == FP4_GATEUP) {
            const bool up = (i & 3) >= 2;
            W = up ? a.w3 : a.w1;
            S = up ? a.s3 : a.s1;
            tile = blockIdx.x * 4 + (i >> 2) * 2 + (i & 1);
        } else {
            W = a.w1;
            S = a.s1;
            tile = blockIdx.x * 8 + i;
        }
        return tile;
    };
    constexpr int NA = 512 / NTH; /* 16-byte weight pieces per thread and chunk */
    const uint8_t *asrc[NA];
    int adst[NA];
    const int q = tid & 63;
#pragma unroll
    for (int j = 0; j < NA; j++) {
        const int i = (tid >> 6) + (NTH / 64) * j;
        const uint8_t *W, *S;
        const int tile = wtile(i, W, S);
        asrc[j] = W + (size_t)e * a.wstride + (size_t)tile * C * 1024 + q * 16;
        adst[j] = i * 1024 + (q & 1) * 512 + (q >> 1) * 16;
    }
    const uint8_t *ssrc = nullptr;
    if (tid < 32) {
        const uint8_t *W, *S;
        const int tile = wtile(tid >> 2, W, S);
        ssrc = S + (size_t)e * a.sstride + (size_t)tile * C * 64 + (tid & 3) * 16;
    }
    auto rowof = [&](int j) { return MODE == FP4_GATEUP ? a.list[off + j] / a.topk : off + j; };
    const uint8_t *bsrc[NTW]; /* BN rows x 8 pieces over NTH threads */
    const int pc = tid & 7;
#pragma unroll
    for (int j = 0; j < NTW; j++) {
        const int tk = (tid >> 3) + (NTH / 8) * j;
        bsrc[j] = tk < cnt ? a.xq + (size_t)rowof(tk) * a.K + pc * 16 : nullptr;
    }
    const float *xsrc = tid < BN && tid < cnt ? a.xs + (size_t)rowof(tid) * C : nullptr;

    auto load = [&](int st, int c) {
        uint8_t *base = sm + st * STAGE;
#pragma unroll
        for (int j = 0; j < NA; j++) cp_async16(base + adst[j], asrc[j] + (size_t)c * 1024, true);
        if (tid < 32) cp_async16(base + SA + tid * 16, ssrc + (size_t)c * 64, true);
#pragma unroll
        for (int j = 0; j < NTW; j++) {
            const int tk = (tid >> 3) + (NTH / 8) * j;
            cp_async16(base + SA + SAS + tk * MG_LDB + pc * 16, bsrc[j] ? bsrc[j] + (size_t)c * 128 : a.xq,
                       bsrc[j] != nullptr);
        }
        if (tid < BN) cp_async4(base + SA + SAS + SB + tid * 4, xsrc ? xsrc + c : a.xs, xsrc != nullptr);
    };

    float acc[4][NTW][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
#pragma unroll
    for (int st = 0; st < MG_STAGES - 1; st++) {
        if (st < C) load(st, st);
        cp_commit();
    }
    for (int c = 0; c < C; c++) {
        cp_wait<MG_STAGES - 2>();
        __syncthreads();
        if (c + MG_STAGES - 1 < C) load((c + MG_STAGES - 1) % MG_STAGES, c + MG_STAGES - 1);
        cp_commit();
        const uint8_t *base = sm + (c % MG_STAGES) * STAGE;
        uint4 wa[4][2];
        uint2 sc[4];
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            const uint8_t *pa = base + (wm * 4 + mt) * 1024 + lane * 16;
            wa[mt][0] = *(const uint4 *)pa;
            wa[mt][1] = *(const uint4 *)(pa + 512);
            sc[mt] = *(const uint2 *)(base + SA + (wm * 4 + mt) * 64 + g * 8);
        }
        /* PART: chunk partial sums, × the row scale at the end (k_fp4's form);
         * else d · (w scale · x scale) straight into acc: the same products
         * (both scales are powers of two), summed in another order, fewer
         * registers */
        float part[PART ? 4 : 1][PART ? NTW : 1][4];
        float xsc[NTW][2];
        const float *sx = (const float *)(base + SA + SAS + SB);
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) {
            const int tl = wn * (NTW * 8) + nt * 8 + 2 * t;
            xsc[nt][0] = sx[tl];
            xsc[nt][1] = sx[tl + 1];
        }
        if (PART) {
#pragma unroll
            for (int mt = 0; mt < (PART ? 4 : 1); mt++)
#pragma unroll
                for (int nt = 0; nt < (PART ? NTW : 1); nt++)
                    part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
        }
#pragma unroll
        for (int s = 0; s < 4 && F16; s++) {
            /* F16 (default): each operand converted once per chunk step, not
             * once per mma (mma_e4m3 is 2 HMMAs + 10 conversions on sm_90); the
             * same HMMA inputs in the same k split, so the same sums */
            uint32_t bf[NTW][4];
#pragma unroll
            for (int nt = 0; nt < NTW; nt++) {
                const int tl = wn * (NTW * 8) + nt * 8;
                const uint2 xv = *(const uint2 *)(base + SA + SAS + (tl + g) * MG_LDB + 32 * s + 8 * t);
                e4m3x8_to_f16(xv.x, xv.y, bf[nt]);
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const uint4 &h = wa[mt][s >> 1];
                uint32_t f0[4], f1[4]; /* rows g, g+8 */
                fp4x8_to_f16((s & 1) ? h.z : h.x, f0);
                fp4x8_to_f16((s & 1) ? h.w : h.y, f1);
                /* 2^6 undoes the E2M1 -> E4M3 bit move */
                const float ws0 = e8m0_to_f32((sc[mt].x >> (8 * s)) & 0xffu) * 64.f;
                const float ws1 = e8m0_to_f32((sc[mt].y >> (8 * s)) & 0xffu) * 64.f;
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) {
                    float d[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_f16(d, f0[0], f1[0], f0[1], f1[1], bf[nt][0], bf[nt][1]);
                    mma_f16(d, f0[2], f1[2], f0[3], f1[3], bf[nt][2], bf[nt][3]);
                    if (PART) {
                        float(&pp)[4] = part[PART ? mt : 0][PART ? nt : 0];
                        pp[0] += d[0] * ws0;
                        pp[1] += d[1] * ws0;
                        pp[2] += d[2] * ws1;
                        pp[3] += d[3] * ws1;
                    } else {
                        acc[mt][nt][0] += d[0] * (ws0 * xsc[nt][0]);
                        acc[mt][nt][1] += d[1] * (ws0 * xsc[nt][1]);
                        acc[mt][nt][2] += d[2] * (ws1 * xsc[nt][0]);
                        acc[mt][nt][3] += d[3] * (ws1 * xsc[nt][1]);
                    }
                }
            }
        }
#pragma unroll
        for (int s = 0; s < 4 && !F16; s++) {
            uint32_t b0[NTW], b1[NTW];
#pragma unroll
            for (int nt = 0; nt < NTW; nt++) {
                const int tl = wn * (NTW * 8) + nt * 8;
                const uint2 xv = *(const uint2 *)(base + SA + SAS + (tl + g) * MG_LDB + 32 * s + 8 * t);
                b0[nt] = __byte_perm(xv.x, xv.y, 0x6420); /* even columns */
                b1[nt] = __byte_perm(xv.x, xv.y, 0x7531); /* odd columns  */
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const uint4 &h = wa[mt][s >> 1];
                const uint32_t w0 = (s & 1) ? h.z : h.x, w1 = (s & 1) ? h.w : h.y; /* rows g, g+8 */
                uint32_t lo0, hi0, lo1, hi1;
                fp4x8_to_e4m3(w0, lo0, hi0);
                fp4x8_to_e4m3(w1, lo1, hi1);
                /* 2^6 undoes the E2M1 -> E4M3 bit move */
                const float ws0 = e8m0_to_f32((sc[mt].x >> (8 * s)) & 0xffu) * 64.f;
                const float ws1 = e8m0_to_f32((sc[mt].y >> (8 * s)) & 0xffu) * 64.f;
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) {
                    float d[4] = {0.f, 0.f, 0.f, 0.f};
                    mma_e4m3(d, lo0, lo1, hi0, hi1, b0[nt], b1[nt]);
                    if (PART) {
                        float(&pp)[4] = part[PART ? mt : 0][PART ? nt : 0];
                        pp[0] += d[0] * ws0;
                        pp[1] += d[1] * ws0;
                        pp[2] += d[2] * ws1;
                        pp[3] += d[3] * ws1;
                    } else {
                        acc[mt][nt][0] += d[0] * (ws0 * xsc[nt][0]);
                        acc[mt][nt][1] += d[1] * (ws0 * xsc[nt][1]);
                        acc[mt][nt][2] += d[2] * (ws1 * xsc[nt][0]);
                        acc[mt][nt][3] += d[3] * (ws1 * xsc[nt][1]);
                    }
                }
            }
        }
        if (PART) {
#pragma unroll
            for (int nt = 0; nt < NTW; nt++)
#pragma unroll
                for (int mt = 0; mt < 4; mt++) {
                    const float(&pp)[4] = part[PART ? mt : 0][PART ? nt : 0];
                    acc[mt][nt][0] += pp[0] * xsc[nt][0];
                    acc[mt][nt][1] += pp[1] * xsc[nt][1];
                    acc[mt][nt][2] += pp[2] * xsc[nt][0];
                    acc[mt][nt][3] += pp[3] * xsc[nt][1];
                }
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int nt = 0; nt < NTW; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = wn * (NTW * 8) + nt * 8 + 2 * t + (i & 1);
            if (j >= cnt) continue;
            float *yr = a.y + (size_t)(off + j) * a.R + g + (i >> 1) * 8;
            if (MODE == FP4_GATEUP) {
                const float wk = a.wts[a.list[off + j]];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    yr[(blockIdx.x * 4 + wm * 2 + mt) * 16] = moe_h(acc[mt][nt][i], acc[mt + 2][nt][i], wk, a.flags);
            } else {
#pragma unroll
                for (int mt = 0; mt < 4; mt++) {
                    float out = acc[mt][nt][i];
                    if (a.flags & DSV4_CUDA_MOE_BF16) out = round_bf16(out);
                    yr[(blockIdx.x * 8 + wm * 4 + mt) * 16] = out;
                }
            }
        }
    }
}

template <int MODE, int NTW, int WN, bool PART, bool F16>
static int launch_moe_gemm(dsv4_cuda_ctx *c, const Fp4Args &a, const int *tiles, int max_tiles,
                           dsv4_err *err) {
    constexpr int BN = 8 * NTW * WN;
    const size_t smem = (size_t)MG_STAGES * (8 * 1024 + 8 * 64 + BN * MG_LDB + BN * 4);
    CU_TRY(cudaFuncSetAttribute(k_moe_gemm<MODE, NTW, WN, PART, F16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
           err, "fp4 experts gemm (shared memory)");
    dim3 grid((unsigned)(a.R / (MODE == FP4_GATEUP ? 64 : 128)), (unsigned)max_tiles);
    CU_TRY(cu_launch(c, k_moe_gemm<MODE, NTW, WN, PART, F16>, grid, dim3(64 * WN), smem, a, tiles), err,
           MODE == FP4_GATEUP ? "fp4 experts gemm w1/w3" : "fp4 experts gemm w2");
    return DSV4_OK;
}

/*
 * Tile shapes of the grouped GEMM (rows per tile BN = 8·NTW·WN, 2·WN warps);
 * DSV4_CUDA_MOE_GEMM_CFG = 1..5 forces one (0 / unset: by rows per expert).
 * Measured on H200, skewed top-6 routing (bench/results/
 * 2026-11-30-cuda-moe-prefill-h200.md): 64 rows x 4 warps is the fastest
 * from ~48 rows per expert (8.8 ms at 4096 tokens, 15.3 ms at 8192), 32 rows
 * x 4 warps below; 8 warps per block, 128 rows, and the folded-scale variant
 * at 2 blocks / SM were all slower.
 */
typedef int (*MoeGemmLaunch)(dsv4_cuda_ctx *, const Fp4Args &, const int *, int, dsv4_err *);
struct MoeGemmCfg {
    int bn;
    MoeGemmLaunch gateup, down;       /* FP8 mma (mma_e4m3): DSV4_CUDA_MOE_F16=0 */
    MoeGemmLaunch gateup16, down16;   /* FP16 mma, operands converted once (default) */
};
#define MG_CFG(NTW, WN, PART)                                                                               \
    { 8 * NTW * WN, launch_moe_gemm<FP4_GATEUP, NTW, WN, PART, false>, launch_moe_gemm<FP4_DOWN, NTW, WN, PART, false>, \
      launch_moe_gemm<FP4_GATEUP, NTW, WN, PART, true>, launch_moe_gemm<FP4_DOWN, NTW, WN, PART, true> }
static const MoeGemmCfg moe_gemm_cfgs[] = {
    MG_CFG(2, 2, true),  /* 1: 32 rows, 4 warps */
    MG_CFG(4, 2, true),  /* 2: 64 rows, 4 warps */
    MG_CFG(2, 4, true),  /* 3: 64 rows, 8 warps */
    MG_CFG(2, 4, false), /* 4: 64 rows, 8 warps, scales folded (2 blocks / SM) */
    MG_CFG(4, 4, true),  /* 5: 128 rows, 8 warps */
};

static const MoeGemmCfg &pick_moe_gemm(int nent, int E) {
    const int f = cu_env_int("DSV4_CUDA_MOE_GEMM_CFG", 0);
    if (f >= 1 && f <= (int)(sizeof moe_gemm_cfgs / sizeof moe_gemm_cfgs[0])) return moe_gemm_cfgs[f - 1];
    return moe_gemm_cfgs[nent >= 48 * E ? 1 : 0];
}

/* k_moe_wg (warpgroup MMA, sm_90a): see the file */
#include "backend/cuda/cuda_moe_wg.cuh"

static int pick_nt4(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

/* nt = 0: one n-tile with the activations quantised in the kernel (FQ). */
template <int MODE>
static int launch_fp4(dsv4_cuda_ctx *c, const Fp4Args &a, int nt, unsigned gy, dsv4_err *err) {
    int chunks = a.K / 128, kw = chunks / 4;
    if (kw < 1) kw = 1;
    if (kw > 8) kw = 8;
    dim3 grid((unsigned)(a.R / 16), gy), block((unsigned)(kw * 32));
    size_t smem = (size_t)2 * kw * 32 * 4 * sizeof(float);
    cudaError_t e;
    if constexpr (MODE != FP4_PLAIN) { /* experts: one 8-row n-tile per pass */
        /* MINB 3 caps registers (more warps resident, maybe spills): measured */
        /* DSV4_CUDA_MOE_F16=0: the FP8-mma form (A/B measurement) */
        const bool f16 = cu_env_int("DSV4_CUDA_MOE_F16", 1) != 0;
        e = nt == 0 ? cu_launch(c, k_fp4<1, MODE, true>, grid, block, smem, a)
            : c->moe_minb3 ? cu_launch(c, k_fp4<1, MODE, false, 3>, grid, block, smem, a)
            : f16          ? cu_launch(c, k_fp4<1, MODE, false, 1, true>, grid, block, smem, a)
                           : cu_launch(c, k_fp4<1, MODE, false>, grid, block, smem, a);
    } else {
        switch (nt) {
        case 0: e = cu_launch(c, k_fp4<1, MODE, true>, grid, block, smem, a); break;
        case 1: e = cu_launch(c, k_fp4<1, MODE, false>, grid, block, smem, a); break;
        case 2: e = cu_launch(c, k_fp4<2, MODE, false>, grid, block, smem, a); break;
        case 4: e = cu_launch(c, k_fp4<4, MODE, false>, grid, block, smem, a); break;
        default: e = cu_launch(c, k_fp4<8, MODE, false>, grid, block, smem, a); break;
        }
    }
    CU_TRY(e, err, MODE == FP4_GATEUP ? "fp4 experts w1/w3" : MODE == FP4_DOWN ? "fp4 experts w2" : "fp4 linear");
    return DSV4_OK;
}

int cu_fp4_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const float *x, const uint8_t *xq,
                  const float *xs, int n, float *y, int flags, dsv4_err *err) {
    Fp4Args a;
    memset(&a, 0, sizeof a);
    a.w1 = (const uint8_t *)w->w;
    a.s1 = (const uint8_t *)w->scale;
    a.R = (int)w->out;
    a.K = (int)w->in;
    a.xq = xq;
    a.xs = xs;
    a.xf = x;
    a.n = n;
    a.y = y;
    a.flags = flags;
    if (!xq) return launch_fp4<FP4_PLAIN>(c, a, 0, (unsigned)((n + 7) / 8), err);
    int nt = pick_nt4(n);
    return launch_fp4<FP4_PLAIN>(c, a, nt, (unsigned)((n + 8 * nt - 1) / (8 * nt)), err);
}

/* ---------------------------------------------------------------- grouping */

#define ROUTE_THREADS 256
#define ROUTE_IPT 4 /* experts per thread: up to 1024 experts */

/*
 * One block. For the n·topk choices: count per expert, list the chosen
 * experts in ascending id (slot order), and place every choice at
 * pos = start(expert) + rank among earlier choices of that expert, so the
 * layout is a pure function of ids (deterministic).
 * The rank is a counting sort: warp w owns the contiguous entries
 * [w·S, (w+1)·S) and walks them 32 at a time; __match_any_sync groups a
 * step's lanes by expert, so a lane's rank within its warp is the warp's
 * running count of that expert (hist[w][e], shared) plus the earlier lanes
 * of the same expert in the step. An exclusive prefix of hist over the warps
 * then gives each warp's offset per expert. (The first version counted the
 * earlier entries of each entry one by one, O(n²): 0.6 ms a call in prefill.)
 * The rank within the warp is parked in inv[] between the two passes (the
 * same thread writes and reads it). Dynamic shared memory: ROUTE_WARPS·E ints.
 */
#define ROUTE_WARPS (ROUTE_THREADS / 32)
__global__ void __launch_bounds__(ROUTE_THREADS) k_route_group(const int *__restrict__ ids, int nent,
                                                               int E, int *act_n, int *act_exp,
                                                               int *act_off, int *list, int *inv) {
    pdl_trigger();
    pdl_wait();
    typedef cub::BlockScan<int, ROUTE_THREADS> Scan;
    __shared__ typename Scan::TempStorage tmp;
    __shared__ int cnt[ROUTE_THREADS * ROUTE_IPT];
    extern __shared__ int hist[]; /* [ROUTE_WARPS][E] */
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < ROUTE_WARPS * E; i += ROUTE_THREADS) hist[i] = 0;
    __syncthreads();
    const int seg = (nent + ROUTE_WARPS - 1) / ROUTE_WARPS, i0 = w * seg;
    const int i1 = i0 + seg < nent ? i0 + seg : nent;
    int *h = hist + w * E;
    for (int b = i0; b < i1; b += 32) {
        const int i = b + lane;
        int v = i < i1 ? ids[i] : -1;
        if (v < 0 || v >= E) v = -1;
        const unsigned peers = __match_any_sync(0xffffffffu, v);
        const int before = __popc(peers & ((1u << lane) - 1u));
        const int base = v >= 0 ? h[v] : 0;
        __syncwarp();
        if (v >= 0 && before == 0) h[v] = base + __popc(peers);
        if (i < i1) inv[i] = v >= 0 ? base + before : -1;
        __syncwarp();
    }
    __syncthreads();
    /* per expert: exclusive prefix over the warps (in place), total into cnt */
    for (int e = tid; e < ROUTE_THREADS * ROUTE_IPT; e += ROUTE_THREADS) {
        int run = 0;
        if (e < E)
            for (int j = 0; j < ROUTE_WARPS; j++) {
                const int c = hist[j * E + e];
                hist[j * E + e] = run;
                run += c;
            }
        cnt[e] = run;
    }
    __syncthreads();
    int cv[ROUTE_IPT], fv[ROUTE_IPT], cs[ROUTE_IPT], fs[ROUTE_IPT];
#pragma unroll
    for (int k = 0; k < ROUTE_IPT; k++) {
        cv[k] = cnt[tid * ROUTE_IPT + k];
        fv[k] = cv[k] > 0;
    }
    int total_c, total_f;
    Scan(tmp).ExclusiveSum(cv, cs, total_c);
    __syncthreads();
    Scan(tmp).ExclusiveSum(fv, fs, total_f);
    __syncthreads(); /* every thread has read cnt[] */
#pragma unroll
    for (int k = 0; k < ROUTE_IPT; k++) {
        const int e = tid * ROUTE_IPT + k;
        cnt[e] = cs[k]; /* now the expert's start */
        if (fv[k]) {
            act_exp[fs[k]] = e;
            act_off[fs[k]] = cs[k];
        }
    }
    if (tid == 0) {
        *act_n = total_f;
        act_off[total_f] = total_c;
    }
    __syncthreads();
    for (int b = i0; b < i1; b += 32) {
        const int i = b + lane;
        if (i >= i1) break;
        int v = ids[i];
        if (v < 0 || v >= E) continue; /* inv[i] is already -1 */
        const int pos = cnt[v] + h[v] + inv[i];
        list[pos] = i;
        inv[i] = pos;
    }
}

/*
 * Grouping for large steps (prefill chunks up to MOE_MAX_ENT choices).
 * Why: k_route_group ranks every choice by scanning all earlier ones in one
 * block (O(nent²), ~0.6 ms at 8192 choices) and holds the ids in 32 KB of
 * shared memory. Same layout, three passes: count per expert (a block per
 * expert), one scan (slots, offsets, and the GEMM's tile list), then a
 * block per expert places its choices in id order (stable, so the layout is
 * k_route_group's exactly: a pure function of the ids).
 */
#define MOE_MAX_ENT 65536
/* average rows per expert from which the grouped GEMM runs (measured: bench/results/2026-11-30-cuda-moe-prefill-h200.md;
 * raised from 8 after a 64 x 6-row verify step (9 rows per expert) ran 40.9 ms with the GEMM and 38.2 ms with
 * k_fp4, 8 layers on an H200 (bench/results/raw/lt-default/moemin.txt); 12 and 16 give the same) */
#define MOE_GEMM_MIN_DEFAULT 12

__global__ void __launch_bounds__(256) k_group_count(const int *__restrict__ ids, int nent, int *cnt) {
    pdl_trigger();
    pdl_wait();
    typedef cub::BlockReduce<int, 256> Red;
    __shared__ typename Red::TempStorage tmp;
    const int e = blockIdx.x;
    int c = 0;
    for (int i = threadIdx.x; i < nent; i += 256) c += __ldg(ids + i) == e;
    c = Red(tmp).Sum(c);
    if (threadIdx.x == 0) cnt[e] = c;
}

/* One block: bn = rows per GEMM tile (0: no tile list). tiles[0] = count,
 * tiles[1 + k] = slot | (row group << 16). */
__global__ void __launch_bounds__(ROUTE_THREADS) k_group_scan(const int *__restrict__ cnt, int E, int bn,
                                                              int *act_n, int *act_exp, int *act_off,
                                                              int *start, int *tiles) {
    pdl_trigger();
    pdl_wait();
    typedef cub::BlockScan<int, ROUTE_THREADS> Scan;
    __shared__ typename Scan::TempStorage tmp;
    const int tid = threadIdx.x;
    int cv[ROUTE_IPT], fv[ROUTE_IPT], tv[ROUTE_IPT], cs[ROUTE_IPT], fs[ROUTE_IPT], ts[ROUTE_IPT];
#pragma unroll
    for (int k = 0; k < ROUTE_IPT; k++) {
        const int e = tid * ROUTE_IPT + k;
        cv[k] = e < E ? cnt[e] : 0;
        fv[k] = cv[k] > 0;
        tv[k] = bn > 0 ? (cv[k] + bn - 1) / bn : 0;
    }
    int total_c, total_f, total_t;
    Scan(tmp).ExclusiveSum(cv, cs, total_c);
    __syncthreads();
    Scan(tmp).ExclusiveSum(fv, fs, total_f);
    __syncthreads();
    Scan(tmp).ExclusiveSum(tv, ts, total_t);
#pragma unroll
    for (int k = 0; k < ROUTE_IPT; k++) {
        const int e = tid * ROUTE_IPT + k;
        if (e < E) start[e] = cs[k];
        if (fv[k]) {
            act_exp[fs[k]] = e;
            act_off[fs[k]] = cs[k];
            for (int b = 0; b < tv[k]; b++) tiles[1 + ts[k] + b] = fs[k] | b << 16;
        }
    }
    if (tid == 0) {
        *act_n = total_f;
        act_off[total_f] = total_c;
        if (bn > 0) tiles[0] = total_t;
    }
}

/* A block per expert: its choices in ascending index get start[e], +1, ...
 * The ids sit in shared memory as 16-bit (E <= 1024); thread k takes a
 * contiguous run, so ranks are a run count plus a block scan. Block 0 also
 * marks the out-of-range ids (inv = -1). */
__global__ void __launch_bounds__(256) k_group_place(const int *__restrict__ ids, int nent, int E,
                                                     const int *__restrict__ start, int *list, int *inv) {
    pdl_trigger();
    pdl_wait();
    typedef cub::BlockScan<int, 256> Scan;
    __shared__ typename Scan::TempStorage tmp;
    extern __shared__ uint16_t sid16[];
    const int tid = threadIdx.x, e = blockIdx.x;
    for (int i = tid; i < nent; i += 256) {
        const int v = __ldg(ids + i);
        const bool ok = v >= 0 && v < E;
        sid16[i] = ok ? (uint16_t)v : (uint16_t)0xffffu;
        if (e == 0 && !ok) inv[i] = -1;
    }
    __syncthreads();
    const int per = (nent + 255) / 256, i0 = tid * per, i1 = min(nent, i0 + per);
    int c = 0;
    for (int i = i0; i < i1; i++) c += sid16[i] == e;
    int r;
    Scan(tmp).ExclusiveSum(c, r);
    int pos = start[e] + r;
    for (int i = i0; i < i1; i++)
        if (sid16[i] == e) {
            list[pos] = i;
            inv[i] = pos;
            pos++;
        }
}

/* y[t] = Σ_k O[inv[t,k]] (+ shared[t]) in expert order; 4 columns per thread. */
__global__ void k_moe_combine(const float *__restrict__ O, const int *__restrict__ inv, int n,
                              int topk, int D, const float *__restrict__ shared,
                              float *__restrict__ y, int flags) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int d4 = D / 4;
    if (i >= (size_t)n * d4) return;
    const int tok = (int)(i / d4), col = (int)(i % d4) * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    /* in ascending expert id (= ascending position in O), the CPU
     * reference's order, so the fp32 sums round alike */
    for (int last = -1;;) {
        int p = INT_MAX;
        for (int k = 0; k < topk; k++) {
            const int q = inv[tok * topk + k];
            if (q > last && q < p) p = q;
        }
        if (p == INT_MAX) break;
        last = p;
        const float4 o = *(const float4 *)(O + (size_t)p * D + col);
        s.x += o.x; s.y += o.y; s.z += o.z; s.w += o.w;
    }
    if (shared) {
        const float4 o = *(const float4 *)(shared + (size_t)tok * D + col);
        s.x += o.x; s.y += o.y; s.z += o.z; s.w += o.w;
    }
    if (flags & DSV4_CUDA_OUT_BF16) {
        s.x = round_bf16(s.x); s.y = round_bf16(s.y); s.z = round_bf16(s.z); s.w = round_bf16(s.w);
    }
    *(float4 *)(y + (size_t)tok * D + col) = s;
}

static int moe_run(dsv4_cuda_ctx *c, const dsv4_cuda_experts *ex, const float *x,
                   const uint8_t *xq_in, const float *xs_in, int n, const int32_t *ids,
                   const float *wts, int topk, const float *shared, float *y, int flags,
                   dsv4_err *err);

extern "C" int dsv4_cuda_moe(dsv4_cuda_ctx *c, const dsv4_cuda_experts *ex, const float *x, int n,
                             const int32_t *ids, const float *wts, int topk, const float *shared,
                             float *y, int flags, dsv4_err *err) {
    return moe_run(c, ex, x, NULL, NULL, n, ids, wts, topk, shared, y, flags, err);
}

extern "C" int dsv4_cuda_moe_q(dsv4_cuda_ctx *c, const dsv4_cuda_experts *ex, const float *x,
                               const uint8_t *xq, const float *xs, int n, const int32_t *ids,
                               const float *wts, int topk, const float *shared, float *y, int flags,
                               dsv4_err *err) {
    if (n > 0 && (!xq || !xs)) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_moe_q: xq/xs is NULL");
    return moe_run(c, ex, x, xq, xs, n, ids, wts, topk, shared, y, flags, err);
}

static int moe_run(dsv4_cuda_ctx *c, const dsv4_cuda_experts *ex, const float *x,
                   const uint8_t *xq_in, const float *xs_in, int n, const int32_t *ids,
                   const float *wts, int topk, const float *shared, float *y, int flags,
                   dsv4_err *err) {
    if (!c || !ex || n < 0 || (n && (!x || !ids || !wts || !y)))
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_moe: bad argument");
    if (topk <= 0 || topk > 16)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_moe: topk %d not in 1..16", topk);
    if (ex->n_experts <= 0 || ex->n_experts > ROUTE_THREADS * ROUTE_IPT || !ex->w1)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_moe: %d experts (need 1..%d, uploaded)",
                      ex->n_experts, ROUTE_THREADS * ROUTE_IPT);
    if (n == 0) return DSV4_OK;
    const int dm = (int)ex->d_model, dff = (int)ex->d_ff, nent = n * topk, E = ex->n_experts;
    const int slots = nent < E ? nent : E;
    if ((long long)n * topk > MOE_MAX_ENT)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_moe: %d tokens x top-%d exceeds %d choices per call", n, topk,
                      MOE_MAX_ENT);
    /* Grouped GEMM from an average of DSV4_CUDA_MOE_GEMM_MIN rows per expert
     * (cuda_gemm.cuh), tile shape from pick_moe_gemm. The
     * decode / verify steps (a few rows per expert) keep k_fp4. */
    const int fq = c->moe_fq && !xq_in;
    const int gemm = !fq && nent >= (long long)cu_env_int("DSV4_CUDA_MOE_GEMM_MIN", MOE_GEMM_MIN_DEFAULT) * E;
    const MoeGemmCfg &mg = pick_moe_gemm(nent, E);
    /* DSV4_CUDA_MOE_F16=0: the grouped GEMM's FP8-mma form (for A/B measurement) */
    const int f16 = cu_env_int("DSV4_CUDA_MOE_F16", 1) != 0;
    /* DSV4_CUDA_MOE_WG: the warpgroup-MMA grouped GEMM (sm_90a) instead of k_moe_gemm */
    const int wgv = moe_wg_variant(c, gemm, nent, E);
    const int bn = wgv ? moe_wg_bn[wgv - 1] : gemm ? mg.bn : 0;
    const int big = gemm || nent * (int)sizeof(int) > 32 * 1024; /* k_group_* instead of k_route_group */
    const int max_tiles = bn ? (nent + slots * (bn - 1)) / bn + 1 : 0;
    /* workspace: act_n act_exp act_off list inv [cnt start tiles] | H [nent, dff]
     *            | O [nent, dm] | xq xs (x quantised) | hq hs (H quantised) */
    size_t o_g = 0;
    size_t gi = (size_t)(1 + slots + slots + 1 + 2 * nent) + (big ? (size_t)2 * E + 1 + max_tiles : 0);
    size_t o_h = o_g + cu_align(gi * 4);
    size_t o_o = o_h + cu_align((size_t)nent * dff * 4);
    size_t o_xq = o_o + cu_align((size_t)nent * dm * 4);
    size_t o_xs = o_xq + cu_align((size_t)n * dm);
    size_t o_hq = o_xs + cu_align((size_t)n * (dm / 128) * 4);
    size_t o_hs = o_hq + cu_align((size_t)nent * dff);
    size_t total = o_hs + cu_align((size_t)nent * (dff / 128) * 4);
    void *wsp = NULL;
    int rc = cu_workspace(c, total, &wsp, err);
    if (rc) return rc;
    uint8_t *base = (uint8_t *)wsp;
    float *H = (float *)(base + o_h), *O = (float *)(base + o_o);
    uint8_t *xq = base + o_xq, *hq = base + o_hq;
    float *xs = (float *)(base + o_xs), *hs = (float *)(base + o_hs);
    /* measured on H200: quantising x / H once (act_quant) beats quantising
     * the same rows again in every (expert, tile) block (bench/results) */
    if (xq_in) {
        xq = (uint8_t *)xq_in; /* the caller quantised x (shared with other linears) */
        xs = (float *)xs_in;
    } else if (!fq && (rc = cu_act_quant(c, x, n, dm, xq, xs, err))) {
        return rc;
    }
    int *act_n = (int *)(base + o_g), *act_exp = act_n + 1, *act_off = act_exp + slots;
    int *list = act_off + slots + 1, *inv = list + nent;
    int *gcnt = inv + nent, *gstart = gcnt + E, *tiles = gstart + E;

    if (!big) {
        CU_TRY(cu_launch(c, k_route_group, dim3(1), dim3(ROUTE_THREADS), (size_t)ROUTE_WARPS * E * sizeof(int), ids,
                         nent, E, act_n, act_exp, act_off, list, inv),
               err, "moe grouping");
    } else {
        CU_TRY(cu_launch(c, k_group_count, dim3((unsigned)E), dim3(256), 0, (const int *)ids, nent, gcnt), err,
               "moe grouping (count)");
        CU_TRY(cu_launch(c, k_group_scan, dim3(1), dim3(ROUTE_THREADS), 0, (const int *)gcnt, E, bn, act_n,
                         act_exp, act_off, gstart, tiles),
               err, "moe grouping (scan)");
        const size_t psm = (size_t)nent * sizeof(uint16_t);
        CU_TRY(cudaFuncSetAttribute(k_group_place, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)psm), err,
               "moe grouping (shared memory)");
        CU_TRY(cu_launch(c, k_group_place, dim3((unsigned)E), dim3(256), psm, (const int *)ids, nent, E,
                         (const int *)gstart, list, inv),
               err, "moe grouping (place)");
    }

    Fp4Args a;
    memset(&a, 0, sizeof a);
    a.act_n = act_n;
    a.act_exp = act_exp;
    a.act_off = act_off;
    a.list = list;
    a.topk = topk;
    a.wts = wts;
    a.flags = flags & DSV4_CUDA_MOE_BF16;
    a.wstride = (size_t)dm * dff / 2;
    a.sstride = (size_t)dm * dff / 32;
    /* w1, w3: [dff, dm] */
    a.w1 = (const uint8_t *)ex->w1;
    a.s1 = (const uint8_t *)ex->s1;
    a.w3 = (const uint8_t *)ex->w3;
    a.s3 = (const uint8_t *)ex->s3;
    a.R = dff;
    a.K = dm;
    a.xf = x;
    a.xq = xq;
    a.xs = xs;
    a.y = H;
    /* One n-tile of 8 rows per pass: most experts get 1-2 rows of a decode /
     * verify step; an expert chosen by more rows is streamed once per 8. */
    if (wgv) rc = moe_wg_launch[wgv - 1][0](c, a, tiles, max_tiles, err);
    else if (gemm) rc = (f16 ? mg.gateup16 : mg.gateup)(c, a, tiles, max_tiles, err);
    else if (!c->moe_persistent) rc = launch_fp4<FP4_GATEUP>(c, a, fq ? 0 : 1, (unsigned)slots, err);
    else rc = fq ? launch_moe_fp4<FP4_GATEUP, true>(c, a, slots, err)
                 : launch_moe_fp4<FP4_GATEUP, false>(c, a, slots, err);
    if (rc) return rc;
    if (!fq && (rc = cu_act_quant(c, H, nent, dff, hq, hs, err))) return rc;
    /* w2: [dm, dff] */
    a.w1 = (const uint8_t *)ex->w2;
    a.s1 = (const uint8_t *)ex->s2;
    a.w3 = a.s3 = NULL;
    a.R = dm;
    a.K = dff;
    a.xf = H;
    a.xq = hq;
    a.xs = hs;
    a.y = O;
    if (wgv) rc = moe_wg_launch[wgv - 1][1](c, a, tiles, max_tiles, err);
    else if (gemm) rc = (f16 ? mg.down16 : mg.down)(c, a, tiles, max_tiles, err);
    else if (!c->moe_persistent) rc = launch_fp4<FP4_DOWN>(c, a, fq ? 0 : 1, (unsigned)slots, err);
    else rc = fq ? launch_moe_fp4<FP4_DOWN, true>(c, a, slots, err)
                 : launch_moe_fp4<FP4_DOWN, false>(c, a, slots, err);
    if (rc) return rc;
    size_t items = (size_t)n * (dm / 4);
    CU_TRY(cu_launch(c, k_moe_combine, dim3((unsigned)((items + 255) / 256)), dim3(256), 0,
                     (const float *)O, (const int *)inv, n, topk, dm, shared, y, flags),
           err, "moe combine");
    return DSV4_OK;
}
