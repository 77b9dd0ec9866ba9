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
 *     q of 16 heads, finds its 64 candidates' key rows, each warp loads 4
 *     keys at once (twice) and reduces the 16 heads' dots: scores ·hd^-½ into
 *     S[row][head][candidate] (−inf where there is no key).
 *  2. pv: grid (128-dim slice x split, group of 16 heads, row); the block
 *     derives max and denominator (sink included) of its heads from S, then
 *     stages pointers and probabilities (bf16-rounded in reference
 *     numerics) of 128 candidates at a time and streams their 128-dim
 *     slices, 4 loads in flight per warp; warps reduced in shared memory.
 *     When rows x slices x head groups would leave SMs idle (decode), the
 *     candidates are split over blocks (down to 64 candidates a part): the
 *     probabilities are already normalised, so the partial outputs just add
 *     (3rd kernel) — flash-decoding's split without its rescaling, which
 *     the bf16 rounding of normalised probabilities rules out.
 * Decode: score blocks shrink to 8 heads x 32 candidates (160 blocks at 640
 * candidates instead of 40) and a warp reduces its 8x4 or 16x4 dots in one
 * transposing butterfly (N shuffles for N sums, not 5N).
 * Small rows (k_att_pv<.., DEC = 1>, the default below ATT_TC_MIN_ROWS rows):
 * at decode both kernels are latency chains, not throughput: ncu (batch 1,
 * H200) timed k_att_scores at 12-13 us with 32 blocks and with 160, and
 * k_att_pv at 13 us (32 blocks) to 16 us (160); more, smaller blocks would
 * not shorten them. What does: pv is launched with PDL while the scores run
 * (k_att_scores triggers at entry); before griddepcontrol.wait a pv block
 * finds its key pointers (row metadata -> selection -> page table -> row,
 * dependent loads) and loads its warps' first 8 value slices, none of which
 * depend on S; after the wait only the statistics, probabilities, FMAs and
 * the block sum remain. The split-K sum moves into the pv kernel (the last
 * split block of a group adds the parts, in k_att_reduce's order), so a
 * layer's attention is two launches, not three. And both kernels issue a
 * warp's key / value loads before decoding any (kv_ld4_raw / kv_dec4):
 * with coded rows the decode under `key ? kv_ld4 : 0` had serialised them.
 * Same values, same FMA order, same sums: bit-identical to
 * DSV4_CUDA_ATT_DEC=0 (the kernels before; gpu_conformance --att-exact
 * checks it).
 * Prefill (row chunks >= ATT_TC_MIN_ROWS): both products on tensor cores,
 * see k_att_scores_tc below.
 * Each key is read from HBM once per row and from L2 by the other head
 * groups. Rows are
 * processed in chunks so S stays within ATT_SCRATCH bytes.
 */
#include "backend/cuda/cuda_kvrow.cuh"

#include <math.h>
#include <stdlib.h>

#define ATT_THREADS 256
#define ATT_QHEADS 16        /* heads per score block */
#define ATT_CHUNK 64         /* candidates per score block: 8 warps x 2 x 4 */
#define ATT_PHEADS 16        /* heads per pv block */
#define ATT_PCHUNK 128       /* candidates whose pointers / probabilities a pv block stages at once */
#define ATT_TARGET_BLOCKS 264 /* pv blocks wanted (2 per SM): split rows' candidates below that */
#define ATT_MIN_PER 64       /* candidates per split-K part at least */
#define ATT_SCRATCH ((size_t)256 << 20)

/* Everything a kernel needs to find the keys of a row (passed by value). */
typedef struct att_args {
    const float *q;
    const uint8_t *kv, *ring; /* the batch's rows and the window ring, both in the store's record format */
    int64_t rb;               /* bytes per key row (cuda_kvrow.cuh: F32 4·hd, BF16 2·hd, fp8_ds_mla record) */
    int nope, scoff;          /* fp8_ds_mla: E4M3 dims, offset of the scale bytes */
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
    int64_t per; /* candidates per split-K part (k_att_pv) */
    unsigned *cnt; /* k_att_pv<.., 1> split arrival counters (workspace), zeroed by k_att_scores; or NULL */
    int ncnt;
} att_args;

/* Key row of candidate j of row t, or NULL when there is none. */
__device__ __forceinline__ const uint8_t *cand_key(const att_args &a, int t, int64_t j) {
    const int64_t p = a.pos[t], p0 = a.p0[t];
    const int slot = a.slot[t];
    const int64_t lo = p - a.window + 1 < 0 ? 0 : p - a.window + 1, nwin = p - lo + 1;
    if (j < nwin) {
        const int64_t pp = lo + j;
        return pp >= p0 ? a.kv + (t - (p - pp)) * a.rb : a.ring + ((int64_t)slot * a.cap + pp % a.cap) * a.rb;
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
        if (w >= nvis) return NULL;
    }
    const int64_t r = cu_cmp_index(a.cs, slot, w);
    return r < 0 ? NULL : (const uint8_t *)a.cs.rows.data + r * a.rb;
}

/*
 * How many of row t's candidates can hold a key: its window rows, then its selected (sel_cols) or
 * visible compressed rows, at most a.ld. Why the kernels bound their loops by it and not by a.ld:
 * a shape-static launch (a CUDA graph, backend.h static_shapes) sizes a.ld by the state's capacity,
 * e.g. 128 + 8192 candidates for a ratio-128 layer at --max-model-len 1048576, while a request at
 * context 4096 has 160; looping to a.ld made a decode step pay for max_model_len (ncu, 2026-12-01:
 * 17 -> 156 us per ratio-128 pv). Every candidate from here on has no key (cand_key NULL), so its score
 * is -inf and its probability 0: max / sum / p·v loops that stop here give the same floats as loops
 * to a.ld (fmax with -inf and + expf(-inf) = + 0 change nothing), whatever the launch width.
 */
__device__ __forceinline__ int64_t att_ncand(const att_args &a, int t) {
    const int64_t p = a.pos[t];
    int64_t n = p + 1 < a.window ? p + 1 : a.window;
    if (a.has_cmp) n += a.sel_cols ? a.sel_cols : (p + 1) / a.cs.ratio;
    return n < a.ld ? n : a.ld;
}

/* att_ncand rounded up to a tensor-core tile of candidates (ATT_TC_CAND, 64), at most a.ld: the
 * candidates the tensor-core pv reads (the score blocks that hold them are never skipped, see
 * att_scores_tc, so every S entry below it is written). */
#define ATT_NCAND_TILE 64
__device__ __forceinline__ int64_t att_ncand_tile(const att_args &a, int t) {
    const int64_t n = (att_ncand(a, t) + ATT_NCAND_TILE - 1) / ATT_NCAND_TILE * ATT_NCAND_TILE;
    return n < a.ld ? n : a.ld;
}

/* Sum of v[i] over the warp's lanes for N (32 or 64) values at once: a transposing butterfly — at
 * each step a lane keeps half of its values and trades the other half with its partner, so the
 * whole set costs N-2 (N = 64) or N-1 (N = 32) shuffles instead of 5·N. On return lane L holds the
 * sums of values 2L, 2L+1 in v[0], v[1] (N = 64) or of value L in v[0] (N = 32). */
template <int HALF, int O>
__device__ __forceinline__ void warp_sum_step(float *v, int lane) {
    const bool up = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float send = up ? v[i] : v[i + HALF];
        const float keep = up ? v[i + HALF] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
template <int N>
__device__ __forceinline__ void warp_sum_transpose(float (&v)[N], int lane) {
    warp_sum_step<N / 2, 16>(v, lane);
    warp_sum_step<N / 4, 8>(v, lane);
    warp_sum_step<N / 8, 4>(v, lane);
    warp_sum_step<N / 16, 2>(v, lane);
    warp_sum_step<N / 32, 1>(v, lane);
}

/* kv_ld4 in two halves, for the small-row kernels (RAW / DEC = 1): kv_ld4_raw only loads (a NULL row
 * gives zero words), kv_dec4 decodes with kv_ld4's operations. Why: behind `key ? kv_ld4(..) : 0` the
 * coded formats' decode sits in a branch per key, and the warp waited there for each key's loads in
 * turn (ptxas output for k_att_scores<4, 8, fp8>: 16 load / decode regions one after the other), so
 * decode at fp8_ds_mla took twice as long as with f32 rows (ncu, batch 1: 13.2 vs 6.5 us), whose
 * plain float4 loads are all in flight at once. With the loads first, all are in flight again. Zero
 * words decode to +0.0f in every format (E4M3 code 0 times a zero scale, bf16 0), which is what a
 * missing key contributed before: the products, and so the outputs, are unchanged bit for bit. */
template <int FMT>
__device__ __forceinline__ uint4 kv_ld4_raw(const uint8_t *row, int i4, int nope, int scoff) {
    uint4 r = make_uint4(0u, 0u, 0u, 0u);
    if (FMT == DSV4_KV_F32) {
        if (row) r = ((const uint4 *)row)[i4];
        return r;
    }
    if (FMT == DSV4_KV_BF16) {
        if (row) {
            const uint2 w = ((const uint2 *)row)[i4];
            r.x = w.x;
            r.y = w.y;
        }
        return r;
    }
    const int d = 4 * i4;
    if (!row) return r;
    if (d < nope) {
        r.x = *(const uint32_t *)(row + d);
        r.y = row[scoff + (d >> 6)];
    } else {
        const uint2 w = *(const uint2 *)(row + nope + 2 * (d - nope));
        r.x = w.x;
        r.y = w.y;
    }
    return r;
}
template <int FMT>
__device__ __forceinline__ float4 kv_dec4(uint4 r, int i4, int nope) {
    if (FMT == DSV4_KV_F32)
        return make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z), __uint_as_float(r.w));
    if (FMT == DSV4_KV_FP8_DS_MLA && 4 * i4 < nope) {
        const float s = __uint_as_float(r.y << 23); /* kv_scale */
        return make_float4(kv_e4m3x(r.x) * s, kv_e4m3x(r.x >> 8) * s, kv_e4m3x(r.x >> 16) * s, kv_e4m3x(r.x >> 24) * s);
    }
    return make_float4(kv_bf(r.x & 0xffffu), kv_bf(r.x >> 16), kv_bf(r.y & 0xffffu), kv_bf(r.y >> 16));
}

