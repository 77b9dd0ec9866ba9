/*
 * cuda_compress.cu — the compressor step (`compress`, spec/MODEL.md §3.4.5,
 * and the indexer's compressor §3.4.6) for the CUDA op table, following the
 * CPU reference (src/backend/cpu/cpu_compress.c) operation for operation.
 *
 * Two kernels per call, in stream order:
 *  1. emit: one block per batch row; rows whose position completes a window
 *     ((p+1) mod ratio == 0) pool the window (per-channel softmax over the
 *     window's slots, fp64 sums as the reference), RMSNorm, RoPE at w·ratio,
 *     then the QAT of reference numerics, and write the row through
 *     DSV4_CMP_ROW (paged or not; an unmapped page is neither read nor written).
 *     Slots at positions < the segment's first position come from the token
 *     ring, the others from this batch's K/Z (+ape).
 *  2. ring: the batch's K and Z+ape into the token ring (a row's channels
 *     spread over up to 16 blocks, so decode is not one block). Only the last `cap`
 *     rows of a segment write (an earlier row's ring slot is overwritten by
 *     a later row of the same chunk in the reference's row order), so blocks
 *     never race on a ring row.
 * Emission reads the ring before the ring kernel writes it, as the reference.
 */
#include "backend/cuda/cuda_kvrow.cuh"

#include <math.h>

#define CMP_THREADS 256
#define CMP_MAX_DIM 1024
#define CMP_CACHE 8 /* pooling slots held in registers (ratio 4 with overlap) */

/* Emitted-row storage checks (shared with the indexer and attention): the rows are F32, BF16 or
 * fp8_ds_mla records of out_dim values (cu_kv_fmt_of). */
int cu_be_check_cmp_rows(const dsv4_cmp_state *cs, int64_t out_dim, const char *what, dsv4_err *err) {
    if (!cs->rows.data) return cu_err(err, DSV4_EINVAL, "cuda: %s: missing rows buffer", what);
    cu_kvfmt f; /* F32, BF16 or fp8_ds_mla records (--kv-cache-dtype, cuda_kvrow.cuh) */
    int rc = cu_kv_fmt_of(&cs->rows, -1, out_dim, what, &f, err);
    if (rc) return rc;
    if (cs->block_table) {
        if (cs->page_rows <= 0 || cs->max_pages <= 0 || cs->rows.rows % cs->page_rows)
            return cu_err(err, DSV4_EINVAL, "cuda: %s: paged state with page_rows %d, max_pages %d, %lld rows",
                          what, cs->page_rows, cs->max_pages, (long long)cs->rows.rows);
    } else if (cs->rows.rows != (int64_t)cs->n_slots * cs->max_rows) {
        return cu_err(err, DSV4_EINVAL, "cuda: %s: %lld rows, expected n_slots*max_rows = %lld", what,
                      (long long)cs->rows.rows, (long long)cs->n_slots * cs->max_rows);
    }
    return DSV4_OK;
}

/* Block-wide sum in fp64 (blockDim.x a multiple of 32); every thread gets it. */
__device__ double block_sum_d(double v, double *part) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i];
    return s;
}

/* (z, k) of channel j in slot sI of window w's pooling set: with overlap, slots [0, m) are the
 * first halves of window w-1 (absent for w = 0: z = -inf, k = 0), [m, 2m) the second halves of
 * window w. Positions >= p0 come from this batch (Z + ape), older ones from the token ring. */
