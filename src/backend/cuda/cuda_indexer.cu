/*
 * cuda_indexer.cu — lightning-indexer selection (`indexer_select`,
 * spec/MODEL.md §3.4.6) for the CUDA op table: score every visible index
 * key of a row, keep the top-k.
 *
 * Scores. I(t, w) = Σ_h (g_scale·g[t][h])·ReLU(q[t][h]·k[w]) — a
 * [H×dk]·[dk×nvis] product per row. A block takes one row and a range of
 * keys in tiles of 8·KPW (8 warps x KPW keys): the row's q (H×dk) sits in
 * shared memory once, each tile's keys are looked up once (one thread per
 * key: page table) and loaded row-major with coalesced float4 loads, each
 * lane computes 2 heads × KPW keys, and the heads are summed once per block
 * (one thread per key). The key range per block is sized from the grid:
 * decode (one row, ~1K keys) takes KPW = 1 and few tiles per block, so the
 * work spreads over hundreds of blocks instead of 8; prefill takes KPW = 4
 * and 4 tiles (128 keys, q loaded once per 128 keys). The tiling does not
 * touch the numerics: each score is computed by one lane in the same order.
 * The arithmetic is the CPU reference's, rounding for rounding (dot
 * products with 8 interleaved partial sums combined pairwise, no FMA
 * contraction, heads summed in order), so scores are bit-identical to the
 * reference and the selected sets agree exactly, ties included (a selection
 * is a discrete choice: a 1-ulp score difference would swap rows at the
 * top-k boundary).
 *
 * Top-k. One block per row: radix select (4 passes of 8-bit histograms over
 * order-preserving keys) finds the k-th largest score, then one ordered pass
 * keeps every row above it and the lowest-indexed rows equal to it (the
 * reference breaks ties towards the lower row). Rows are written in
 * ascending order, as the reference; −1 pads the rest.
 *
 * Rows are processed in chunks so the score scratch stays bounded
 * (IDX_SCRATCH bytes), whatever the prefill length.
 *
 * Prefill on the tensor cores (k_idx_scores_tc, Flash shape 64 heads x 128).
 * The scores of a chunk are the GEMM [rows·64 heads × 128]·[128 × keys] with
 * ReLU and the head-weighted sum in the epilogue: the scalar kernel ran it at
 * ~14 TFLOP/s (10 ms for 8192 rows at 2048 keys). In reference numerics both
 * operands come out of the Hadamard + FP4 round trip (§3.4.6): every value is
 * an E2M1 value times a power of two, so it is exact in bf16, each bf16
 * product is exact in fp32, and a 128-term dot product of such values needs
 * at most 13 bits + the spread of the four per-32 block scales: it is exact
 * in fp32 (whatever the summation order) unless those scales span more than
 * ~2^9, and then it differs from the reference by rounding only. So one bf16
 * mma.sync m16n8k16 per 16 dims gives the reference's dot products; the ReLU,
 * the g-weighting and the sum over heads (in head order, one thread per
 * (row, key)) are the reference's rounding for rounding. A block takes 4
 * rows (M = 256) and walks all their visible keys in tiles of 64 (keys read
 * once per 4 rows, q once). Rows whose q, or whose keys, are not exactly
 * bf16 (HF numerics: no QAT) are flagged and recomputed by the scalar kernel,
 * which then runs only for them (other blocks return at once), so the
 * selection never depends on which path ran.
 */
#include "backend/cuda/cuda_be_internal.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define IDX_THREADS 256
#define IDX_BLOCK_KEYS 128   /* keys per block at most (head-sum buffer) */
#define IDX_MAXH 64          /* heads: 2 per lane */
#define IDX_SEL_THREADS 1024
#define IDX_SCRATCH ((size_t)256 << 20)
#define IDX_TARGET_BLOCKS 264 /* 2 per SM: below this, smaller key ranges per block */

/* ------------------------------------------------------------------ scores */

/* Shared floats of k_idx_scores<KPW>: q [H][dk+1], keys [8·KPW][dk+4], dots [IDX_BLOCK_KEYS][H+1], g [H]. */
static size_t idx_smem(int H, int dk, int kpw) {
    return ((((size_t)H * (dk + 1) + 3) & ~(size_t)3) + (size_t)8 * kpw * (dk + 4) +
            (size_t)IDX_BLOCK_KEYS * (H + 1) + H) * sizeof(float);
}