/* Scores of `chunk` candidates x QH heads of one row. NV = hd/128.
 * The candidates' key pointers are found first (one thread each), then every
 * warp loads its 4 keys at once (loads in flight together), accumulates the
 * QH x 4 dots of its lanes' dims and reduces them over the warp in one
 * transposing butterfly. */
template <int NV, int QH, int FMT, int RAW>
__global__ void __launch_bounds__(ATT_THREADS, 2) k_att_scores(att_args a, int chunk) {
    constexpr int C = 4; /* keys per warp in flight */
    __shared__ float4 qs[QH][NV * 32];
    __shared__ const uint8_t *kp[ATT_CHUNK];
    if (RAW) { /* the small-row launch (att_launch: L.dec) */
        pdl_trigger(); /* lets the PDL-launched k_att_pv start its loads that do not depend on S */
        if (a.cnt && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) /* for the pv blocks' split sums */
            for (int i = threadIdx.x; i < a.ncnt; i += blockDim.x) a.cnt[i] = 0;
    }
    const int tl = blockIdx.z, t = a.t0 + tl, hg0 = blockIdx.y * QH;
    const int nh = a.H - hg0 < QH ? a.H - hg0 : QH;
    const int64_t j0 = (int64_t)blockIdx.x * chunk;
    if (j0 >= att_ncand(a, t)) return; /* no key from here on; k_att_pv reads S below att_ncand only */
    if (threadIdx.x < chunk) kp[threadIdx.x] = j0 + threadIdx.x < a.ld ? cand_key(a, t, j0 + threadIdx.x) : NULL;
    for (int i = threadIdx.x; i < QH * NV * 32; i += blockDim.x) {
        const int h = i / (NV * 32);
        qs[h][i % (NV * 32)] = h < nh ? ((const float4 *)(a.q + ((int64_t)t * a.H + hg0 + h) * a.hd))[i % (NV * 32)]
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *S = a.S + ((int64_t)tl * a.H + hg0) * a.ld;
    for (int jb = warp * C; jb < chunk; jb += 8 * C) {
        float4 k[C][NV];
        if (RAW) { /* every load issued before the first decode (kv_ld4_raw) */
            uint4 kr[C][NV];
#pragma unroll
            for (int c = 0; c < C; c++) {
                const uint8_t *key = kp[jb + c];
#pragma unroll
                for (int v = 0; v < NV; v++) kr[c][v] = kv_ld4_raw<FMT>(key, v * 32 + lane, a.nope, a.scoff);
            }
#pragma unroll
            for (int c = 0; c < C; c++)
#pragma unroll
                for (int v = 0; v < NV; v++) k[c][v] = kv_dec4<FMT>(kr[c][v], v * 32 + lane, a.nope);
        } else {
#pragma unroll
            for (int c = 0; c < C; c++) {
                const uint8_t *key = kp[jb + c];
#pragma unroll
                for (int v = 0; v < NV; v++)
                    k[c][v] = key ? kv_ld4<FMT>(key, v * 32 + lane, a.nope, a.scoff) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        float s[QH * C]; /* [head][key] partial dots of this lane's dims */
#pragma unroll
        for (int h = 0; h < QH; h++) {
#pragma unroll
            for (int c = 0; c < C; c++) s[h * C + c] = 0.f;
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const float4 qv = qs[h][v * 32 + lane];
#pragma unroll
                for (int c = 0; c < C; c++)
                    s[h * C + c] += qv.x * k[c][v].x + qv.y * k[c][v].y + qv.z * k[c][v].z + qv.w * k[c][v].w;
            }
        }
        warp_sum_transpose<QH * C>(s, lane);
        constexpr int R = QH * C / 32; /* sums per lane: values R·lane .. R·lane+R-1 */
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int idx = R * lane + r, h = idx / C, c = idx % C;
            const int64_t j = j0 + jb + c;
            if (h < nh && j < a.ld) S[(int64_t)h * a.ld + j] = kp[jb + c] ? s[r] * a.scale : -INFINITY;
        }
    }
}

/*
 * Softmax (with the sink) and p·v for ATT_PHEADS heads x one 128-dim slice
 * of one row, over candidates [c0, c1) (split-K: the probabilities are
 * already normalised, so partial sums of a row simply add). Candidates go in
 * chunks of ATT_PCHUNK: pointers and probabilities first (all threads), then
 * each warp streams its candidates' slices, 4 loads in flight.
 * out: o itself (one split) or the split's partial buffer.
 */
/*
 * The inverse RoPE of o (§3.4.8) on a float4 of head dims d..d+3 of row t,
 * for k_att_pv<.., DEC = 1> with orope set (the op attention_rope): k_rope's
 * arithmetic (cosf / sinf of pos·freq, sin negated, the same products) on the
 * pairs at or after the head's tail = hd − rope_dim (even, so a pair never
 * straddles two float4s). Measured (H200, gpu_conformance, fused vs
 * DSV4_CUDA_ATT_OROPE=0): not bit-identical to attention + rope — the errors
 * vs the CPU differ in the 3rd digit at ~1e-7 — likely ptxas contracting
 * a*c - b*s differently in the two kernels; far inside the tolerance.
 */
__device__ __forceinline__ float4 att_orope(float4 v, const dsv4_rope &r, int pos, int d, int hd) {
    const int tail = hd - r.rope_dim;
    float o[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
        if (d + j < tail) continue;
        const float ang = (float)pos * r.freq[(d + j - tail) / 2];
        const float c = cosf(ang), s = -sinf(ang), x0 = o[j], x1 = o[j + 1];
        o[j] = x0 * c - x1 * s;
        o[j + 1] = x0 * s + x1 * c;
    }
    return make_float4(o[0], o[1], o[2], o[3]);
}

template <int MINB, int FMT, int DEC>
__global__ void __launch_bounds__(ATT_THREADS, MINB) k_att_pv(att_args a, const void *sinks, int sinks_bf16, int ref,
                                                        int nsplit, float *part, const dsv4_rope orope, int do_rope) {
    __shared__ float mx_s[ATT_PHEADS], den_s[ATT_PHEADS];
    __shared__ __align__(16) float ps[ATT_PHEADS][ATT_PCHUNK];
    __shared__ const uint8_t *kp[ATT_PCHUNK];
    __shared__ float4 red[ATT_THREADS / 32][ATT_PHEADS / 2][32];
    const int tl = blockIdx.z, t = a.t0 + tl, hg0 = blockIdx.y * ATT_PHEADS;
    const int slice = blockIdx.x % (a.hd / 128), split = blockIdx.x / (a.hd / 128);
    const int nh = a.H - hg0 < ATT_PHEADS ? a.H - hg0 : ATT_PHEADS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int nwarps = ATT_THREADS / 32; /* launched with ATT_THREADS threads */
    const float *S = a.S + ((int64_t)tl * a.H + hg0) * a.ld;
    /* this part's candidates, cut at the row's own (att_ncand): parts past it sum nothing and write zeros */
    const int64_t nc = att_ncand(a, t), per = a.per, c0 = split * per;
    const int64_t c1 = c0 + per < nc ? c0 + per : nc > c0 ? nc : c0;
    /* parts holding some of the row's candidates (the rest hold none: c0 >= nc) */
    const int64_t nreal_ = (nc + per - 1) / per;
    const int nreal = nreal_ < 1 ? 1 : nreal_ > nsplit ? nsplit : (int)nreal_;
    /* DEC (small-row launch, PDL after k_att_scores, see att_launch): before waiting for the scores, which
     * only S depends on, find the first chunk's key pointers and load this warp's first two rounds of
     * value slices (the same loads, in the same order, as the loop below would issue). */
    float4 vpre[2][4];
    if (DEC) {
        pdl_trigger();
        const int n0 = (int)(c1 - c0 < ATT_PCHUNK ? c1 - c0 : ATT_PCHUNK);
        for (int i = threadIdx.x; i < ATT_PCHUNK; i += blockDim.x) kp[i] = i < n0 ? cand_key(a, t, c0 + i) : NULL;
        __syncthreads();
        uint4 vr[2][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = warp * 4 + r * nwarps * 4 + u;
                vr[r][u] = kv_ld4_raw<FMT>(j < n0 ? kp[j] : NULL, slice * 32 + lane, a.nope, a.scoff);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int u = 0; u < 4; u++) vpre[r][u] = kv_dec4<FMT>(vr[r][u], slice * 32 + lane, a.nope);
        pdl_wait(); /* S is complete and visible from here */
    }
    /* statistics over every candidate of the row (a part without candidates needs none) */
    for (int h = warp; h < nh && c1 > c0; h += nwarps) {
        const float sink = cu_ldf(sinks, sinks_bf16, hg0 + h);
        float m = sink;
        for (int64_t j = lane; j < nc; j += 32) m = fmaxf(m, S[(int64_t)h * a.ld + j]);
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float d = 0.f;
        for (int64_t j = lane; j < nc; j += 32) d += expf(S[(int64_t)h * a.ld + j] - m);
        for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (lane == 0) {
            mx_s[h] = m;
            den_s[h] = d + expf(sink - m);
        }
    }
    float4 acc[ATT_PHEADS];
#pragma unroll
    for (int h = 0; h < ATT_PHEADS; h++) acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int64_t cb = c0; cb < c1; cb += ATT_PCHUNK) {
        const int n = (int)(c1 - cb < ATT_PCHUNK ? c1 - cb : ATT_PCHUNK);
        const bool pre = DEC && cb == c0; /* pointers and the first two rounds already loaded */
        __syncthreads(); /* statistics ready; previous chunk consumed */
        if (!pre)
            for (int i = threadIdx.x; i < ATT_PCHUNK; i += blockDim.x) kp[i] = i < n ? cand_key(a, t, cb + i) : NULL;
        for (int i = threadIdx.x; i < ATT_PHEADS * ATT_PCHUNK; i += blockDim.x) {
            const int h = i / ATT_PCHUNK, j = i % ATT_PCHUNK;
            float p = 0.f;
            if (h < nh && j < n) {
                p = expf(S[(int64_t)h * a.ld + cb + j] - mx_s[h]) / den_s[h];
                if (ref) p = round_bf16(p); /* official: bf16 probabilities into PV */
            }
            ps[h][j] = p;
        }
        __syncthreads();
        /* candidates past n have p = 0 and v = 0: no tail test, one broadcast float4 of p per head */
        auto pv4 = [&](const float4 (&v)[4], int j) {
#pragma unroll
            for (int h = 0; h < ATT_PHEADS; h++) {
                const float4 p4 = *(const float4 *)&ps[h][j];
                const float pu[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    acc[h].x += pu[u] * v[u].x;
                    acc[h].y += pu[u] * v[u].y;
                    acc[h].z += pu[u] * v[u].z;
                    acc[h].w += pu[u] * v[u].w;
                }
            }
        };
        int j = warp * 4;
        if (pre) {
            if (j < n) pv4(vpre[0], j);
            j += nwarps * 4;
            if (j < n) pv4(vpre[1], j);
            j += nwarps * 4;
        }
        for (; j < n; j += nwarps * 4) {
            float4 v[4];
            if (DEC) { /* the 4 loads in flight before the first decode (kv_ld4_raw) */
                uint4 vr[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    vr[u] = kv_ld4_raw<FMT>(j + u < n ? kp[j + u] : NULL, slice * 32 + lane, a.nope, a.scoff);
#pragma unroll
                for (int u = 0; u < 4; u++) v[u] = kv_dec4<FMT>(vr[u], slice * 32 + lane, a.nope);
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint8_t *key = j + u < n ? kp[j + u] : NULL;
                    v[u] = key ? kv_ld4<FMT>(key, slice * 32 + lane, a.nope, a.scoff) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
            pv4(v, j);
        }
    }
    float *out = nsplit > 1 ? part + (int64_t)split * gridDim.z * a.H * a.hd : a.o + (int64_t)a.t0 * a.H * a.hd;
    /* DEC: a part past the row's candidates writes nothing (the last block sums parts < nreal only, the
     * same floats: the others were zeros); k_att_reduce (DEC 0) sums all nsplit, so there they write zeros */
    const bool skip_out = DEC && nsplit > 1 && split >= nreal;
    for (int half = 0; half < 2 && !skip_out; half++) {
        __syncthreads();
#pragma unroll
        for (int h = 0; h < ATT_PHEADS / 2; h++) red[warp][h][lane] = acc[half * (ATT_PHEADS / 2) + h];
        __syncthreads();
        for (int i = threadIdx.x; i < (ATT_PHEADS / 2) * 32; i += blockDim.x) {
            const int h = i / 32, l = i % 32, hh = half * (ATT_PHEADS / 2) + h;
            if (hh >= nh) continue;
            float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int w = 0; w < nwarps; w++) {
                const float4 r = red[w][h][l];
                s.x += r.x;
                s.y += r.y;
                s.z += r.z;
                s.w += r.w;
            }
            if (DEC && do_rope && nsplit == 1) s = att_orope(s, orope, a.pos[t], slice * 128 + 4 * l, a.hd);
            ((float4 *)(out + ((int64_t)tl * a.H + hg0 + hh) * a.hd + slice * 128))[l] = s;
        }
    }
    /* DEC with splits: the last of a (row, head group, slice)'s split blocks to finish sums the parts, in
     * split order from part 0, as k_att_reduce does (same floats, same order: bit-identical), so the
     * third launch goes. The counters (one per group, in this call's workspace, so no other stream or
     * context shares them) were zeroed by k_att_scores, which completed before pdl_wait returned. */
    if (DEC && nsplit > 1) {
        __shared__ int last_s;
        __threadfence(); /* this block's part is visible before its arrival is counted */
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned id = ((unsigned)tl * gridDim.y + blockIdx.y) * (unsigned)(a.hd / 128) + slice;
            last_s = atomicAdd(a.cnt + id, 1u) == (unsigned)nsplit - 1;
        }
        __syncthreads();
        if (!last_s) return;
        __threadfence();
        const int64_t pstride = (int64_t)gridDim.z * a.H * a.hd;
        float *o = a.o + (int64_t)a.t0 * a.H * a.hd;
        for (int i = threadIdx.x; i < nh * 32; i += blockDim.x) {
            const int64_t off = ((int64_t)tl * a.H + hg0 + i / 32) * a.hd + slice * 128 + (i % 32) * 4;
            float4 s = __ldcg((const float4 *)(part + off));
            for (int k = 1; k < nreal; k++) {
                const float4 r = __ldcg((const float4 *)(part + k * pstride + off));
                s.x += r.x;
                s.y += r.y;
                s.z += r.z;
                s.w += r.w;
            }
            if (do_rope) s = att_orope(s, orope, a.pos[t], slice * 128 + (i % 32) * 4, a.hd);
            *(float4 *)(o + off) = s;
        }
    }
}

