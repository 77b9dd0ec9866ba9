/*
 * cuda_attn.cu — sink attention over the raw window + compressed rows
 * (`attention`, spec/MODEL.md §3.4.7, §3.8) for the CUDA op table; the CPU
 * reference is src/backend/cpu/cpu_attn.c.
 *
 * Candidates of a query row t (slot s, position p, segment start p0): the
 * raw window positions max(0, p−W+1)..p (positions >= p0 are this batch's
 * kv rows, older ones the slot's ring), then the compressed rows — the
 * selection's (−1 and rows not yet visible are skipped) or every visible
 * row w < (p+1)/ratio — addressed through DSV4_CMP_ROW (an unmapped page is
 * never read). Candidate j of a row is found arithmetically, so no list is
 * built.
 *
 * Why two kernels and a score scratch: reference numerics round each
 * probability to bf16 before the PV product, and a probability needs the
 * final max and denominator, so an online (flash) softmax cannot be used
 * as is. Instead:
 *  1. scores: grid (candidate chunk, head group, row); a block holds the
 *     q of 16 heads and streams 32 candidate keys, a warp per key, scores
 *     ·hd^-½ into S[row][head][candidate] (−inf where there is no key).
 *  2. pv: grid (128-dim slice, group of 8 heads, row); the block derives
 *     max and denominator (sink included) of its heads from S, then streams
 *     the candidates' 128-dim slices once, accumulating p·v for 8 heads
 *     (p rounded to bf16 in reference numerics), warps over candidates,
 *     reduced in shared memory at the end.
 * Each key is read from HBM once per row and from L2 by the other head
 * groups; both kernels split a decode row over dozens of blocks. Rows are
 * processed in chunks so S stays within ATT_SCRATCH bytes.
 */
#include "backend/cuda/cuda_be_internal.cuh"

#include <math.h>

#define ATT_THREADS 256
#define ATT_QHEADS 16        /* heads per score block */
#define ATT_CHUNK 32         /* candidates per score block: 8 warps x 4 */
#define ATT_PHEADS 8         /* heads per pv block (one warp each for the softmax statistics) */
#define ATT_SCRATCH ((size_t)256 << 20)

/* Everything a kernel needs to find the keys of a row (passed by value). */
typedef struct att_args {
    const float *q, *kv, *ring;
    float *o;
    const int32_t *sel;
    int sel_cols;        /* 0: no selection (every visible compressed row) */
    int has_cmp;
    dsv4_cmp_state cs;   /* valid when has_cmp */
    int H, hd, window, cap;
    float scale;
    const int32_t *pos, *slot, *p0;
    int t0;
    float *S;            /* [rows of the chunk][H][ld] */
    int64_t ld;
} att_args;

/* Key row of candidate j of row t, or NULL when there is none. */
__device__ __forceinline__ const float *cand_key(const att_args &a, int t, int64_t j) {
    const int64_t p = a.pos[t], p0 = a.p0[t];
    const int slot = a.slot[t];
    const int64_t lo = p - a.window + 1 < 0 ? 0 : p - a.window + 1, nwin = p - lo + 1;
    if (j < nwin) {
        const int64_t pp = lo + j;
        return pp >= p0 ? a.kv + (t - (p - pp)) * (int64_t)a.hd
                        : a.ring + ((int64_t)slot * a.cap + pp % a.cap) * (int64_t)a.hd;
    }
    if (!a.has_cmp) return NULL;
    const int64_t jj = j - nwin, nvis = (p + 1) / a.cs.ratio;
    int64_t w;
    if (a.sel_cols) {
        if (jj >= a.sel_cols) return NULL;
        w = a.sel[(int64_t)t * a.sel_cols + jj];
        if (w < 0 || w >= nvis) return NULL;
    } else {
        w = jj;
        if (w >= nvis || (!a.cs.block_table && w >= a.cs.max_rows)) return NULL;
    }
    if (a.cs.block_table) {
        if (w / a.cs.page_rows >= a.cs.max_pages) return NULL;
        if (a.cs.block_table[(int64_t)slot * a.cs.max_pages + w / a.cs.page_rows] < 0) return NULL;
    }
    return (const float *)a.cs.rows.data + DSV4_CMP_ROW(&a.cs, slot, w) * a.hd;
}