/* Scores of keys [blockIdx.x·tpb·8·KPW, +tpb·8·KPW) of chunk row tl (the whole block; returns early
 * when the range is past the row's visible keys). */
template <int KPW>
__device__ __forceinline__ void idx_scores_row(const float *qi, const float *g, float g_scale, const dsv4_cmp_state &cs,
                                               int H, int dk, const int32_t *pos, const int32_t *slots, int t0,
                                               int tpb, float *scores, int64_t ld, int tl) {
    constexpr int TILE = 8 * KPW;
    extern __shared__ float sm[];
    __shared__ int64_t krow[TILE];
    const int qld = dk + 1, kld = dk + 4, dld = H + 1;
    float *qs = sm;                          /* [H][dk+1]: lanes read different heads conflict-free */
    float *ks = qs + ((H * qld + 3) & ~3);   /* [TILE][dk+4] key rows (16-byte aligned) */
    float *dots = ks + TILE * kld;           /* [IDX_BLOCK_KEYS][H+1] relu'd dots */
    float *gw = dots + IDX_BLOCK_KEYS * dld; /* [H] g_scale*g */
    const int t = t0 + tl;
    const int64_t p = pos[t];
    int64_t nvis = (p + 1) / cs.ratio;
    if (nvis > cs.max_rows) nvis = cs.max_rows;
    if (cs.block_table && nvis > (int64_t)cs.max_pages * cs.page_rows) nvis = (int64_t)cs.max_pages * cs.page_rows;
    const int64_t wbase = (int64_t)blockIdx.x * TILE * tpb;
    if (wbase >= nvis) return;
    const int slot = slots[t];
    for (int i = threadIdx.x; i < H * dk; i += blockDim.x) qs[(i / dk) * qld + i % dk] = qi[(int64_t)t * H * dk + i];
    for (int h = threadIdx.x; h < H; h += blockDim.x) gw[h] = __fmul_rn(g_scale, g[(int64_t)t * H + h]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dk4 = dk >> 2;
    const float *keys = (const float *)cs.rows.data;
    const int h0 = lane, h1 = lane + 32;
    int ntiles = 0;
    for (int tile = 0; tile < tpb; tile++) {
        const int64_t w0 = wbase + (int64_t)tile * TILE;
        if (w0 >= nvis) break;
        ntiles++;
        __syncthreads(); /* ks / krow of the previous tile are consumed */
        if (threadIdx.x < TILE) {
            const int64_t w = w0 + threadIdx.x;
            krow[threadIdx.x] = w < nvis ? cu_cmp_index(cs, slot, w) : -1;
        }
        __syncthreads();
        /* key rows, one warp per key, float4 per lane; missing keys (past nvis, unmapped pages) as zeros */
        for (int kk = warp; kk < TILE; kk += IDX_THREADS / 32) {
            const int64_t r = krow[kk];
            const float4 *src = (const float4 *)(keys + (r >= 0 ? r : 0) * dk);
            for (int d4 = lane; d4 < dk4; d4 += 32)
                *(float4 *)(ks + kk * kld + 4 * d4) = r >= 0 ? src[d4] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        __syncthreads();
        /* 2 heads (lane, lane+32) x KPW keys (KPW·warp ..), 8 partial sums each */
        float acc[2][KPW][8];
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int b = 0; b < KPW; b++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[a][b][j] = 0.f;
        const float *q0 = qs + (h0 < H ? h0 : 0) * qld, *q1 = qs + (h1 < H ? h1 : 0) * qld;
        const float *kb = ks + warp * KPW * kld;
        for (int d = 0; d < dk; d += 8) {
            float kv[KPW][8];
#pragma unroll
            for (int b = 0; b < KPW; b++) {
                const float4 lo = *(const float4 *)(kb + b * kld + d), hi = *(const float4 *)(kb + b * kld + d + 4);
                kv[b][0] = lo.x, kv[b][1] = lo.y, kv[b][2] = lo.z, kv[b][3] = lo.w;
                kv[b][4] = hi.x, kv[b][5] = hi.y, kv[b][6] = hi.z, kv[b][7] = hi.w;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float a0 = q0[d + j], a1 = q1[d + j];
#pragma unroll
                for (int b = 0; b < KPW; b++) {
                    acc[0][b][j] = __fadd_rn(acc[0][b][j], __fmul_rn(a0, kv[b][j]));
                    acc[1][b][j] = __fadd_rn(acc[1][b][j], __fmul_rn(a1, kv[b][j]));
                }
            }
        }
#pragma unroll
        for (int a = 0; a < 2; a++) {
            const int h = a ? h1 : h0;
            if (h >= H) continue;
#pragma unroll
            for (int b = 0; b < KPW; b++) {
                const float(&c)[8] = acc[a][b];
                const float s = __fadd_rn(__fadd_rn(__fadd_rn(c[0], c[1]), __fadd_rn(c[2], c[3])),
                                          __fadd_rn(__fadd_rn(c[4], c[5]), __fadd_rn(c[6], c[7])));
                dots[(tile * TILE + warp * KPW + b) * dld + h] = s > 0.f ? s : 0.f;
            }
        }
    }
    __syncthreads();
    /* heads summed in order, one thread per key of the block */
    for (int i = threadIdx.x; i < ntiles * TILE; i += blockDim.x) {
        const int64_t w = wbase + i;
        if (w >= nvis) continue;
        float total = 0.f;
        for (int h = 0; h < H; h++) total = __fadd_rn(total, __fmul_rn(gw[h], dots[i * dld + h]));
        if (cu_cmp_index(cs, slot, w) < 0) total = -INFINITY; /* unreachable row: never preferred */
        scores[(int64_t)tl * ld + w] = total;
    }
}

/* Chunk rows blockIdx.y, + gridDim.y, .. < n; with redo, only the rows flagged there (the rest were scored
 * by k_idx_scores_tc; a short grid then keeps the launch cheap when nothing is flagged). */
template <int KPW>
__global__ void __launch_bounds__(IDX_THREADS) k_idx_scores(const float *qi, const float *g, float g_scale,
                                                            dsv4_cmp_state cs, int H, int dk, const int32_t *pos,
                                                            const int32_t *slots, int t0, int tpb, float *scores,
                                                            int64_t ld, int n, const int32_t *redo) {
    __shared__ uint32_t s_rows[IDX_THREADS / 32]; /* bit = row to score, of the next IDX_THREADS of this block */
    for (int64_t j0 = 0; blockIdx.y + j0 * gridDim.y < (uint32_t)n; j0 += IDX_THREADS) {
        const int64_t tli = blockIdx.y + (j0 + threadIdx.x) * gridDim.y; /* the flags read in parallel */
        const uint32_t bits = __ballot_sync(0xffffffffu, tli < n && (!redo || redo[tli]));
        if ((threadIdx.x & 31) == 0) s_rows[threadIdx.x >> 5] = bits;
        __syncthreads();
        for (int wi = 0; wi < IDX_THREADS / 32; wi++)
            for (uint32_t m = s_rows[wi]; m; m &= m - 1) {
                const int tl = (int)(blockIdx.y + (j0 + 32 * wi + __ffs(m) - 1) * gridDim.y);
                idx_scores_row<KPW>(qi, g, g_scale, cs, H, dk, pos, slots, t0, tpb, scores, ld, tl);
                __syncthreads(); /* shared memory is the next row's */
            }
        __syncthreads(); /* s_rows is the next round's */
    }
}

/* ------------------------------------------------------ scores, tensor cores */

#define TC_H 64
#define TC_DK 128
#define TC_BN 64            /* keys per tile */
#define TC_ALD (TC_DK + 8)  /* bf16 stride of q and key rows in shared memory: 272 B, ldmatrix conflict-free */
#define TC_PLD (TC_H + 4)   /* float stride of one (row, key) head vector of ReLU'd dots */

/* Shared bytes of k_idx_scores_tc<TOK>: q [TOK·64][136] bf16, keys [64][136] bf16, dots [TOK·64][68] f32,
 * g [TOK][64] f32. */
static size_t idx_tc_smem(int tok) {
    return (size_t)tok * TC_H * TC_ALD * 2 + (size_t)TC_BN * TC_ALD * 2 + (size_t)tok * TC_BN * TC_PLD * 4 +
           (size_t)tok * TC_H * 4;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* D += A·B, m16n8k16 bf16 x bf16 -> fp32 (PTX ISA fragment layout: D rows g, g+8 at columns 2t, 2t+1). */
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)a; (void)b0; (void)b1;
    d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7fc00000);
#endif
}