/* ---------------------------------------------------------------------------
 * Many rows (prefill chunks): tensor cores. Per row the scores are a
 * [heads x hd]·[hd x candidates] product and PV a [heads x candidates]·
 * [candidates x hd] one, with M = 64 heads — the shape of an mma.sync tile
 * set. fp32 operands are split into bf16 hi + lo parts and the products
 * summed as lo·hi + hi·lo + hi·hi with fp32 accumulation (the lo·lo term,
 * ~2^-16 of the product, is dropped), which is fp32-grade (relative error
 * ~1e-5 per dot) at a fraction of the SIMT cost. In reference numerics the
 * probabilities are bf16 values already (rounded before PV, as the
 * reference), so PV needs only p·v_hi + p·v_lo. The score / statistics /
 * probability pipeline is the fp32 kernels' (same S scratch, same max and
 * denominator, same bf16 rounding); only the dot products change
 * summation order, so the outputs agree with the reference to ~1e-5.
 * Fragment layouts: PTX ISA, mma.m16n8k16 (.bf16): A rows g / g+8, k pairs
 * 2c, 2c+8; B k pairs 2c, 2c+8 of column g; C rows g / g+8, columns 2c, 2c+1
 * (g = lane/4, c = lane%4). F32 operands are read straight from global memory
 * (L1 serves the 4 warps of a block, which read the same keys).
 * Coded rows (bf16, fp8_ds_mla) are staged instead: the block's 4 warps all
 * need the same 64 candidates' rows, so decoding them lane by lane from
 * global memory (scattered 2-byte loads, every element decoded 4x) made the
 * coded kernels 2-3x slower than the f32 ones (ncu, 2026-12-01). The block
 * loads a 64-candidate x 128-dim tile of records once, coalesced, decodes
 * each element once into its bf16 bits (the same bits kv_raw* give: coded
 * values are bf16-exact) in shared memory, and the warps take their B
 * fragments with ldmatrix (.trans for P·V, where candidates are the k
 * dimension). Same operands, same MMA order: bit-identical to the direct
 * path, which DSV4_CUDA_ATT_CODED_DIRECT=1 keeps (for measuring and the
 * exactness check of gpu_conformance --att-exact).
 * ------------------------------------------------------------------------- */