/* Scores of ATT_CHUNK candidates x ATT_QHEADS heads of one row. NV = hd/128. */
template <int NV>
__global__ void __launch_bounds__(ATT_THREADS) k_att_scores(att_args a) {
    __shared__ float4 qs[ATT_QHEADS][NV * 32];
    const int tl = blockIdx.z, t = a.t0 + tl, hg0 = blockIdx.y * ATT_QHEADS;
    const int nh = a.H - hg0 < ATT_QHEADS ? a.H - hg0 : ATT_QHEADS;
    const int64_t j0 = (int64_t)blockIdx.x * ATT_CHUNK;
    if (j0 >= a.ld) return;
    for (int i = threadIdx.x; i < nh * NV * 32; i += blockDim.x)
        qs[i / (NV * 32)][i % (NV * 32)] =
            ((const float4 *)(a.q + ((int64_t)t * a.H + hg0 + i / (NV * 32)) * a.hd))[i % (NV * 32)];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *S = a.S + ((int64_t)tl * a.H + hg0) * a.ld;
    for (int c = 0; c < ATT_CHUNK / 8; c++) {
        const int64_t j = j0 + warp * (ATT_CHUNK / 8) + c;
        if (j >= a.ld) break;
        const float *key = cand_key(a, t, j);
        if (!key) {
            if (lane < nh) S[(int64_t)lane * a.ld + j] = -INFINITY;
            continue;
        }
        float4 k[NV];
#pragma unroll
        for (int v = 0; v < NV; v++) k[v] = ((const float4 *)key)[v * 32 + lane];
        for (int h = 0; h < nh; h++) {
            float s = 0.f;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const float4 qv = qs[h][v * 32 + lane];
                s += qv.x * k[v].x + qv.y * k[v].y + qv.z * k[v].z + qv.w * k[v].w;
            }
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) S[(int64_t)h * a.ld + j] = s * a.scale;
        }
    }
}

/* Softmax (with the sink) and p·v for ATT_PHEADS heads x one 128-dim slice of one row. */
__global__ void __launch_bounds__(ATT_THREADS) k_att_pv(att_args a, const void *sinks, int sinks_bf16, int ref) {
    __shared__ float mx_s[ATT_PHEADS], den_s[ATT_PHEADS];
    __shared__ float4 red[ATT_THREADS / 32][ATT_PHEADS][32];
    const int tl = blockIdx.z, t = a.t0 + tl, hg0 = blockIdx.y * ATT_PHEADS, slice = blockIdx.x;
    const int nh = a.H - hg0 < ATT_PHEADS ? a.H - hg0 : ATT_PHEADS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const float *S = a.S + ((int64_t)tl * a.H + hg0) * a.ld;
    /* statistics: warp h -> head hg0 + h */
    for (int h = warp; h < nh; h += nwarps) {
        const float sink = cu_ldf(sinks, sinks_bf16, hg0 + h);
        float m = sink;
        for (int64_t j = lane; j < a.ld; j += 32) m = fmaxf(m, S[(int64_t)h * a.ld + j]);
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float d = 0.f;
        for (int64_t j = lane; j < a.ld; j += 32) d += expf(S[(int64_t)h * a.ld + j] - m);
        for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (lane == 0) {
            mx_s[h] = m;
            den_s[h] = d + expf(sink - m);
        }
    }
    __syncthreads();
    float4 acc[ATT_PHEADS];
#pragma unroll
    for (int h = 0; h < ATT_PHEADS; h++) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t j = warp; j < a.ld; j += nwarps) {
        const float *key = cand_key(a, t, j);
        if (!key) continue;
        const float4 v = ((const float4 *)(key + slice * 128))[lane];
#pragma unroll
        for (int h = 0; h < ATT_PHEADS; h++) {
            if (h >= nh) break;
            float p = expf(S[(int64_t)h * a.ld + j] - mx_s[h]) / den_s[h];
            if (ref) p = round_bf16(p); /* official: bf16 probabilities into PV */
            acc[h].x += p * v.x;
            acc[h].y += p * v.y;
            acc[h].z += p * v.z;
            acc[h].w += p * v.w;
        }
    }
#pragma unroll
    for (int h = 0; h < ATT_PHEADS; h++) red[warp][h][lane] = acc[h];
    __syncthreads();
    for (int i = threadIdx.x; i < nh * 32; i += blockDim.x) {
        const int h = i / 32, l = i % 32;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = 0; w < nwarps; w++) {
            const float4 r = red[w][h][l];
            s.x += r.x;
            s.y += r.y;
            s.z += r.z;
            s.w += r.w;
        }
        ((float4 *)(a.o + ((int64_t)t * a.H + hg0 + h) * a.hd + slice * 128))[l] = s;
    }
}