/* 4 floats -> 4 bf16 by truncation (exact when the low halves are zero); *inexact |= the low halves. */
__device__ __forceinline__ uint2 f4_bf16(float4 v, uint32_t *inexact) {
    const uint32_t x = __float_as_uint(v.x), y = __float_as_uint(v.y), z = __float_as_uint(v.z),
                   w = __float_as_uint(v.w);
    *inexact |= (x | y | z | w) & 0xffffu;
    return make_uint2((x >> 16) | (y & 0xffff0000u), (z >> 16) | (w & 0xffff0000u));
}

/*
 * Scores of chunk rows [TOK·b, TOK·b + TOK) (b counted from the last group: the rows with the most keys
 * start first) against their visible keys in tiles blockIdx.y, + gridDim.y, .. (few rows, e.g. a batch
 * of decode or verify requests: the keys are split over blockIdx.y too). 8 warps = 4 (rows·heads, TOK·16
 * each) x 2 (32 keys each). Sets redo[row] = 1 (zeroed before) where the scores are not the reference's
 * (q or a key not exact in bf16): k_idx_scores then recomputes that row. Rows of one block that belong to
 * different slots (request boundaries) take one pass over the keys per slot.
 */
template <int TOK>
__global__ void __launch_bounds__(IDX_THREADS, TOK == 2 ? 2 : 1)
    k_idx_scores_tc(const float *qi, const float *g, float g_scale, dsv4_cmp_state cs, const int32_t *pos,
                    const int32_t *slots, int t0, int n, float *scores, int64_t ld, int32_t *redo) {
    constexpr int MT = TOK; /* m16 tiles per warp: TOK·64 rows over 4 warps */
    extern __shared__ __align__(16) unsigned char smraw[];
    uint16_t *As = (uint16_t *)smraw;           /* [TOK·64][TC_ALD] q, row = tok·64 + head */
    uint16_t *Bs = As + TOK * TC_H * TC_ALD;    /* [TC_BN][TC_ALD] keys of the tile */
    float *P = (float *)(Bs + TC_BN * TC_ALD);  /* [TOK·TC_BN][TC_PLD] ReLU'd dots, (row, key) major */
    float *gw = P + TOK * TC_BN * TC_PLD;       /* [TOK][64] g_scale·g */
    __shared__ int s_slot[TOK], s_bad[TOK], s_kbad;
    __shared__ int64_t s_nvis[TOK];
    __shared__ uint8_t s_kmiss[TC_BN];          /* key of the tile on an unmapped page */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tb = (int)(gridDim.x - 1 - blockIdx.x) * TOK;
    if (tid < TOK) {
        const int tl = tb + tid;
        int64_t nv = 0;
        int sl = -1;
        if (tl < n) {
            const int t = t0 + tl;
            nv = ((int64_t)pos[t] + 1) / cs.ratio;
            if (nv > cs.max_rows) nv = cs.max_rows;
            if (cs.block_table && nv > (int64_t)cs.max_pages * cs.page_rows) nv = (int64_t)cs.max_pages * cs.page_rows;
            sl = slots[t];
        }
        s_nvis[tid] = nv;
        s_slot[tid] = sl;
        s_bad[tid] = 0;
    }
    if (tid == 0) s_kbad = 0;
    /* q of the rows -> bf16 (thread: float4 column `lane` of heads warp + 8m), exactness per row */
#pragma unroll
    for (int tok = 0; tok < TOK; tok++) {
        const int tl = tb + tok;
        uint32_t bad = 0;
#pragma unroll
        for (int m = 0; m < TC_H / 8; m++) {
            const int h = warp + 8 * m;
            const float4 v = tl < n ? ((const float4 *)(qi + ((int64_t)(t0 + tl) * TC_H + h) * TC_DK))[lane]
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
            *(uint2 *)(As + (tok * TC_H + h) * TC_ALD + 4 * lane) = f4_bf16(v, &bad);
        }
        if (__any_sync(0xffffffffu, bad != 0) && lane == 0) atomicOr(&s_bad[tok], 1);
    }
    for (int i = tid; i < TOK * TC_H; i += blockDim.x) {
        const int tl = tb + i / TC_H;
        gw[i] = tl < n ? __fmul_rn(g_scale, g[(int64_t)(t0 + tl) * TC_H + i % TC_H]) : 0.f;
    }
    __syncthreads();
    const float *keys = (const float *)cs.rows.data;
    const int wm = warp & 3, wn = warp >> 2; /* warp tile: rows·heads wm·16·MT .. +16·MT x keys wn·32 .. +32 */
    const int gq = lane >> 2, tq = lane & 3;
    int done = 0;
    for (int tok = 0; tok < TOK; tok++)
        if (s_slot[tok] < 0) done |= 1 << tok;
    while (done != (1 << TOK) - 1) {
        const int slot = s_slot[__ffs(~done) - 1];
        int act = 0, need = 0;
        int64_t nv = 0;
        for (int tok = 0; tok < TOK; tok++)
            if (!(done >> tok & 1) && s_slot[tok] == slot) {
                act |= 1 << tok;
                need |= !s_bad[tok];
                if (s_nvis[tok] > nv) nv = s_nvis[tok];
            }
        done |= act;
        if (!need) continue; /* every row of the pass is recomputed anyway */
        float4 kr[TC_BN / 8];
        uint32_t miss = 0;
        /* key tile w0 into registers (thread: float4 column `lane` of keys warp + 8m); missing keys as zeros,
         * bit m of miss = key warp + 8m on an unmapped page */
        auto load = [&](int64_t w0) {
            miss = 0;
#pragma unroll
            for (int m = 0; m < TC_BN / 8; m++) {
                const int64_t w = w0 + warp + 8 * m;
                const int64_t r = w < nv ? cu_cmp_index(cs, slot, w) : -1;
                if (w < nv && r < 0) miss |= 1u << m;
                kr[m] = r >= 0 ? ((const float4 *)(keys + r * TC_DK))[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        };
        const int64_t wstep = (int64_t)gridDim.y * TC_BN;
        load((int64_t)blockIdx.y * TC_BN);
        for (int64_t w0 = (int64_t)blockIdx.y * TC_BN; w0 < nv; w0 += wstep) {
            uint32_t kbad = 0;
#pragma unroll
            for (int m = 0; m < TC_BN / 8; m++) *(uint2 *)(Bs + (warp + 8 * m) * TC_ALD + 4 * lane) = f4_bf16(kr[m], &kbad);
            if (lane < TC_BN / 8) s_kmiss[warp + 8 * lane] = (uint8_t)(miss >> lane & 1);
            if (__any_sync(0xffffffffu, kbad != 0) && lane == 0) s_kbad = 1;
            __syncthreads(); /* Bs complete; P of the previous tile consumed */
            if (s_kbad) break;
            const int kmiss = s_kmiss[tid % TC_BN]; /* read before the next tile's write (after the sync below) */
            if (w0 + wstep < nv) load(w0 + wstep); /* in flight during the mma */
            float acc[MT][4][4];
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < TC_DK / 16; ks++) {
                uint32_t a[MT][4], b[4][2];
#pragma unroll
                for (int i = 0; i < MT; i++)
                    ldsm_x4(a[i], As + (wm * 16 * MT + 16 * i + (lane & 15)) * TC_ALD + ks * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    uint32_t r[4];
                    ldsm_x4(r, Bs + (wn * 32 + jj * 16 + (lane >> 4) * 8 + (lane & 7)) * TC_ALD + ks * 16 +
                                   ((lane >> 3) & 1) * 8);
                    b[2 * jj][0] = r[0], b[2 * jj][1] = r[1], b[2 * jj + 1][0] = r[2], b[2 * jj + 1][1] = r[3];
                }
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) mma_bf16_16816(acc[i][j], a[i], b[j][0], b[j][1]);
            }
            /* ReLU'd dots to P[row][key][head] (as the reference: dot > 0 ? dot : 0) */
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int rr = wm * 16 * MT + 16 * i + gq; /* row·64 + head of c[0], c[1] */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float *p = P + ((rr / TC_H) * TC_BN + wn * 32 + 8 * j + 2 * tq) * TC_PLD + rr % TC_H;
                    const float(&c)[4] = acc[i][j];
                    p[0] = c[0] > 0.f ? c[0] : 0.f;
                    p[TC_PLD] = c[1] > 0.f ? c[1] : 0.f;
                    p[8] = c[2] > 0.f ? c[2] : 0.f;
                    p[TC_PLD + 8] = c[3] > 0.f ? c[3] : 0.f;
                }
            }
            __syncthreads(); /* P complete; Bs consumed */
            /* heads summed in order, one thread per (row, key) of the tile */
            if (tid < TOK * TC_BN) {
                const int tok = tid / TC_BN, kk = tid % TC_BN;
                const int64_t w = w0 + kk;
                if ((act >> tok & 1) && w < s_nvis[tok]) {
                    const float *pv = P + (tok * TC_BN + kk) * TC_PLD, *gv = gw + tok * TC_H;
                    float total = 0.f;
#pragma unroll
                    for (int h = 0; h < TC_H; h += 4) {
                        const float4 d = *(const float4 *)(pv + h);
                        total = __fadd_rn(total, __fmul_rn(gv[h], d.x));
                        total = __fadd_rn(total, __fmul_rn(gv[h + 1], d.y));
                        total = __fadd_rn(total, __fmul_rn(gv[h + 2], d.z));
                        total = __fadd_rn(total, __fmul_rn(gv[h + 3], d.w));
                    }
                    if (kmiss) total = -INFINITY; /* unreachable row: never preferred */
                    scores[(int64_t)(tb + tok) * ld + w] = total;
                }
            }
        }
        __syncthreads(); /* s_kbad final for the pass */
        if (s_kbad && tid < TOK && (act >> tid & 1)) s_bad[tid] = 1;
        __syncthreads();
        if (tid == 0) s_kbad = 0;
        __syncthreads();
    }
    if (tid < TOK && tb + tid < n && s_bad[tid]) redo[tb + tid] = 1;
}