#define ATT_TC_THREADS 128   /* 4 warps x 16 heads */
#define ATT_TC_HEADS 64
#define ATT_TC_CAND 64       /* candidates per score block */
#define ATT_TC_MIN_ROWS 64   /* row chunks at least this long take the tensor-core kernels */
#ifndef ATT_TC_STAGE_GROUP
#define ATT_TC_STAGE_GROUP 4 /* 8-dim units a thread loads before decoding them (loads in flight vs registers) */
#endif
#define ATT_TC_KD 128        /* dims of a staged tile of coded rows */
#define ATT_TC_PITCH (ATT_TC_KD + 8) /* tile row pitch in bf16: 272 bytes = 68 words, so the 8 rows of an
                                      * ldmatrix phase (16 bytes each) fall on distinct banks */

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* (x0, x1) as packed bf16 hi and lo parts (x ≈ hi + lo); x0 in the low half. */
__device__ __forceinline__ void split2(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __low2float(h), x1 - __high2float(h));
    hi = *(const uint32_t *)&h;
    lo = *(const uint32_t *)&l;
}

__device__ __forceinline__ float2 ld2(const float *p, int k) {
    return p ? *(const float2 *)(p + k) : make_float2(0.f, 0.f);
}
template <int FMT>
__device__ __forceinline__ float2 kld2(const att_args &a, const uint8_t *p, int k) {
    return p ? kv_ld2<FMT>(p, k, a.nope, a.scoff) : make_float2(0.f, 0.f);
}
template <int FMT>
__device__ __forceinline__ float kld1(const att_args &a, const uint8_t *p, int k) {
    return p ? kv_ld1<FMT>(p, k, a.nope, a.scoff) : 0.f;
}
/* Coded rows (cuda_kvrow.cuh kv_raw*): bf16 bits as stored (exact), 0 for no key. */
template <int FMT>
__device__ __forceinline__ uint32_t kraw1(const att_args &a, const uint8_t *p, int k) {
    return p ? kv_raw1<FMT>(p, k, a.nope, a.scoff) : 0u;
}
template <int FMT>
__device__ __forceinline__ uint32_t kraw2(const att_args &a, const uint8_t *p, int k) {
    return p ? kv_raw2<FMT>(p, k, a.nope, a.scoff) : 0u;
}

/* Four 8x8 b16 matrices from shared memory (lane l gives the address of row l%8 of matrix l/8); .trans
 * hands each lane a column pair instead of a row pair (PTX ISA, ldmatrix). */
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p))
                 : "memory");
}

/* tile[r][0..ATT_TC_KD) = the bf16 bits of dims d0.. of coded row kp[r] (zeros for NULL), for the
 * ATT_TC_CAND rows; every thread of the block calls it. 8-dim units (an fp8_ds_mla unit is all E4M3
 * or all rope: nope is a multiple of 8), 16 threads per row so a row's bytes are read together; all
 * loads first (in flight together), then the decode, which is kv_raw2's operation for operation. */
