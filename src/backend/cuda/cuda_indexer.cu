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
 */
#include "backend/cuda/cuda_be_internal.cuh"

#include <math.h>

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

/* Scores of keys [blockIdx.x·tpb·8·KPW, +tpb·8·KPW) of row t0 + blockIdx.y. */
template <int KPW>
__global__ void __launch_bounds__(IDX_THREADS) k_idx_scores(const float *qi, const float *g, float g_scale,
                                                            dsv4_cmp_state cs, int H, int dk, const int32_t *pos,
                                                            const int32_t *slots, int t0, int tpb, float *scores,
                                                            int64_t ld) {
    constexpr int TILE = 8 * KPW;
    extern __shared__ float sm[];
    __shared__ int64_t krow[TILE];
    const int qld = dk + 1, kld = dk + 4, dld = H + 1;
    float *qs = sm;                          /* [H][dk+1]: lanes read different heads conflict-free */
    float *ks = qs + ((H * qld + 3) & ~3);   /* [TILE][dk+4] key rows (16-byte aligned) */
    float *dots = ks + TILE * kld;           /* [IDX_BLOCK_KEYS][H+1] relu'd dots */
    float *gw = dots + IDX_BLOCK_KEYS * dld; /* [H] g_scale*g */
    const int tl = blockIdx.y, t = t0 + tl;
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
    float *scores = NULL;
    int64_t ld = maxn > topk ? maxn : 1, chunk = T;
    if (maxn > topk) {
        chunk = (int64_t)(IDX_SCRATCH / ((size_t)ld * sizeof(float)));
        if (chunk < 1) chunk = 1;
        if (chunk > T) chunk = T;
        if (chunk > 65535) chunk = 65535; /* grid dimension */
        void *p = NULL;
        if ((rc = cu_workspace(ctx, (size_t)chunk * ld * sizeof(float), &p, err))) return rc;
        scores = (float *)p;
    }
    /* key range per block: prefill (many rows) takes 32-key tiles x 4; decode and short verify steps
     * take 8-key tiles, as many per block as keep about IDX_TARGET_BLOCKS blocks busy */
    const int64_t nt32 = (maxn + 31) / 32, nt8 = (maxn + 7) / 8;
    int kpw = 4, tpb = 4;
    if ((int64_t)T * nt32 < 2 * IDX_TARGET_BLOCKS) {
        kpw = 1;
        const int64_t want = (int64_t)T * nt8 / IDX_TARGET_BLOCKS;
        tpb = (int)(want < 1 ? 1 : want > IDX_BLOCK_KEYS / 8 ? IDX_BLOCK_KEYS / 8 : want);
    }
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
            dim3 grid((unsigned)((maxn + per_block - 1) / per_block), (unsigned)n);
            if (kpw == 4)
                k_idx_scores<4><<<grid, IDX_THREADS, smem, ctx->stream>>>(
                    (const float *)qi->data, (const float *)g->data, g_scale, *idx, H, dk, pos, slot, (int)t0, tpb,
                    scores, ld);
            else
                k_idx_scores<1><<<grid, IDX_THREADS, smem, ctx->stream>>>(
                    (const float *)qi->data, (const float *)g->data, g_scale, *idx, H, dk, pos, slot, (int)t0, tpb,
                    scores, ld);
            CU_LAUNCHED(err, "indexer_select (scores)");
        }
        k_idx_topk<<<n, IDX_SEL_THREADS, 0, ctx->stream>>>(scores, ld, idx->ratio, max_vis, pos, (int)t0, topk,
                                                         (int32_t *)sel->data);
        CU_LAUNCHED(err, "indexer_select (top-k)");
    }
    return DSV4_OK;
}
