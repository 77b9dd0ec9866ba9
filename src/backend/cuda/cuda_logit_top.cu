/*
 * logit_top on the GPU (backend.h; issue 7 "sampling and speculative
 * verification on the GPU"): per logit row the greedy id, and when asked the
 * next most likely ids and the log-softmax of each, so a greedy step reads
 * back 4 bytes per row instead of the row's 129280 floats (517 KB).
 *
 * One block per row. Each pick is a block-wide reduction over the row under
 * the order "larger value first, ties by lower id" restricted to the
 * elements strictly after the previous pick, which is exactly the CPU
 * reference's repeated selection (cpu_logit_top.c) and, for the first pick,
 * the host sampler's argmax (a NaN never wins; a NaN at id 0 is kept). k
 * passes over the row cost k reads of it: k is 1 on the greedy path and at
 * most DSV4_LOGIT_TOP_MAX, over L2-resident rows, for logprobs.
 * The log-sum-exp is summed in double like the reference; only the order of
 * the summation differs (last-bit differences in lp, never in ids).
 */
#include "backend/cuda/cuda_be_internal.cuh"
#include "backend/cuda/cuda_logit_top.h"

#define LT_THREADS 1024

/* (a, ia) before (b, ib): larger value first, ties by lower id; an empty candidate (id < 0) is last. */
__device__ __forceinline__ bool lt_before(float a, int ia, float b, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return false;
    return a > b || (a == b && ia < ib);
}

/* Block-wide best candidate; every thread gets the result. */
__device__ void lt_reduce(float &v, int &i, float *sv, int *si) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, v, o);
        int oi = __shfl_down_sync(0xffffffffu, i, o);
        if (lt_before(ov, oi, v, i)) v = ov, i = oi;
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); /* sv / si may still be read from the previous reduction */
    if (lane == 0) sv[w] = v, si[w] = i;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sv[lane] : 0.f;
        i = lane < nw ? si[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, v, o);
            int oi = __shfl_down_sync(0xffffffffu, i, o);
            if (lt_before(ov, oi, v, i)) v = ov, i = oi;
        }
        if (lane == 0) sv[0] = v, si[0] = i;
    }
    __syncthreads();
    v = sv[0];
    i = si[0];
}

/* Offer element c (value xv) to the running best (bv, bi): only non-NaN values strictly after the previous pick. */
__device__ __forceinline__ void lt_take(float xv, int c, float pv, int pi, float &bv, int &bi) {
    if (isnan(xv) || (pi >= 0 && !lt_before(pv, pi, xv, c))) return;
    if (lt_before(xv, c, bv, bi)) bv = xv, bi = c;
}

/* This thread's best element of the row. The order is total (ties broken by
 * id), so the block's result does not depend on which thread saw what: the
 * row is read as float4 with four loads in flight per thread when it can be
 * (one block per row must stream 517 KB at batch 1 without stalling on each
 * load). */
__device__ __forceinline__ void lt_scan(const float *x, int64_t V, int vec, float pv, int pi, float &bv, int &bi) {
    const int bd = blockDim.x;
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        const int64_t V4 = V >> 2;
        int64_t c = threadIdx.x;
        for (; c + 3 * bd < V4; c += 4 * bd) {
            float4 q[4];
#pragma unroll
            for (int u = 0; u < 4; u++) q[u] = x4[c + u * bd];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int b = (int)((c + u * bd) << 2);
                lt_take(q[u].x, b, pv, pi, bv, bi);
                lt_take(q[u].y, b + 1, pv, pi, bv, bi);
                lt_take(q[u].z, b + 2, pv, pi, bv, bi);
                lt_take(q[u].w, b + 3, pv, pi, bv, bi);
            }
        }
        for (; c < V4; c += bd) {
            const float4 q = x4[c];
            const int b = (int)(c << 2);
            lt_take(q.x, b, pv, pi, bv, bi);
            lt_take(q.y, b + 1, pv, pi, bv, bi);
            lt_take(q.z, b + 2, pv, pi, bv, bi);
            lt_take(q.w, b + 3, pv, pi, bv, bi);
        }
        return;
    }
    for (int64_t c = threadIdx.x; c < V; c += bd) lt_take(x[c], (int)c, pv, pi, bv, bi);
}

__device__ double lt_sum(double s, double *sd) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sd[w] = s;
    __syncthreads();
    if (w == 0) {
        s = lane < nw ? sd[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) sd[0] = s;
    }
    __syncthreads();
    return sd[0];
}

__global__ void __launch_bounds__(LT_THREADS) k_logit_top(const float *X, int64_t V, int k, int32_t *ids, float *lp) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ double sd[32];
    const float *x = X + (int64_t)blockIdx.x * V;
    const int vec = (V & 3) == 0 && ((uintptr_t)X & 15) == 0; /* every row float4-aligned */
    int32_t *oid = ids + (int64_t)blockIdx.x * k;
    float pv = 0.f;
    int pi = -1; /* previous pick (-1: none yet, or a NaN pick: no bound) */
    int first = -1, found = 0;
    for (int j = 0; j < k; j++) {
        float bv = 0.f;
        int bi = -1;
        lt_scan(x, V, vec, pv, pi, bv, bi);
        lt_reduce(bv, bi, sv, si);
        if (j == 0) {
            if (isnan(x[0])) bv = x[0], bi = 0; /* the host scan keeps a NaN at id 0 */
            first = bi;
        }
        if (threadIdx.x == 0) oid[j] = bi;
        if (bi < 0) break; /* no further non-NaN value */
        found = j + 1;
        pv = bv;
        pi = isnan(bv) ? -1 : bi;
    }
    for (int r = found + threadIdx.x; r < k; r += blockDim.x) oid[r] = -1;
    if (!lp) return;
    const float mx = first >= 0 ? x[first] : 0.f;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += exp((double)x[c] - (double)mx);
    const double lse = (double)mx + log(lt_sum(s, sd));
    if (threadIdx.x == 0) /* thread 0 wrote oid: its own writes */
        for (int j = 0; j < k; j++)
            lp[(int64_t)blockIdx.x * k + j] = j < found ? (float)((double)x[oid[j]] - lse) : -INFINITY;
}

int cu_be_logit_top(dsv4_backend *be, const dsv4_buf *x, dsv4_buf *ids, dsv4_buf *lp, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "logit_top x", err);
    if (!rc) rc = cu_be_check(ids, DSV4_DT_I32, x->rows, -1, "logit_top ids", err);
    if (!rc && lp) rc = cu_be_check(lp, DSV4_DT_F32, x->rows, ids->cols, "logit_top lp", err);
    if (rc) return rc;
    const int64_t V = x->cols, k = ids->cols;
    if (k < 1 || k > DSV4_LOGIT_TOP_MAX || k > V || V > INT32_MAX)
        return cu_err(err, DSV4_EINVAL, "cuda: logit_top: %lld ids per row of %lld columns (1..%d, at most the columns)",
                      (long long)k, (long long)V, DSV4_LOGIT_TOP_MAX);
    if (!x->rows) return DSV4_OK;
    k_logit_top<<<(unsigned)x->rows, LT_THREADS, 0, cube(be)->ctx->stream>>>(
        (const float *)x->data, V, (int)k, (int32_t *)ids->data, lp ? (float *)lp->data : NULL);
    CU_LAUNCHED(err, "logit_top");
    return DSV4_OK;
}