template <int FMT, int NR = ATT_TC_CAND>
__device__ __forceinline__ void stage_tile(uint16_t (*tile)[ATT_TC_PITCH], const uint8_t *const *kp, int d0,
                                           const att_args &a) {
    constexpr int UPR = ATT_TC_KD / 8, PER = NR * UPR / ATT_TC_THREADS;
#pragma unroll
    for (int u0 = 0; u0 < PER; u0 += ATT_TC_STAGE_GROUP) {
    uint4 w[ATT_TC_STAGE_GROUP];
#pragma unroll
    for (int u = 0; u < ATT_TC_STAGE_GROUP; u++) {
        const int idx = (u0 + u) * ATT_TC_THREADS + threadIdx.x, d = d0 + (idx % UPR) * 8;
        const uint8_t *row = kp[idx / UPR];
        w[u] = make_uint4(0u, 0u, 0u, 0u);
        if (!row) continue;
        if (FMT == DSV4_KV_FP8_DS_MLA && d < a.nope) {
            const uint2 c8 = *(const uint2 *)(row + d);
            w[u] = make_uint4(c8.x, c8.y, row[a.scoff + (d >> 6)], 0u);
        } else {
            const uint8_t *p = FMT == DSV4_KV_BF16 ? row + 2 * d : row + a.nope + 2 * (d - a.nope);
            const uint2 lo = *(const uint2 *)p, hi = *(const uint2 *)(p + 8);
            w[u] = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
    }
#pragma unroll
    for (int u = 0; u < ATT_TC_STAGE_GROUP; u++) {
        const int idx = (u0 + u) * ATT_TC_THREADS + threadIdx.x, dd = (idx % UPR) * 8;
        uint4 o = w[u];
        if (FMT == DSV4_KV_FP8_DS_MLA && d0 + dd < a.nope) {
            const float s = __uint_as_float(w[u].z << 23); /* kv_scale */
            uint32_t h[8];
#pragma unroll
            for (int b = 0; b < 8; b++) h[b] = __float_as_uint(kv_e4m3x((b < 4 ? w[u].x : w[u].y) >> (8 * (b & 3))) * s);
            o = make_uint4((h[0] >> 16) | (h[1] & 0xffff0000u), (h[2] >> 16) | (h[3] & 0xffff0000u),
                           (h[4] >> 16) | (h[5] & 0xffff0000u), (h[6] >> 16) | (h[7] & 0xffff0000u));
        }
        *(uint4 *)&tile[idx / UPR][dd] = o;
    }
    }
}

/* S of NC candidates x 64 heads of one row; warp w: heads 16w.., all candidates (NC/8 n-tiles).
 * STAGED (coded rows only): keys through the shared tile, ATT_TC_KD dims at a time.
 * NC = 128 (staged only; DSV4_CUDA_ATT_SC128=0: 64): a block's A operands (q of its row: 64 heads x hd fp32,
 * 128 KB at hd 512, loaded from L2 and split into bf16 hi / lo at every k step) serve twice the MMAs, so
 * the q traffic and the split work per score halve. Each score is the same MMA chain over k (the same
 * operands in the same order), so S is bit-identical to NC = 64. */
template <int FMT, int STAGED, int NC = ATT_TC_CAND>
__device__ __forceinline__ void att_scores_tc(const att_args &a) {
    constexpr int NT = NC / 8; /* n-tiles */
    __shared__ const uint8_t *kp[NC];
    __shared__ __align__(16) uint16_t kt[STAGED ? NC : 1][ATT_TC_PITCH];
    const int tl = blockIdx.z, t = a.t0 + tl, hb = blockIdx.y * ATT_TC_HEADS;
    const int64_t j0 = (int64_t)blockIdx.x * NC;
    /* blocks past the row's candidates write nothing: k_att_softmax and att_pv_tc read S below
     * att_ncand_tile only, which lies in blocks that start below att_ncand (NC a multiple of 64) */
    if (j0 >= att_ncand(a, t)) return;
    for (int i = threadIdx.x; i < NC; i += ATT_TC_THREADS)
        kp[i] = j0 + i < a.ld ? cand_key(a, t, j0 + i) : NULL;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int h0 = hb + warp * 16 + g, h1 = h0 + 8;
    const float *q0 = h0 < a.H ? a.q + ((int64_t)t * a.H + h0) * a.hd : NULL;
    const float *q1 = h1 < a.H ? a.q + ((int64_t)t * a.H + h1) * a.hd : NULL;
    static_assert(STAGED || NC == 8 * 8, "the direct paths take 64 candidates");
    const uint8_t *kr[8];
#pragma unroll
    for (int i = 0; i < 8; i++) kr[i] = STAGED ? NULL : kp[i * 8 + g];
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int k0 = 0; k0 < a.hd; k0 += 16) {
        const int ka = k0 + 2 * c, kb = ka + 8;
        if constexpr (STAGED) {
            if (k0 % ATT_TC_KD == 0) {
                if (k0) __syncthreads(); /* the previous tile consumed */
                stage_tile<FMT, NC>(kt, kp, k0, a);
                __syncthreads();
            }
        }
        uint32_t ah[4], al[4];
        float2 x = ld2(q0, ka);
        split2(x.x, x.y, ah[0], al[0]);
        x = ld2(q1, ka);
        split2(x.x, x.y, ah[1], al[1]);
        x = ld2(q0, kb);
        split2(x.x, x.y, ah[2], al[2]);
        x = ld2(q1, kb);
        split2(x.x, x.y, ah[3], al[3]);
        if constexpr (STAGED) { /* lane l: row l%8 of n-tile i + l/16, dims k0 + 8·(l/8 % 2): b0, b1 of tiles i, i+1 */
            const int kk = k0 % ATT_TC_KD;
#pragma unroll
            for (int i = 0; i < NT; i += 2) {
                uint32_t r[4];
                ldsm4(r, &kt[(i + (lane >> 4)) * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
                mma_bf16(acc[i], al, r[0], r[1]);
                mma_bf16(acc[i], ah, r[0], r[1]);
                mma_bf16(acc[i + 1], al, r[2], r[3]);
                mma_bf16(acc[i + 1], ah, r[2], r[3]);
            }
        } else if constexpr (FMT != DSV4_KV_F32) { /* coded keys are bf16 values: their lo part is 0, one product fewer */
            uint32_t yb[8][2];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                yb[i][0] = kraw2<FMT>(a, kr[i], ka);
                yb[i][1] = kraw2<FMT>(a, kr[i], kb);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                mma_bf16(acc[i], al, yb[i][0], yb[i][1]);
                mma_bf16(acc[i], ah, yb[i][0], yb[i][1]);
            }
        } else {
            float2 y[8][2];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                y[i][0] = kld2<FMT>(a, kr[i], ka);
                y[i][1] = kld2<FMT>(a, kr[i], kb);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t bh0, bl0, bh1, bl1;
                split2(y[i][0].x, y[i][0].y, bh0, bl0);
                split2(y[i][1].x, y[i][1].y, bh1, bl1);
                mma_bf16(acc[i], al, bh0, bh1);
                mma_bf16(acc[i], ah, bl0, bl1);
                mma_bf16(acc[i], ah, bh0, bh1);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = e < 2 ? h0 : h1, jj = i * 8 + 2 * c + (e & 1);
            const int64_t j = j0 + jj;
            if (h < a.H && j < a.ld)
                a.S[((int64_t)tl * a.H + h) * a.ld + j] = kp[jj] ? acc[i][e] * a.scale : -INFINITY;
        }
}

/*
 * Softmax once per (row, head), in place: S[row][h][j] becomes the probability p = exp(s − max) / den
 * (den with the sink; bf16-rounded in reference numerics) that att_pv_tc<.., PSM = 1> then reads as
 * its A operand. Why: without it each of a row's hd/128 pv blocks (one per 128-dim slice) derived the
 * max and denominator of all 64 heads from S and then computed every probability again, an expf, an
 * IEEE division and a rounding per A element inside the MMA loop, 4x over at hd = 512. ncu (4 layers,
 * 8192-token prefill, bench/results/raw/prof-368a5a5): k_att_pv_tcs 18.4 ms vs 8.7 ms for the scores,
 * which issue twice the MMAs; by instruction count the exp / division work was ~3x the MMA time.
 * The same statistics code (lane-strided max and sum, xor butterflies) and the same expression for p
 * as att_pv_tc<.., 0>, so P and the outputs are bit-identical. One warp per (row, head); 256 threads.
 */
/* pbf (reference numerics only; DSV4_CUDA_ATT_PBF=0 turns it off): p is written as bf16 at the start of the
 * head's row (bf16 slot j of the row's first 2·ld bytes), zero-padded to a multiple of 16 candidates (the
 * caller needs ld >= 16), for att_pv_tc<.., PSM = 2>. The pv rounds p to bf16 for its A operand anyway
 * (reference: p·v_hi only, lo unused), so packing here gives the same A bits from half the bytes and
 * one 32-bit load per candidate pair instead of two float loads and a conversion, in each of the hd/128
 * slice blocks that read the row. */
__global__ void __launch_bounds__(256) k_att_softmax(att_args a, const void *sinks, int sinks_bf16, int ref, int pbf) {
    const int tl = blockIdx.y, lane = threadIdx.x & 31, h = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (h >= a.H) return;
    float *S = a.S + ((int64_t)tl * a.H + h) * a.ld;
    /* the row's candidates (att_ncand) for the statistics, whole tiles of them (att_ncand_tile) for the
     * probabilities att_pv_tc reads; past those S is not written (att_scores_tc) and not read */
    const int64_t t = a.t0 + tl, nc = att_ncand(a, (int)t), ncl = att_ncand_tile(a, (int)t);
    const float sink = cu_ldf(sinks, sinks_bf16, h);
    float m = sink;
    for (int64_t j = lane; j < nc; j += 32) m = fmaxf(m, S[j]);
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float d = 0.f;
    for (int64_t j = lane; j < nc; j += 32) d += expf(S[j] - m);
    for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float den = d + expf(sink - m);
    if (ref && pbf) { /* the bf16 slots overlap floats not yet read in the first 32: read, sync, write */
        uint16_t *P = (uint16_t *)S;
        for (int64_t j0 = 0; j0 < ncl; j0 += 32) {
            const int64_t j = j0 + lane;
            const float p = j < ncl ? expf(S[j] - m) / den : 0.f;
            __syncwarp();
            if (j < ncl) P[j] = __bfloat16_as_ushort(__float2bfloat16_rn(p));
        }
        __syncwarp();
        for (int64_t j = ncl + lane; j < ((ncl + 15) & ~(int64_t)15); j += 32) P[j] = 0;
        return;
    }
    for (int64_t j = lane; j < ncl; j += 32) {
        float p = expf(S[j] - m) / den;
        if (ref) p = round_bf16(p);
        S[j] = p;
    }
}

/* Softmax (with the sink) and P·V of 64 heads x one 128-dim slice of one row, all candidates;
 * warp w: heads 16w.., 16 n-tiles of 8 dims. PSM: S already holds the probabilities (k_att_softmax). */
template <int FMT, int STAGED, int PSM>
__device__ __forceinline__ void att_pv_tc(const att_args &a, const void *sinks, int sinks_bf16, int ref) {
    __shared__ float mx_s[ATT_TC_HEADS], den_s[ATT_TC_HEADS];
    __shared__ const uint8_t *kp[ATT_TC_CAND];
    __shared__ __align__(16) uint16_t vt[STAGED ? ATT_TC_CAND : 1][ATT_TC_PITCH]; /* [candidate][dim of the slice] */
    const int tl = blockIdx.z, t = a.t0 + tl, hb = blockIdx.y * ATT_TC_HEADS, slice = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int nh = a.H - hb < ATT_TC_HEADS ? a.H - hb : ATT_TC_HEADS;
    const float *S = a.S + ((int64_t)tl * a.H + hb) * a.ld;
    /* the row's candidates (att_ncand), and the whole tiles holding them (att_ncand_tile): the tiles
     * past those would add p = 0 times v */
    const int64_t nc = att_ncand(a, t), ncl = att_ncand_tile(a, t);
    /* statistics over every candidate of the row (as k_att_pv) */
    for (int h = warp; h < nh && !PSM; h += ATT_TC_THREADS / 32) {
        const float sink = cu_ldf(sinks, sinks_bf16, hb + h);
        float m = sink;
        for (int64_t j = lane; j < nc; j += 32) m = fmaxf(m, S[(int64_t)h * a.ld + j]);
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float d = 0.f;
        for (int64_t j = lane; j < nc; j += 32) d += expf(S[(int64_t)h * a.ld + j] - m);
        for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if (lane == 0) {
            mx_s[h] = m;
            den_s[h] = d + expf(sink - m);
        }
    }
    const int r0 = warp * 16 + g, r1 = r0 + 8; /* heads of this lane's A rows, relative to hb */
    float acc[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const int dim0 = slice * 128 + g;
    for (int64_t cb = 0; cb < ncl; cb += ATT_TC_CAND) {
        __syncthreads(); /* statistics ready; previous chunk's pointers consumed */
        if (threadIdx.x < ATT_TC_CAND)
            kp[threadIdx.x] = cb + threadIdx.x < a.ld ? cand_key(a, t, cb + threadIdx.x) : NULL;
        __syncthreads();
        if constexpr (STAGED) {
            stage_tile<FMT>(vt, kp, slice * 128, a);
            __syncthreads();
        }
        for (int kk = 0; kk < ATT_TC_CAND; kk += 16) {
            /* A = probabilities: rows r0 / r1, candidates kk+2c(+1), kk+8+2c(+1) */
            float pv[2][4];
#pragma unroll
            for (int rr = 0; rr < 2 && PSM != 2; rr++) {
                const int r = rr ? r1 : r0;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int64_t j = cb + kk + 2 * c + (e & 1) + (e >> 1) * 8;
                    float p = 0.f;
                    if (PSM) {
                        if (r < nh && j < ncl) p = S[(int64_t)r * a.ld + j]; /* k_att_softmax's p */
                    } else if (r < nh && j < ncl) {
                        p = expf(S[(int64_t)r * a.ld + j] - mx_s[r]) / den_s[r];
                        if (ref) p = round_bf16(p); /* official: bf16 probabilities into PV */
                    }
                    pv[rr][e] = p;
                }
            }
            uint32_t ah[4], al[4];
            if constexpr (PSM == 2) { /* bf16 pairs from k_att_softmax (pbf): the same bits as split2's hi of the
                                       * bf16-rounded p; lo is 0 (reference numerics only) */
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int r = u & 1 ? r1 : r0;
                    const int64_t j = cb + kk + 2 * c + (u >> 1) * 8;
                    ah[u] = r < nh && j < ncl ? ((const uint32_t *)(S + (int64_t)r * a.ld))[j >> 1] : 0u;
                    al[u] = 0u;
                }
            } else {
                split2(pv[0][0], pv[0][1], ah[0], al[0]);
                split2(pv[1][0], pv[1][1], ah[1], al[1]);
                split2(pv[0][2], pv[0][3], ah[2], al[2]);
                split2(pv[1][2], pv[1][3], ah[3], al[3]);
            }
            if constexpr (STAGED) { /* lane l: candidates kk + l%8 + 8·(l/8 % 2), dims of n-tile i + l/16, transposed:
                                      * b0, b1 of tiles i, i+1 */
#pragma unroll
                for (int i = 0; i < 16; i += 2) {
                    uint32_t r[4];
                    ldsm4t(r, &vt[kk + (lane & 7) + ((lane >> 3) & 1) * 8][(i + (lane >> 4)) * 8]);
                    if (!ref) mma_bf16(acc[i], al, r[0], r[1]);
                    mma_bf16(acc[i], ah, r[0], r[1]);
                    if (!ref) mma_bf16(acc[i + 1], al, r[2], r[3]);
                    mma_bf16(acc[i + 1], ah, r[2], r[3]);
                }
            } else if constexpr (FMT != DSV4_KV_F32) { /* coded values are bf16 values (lo = 0): stored bits in */
                const uint8_t *v0 = kp[kk + 2 * c], *v1 = kp[kk + 2 * c + 1], *v2 = kp[kk + 8 + 2 * c],
                              *v3 = kp[kk + 9 + 2 * c];
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int dim = dim0 + i * 8;
                    const uint32_t bh0 = kraw1<FMT>(a, v0, dim) | kraw1<FMT>(a, v1, dim) << 16;
                    const uint32_t bh1 = kraw1<FMT>(a, v2, dim) | kraw1<FMT>(a, v3, dim) << 16;
                    if (!ref) mma_bf16(acc[i], al, bh0, bh1);
                    mma_bf16(acc[i], ah, bh0, bh1);
                }
            } else {
                const uint8_t *v0 = kp[kk + 2 * c], *v1 = kp[kk + 2 * c + 1], *v2 = kp[kk + 8 + 2 * c],
                              *v3 = kp[kk + 9 + 2 * c];
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    const int dim = dim0 + i * 8;
                    uint32_t bh0, bl0, bh1, bl1;
                    split2(kld1<FMT>(a, v0, dim), kld1<FMT>(a, v1, dim), bh0, bl0);
                    split2(kld1<FMT>(a, v2, dim), kld1<FMT>(a, v3, dim), bh1, bl1);
                    if (!ref) mma_bf16(acc[i], al, bh0, bh1); /* reference: p is a bf16 value, lo = 0 */
                    mma_bf16(acc[i], ah, bl0, bl1);
                    mma_bf16(acc[i], ah, bh0, bh1);
                }
            }
        }
    }
    float *o = a.o + ((int64_t)t * a.H + hb) * a.hd + slice * 128;
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e < 2 ? r0 : r1;
            if (r < nh) o[(int64_t)r * a.hd + i * 8 + 2 * c + (e & 1)] = acc[i][e];
        }
}