__device__ __forceinline__ void cmp_slot(const dsv4_cmp_state &cs, const float *K, const float *Z, const void *ape,
                                         int ape_bf16, int t, int64_t p, int64_t p0, int slot, int64_t w, int sI, int j,
                                         int64_t cw, float &z, float &k) {
    const int m = cs.ratio, part = cs.overlap ? sI / m : 1, i = cs.overlap ? sI % m : sI;
    const int64_t wb = part == 0 ? w - 1 : w;
    if (wb < 0) {
        z = -INFINITY;
        k = 0.f;
        return;
    }
    const int64_t off = (cs.overlap && part == 1) ? cs.out_dim : 0, pp = wb * m + i;
    if (pp >= p0) {
        const int64_t r = t - (p - pp);
        z = Z[r * cw + off + j] + cu_ldf(ape, ape_bf16, (pp % m) * cw + off + j);
        k = K[r * cw + off + j];
    } else {
        const int64_t r = (int64_t)slot * cs.cap + pp % cs.cap;
        z = ((const float *)cs.score.data)[r * cw + off + j];
        k = ((const float *)cs.kv.data)[r * cw + off + j];
    }
}

/* Window pooling, norm, RoPE, QAT of every window completed by a batch row. */
__global__ void __launch_bounds__(CMP_THREADS) k_cmp_emit(dsv4_cmp_state cs, const float *K, const float *Z,
                                                          const void *ape, int ape_bf16, const void *nw, int nw_bf16,
                                                          float eps, dsv4_rope rope, int qat, const int32_t *pos,
                                                          const int32_t *slots, const int32_t *p0s, cu_kvfmt rf) {
    __shared__ float row[CMP_MAX_DIM];
    __shared__ double part[32];
    const int t = blockIdx.x, m = cs.ratio, D = cs.out_dim;
    const int64_t p = pos[t];
    if ((p + 1) % m) return;
    const int slot = slots[t];
    const int64_t w = p / m, p0 = p0s[t];
    const int64_t dst = cu_cmp_index(cs, slot, w);
    if (dst < 0) return; /* unmapped page: nothing may be written */
    const int64_t cw = (int64_t)D * (cs.overlap ? 2 : 1);
    /* 1. per-channel softmax pooling over the window's slots (§3.4.5 "Pooling"), slots in the
     * reference's order; up to CMP_CACHE slots (ratio 4) are loaded at once into registers
     * (the loads overlap), longer windows (ratio 128) take two passes over memory */
    const int nsl = m * (cs.overlap ? 2 : 1);
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        if (nsl <= CMP_CACHE) {
            float zc[CMP_CACHE], kc[CMP_CACHE], mx = -INFINITY;
#pragma unroll
            for (int sI = 0; sI < CMP_CACHE; sI++) {
                zc[sI] = -INFINITY;
                kc[sI] = 0.f;
                if (sI < nsl) cmp_slot(cs, K, Z, ape, ape_bf16, t, p, p0, slot, w, sI, j, cw, zc[sI], kc[sI]);
            }
#pragma unroll
            for (int sI = 0; sI < CMP_CACHE; sI++) mx = fmaxf(mx, zc[sI]);
            double den = 0, acc = 0;
#pragma unroll
            for (int sI = 0; sI < CMP_CACHE; sI++) {
                if (sI >= nsl || zc[sI] == -INFINITY) continue; /* weight 0 (absent previous window) */
                const double e = exp((double)zc[sI] - mx);
                den += e;
                acc += e * kc[sI];
            }
            row[j] = (float)(acc / den);
            continue;
        }
        float mx = -INFINITY;
        for (int sI = 0; sI < nsl; sI++) {
            float z, k;
            cmp_slot(cs, K, Z, ape, ape_bf16, t, p, p0, slot, w, sI, j, cw, z, k);
            mx = fmaxf(mx, z);
        }
        double den = 0, acc = 0;
        for (int sI = 0; sI < nsl; sI++) {
            float z, k;
            cmp_slot(cs, K, Z, ape, ape_bf16, t, p, p0, slot, w, sI, j, cw, z, k);
            if (z == -INFINITY) continue;
            const double e = exp((double)z - mx);
            den += e;
            acc += e * k;
        }
        row[j] = (float)(acc / den);
    }
    __syncthreads();
    /* 2. RMSNorm (fp64 sum of squares, as the reference) */
    double ss = 0;
    for (int j = threadIdx.x; j < D; j += blockDim.x) ss += (double)row[j] * row[j];
    ss = block_sum_d(ss, part);
    const float r = (float)(1.0 / sqrt(ss / D + eps));
    for (int j = threadIdx.x; j < D; j += blockDim.x) row[j] = __fmul_rn(__fmul_rn(row[j], r), cu_ldf(nw, nw_bf16, j));
    __syncthreads();
    /* 3. RoPE at the window's first position */
    float *rr = row + D - rope.rope_dim;
    for (int i = threadIdx.x; i < rope.rope_dim / 2; i += blockDim.x) {
        const float ang = __fmul_rn((float)(w * m), rope.freq[i]);
        const float c = cosf(ang), s = sinf(ang);
        const float a = rr[2 * i], bb = rr[2 * i + 1];
        rr[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
        rr[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(bb, c));
    }
    __syncthreads();
    /* 4. QAT (reference numerics only; qat = 0 otherwise) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (qat == DSV4_QAT_FP8_NOPE) {
        const int nope = D - rope.rope_dim; /* blocks of 64, a shorter tail only in toy shapes */
        for (int k0 = warp * 64; k0 < nope; k0 += nwarps * 64) {
            const int n = nope - k0 < 64 ? nope - k0 : 64;
            float amax = 0.f;
            for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(row[k0 + i]));
            for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
            for (int i = lane; i < n; i += 32) row[k0 + i] = e4m3_round(row[k0 + i] / s) * s;
        }
    } else if (qat == DSV4_QAT_HADAMARD_FP4) {
        for (int h = 1; h < D; h *= 2) { /* Sylvester butterflies, the reference's order */
            for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
                const int j = (i / h) * 2 * h + i % h;
                const float a = row[j], b = row[j + h];
                row[j] = a + b;
                row[j + h] = a - b;
            }
            __syncthreads();
        }
        const float sc = 1.0f / sqrtf((float)D);
        for (int k0 = warp * 32; k0 < D; k0 += nwarps * 32) {
            const float v = row[k0 + lane] * sc;
            float amax = fabsf(v);
            for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float s = pow2_ceil(fmaxf(amax, 6.0f * 1.1754943508222875e-38f) / 6.0f);
            row[k0 + lane] = e2m1_round(v / s) * s;
        }
    }
    __syncthreads();
    /* 5. into the store in its record format (kvcodec.h; F32 is a copy) */
    kv_encode_row(rf.t, row, (uint8_t *)cs.rows.data + dst * rf.bytes, D, rf.nope, rf.scoff);
}