int cu_be_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                    const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                    const dsv4_batch *b, dsv4_buf *o, dsv4_err *err) {
    if (!b) return cu_err(err, DSV4_EINVAL, "cuda: attention: no batch");
    const int T = b->n_rows;
    int rc = cu_be_check(kv, DSV4_DT_F32, T, -1, "attention kv", err);
    if (rc) return rc;
    const int64_t hd = kv->cols;
    if (n_heads <= 0) return cu_err(err, DSV4_EINVAL, "cuda: attention: %d heads", n_heads);
    rc = cu_be_check(q, DSV4_DT_F32, T, hd * n_heads, "attention q", err);
    if (!rc) rc = cu_be_check(o, DSV4_DT_F32, T, hd * n_heads, "attention o", err);
    if (!rc && (!ws || ws->cap < ws->window || ws->window <= 0))
        rc = cu_err(err, DSV4_EINVAL, "cuda: attention: window state: cap must be >= window > 0");
    if (!rc && ws->rows.dtype != DSV4_DT_F32)
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: attention: window ring dtype %d (only F32 rings implemented)",
                    (int)ws->rows.dtype);
    if (!rc) rc = cu_be_check(&ws->rows, DSV4_DT_F32, (int64_t)ws->n_slots * ws->cap, hd, "window rows", err);
    if (!rc) rc = cu_be_check_vec(sinks, n_heads, "attn_sink", err);
    if (!rc && cs && cs->ratio <= 0) rc = cu_err(err, DSV4_EINVAL, "cuda: attention: compressed state ratio %d", cs->ratio);
    if (!rc && cs) rc = cu_be_check_cmp_rows(cs, hd, "compressed rows", err);
    if (!rc && sel) rc = cu_be_check(sel, DSV4_DT_I32, T, -1, "attention sel", err);
    if (!rc && hd != 128 && hd != 256 && hd != 512)
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: attention: head_dim %lld (128, 256 or 512 implemented)",
                    (long long)hd);
    if (rc) return rc;
    if (!T) return DSV4_OK;
    /* the widest candidate list of the batch */
    int64_t maxc = 0;
    for (int t = 0; t < T; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= ws->n_slots || (cs && b->slot[t] >= cs->n_slots) || b->pos[t] < 0)
            return cu_err(err, DSV4_EINVAL, "attention: slot %d / position %d of row %d out of range", b->slot[t],
                          b->pos[t], t);
        int64_t p = b->pos[t], n = p + 1 < ws->window ? p + 1 : ws->window;
        if (cs) {
            int64_t nvis = (p + 1) / cs->ratio;
            if (!cs->block_table && nvis > cs->max_rows) nvis = cs->max_rows;
            n += sel ? sel->cols : nvis;
        }
        if (n > maxc) maxc = n;
    }
    const int32_t *tok, *pos, *slot, *p0, *r0, *r1;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err)) || (rc = cu_be_batch_seg(be, b, &p0, &r0, &r1, err)))
        return rc;
    dsv4_cuda_ctx *ctx = cube(be)->ctx;
    att_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)q->data;
    a.kv = (const float *)kv->data;
    a.ring = (const float *)ws->rows.data;
    a.o = (float *)o->data;
    a.sel = sel ? (const int32_t *)sel->data : NULL;
    a.sel_cols = sel ? (int)sel->cols : 0;
    a.has_cmp = cs != NULL;
    if (cs) a.cs = *cs;
    a.H = n_heads;
    a.hd = (int)hd;
    a.window = ws->window;
    a.cap = ws->cap;
    a.scale = 1.0f / sqrtf((float)hd);
    a.pos = pos;
    a.slot = slot;
    a.p0 = p0;
    a.ld = maxc;
    int64_t chunk = (int64_t)(ATT_SCRATCH / ((size_t)n_heads * maxc * sizeof(float)));
    if (chunk < 1) chunk = 1;
    if (chunk > T) chunk = T;
    if (chunk > 65535) chunk = 65535; /* grid dimension */
    void *ws_p = NULL;
    if ((rc = cu_workspace(ctx, (size_t)chunk * n_heads * maxc * sizeof(float), &ws_p, err))) return rc;
    a.S = (float *)ws_p;
    const int ref = be->numerics == DSV4_NUMERICS_REFERENCE, sbf = sinks->dtype == DSV4_DT_BF16;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const unsigned n = (unsigned)(T - t0 < chunk ? T - t0 : chunk);
        a.t0 = (int)t0;
        dim3 g1((unsigned)((maxc + ATT_CHUNK - 1) / ATT_CHUNK), (unsigned)((n_heads + ATT_QHEADS - 1) / ATT_QHEADS), n);
        if (hd == 128) k_att_scores<1><<<g1, ATT_THREADS, 0, ctx->stream>>>(a);
        else if (hd == 256) k_att_scores<2><<<g1, ATT_THREADS, 0, ctx->stream>>>(a);
        else k_att_scores<4><<<g1, ATT_THREADS, 0, ctx->stream>>>(a);
        CU_LAUNCHED(err, "attention (scores)");
        dim3 g2((unsigned)(hd / 128), (unsigned)((n_heads + ATT_PHEADS - 1) / ATT_PHEADS), n);
        k_att_pv<<<g2, ATT_THREADS, 0, ctx->stream>>>(a, sinks->data, sbf, ref);
        CU_LAUNCHED(err, "attention (pv)");
    }
    return DSV4_OK;
}