/* The kernels: direct (F32 rows, or coded with DSV4_CUDA_ATT_CODED_DIRECT=1) and staged (coded rows).
 * The staged ones are bounded to ATT_TC_*_MINB blocks / SM (ptxas -v, sm_90: pv 128 registers, scores
 * 109, no spills), which lets 4 blocks share an SM, so one block's tile loads overlap the others' MMAs. */
#define ATT_TC_SC_MINB 4
#define ATT_TC_PV_MINB 4
template <int FMT>
__global__ void __launch_bounds__(ATT_TC_THREADS) k_att_scores_tc(att_args a) {
    att_scores_tc<FMT, 0>(a);
}
/* NC = 128: 3 blocks / SM (at 4, 128 registers, ptxas spilled 92 bytes) */
template <int FMT, int NC>
__global__ void __launch_bounds__(ATT_TC_THREADS, NC == 128 ? 3 : ATT_TC_SC_MINB) k_att_scores_tcs(att_args a) {
    att_scores_tc<FMT, 1, NC>(a);
}
template <int FMT, int PSM>
__global__ void __launch_bounds__(ATT_TC_THREADS) k_att_pv_tc(att_args a, const void *sinks, int sinks_bf16, int ref) {
    att_pv_tc<FMT, 0, PSM>(a, sinks, sinks_bf16, ref);
}
template <int FMT, int PSM>
__global__ void __launch_bounds__(ATT_TC_THREADS, ATT_TC_PV_MINB) k_att_pv_tcs(att_args a, const void *sinks,
                                                                             int sinks_bf16, int ref) {
    att_pv_tc<FMT, 1, PSM>(a, sinks, sinks_bf16, ref);
}

/* o[t0 + i] = Σ_split part[split][i], float4 at a time. */
__global__ void k_att_reduce(const float4 *part, int nsplit, int64_t n4, float4 *o) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 s = part[i];
    for (int k = 1; k < nsplit; k++) {
        const float4 r = part[(int64_t)k * n4 + i];
        s.x += r.x;
        s.y += r.y;
        s.z += r.z;
        s.w += r.w;
    }
    o[i] = s;
}

/* Launch sizes of one attention call (cu_be_attention), passed to the per-format launcher. */
typedef struct att_launch_cfg {
    int T, n_heads, tc, sc_qh, sc_chunk, pv_one_block, nsplit, sbf, ref;
    int direct; /* coded rows: the tensor-core kernels decode from global memory (no staged tile) */
    int dec;    /* small rows: k_att_pv<..., 1> (PDL, early loads, last-block split sum); 0: as before */
    int do_rope; /* dec: k_att_pv<..., 1> applies the inverse RoPE of o (attention_rope) */
    dsv4_rope orope;
    dsv4_cuda_ctx *ctx;
    unsigned *cnt; /* dec with splits: counters for (rows of a chunk) x head groups x slices */
    int64_t hd, maxc, chunk;
    const void *sinks;
    float *part;
    cudaStream_t stream;
    int psm; /* tensor-core path: k_att_softmax between scores and pv (DSV4_CUDA_ATT_PSM=0: off) */
    int sc128; /* staged scores: 128 candidates a block (DSV4_CUDA_ATT_SC128=0: 64) */
    int pbf;   /* with psm, reference numerics: probabilities as bf16 (DSV4_CUDA_ATT_PBF=0: fp32) */
} att_launch_cfg;