/* The batch's (K, Z+ape) into the token ring; rows overwritten later in the same segment skip. */
__global__ void k_cmp_ring(dsv4_cmp_state cs, const float *K, const float *Z, const void *ape, int ape_bf16,
                           const int32_t *pos, const int32_t *slots, const int32_t *r1s) {
    const int t = blockIdx.x;
    if (t + cs.cap < r1s[t]) return;
    const int64_t cw = (int64_t)cs.out_dim * (cs.overlap ? 2 : 1), p = pos[t];
    const int64_t r = (int64_t)slots[t] * cs.cap + p % cs.cap;
    float *kd = (float *)cs.kv.data + r * cw, *zd = (float *)cs.score.data + r * cw;
    for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; j < cw; j += (int64_t)gridDim.y * blockDim.x) {
        kd[j] = K[(int64_t)t * cw + j];
        zd[j] = Z[(int64_t)t * cw + j] + cu_ldf(ape, ape_bf16, (p % cs.ratio) * cw + j);
    }
}

int cu_be_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                   const dsv4_tview *ape, const dsv4_tview *norm_w, float eps, const dsv4_rope *rope,
                   dsv4_qat qat, const dsv4_batch *b, dsv4_err *err) {
    if (!cs || !b || !rope || cs->ratio <= 0 || cs->out_dim <= 0 || cs->cap < cs->ratio * (1 + cs->overlap))
        return cu_err(err, DSV4_EINVAL, "cuda: compress: bad state (ratio, out_dim, cap)");
    const int m = cs->ratio, D = cs->out_dim;
    const int64_t cw = (int64_t)D * (cs->overlap ? 2 : 1);
    if (D > CMP_MAX_DIM || rope->rope_dim <= 0 || rope->rope_dim > D || rope->rope_dim % 2)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: compress: out_dim %d (max %d) / rope_dim %d", D, CMP_MAX_DIM,
                      rope->rope_dim);
    if (qat == DSV4_QAT_HADAMARD_FP4 && (D < 32 || (D & (D - 1))))
        return cu_err(err, DSV4_EINVAL, "cuda: compress: Hadamard over out_dim %d (not a power of two >= 32)", D);
    int rc = cu_be_check(K, DSV4_DT_F32, b->n_rows, cw, "compress K", err);
    if (!rc) rc = cu_be_check(Z, DSV4_DT_F32, b->n_rows, cw, "compress Z", err);
    if (!rc) rc = cu_be_check_vec(ape, (int64_t)m * cw, "compressor ape", err);
    if (!rc) rc = cu_be_check_vec(norm_w, D, "compressor norm", err);
    if (!rc && (cs->kv.dtype != DSV4_DT_F32 || cs->score.dtype != DSV4_DT_F32))
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: compress: token ring dtype not F32 (only F32 rings implemented)");
    if (!rc) rc = cu_be_check(&cs->kv, DSV4_DT_F32, (int64_t)cs->n_slots * cs->cap, cw, "compressor kv ring", err);
    if (!rc) rc = cu_be_check(&cs->score, DSV4_DT_F32, (int64_t)cs->n_slots * cs->cap, cw, "compressor score ring", err);
    cu_kvfmt rf;
    if (!rc) rc = cu_be_check_cmp_rows(cs, D, "compressed rows", err);
    if (!rc) rc = cu_kv_fmt_of(&cs->rows, -1, D, "compressed rows", &rf, err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= cs->n_slots || b->pos[t] < 0)
            return cu_err(err, DSV4_EINVAL, "compress: slot %d / position %d of row %d out of range", b->slot[t],
                          b->pos[t], t);
        if ((b->pos[t] + 1) % m == 0) {
            int64_t w = b->pos[t] / m;
            if (w >= cs->max_rows || (cs->block_table && w / cs->page_rows >= cs->max_pages))
                return cu_err(err, DSV4_ERANGE, "compress: position %d beyond the state's %lld rows", b->pos[t],
                              (long long)cs->max_rows);
        }
    }
    if (!b->n_rows) return DSV4_OK;
    const int32_t *tok, *pos, *slot, *p0, *r0, *r1;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err)) || (rc = cu_be_batch_seg(be, b, &p0, &r0, &r1, err)))
        return rc;
    cudaStream_t st = cube(be)->ctx->stream;
    const int q = be->numerics == DSV4_NUMERICS_REFERENCE ? (int)qat : 0;
    const int abf = ape->dtype == DSV4_DT_BF16, nbf = norm_w->dtype == DSV4_DT_BF16;
    k_cmp_emit<<<b->n_rows, CMP_THREADS, 0, st>>>(*cs, (const float *)K->data, (const float *)Z->data, ape->data,
                                                  abf, norm_w->data, nbf, eps, *rope, q, pos, slot, p0, rf);
    CU_LAUNCHED(err, "compress (emit)");
    /* a row's channels over several blocks: one round trip per thread, not cw/128 dependent ones */
    const unsigned ring_y = (unsigned)((cw + 127) / 128 < 16 ? (cw + 127) / 128 : 16);
    k_cmp_ring<<<dim3((unsigned)b->n_rows, ring_y), 128, 0, st>>>(*cs, (const float *)K->data, (const float *)Z->data, ape->data, abf, pos,
                                          slot, r1);
    CU_LAUNCHED(err, "compress (token ring)");
    return DSV4_OK;
}