/* ------------------------------------------------------------------- top-k */

/* Larger float -> larger key; -0 counts as +0 (the reference compares floats). */
__device__ __forceinline__ uint32_t ord_key(float s) {
    if (s == 0.f) s = 0.f;
    const uint32_t b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Exclusive block-wide prefix sum of v (blockDim.x = IDX_SEL_THREADS); *total gets the sum. */
__device__ int block_scan_excl(int v, int *warp_sums, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_sums[lane] = s; /* inclusive over warps */
    }
    __syncthreads();
    *total = warp_sums[(blockDim.x >> 5) - 1];
    return x - v + (warp ? warp_sums[warp - 1] : 0);
}

__global__ void __launch_bounds__(IDX_SEL_THREADS) k_idx_topk(const float *scores, int64_t ld, int ratio,
                                                              int64_t max_vis, const int32_t *pos, int t0, int topk,
                                                              int32_t *sel) {
    __shared__ int hist[256];
    __shared__ int warp_sums[32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_kk;
    const int tl = blockIdx.x, t = t0 + tl;
    int64_t nvis = ((int64_t)pos[t] + 1) / ratio;
    if (nvis > max_vis) nvis = max_vis;
    int32_t *out = sel + (int64_t)t * topk;
    if (nvis <= topk) { /* everything visible is kept: no scores needed */
        for (int j = threadIdx.x; j < topk; j += blockDim.x) out[j] = j < nvis ? j : -1;
        return;
    }
    const float *sc = scores + (int64_t)tl * ld;
    uint32_t prefix = 0, mask = 0;
    int kk = topk; /* how many still to take at or below the current prefix */
    const int lane = threadIdx.x & 31;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        /* warp-aggregated counts: scores of a row share few top bytes (sign + exponent), so
         * plain shared atomics would serialise on one bin */
        for (int64_t base = 0; base < nvis; base += blockDim.x) {
            const int64_t w = base + threadIdx.x;
            const uint32_t u = w < nvis ? ord_key(sc[w]) : 0u;
            const int valid = w < nvis && (u & mask) == prefix;
            const unsigned bin = valid ? (u >> shift) & 255u : 256u;
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (valid && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        /* the digit where the count from the top reaches kk: scan bins from 255 down, in parallel */
        const int bin = 255 - (int)threadIdx.x;
        const int cnt = threadIdx.x < 256 ? hist[bin] : 0;
        int total;
        const int above = block_scan_excl(cnt, warp_sums, &total);
        if (threadIdx.x < 256 && above < kk && kk <= above + cnt) {
            s_prefix = prefix | ((uint32_t)bin << shift);
            s_kk = kk - above;
        }
        __syncthreads();
        prefix = s_prefix;
        kk = s_kk;
        mask |= 255u << shift;
    }
    /* prefix = key of the k-th largest; take all above it and the first kk equal to it, in row order */
    int written = 0, eq_seen = 0;
    for (int64_t base = 0; base < nvis; base += blockDim.x) {
        const int64_t w = base + threadIdx.x;
        const uint32_t u = w < nvis ? ord_key(sc[w]) : 0u;
        const int is_eq = w < nvis && u == prefix;
        int n_eq;
        const int eq_rank = eq_seen + block_scan_excl(is_eq, warp_sums, &n_eq);
        const int take = w < nvis && (u > prefix || (is_eq && eq_rank < kk));
        int n_take;
        const int at = written + block_scan_excl(take, warp_sums, &n_take);
        if (take) out[at] = (int32_t)w;
        written += n_take;
        eq_seen += n_eq;
    }
    for (int j = written + threadIdx.x; j < topk; j += blockDim.x) out[j] = -1;
}

/* ---------------------------------------------------------------------- op */

int cu_be_indexer_select(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float g_scale,
                         const dsv4_cmp_state *idx, int topk, const dsv4_batch *b, dsv4_buf *sel,
                         dsv4_err *err) {
    if (!idx || !b || idx->ratio <= 0) return cu_err(err, DSV4_EINVAL, "cuda: indexer_select: bad index state");
    const int T = b->n_rows;
    int rc = cu_be_check(g, DSV4_DT_F32, T, -1, "indexer g", err);
    if (rc) return rc;
    const int H = (int)g->cols, dk = idx->out_dim;
    rc = cu_be_check(qi, DSV4_DT_F32, T, (int64_t)H * dk, "indexer q", err);
    if (!rc) rc = cu_be_check(sel, DSV4_DT_I32, T, topk, "indexer sel", err);
    if (!rc) rc = cu_be_check_cmp_rows(idx, dk, "index keys", err);
    if (!rc && idx->rows.dtype != DSV4_DT_F32) /* as the CPU reference: index keys have no record format */
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: indexer_select: index keys must be F32 rows");
    if (!rc && (topk <= 0 || H <= 0 || H > IDX_MAXH || dk <= 0 || dk % 8 || dk > 256))
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: indexer_select: %d heads (max %d) x dim %d (multiple of 8, "
                    "max 256), topk %d", H, IDX_MAXH, dk, topk);
    if (rc) return rc;
    if (!T) return DSV4_OK;
    int64_t max_vis = idx->max_rows; /* as the reference: rows w >= max_rows are never visible */
    if (idx->block_table && (int64_t)idx->max_pages * idx->page_rows < max_vis)
        max_vis = (int64_t)idx->max_pages * idx->page_rows;
    int64_t maxn = 0;
    for (int t = 0; t < T; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= idx->n_slots || b->pos[t] < 0)
            return cu_err(err, DSV4_EINVAL, "indexer_select: slot %d / position %d of row %d out of range",
                          b->slot[t], b->pos[t], t);
        int64_t n = ((int64_t)b->pos[t] + 1) / idx->ratio;
        if (n > max_vis) n = max_vis;
        if (n > maxn) maxn = n;
    }
    /* shape-static (graph capture): as if some row saw every row it could;
     * k_idx_topk bounds each row by its own device position, so the selection
     * is the same as with the host's maximum */
    if (be->static_shapes) maxn = max_vis;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    dsv4_cuda_ctx *ctx = cube(be)->ctx;
    /* key range per block: prefill (many rows) takes 32-key tiles x 4; decode and short verify steps
     * take 8-key tiles, as many per block as keep about IDX_TARGET_BLOCKS blocks busy */
    const int64_t nt32 = (maxn + 31) / 32, nt8 = (maxn + 7) / 8;
    int kpw = 4, tpb = 4;
    if ((int64_t)T * nt32 < 2 * IDX_TARGET_BLOCKS) {
        kpw = 1;
        const int64_t want = (int64_t)T * nt8 / IDX_TARGET_BLOCKS;
        tpb = (int)(want < 1 ? 1 : want > IDX_BLOCK_KEYS / 8 ? IDX_BLOCK_KEYS / 8 : want);
    }
    /* prefill-sized calls at the Flash shape score on the tensor cores (DSV4_CUDA_IDX_TC=0: scalar only) */
    static int tc_env = -1;
    if (tc_env < 0) { /* DSV4_CUDA_IDX_TC: 0 = scalar, 4 = 4 rows per block, else 2 (2 blocks per SM) */
        const char *e = getenv("DSV4_CUDA_IDX_TC");
        tc_env = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "4") ? 4 : 2;
    }
    const int tc_tok = tc_env, use_tc = tc_env && kpw == 4 && H == TC_H && dk == TC_DK && maxn > topk;
    float *scores = NULL;
    int32_t *redo = NULL;
    int64_t ld = maxn > topk ? maxn : 1, chunk = T;
    if (maxn > topk) {
        chunk = (int64_t)(IDX_SCRATCH / ((size_t)ld * sizeof(float)));
        if (chunk < 1) chunk = 1;
        if (chunk > T) chunk = T;
        if (chunk > 65535) chunk = 65535; /* grid dimension */
        void *p = NULL;
        const size_t sbytes = cu_align((size_t)chunk * ld * sizeof(float));
        if ((rc = cu_workspace(ctx, sbytes + (use_tc ? (size_t)chunk * sizeof(int32_t) : 0), &p, err))) return rc;
        scores = (float *)p;
        if (use_tc) redo = (int32_t *)((char *)p + sbytes);
    }
    if (use_tc && tc_tok == 4)
        CU_TRY(cudaFuncSetAttribute(k_idx_scores_tc<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)idx_tc_smem(4)), err, "indexer_select (shared memory)");
    if (use_tc && tc_tok == 2)
        CU_TRY(cudaFuncSetAttribute(k_idx_scores_tc<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)idx_tc_smem(2)), err, "indexer_select (shared memory)");
    const size_t smem = idx_smem(H, dk, kpw);
    if (kpw == 4)
        CU_TRY(cudaFuncSetAttribute(k_idx_scores<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "indexer_select (shared memory)");
    else
        CU_TRY(cudaFuncSetAttribute(k_idx_scores<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
               "indexer_select (shared memory)");
    const int64_t per_block = (int64_t)8 * kpw * tpb;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int n = (int)(T - t0 < chunk ? T - t0 : chunk);
        if (scores) {
            if (use_tc) {
                /* key tiles split over grid.y when the rows alone give fewer than ~2 blocks per SM */
                const int64_t groups = (n + tc_tok - 1) / tc_tok, ktiles = (maxn + TC_BN - 1) / TC_BN;
                int64_t ky = (IDX_TARGET_BLOCKS + groups - 1) / groups;
                ky = ky < 1 ? 1 : ky > ktiles ? ktiles : ky > 65535 ? 65535 : ky;
                CU_TRY(cudaMemsetAsync(redo, 0, (size_t)n * sizeof(int32_t), ctx->stream), err,
                       "indexer_select (row flags)");
                const dim3 grid((unsigned)groups, (unsigned)ky);
                if (tc_tok == 4)
                    k_idx_scores_tc<4><<<grid, IDX_THREADS, idx_tc_smem(4), ctx->stream>>>(
                        (const float *)qi->data, (const float *)g->data, g_scale, *idx, pos, slot, (int)t0, n, scores,
                        ld, redo);
                else
                    k_idx_scores_tc<2><<<grid, IDX_THREADS, idx_tc_smem(2), ctx->stream>>>(
                        (const float *)qi->data, (const float *)g->data, g_scale, *idx, pos, slot, (int)t0, n, scores,
                        ld, redo);
                CU_LAUNCHED(err, "indexer_select (tensor-core scores)");
            }
            /* with use_tc: only the rows k_idx_scores_tc flagged (q or keys not exact in bf16) */
            dim3 grid((unsigned)((maxn + per_block - 1) / per_block), (unsigned)(use_tc && n > 128 ? 128 : n));
            if (kpw == 4)
                k_idx_scores<4><<<grid, IDX_THREADS, smem, ctx->stream>>>(
                    (const float *)qi->data, (const float *)g->data, g_scale, *idx, H, dk, pos, slot, (int)t0, tpb,
                    scores, ld, n, redo);
            else
                k_idx_scores<1><<<grid, IDX_THREADS, smem, ctx->stream>>>(
                    (const float *)qi->data, (const float *)g->data, g_scale, *idx, H, dk, pos, slot, (int)t0, tpb,
                    scores, ld, n, NULL);
            CU_LAUNCHED(err, "indexer_select (scores)");
        }
        k_idx_topk<<<n, IDX_SEL_THREADS, 0, ctx->stream>>>(scores, ld, idx->ratio, max_vis, pos, (int)t0, topk,
                                                         (int32_t *)sel->data);
        CU_LAUNCHED(err, "indexer_select (top-k)");
    }
    return DSV4_OK;
}