/* k_att_scores for head_dim hd (128, 256, 512) and sc_qh heads a block. */
template <int FMT, int RAW>
static void att_scores_launch(const att_args &a, dim3 g1, int sc_qh, int sc_chunk, int64_t hd, cudaStream_t stream) {
    if (sc_qh == ATT_QHEADS) {
        if (hd == 128) k_att_scores<1, ATT_QHEADS, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
        else if (hd == 256) k_att_scores<2, ATT_QHEADS, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
        else k_att_scores<4, ATT_QHEADS, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
    } else {
        if (hd == 128) k_att_scores<1, ATT_QHEADS / 2, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
        else if (hd == 256) k_att_scores<2, ATT_QHEADS / 2, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
        else k_att_scores<4, ATT_QHEADS / 2, FMT, RAW><<<g1, ATT_THREADS, 0, stream>>>(a, sc_chunk);
    }
}

/* The kernels of one call for key rows in record format FMT (cuda_kvrow.cuh). */
template <int FMT>
static int att_launch(att_args a, const att_launch_cfg &L, dsv4_err *err) {
    const int T = L.T, n_heads = L.n_heads, tc = L.tc, sc_qh = L.sc_qh, sc_chunk = L.sc_chunk, nsplit = L.nsplit;
    const int64_t hd = L.hd, maxc = L.maxc, chunk = L.chunk;
    const int pv_one_block = L.pv_one_block, sbf = L.sbf, ref = L.ref;
    float *part = L.part;
    cudaStream_t stream = L.stream;
    const void *sinks = L.sinks;
    const int pbf = L.pbf && ref && a.ld >= 16; /* bf16 probabilities (k_att_softmax pbf, att_pv_tc<.., 2>) */
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const unsigned n = (unsigned)(T - t0 < chunk ? T - t0 : chunk);
        a.t0 = (int)t0;
        if (tc) {
            dim3 gs((unsigned)((maxc + ATT_TC_CAND - 1) / ATT_TC_CAND),
                    (unsigned)((n_heads + ATT_TC_HEADS - 1) / ATT_TC_HEADS), n);
            dim3 gp((unsigned)(hd / 128), (unsigned)((n_heads + ATT_TC_HEADS - 1) / ATT_TC_HEADS), n);
            const dim3 gsm((unsigned)((n_heads + 7) / 8), n);
            if constexpr (FMT != DSV4_KV_F32) {
                if (!L.direct) {
                    /* 128-candidate blocks only where they add no padding over 64-candidate ones: at ld = 192
                     * (ratio-128 layers at 8K) the second block is half empty, and ncu measured 1133 vs 1027 us */
                    if (L.sc128 && (maxc + 127) / 128 * 128 <= (maxc + 63) / 64 * 64) {
                        const dim3 gs2((unsigned)((maxc + 127) / 128), gs.y, gs.z);
                        k_att_scores_tcs<FMT, 128><<<gs2, ATT_TC_THREADS, 0, stream>>>(a);
                    } else k_att_scores_tcs<FMT, ATT_TC_CAND><<<gs, ATT_TC_THREADS, 0, stream>>>(a);
                    CU_LAUNCHED(err, "attention (scores, tensor cores, staged)");
                    if (L.psm) {
                        k_att_softmax<<<gsm, 256, 0, stream>>>(a, sinks, sbf, ref, pbf);
                        CU_LAUNCHED(err, "attention (softmax)");
                        if (pbf) k_att_pv_tcs<FMT, 2><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
                        else k_att_pv_tcs<FMT, 1><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
                    } else k_att_pv_tcs<FMT, 0><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
                    CU_LAUNCHED(err, "attention (pv, tensor cores, staged)");
                    continue;
                }
            }
            k_att_scores_tc<FMT><<<gs, ATT_TC_THREADS, 0, stream>>>(a);
            CU_LAUNCHED(err, "attention (scores, tensor cores)");
            if (L.psm) {
                k_att_softmax<<<gsm, 256, 0, stream>>>(a, sinks, sbf, ref, pbf);
                CU_LAUNCHED(err, "attention (softmax)");
                if (pbf) k_att_pv_tc<FMT, 2><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
                else k_att_pv_tc<FMT, 1><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
            } else k_att_pv_tc<FMT, 0><<<gp, ATT_TC_THREADS, 0, stream>>>(a, sinks, sbf, ref);
            CU_LAUNCHED(err, "attention (pv, tensor cores)");
            continue;
        }
        dim3 g1((unsigned)((maxc + sc_chunk - 1) / sc_chunk), (unsigned)((n_heads + sc_qh - 1) / sc_qh), n);
        const unsigned pv_groups = (unsigned)((n_heads + ATT_PHEADS - 1) / ATT_PHEADS);
        a.cnt = L.dec && nsplit > 1 ? L.cnt : NULL;
        a.ncnt = a.cnt ? (int)(n * pv_groups * (hd / 128)) : 0;
        if (L.dec) att_scores_launch<FMT, 1>(a, g1, sc_qh, sc_chunk, hd, stream);
        else att_scores_launch<FMT, 0>(a, g1, sc_qh, sc_chunk, hd, stream);
        CU_LAUNCHED(err, "attention (scores)");
        dim3 g2((unsigned)(hd / 128 * nsplit), (unsigned)((n_heads + ATT_PHEADS - 1) / ATT_PHEADS), n);
        if (L.dec) {
            const cudaError_t ce =
                cu_launch(L.ctx, k_att_pv<2, FMT, 1>, g2, dim3(ATT_THREADS), 0, a, sinks, sbf, ref, nsplit, part,
                          L.orope, L.do_rope);
            if (ce != cudaSuccess) return cu_err(err, DSV4_EBACKEND, "cuda: attention (pv, small rows): %s",
                                                 cudaGetErrorString(ce));
            continue; /* the split sum is done by each group's last block */
        }
        if (pv_one_block)
            k_att_pv<1, FMT, 0><<<g2, ATT_THREADS, 0, stream>>>(a, sinks, sbf, ref, nsplit, part, L.orope, 0);
        else k_att_pv<2, FMT, 0><<<g2, ATT_THREADS, 0, stream>>>(a, sinks, sbf, ref, nsplit, part, L.orope, 0);
        CU_LAUNCHED(err, "attention (pv)");
        if (nsplit > 1) {
            const int64_t n4 = (int64_t)n * n_heads * hd / 4;
            k_att_reduce<<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(
                (const float4 *)part, nsplit, n4, (float4 *)(a.o + t0 * n_heads * hd));
            CU_LAUNCHED(err, "attention (split sum)");
        }
    }
    return DSV4_OK;
}

/* attention, then (orope non-NULL) the inverse RoPE of o: inside k_att_pv on the small-row path, else rope. */
static int att_run(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                   const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                   const dsv4_batch *b, const dsv4_rope *orope, dsv4_buf *o, dsv4_err *err) {
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
    cu_kvfmt wf, cf;
    if (!rc) rc = cu_kv_fmt_of(&ws->rows, (int64_t)ws->n_slots * ws->cap, hd, "window rows", &wf, err);
    if (!rc) rc = cu_be_check_vec(sinks, n_heads, "attn_sink", err);
    if (!rc && cs && cs->ratio <= 0) rc = cu_err(err, DSV4_EINVAL, "cuda: attention: compressed state ratio %d", cs->ratio);
    if (!rc && cs) rc = cu_be_check_cmp_rows(cs, hd, "compressed rows", err);
    if (!rc && cs) rc = cu_kv_fmt_of(&cs->rows, -1, hd, "compressed rows", &cf, err);
    if (!rc && cs && (cf.t != wf.t || cf.bytes != wf.bytes)) /* one record format for every key (the state's) */
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: attention: window rows (%s) and compressed rows (%s) in "
                    "different formats", dsv4_kv_dtype_name((dsv4_kv_dtype)wf.t), dsv4_kv_dtype_name((dsv4_kv_dtype)cf.t));
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
            if (nvis > cs->max_rows) nvis = cs->max_rows;
            n += sel ? sel->cols : nvis;
        }
        if (n > maxc) maxc = n;
    }
    /* shape-static (graph capture): the widest list any positions could give;
     * rows' own counts are read on the device, the extra candidates are -inf */
    const int64_t ld_s = ws->window + (cs ? (sel ? sel->cols : cs->max_rows) : 0);
    if (be->static_shapes) maxc = ld_s;
    const int32_t *tok, *pos, *slot, *p0, *r0, *r1;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err)) || (rc = cu_be_batch_seg(be, b, &p0, &r0, &r1, err)))
        return rc;
    dsv4_cuda_ctx *ctx = cube(be)->ctx;
    att_args a;
    memset(&a, 0, sizeof a);
    a.q = (const float *)q->data;
    a.kv = (const uint8_t *)kv->data; /* coded stores: replaced by the encoded batch rows below */
    a.ring = (const uint8_t *)ws->rows.data;
    a.rb = wf.bytes;
    a.nope = wf.nope;
    a.scoff = wf.scoff;
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
    /* split-K over candidates when the grid would be small (decode): partial outputs, then a sum */
    const int64_t pv_blocks = (hd / 128) * ((n_heads + ATT_PHEADS - 1) / ATT_PHEADS) * chunk;
    /* The split boundaries follow the widest list the state allows (ld_s), not
     * this batch's: the candidates of a row fall into the same parts whatever
     * the launch width, so shape-static launches (graphs) and position-sized
     * ones sum in the same order (bit-identical); a narrower batch just
     * launches fewer parts. */
    int nsplit = (int)((ATT_TARGET_BLOCKS + pv_blocks - 1) / pv_blocks);
    if (nsplit > (ld_s + ATT_MIN_PER - 1) / ATT_MIN_PER) nsplit = (int)((ld_s + ATT_MIN_PER - 1) / ATT_MIN_PER);
    if (nsplit < 1) nsplit = 1;
    a.per = (ld_s + nsplit - 1) / nsplit;
    if (a.per < 1) a.per = 1;
    nsplit = (int)((maxc + a.per - 1) / a.per);
    if (nsplit < 1) nsplit = 1;
    /* pv compiled for 2 blocks / SM (128 registers, a few spills) or 1 (172 registers, no spills);
     * DSV4_CUDA_ATT_PV_MINB=1 picks the latter (for measuring, bench/results) */
    const char *minb = getenv("DSV4_CUDA_ATT_PV_MINB");
    const int pv_one_block = minb && minb[0] == '1';
    const size_t s_bytes = cu_align((size_t)chunk * n_heads * maxc * sizeof(float));
    const size_t p_bytes = nsplit > 1 ? (size_t)nsplit * chunk * n_heads * hd * sizeof(float) : 0;
    void *ws_p = NULL;
    /* coded stores: the batch's own rows as the store will hold them (the CPU reference encodes and
     * decodes them too), so a result never depends on where chunks fall */
    const size_t k_bytes = wf.t != DSV4_KV_F32 ? cu_align((size_t)T * (size_t)wf.bytes) : 0;
    /* small-row pv split sums (k_att_pv<.., 1>): one arrival counter per (row, head group, slice) */
    const char *dec = getenv("DSV4_CUDA_ATT_DEC");
    const int use_dec = !pv_one_block && !(dec && dec[0] == '0');
    const size_t c_bytes = use_dec && nsplit > 1
                               ? cu_align((size_t)chunk * ((n_heads + ATT_PHEADS - 1) / ATT_PHEADS) * (hd / 128) * 4)
                               : 0;
    if ((rc = cu_workspace(ctx, s_bytes + p_bytes + k_bytes + c_bytes, &ws_p, err))) return rc;
    if (k_bytes) {
        uint8_t *kb = (uint8_t *)ws_p + s_bytes + p_bytes;
        if ((rc = cu_kv_encode_rows(ctx->stream, &wf, (const float *)kv->data, T, kb, err))) return rc;
        a.kv = kb;
    }
    a.S = (float *)ws_p;
    float *part = nsplit > 1 ? (float *)((char *)ws_p + s_bytes) : NULL;
    const int ref = be->numerics == DSV4_NUMERICS_REFERENCE, sbf = sinks->dtype == DSV4_DT_BF16;
    /* score blocks: 16 heads x 64 candidates when the rows fill the GPU, else 8 heads x 32 candidates
     * (decode: 160 blocks instead of 40 at 640 candidates) */
    int sc_qh = ATT_QHEADS, sc_chunk = ATT_CHUNK;
    /* shape-static launches judge by at most 1024 candidates: their maxc is the state's capacity (8,320
     * for a ratio-128 layer at max_len 1M), not the row's, and blocks past a row's candidates return at
     * once, so 16-head blocks left the short rows of a decode graph to 12 busy blocks (ncu: 15 vs 7 us) */
    const int64_t maxc_sc = be->static_shapes && maxc > 1024 ? 1024 : maxc;
    if (chunk * ((maxc_sc + ATT_CHUNK - 1) / ATT_CHUNK) * ((n_heads + ATT_QHEADS - 1) / ATT_QHEADS) < ATT_TARGET_BLOCKS) {
        sc_qh = ATT_QHEADS / 2;
        sc_chunk = ATT_CHUNK / 2;
    }
    /* long row chunks (prefill) on tensor cores; DSV4_CUDA_ATT_TC=0 keeps the fp32 kernels (measuring) */
    const char *tce = getenv("DSV4_CUDA_ATT_TC");
    const int tc = chunk >= ATT_TC_MIN_ROWS && !(tce && tce[0] == '0');
    /* DSV4_CUDA_ATT_CODED_DIRECT=1: coded rows decoded lane by lane from global memory in the tensor-core
     * kernels, as before the staged tiles (bit-identical; for measuring and gpu_conformance --att-exact) */
    const char *dir = getenv("DSV4_CUDA_ATT_CODED_DIRECT");
    /* use_dec (above): DSV4_CUDA_ATT_DEC=0 launches the small-row pv plain with a separate split sum, as
     * before (measuring; the outputs are bit-identical either way) */
    /* orope: fused where every chunk takes the small-row pv (k_att_pv<.., 1>), else a rope launch after */
    const int fuse = orope && !tc && use_dec && orope->rope_dim > 0 && orope->rope_dim % 2 == 0 &&
                     orope->rope_dim <= hd && orope->rope_dim <= 2 * DSV4_ROPE_MAX_PAIRS;
    att_launch_cfg L = {T, n_heads, tc, sc_qh, sc_chunk, pv_one_block, nsplit, sbf, ref, dir && dir[0] == '1',
                        use_dec, fuse, {}, ctx,
                        c_bytes ? (unsigned *)((char *)ws_p + s_bytes + p_bytes + k_bytes) : NULL,
                        hd, maxc, chunk, sinks->data, part, ctx->stream, 1, 1, 1};
    if (fuse) L.orope = *orope;
    /* DSV4_CUDA_ATT_PSM=0: the tensor-core pv derives the statistics and probabilities itself, per
     * 128-dim slice, as before k_att_softmax (measuring; bit-identical either way) */
    const char *psm = getenv("DSV4_CUDA_ATT_PSM");
    if (psm && psm[0] == '0') L.psm = 0;
    /* DSV4_CUDA_ATT_SC128=0: staged score blocks of 64 candidates, as before (measuring; bit-identical) */
    const char *sc128 = getenv("DSV4_CUDA_ATT_SC128");
    if (sc128 && sc128[0] == '0') L.sc128 = 0;
    /* DSV4_CUDA_ATT_PBF=0: k_att_softmax writes fp32 probabilities that the pv rounds, as before (measuring;
     * bit-identical either way) */
    const char *pbfe = getenv("DSV4_CUDA_ATT_PBF");
    if (pbfe && pbfe[0] == '0') L.pbf = 0;
    switch (wf.t) {
    case DSV4_KV_F32: rc = att_launch<DSV4_KV_F32>(a, L, err); break;
    case DSV4_KV_BF16: rc = att_launch<DSV4_KV_BF16>(a, L, err); break;
    default: rc = att_launch<DSV4_KV_FP8_DS_MLA>(a, L, err); break;
    }
    if (!rc && orope && !fuse) rc = cu_be_rope(be, o, (int)hd, orope, b, 1, err);
    return rc;
}

int cu_be_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                    const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                    const dsv4_batch *b, dsv4_buf *o, dsv4_err *err) {
    return att_run(be, q, kv, ws, cs, sel, sinks, n_heads, b, NULL, o, err);
}

/* attention_rope (backend.h): attention, then the inverse RoPE of o in the same pv launch at decode.
 * DSV4_CUDA_ATT_OROPE=0: the two launches (measuring; the outputs are the same). */
int cu_be_attention_rope(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                         const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                         const dsv4_batch *b, const dsv4_rope *rope, dsv4_buf *o, dsv4_err *err) {
    if (!rope) return cu_err(err, DSV4_EINVAL, "cuda: attention_rope: rope is NULL");
    const char *e = getenv("DSV4_CUDA_ATT_OROPE");
    if (e && e[0] == '0') {
        int rc = att_run(be, q, kv, ws, cs, sel, sinks, n_heads, b, NULL, o, err);
        return rc ? rc : cu_be_rope(be, o, (int)kv->cols, rope, b, 1, err);
    }
    return att_run(be, q, kv, ws, cs, sel, sinks, n_heads, b, rope, o, err);
}
