/*
 * cuda_be_ops.cu — the small ops of the CUDA op table: embedding, add,
 * RMSNorm (grouped, F32/BF16/no weight), RoPE, the QAT round-trips, clamped
 * SwiGLU, the hyper-connection mixes (pre / post / head), the window-ring
 * store and the router's tail (spec/MODEL.md §0, §3.1-3.6, §3.4.2-3.4.6).
 *
 * Why plain kernels: these ops move a few rows per step; they follow the
 * CPU reference (src/backend/cpu/) operation for operation so the
 * conformance harness can compare them at ~1e-7 (fusing them into the
 * linears comes later, bench/results/2026-11-30-gpu-ops-h200.md). The ones
 * that read a lot per row (the hyper-connection mixes, the router's top-k)
 * spread a row over many threads so a decode step (one row) still fills the
 * GPU: bench/results/2026-11-30-cuda-small-kernels-h200.md.
 */
#include "backend/cuda/cuda_be_internal.cuh"
#include "backend/cuda/cuda_kvrow.cuh" /* coded window rings */

#include <limits.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>

static unsigned nblk(int64_t n, int t) { return (unsigned)((n + t - 1) / t); }

/* ------------------------------------------------------------------ embed */

__global__ void k_embed(const void *table, int bf16, int64_t d, int n_copies, const int32_t *tok,
                        float *out) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x;
    const int64_t row = tok[t];
    float *o = out + (int64_t)t * d * n_copies;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = cu_ldf(table, bf16, row * d + i);
        for (int c = 0; c < n_copies; c++) o[c * d + i] = v;
    }
}

int cu_be_embed(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                dsv4_buf *out, dsv4_err *err) {
    if (!table || !table->data || table->ndim != 2 ||
        (table->dtype != DSV4_DT_BF16 && table->dtype != DSV4_DT_F32) || n_copies < 1)
        return cu_err(err, DSV4_EINVAL, "cuda: embed: table must be BF16/F32 [V][d]");
    int64_t V = table->shape[0], d = table->shape[1];
    int rc = cu_be_check(out, DSV4_DT_F32, b->n_rows, d * n_copies, "embed out", err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++)
        if (b->token[t] < 0 || b->token[t] >= V)
            return cu_err(err, DSV4_EINVAL, "embed: token id %d at row %d outside vocabulary [0,%lld)",
                          b->token[t], t, (long long)V);
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    if (!b->n_rows) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_embed, dim3(b->n_rows), dim3(256), 0, table->data,
                     (int)(table->dtype == DSV4_DT_BF16), d, n_copies, tok, (float *)out->data),
           err, "embed");
    return DSV4_OK;
}

/* -------------------------------------------------------------- add, swiglu */

__global__ void k_add(const float *a, const float *b, float *y, int64_t n) {
    pdl_trigger();
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

int cu_be_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(a, DSV4_DT_F32, -1, -1, "add a", err);
    if (!rc) rc = cu_be_check(b, DSV4_DT_F32, a->rows, a->cols, "add b", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, a->rows, a->cols, "add y", err);
    if (rc) return rc;
    int64_t n = a->rows * a->cols;
    if (!n) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_add, dim3(nblk(n, 256)), dim3(256), 0, (const float *)a->data,
                     (const float *)b->data, (float *)y->data, n),
           err, "add");
    return DSV4_OK;
}

__global__ void k_swiglu(const float *g, const float *u, float limit, float *h, int64_t n) {
    pdl_trigger();
    pdl_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[i] = cu_swiglu1(g[i], u[i], limit);
}

int cu_be_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit, dsv4_buf *h,
                 dsv4_err *err) {
    int rc = cu_be_check(g, DSV4_DT_F32, -1, -1, "swiglu g", err);
    if (!rc) rc = cu_be_check(u, DSV4_DT_F32, g->rows, g->cols, "swiglu u", err);
    if (!rc) rc = cu_be_check(h, DSV4_DT_F32, g->rows, g->cols, "swiglu h", err);
    if (rc) return rc;
    int64_t n = g->rows * g->cols;
    if (!n) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_swiglu, dim3(nblk(n, 256)), dim3(256), 0, (const float *)g->data,
                     (const float *)u->data, limit, (float *)h->data, n),
           err, "swiglu");
    return DSV4_OK;
}

/* ----------------------------------------------------------------- rmsnorm */

/* Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __syncthreads(); /* part[] may still be read from a previous call */
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i];
    return s;
}

/* One block per group of `group` elements. */
__global__ void k_rmsnorm_g(const float *x, const void *w, int wbf16, int group, float eps, float *y) {
    pdl_trigger();
    pdl_wait();
    const int64_t g0 = (int64_t)blockIdx.x * group;
    float ss = 0.f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += x[g0 + i] * x[g0 + i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) {
        float v = x[g0 + i] * r;
        y[g0 + i] = w ? v * cu_ldf(w, wbf16, i) : v;
    }
}

/* One block of group/4 threads per group (group % 128 == 0, <= 4096): each
 * thread loads its 4 values once (float4) and keeps them for the scaling
 * pass, where k_rmsnorm_g reads x twice. Σx² per thread in element order,
 * then block_sum (the same tree as k_rmsnorm_g above, over other partials). */
__global__ void k_rmsnorm_v4(const float *x, const void *w, int wbf16, int group, float eps, float *y) {
    pdl_trigger();
    pdl_wait();
    const int64_t g0 = (int64_t)blockIdx.x * group;
    const int i = threadIdx.x * 4;
    const float4 v = *(const float4 *)(x + g0 + i);
    float ss = v.x * v.x;
    ss += v.y * v.y;
    ss += v.z * v.z;
    ss += v.w * v.w;
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)group + eps);
    float4 o = make_float4(v.x * r, v.y * r, v.z * r, v.w * r);
    if (w) {
        o.x *= cu_ldf(w, wbf16, i);
        o.y *= cu_ldf(w, wbf16, i + 1);
        o.z *= cu_ldf(w, wbf16, i + 2);
        o.w *= cu_ldf(w, wbf16, i + 3);
    }
    *(float4 *)(y + g0 + i) = o;
}

int cu_be_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group, float eps,
                  dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "rmsnorm x", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, x->rows, x->cols, "rmsnorm y", err);
    if (!rc && (group <= 0 || x->cols % group))
        rc = cu_err(err, DSV4_EINVAL, "cuda: rmsnorm: group %d does not divide %lld", group, (long long)x->cols);
    if (!rc && weight) rc = cu_be_check_vec(weight, group, "rmsnorm weight", err);
    if (rc) return rc;
    int64_t ng = x->rows * (x->cols / group);
    if (!ng) return DSV4_OK;
    const void *w = weight ? weight->data : NULL;
    const int wb = weight && weight->dtype == DSV4_DT_BF16;
    if (group % 128 == 0 && group <= 4096 && !(((uintptr_t)x->data | (uintptr_t)y->data) & 15)) {
        CU_TRY(cu_launch(cube(be)->ctx, k_rmsnorm_v4, dim3((unsigned)ng), dim3(group / 4), 0, (const float *)x->data,
                         w, wb, group, eps, (float *)y->data),
               err, "rmsnorm");
    } else {
        int th = group >= 1024 ? 1024 : group >= 256 ? 256 : 128;
        CU_TRY(cu_launch(cube(be)->ctx, k_rmsnorm_g, dim3((unsigned)ng), dim3(th), 0, (const float *)x->data, w, wb,
                         group, eps, (float *)y->data),
               err, "rmsnorm");
    }
    return DSV4_OK;
}

/* -------------------------------------------------------------------- rope */

/* One block per (row, group of ROPE_HG heads): the block's first rope_dim/2
 * threads compute each pair's cos / sin once (the same cosf / sinf of the
 * same angle as before), then the threads rotate the group's pairs. (One
 * block per (row, head) recomputed the trig per head: 64x at the Flash q.) */
#define ROPE_HG 16
__global__ void k_rope(float *x, int head_dim, int nh, dsv4_rope r, const int32_t *pos, int inverse) {
    pdl_trigger();
    pdl_wait();
    __shared__ float cs[DSV4_ROPE_MAX_PAIRS], sn[DSV4_ROPE_MAX_PAIRS];
    const int t = blockIdx.x, np = r.rope_dim / 2, h0 = blockIdx.y * ROPE_HG;
    const int hg = nh - h0 < ROPE_HG ? nh - h0 : ROPE_HG;
    if (threadIdx.x < np) {
        const float ang = (float)pos[t] * r.freq[threadIdx.x];
        cs[threadIdx.x] = cosf(ang);
        sn[threadIdx.x] = inverse ? -sinf(ang) : sinf(ang);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hg * np; e += blockDim.x) {
        const int h = h0 + e / np, i = e % np;
        float *p = x + ((int64_t)t * nh + h) * head_dim + head_dim - r.rope_dim + 2 * i;
        const float c = cs[i], s = sn[i], a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

int cu_be_rope(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope, const dsv4_batch *b,
               int inverse, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, b->n_rows, -1, "rope x", err);
    if (!rc && (!rope || head_dim <= 0 || x->cols % head_dim || rope->rope_dim > head_dim || rope->rope_dim <= 0 ||
                rope->rope_dim % 2 || rope->rope_dim > 2 * DSV4_ROPE_MAX_PAIRS))
        rc = cu_err(err, DSV4_EINVAL, "cuda: rope: head_dim %d vs cols %lld / rope_dim %d", head_dim,
                    (long long)x->cols, rope ? rope->rope_dim : -1);
    if (rc) return rc;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    int nh = (int)(x->cols / head_dim);
    if (!b->n_rows || !nh) return DSV4_OK;
    const int np = rope->rope_dim / 2, hg = nh < ROPE_HG ? nh : ROPE_HG;
    const int th = hg * np >= 256 ? 256 : (hg * np + 31) / 32 * 32 < 64 ? 64 : (hg * np + 31) / 32 * 32;
    CU_TRY(cu_launch(cube(be)->ctx, k_rope, dim3((unsigned)b->n_rows, (unsigned)((nh + ROPE_HG - 1) / ROPE_HG)),
                     dim3(th), 0, (float *)x->data, head_dim, nh, *rope, pos, inverse),
           err, "rope");
    return DSV4_OK;
}

/* ------------------------------------------------------------ rmsnorm + rope */

/*
 * k_rmsnorm_v4 and k_rope in one kernel: one block of head_dim/4 threads per
 * (row, head), each thread keeping its 4 values in registers through both.
 * The norm is k_rmsnorm_v4's arithmetic (same per-thread partial, same
 * block_sum tree) and the rotation k_rope's (cosf / sinf of pos·freq, the
 * same products), so the output matches the two kernels. The rotated tail
 * starts at an even column, so a pair never straddles two threads.
 */
__global__ void k_rmsnorm_rope(float *x, const void *w, int wbf16, int group, float eps, int nh, dsv4_rope r,
                               const int32_t *pos, int n_quant, int qblock) {
    pdl_trigger();
    pdl_wait();
    const int64_t g0 = (int64_t)blockIdx.x * group;
    const int i = threadIdx.x * 4, t = (int)(blockIdx.x / nh);
    const float4 v = *(const float4 *)(x + g0 + i);
    float ss = v.x * v.x;
    ss += v.y * v.y;
    ss += v.z * v.z;
    ss += v.w * v.w;
    ss = block_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)group + eps);
    float o[4] = {v.x * rs, v.y * rs, v.z * rs, v.w * rs};
    if (w) {
        o[0] *= cu_ldf(w, wbf16, i);
        o[1] *= cu_ldf(w, wbf16, i + 1);
        o[2] *= cu_ldf(w, wbf16, i + 2);
        o[3] *= cu_ldf(w, wbf16, i + 3);
    }
    const int tail = group - r.rope_dim;
#pragma unroll
    for (int j = 0; j < 4; j += 2) {
        if (i + j < tail) continue;
        const float ang = (float)pos[t] * r.freq[(i + j - tail) / 2];
        const float c = cosf(ang), s = sinf(ang), a = o[j], b = o[j + 1];
        o[j] = a * c - b * s;
        o[j + 1] = a * s + b * c;
    }
    /* rmsnorm_rope_qat_fp8: k_qat_fp8 on dims [0, n_quant) in blocks of qblock (the qblock/4 threads of a
     * block are consecutive lanes of one warp; amax is a max, so the lanes' order does not matter) */
    if (n_quant) {
        float amax = fmaxf(fmaxf(fabsf(o[0]), fabsf(o[1])), fmaxf(fabsf(o[2]), fabsf(o[3])));
        for (int m = qblock / 8; m; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        if (i < n_quant) {
            const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
#pragma unroll
            for (int j = 0; j < 4; j++) o[j] = e4m3_round(o[j] / s) * s;
        }
    }
    *(float4 *)(x + g0 + i) = make_float4(o[0], o[1], o[2], o[3]);
}

int cu_be_rmsnorm_rope(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim, float eps,
                       const dsv4_rope *rope, const dsv4_batch *b, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, b->n_rows, -1, "rmsnorm_rope x", err);
    if (rc) return rc;
    const int fused = rope && head_dim % 128 == 0 && head_dim <= 4096 && x->cols % head_dim == 0 &&
                      rope->rope_dim > 0 && rope->rope_dim % 2 == 0 && rope->rope_dim <= head_dim &&
                      rope->rope_dim <= 2 * DSV4_ROPE_MAX_PAIRS && !((uintptr_t)x->data & 15);
    if (!fused) { /* the two ops (they check and report the arguments) */
        if ((rc = cu_be_rmsnorm(be, x, weight, head_dim, eps, x, err))) return rc;
        return cu_be_rope(be, x, head_dim, rope, b, 0, err);
    }
    if (weight && (rc = cu_be_check_vec(weight, head_dim, "rmsnorm_rope weight", err))) return rc;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    const int nh = (int)(x->cols / head_dim);
    const int64_t nb = (int64_t)b->n_rows * nh;
    if (!nb) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_rmsnorm_rope, dim3((unsigned)nb), dim3(head_dim / 4), 0, (float *)x->data,
                     weight ? weight->data : NULL, (int)(weight && weight->dtype == DSV4_DT_BF16), head_dim, eps, nh,
                     *rope, pos, 0, 0),
           err, "rmsnorm_rope");
    return DSV4_OK;
}

/* DSV4_CUDA_FUSE_QAT=0: the QAT fusions below run their ops one after the other (measuring). */
static int fuse_qat_on(void) {
    const char *e = getenv("DSV4_CUDA_FUSE_QAT");
    return !(e && e[0] == '0');
}

/* rmsnorm_rope then qat_fp8 (backend.h): k_rmsnorm_rope's thread holds 4 values of a head, so the FP8
 * round-trip of the KV head's nope dims (§3.4.2.3) happens in its registers — one launch fewer per layer. */
int cu_be_rmsnorm_rope_qat_fp8(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim, float eps,
                               const dsv4_rope *rope, const dsv4_batch *b, int n_quant, int block, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, b->n_rows, -1, "rmsnorm_rope_qat_fp8 x", err);
    if (rc) return rc;
    const int fused = fuse_qat_on() && rope && head_dim % 128 == 0 && head_dim <= 4096 && x->cols % head_dim == 0 &&
                      rope->rope_dim > 0 && rope->rope_dim % 2 == 0 && rope->rope_dim <= head_dim &&
                      rope->rope_dim <= 2 * DSV4_ROPE_MAX_PAIRS && !((uintptr_t)x->data & 15) && n_quant > 0 &&
                      n_quant <= head_dim - rope->rope_dim && (block == 8 || block == 16 || block == 32 ||
                      block == 64 || block == 128) && n_quant % block == 0;
    if (!fused) { /* the ops (they check and report the arguments) */
        if ((rc = cu_be_rmsnorm_rope(be, x, weight, head_dim, eps, rope, b, err))) return rc;
        return cu_be_qat_fp8(be, x, head_dim, n_quant, block, err);
    }
    if (weight && (rc = cu_be_check_vec(weight, head_dim, "rmsnorm_rope_qat_fp8 weight", err))) return rc;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    const int nh = (int)(x->cols / head_dim);
    const int64_t nb = (int64_t)b->n_rows * nh;
    if (!nb) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_rmsnorm_rope, dim3((unsigned)nb), dim3(head_dim / 4), 0, (float *)x->data,
                     weight ? weight->data : NULL, (int)(weight && weight->dtype == DSV4_DT_BF16), head_dim, eps, nh,
                     *rope, pos, n_quant, block),
           err, "rmsnorm_rope_qat_fp8");
    return DSV4_OK;
}

/* -------------------------------------------------------------------- QAT */

/* One warp per block of `block` values: FP8 round-trip with a pow2 scale
 * (one thread per block, the first version, looped over 64 values serially). */
__global__ void k_qat_fp8(float *x, int head_dim, int n_quant, int block, int64_t nblocks) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (i >= nblocks) return; /* whole warps */
    const int per_head = n_quant / block;
    float *p = x + (i / per_head) * head_dim + (i % per_head) * block;
    float amax = 0.f;
    for (int k = lane; k < block; k += 32) amax = fmaxf(amax, fabsf(p[k]));
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
    for (int k = lane; k < block; k += 32) p[k] = e4m3_round(p[k] / s) * s;
}

int cu_be_qat_fp8(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "qat_fp8 x", err);
    if (!rc && (head_dim <= 0 || x->cols % head_dim || block <= 0 || n_quant % block || n_quant > head_dim))
        rc = cu_err(err, DSV4_EINVAL, "cuda: qat_fp8: head_dim %d, n_quant %d, block %d", head_dim, n_quant, block);
    if (rc) return rc;
    int64_t nb = x->rows * (x->cols / head_dim) * (n_quant / block);
    if (!nb) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_qat_fp8, dim3(nblk(nb * 32, 128)), dim3(128), 0, (float *)x->data, head_dim,
                     n_quant, block, nb),
           err, "qat_fp8");
    return DSV4_OK;
}

/* One block of head_dim threads per head: Sylvester Hadamard (same butterfly
 * order and scaling as the CPU reference), then FP4 round-trip per 32 (one warp). */
/* do_rope (rope_qat_hadamard_fp4): the head's last rope_dim values are rotated first, as k_rope
 * (forward) does — the same cosf / sinf of pos·freq and the same products — so the result is the two
 * kernels' (nh heads per row). */
__global__ void k_qat_hadamard_fp4(float *x, int n, int do_rope, int nh, dsv4_rope r, const int32_t *pos) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float v[];
    float *p = x + (int64_t)blockIdx.x * n;
    const int i = threadIdx.x;
    const int tail = n - r.rope_dim;
    if (do_rope && i >= tail) {
        const int k = (i - tail) / 2;
        const float ang = (float)pos[blockIdx.x / nh] * r.freq[k];
        const float c = cosf(ang), s = sinf(ang), a = p[tail + 2 * k], b = p[tail + 2 * k + 1];
        v[i] = ((i - tail) & 1) ? a * s + b * c : a * c - b * s;
    } else {
        v[i] = p[i];
    }
    __syncthreads();
    for (int h = 1; h < n; h *= 2) {
        /* thread i owns the pair (j, j+h) with j = (i / h)·2h + i % h, for i < n/2 */
        float a = 0.f, b = 0.f;
        int j = 0;
        if (i < n / 2) {
            j = (i / h) * 2 * h + i % h;
            a = v[j];
            b = v[j + h];
        }
        __syncthreads();
        if (i < n / 2) {
            v[j] = a + b;
            v[j + h] = a - b;
        }
        __syncthreads();
    }
    const float s = 1.0f / sqrtf((float)n);
    float val = v[i] * s;
    float amax = fabsf(val);
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = pow2_ceil(fmaxf(amax, 6.0f * 1.1754943508222875e-38f) / 6.0f);
    p[i] = e2m1_round(val / sc) * sc;
}

int cu_be_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "qat_hadamard_fp4 x", err);
    if (!rc && (head_dim < 32 || head_dim > 1024 || (head_dim & (head_dim - 1)) || x->cols % head_dim))
        rc = cu_err(err, DSV4_EINVAL, "cuda: qat_hadamard_fp4: head_dim %d not a power of two in [32,1024]",
                    head_dim);
    if (rc) return rc;
    int64_t nh = x->rows * (x->cols / head_dim);
    if (!nh) return DSV4_OK;
    dsv4_rope none;
    memset(&none, 0, sizeof none);
    CU_TRY(cu_launch(cube(be)->ctx, k_qat_hadamard_fp4, dim3((unsigned)nh), dim3(head_dim), head_dim * sizeof(float),
                     (float *)x->data, head_dim, 0, 1, none, (const int32_t *)NULL),
           err, "qat_hadamard_fp4");
    return DSV4_OK;
}

/* rope (forward) then qat_hadamard_fp4 (backend.h) in one launch: the indexer's queries (§3.4.6). */
int cu_be_rope_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                                const dsv4_batch *b, dsv4_err *err) {
    int rc = cu_be_check(x, DSV4_DT_F32, b ? b->n_rows : -1, -1, "rope_qat_hadamard_fp4 x", err);
    if (rc) return rc;
    const int fused = fuse_qat_on() && rope && head_dim >= 32 && head_dim <= 1024 && !(head_dim & (head_dim - 1)) &&
                      x->cols % head_dim == 0 && rope->rope_dim > 0 && rope->rope_dim % 2 == 0 &&
                      rope->rope_dim <= head_dim && rope->rope_dim <= 2 * DSV4_ROPE_MAX_PAIRS;
    if (!fused) {
        if ((rc = cu_be_rope(be, x, head_dim, rope, b, 0, err))) return rc;
        return cu_be_qat_hadamard_fp4(be, x, head_dim, err);
    }
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    const int hpr = (int)(x->cols / head_dim);
    const int64_t nh = x->rows * hpr;
    if (!nh) return DSV4_OK;
    CU_TRY(cu_launch(cube(be)->ctx, k_qat_hadamard_fp4, dim3((unsigned)nh), dim3(head_dim), head_dim * sizeof(float),
                     (float *)x->data, head_dim, 1, hpr, *rope, pos),
           err, "rope_qat_hadamard_fp4");
    return DSV4_OK;
}

/* ------------------------------------------------------- hyper-connections */

/*
 * The mixes m[k] = (fn[k]·x)·(mean(x²)+eps)^-½ (k < nm = n_hc(2+n_hc) = 24
 * for hc_pre, n_hc for hc_head) read fn [nm][n] (1.5 MB at Flash shapes,
 * n = 16384) and each row of X once. Why split-K: one block per row (the
 * first version) ran a decode step's mixes on one SM (224 µs of a 9 ms step,
 * bench/results/2026-11-30-cuda-small-kernels-h200.md). Now:
 *  - k_hc_part_s (T < HC_BIG_T rows): grid (n/128 chunks, T), a thread per
 *    column; each block writes its chunk's nm dot-product partials and its
 *    Σx² (block tree sums);
 *  - k_hc_part_l (T >= HC_BIG_T): grid (n/512 chunks, T/128), a thread per
 *    row summing its chunk in column order, fn's chunk staged in shared
 *    memory once per 128 rows and read as broadcasts (k_hc_part_lp: batched
 *    X loads; k_hc_part_lr: 2 or 4 rows a thread, the default for hc_pre);
 *  - k_hc_fin: per row, the chunk partials summed (fixed order: lane-strided,
 *    then a warp tree), then the sigmoids, Sinkhorn (one thread, the
 *    reference's loop order) and the weighted stream sum, the y columns
 *    spread over several blocks when T is small.
 * fp32 products and sums as the reference, Σx² in double as the reference;
 * the order of the fp32 sums differs from the CPU's (cpu_hc.c sums each dot
 * product left to right) and between the two partial kernels, so a row's
 * mixes can differ in the last bits between a decode step and a prefill.
 */
#define HC_MAXM 24     /* n_hc*(2+n_hc) for n_hc <= 4 (Flash: 4) */
#define HC_S_CH 128    /* k_hc_part_s: columns (= threads) per block */
#define HC_L_ROWS 128  /* k_hc_part_l: rows (= threads) per block */
#define HC_L_CH 512    /* k_hc_part_l: columns per block */
#define HC_L_SUB 256   /* k_hc_part_l: columns of fn staged at a time */
#define HC_L_XT 32     /* k_hc_part_l: columns of X staged at a time */
#define HC_L_XS 36     /* k_hc_part_l: padded row stride of the X tile (16-byte rows, no bank conflicts) */
#define HC_BIG_T 1024  /* rows from which k_hc_part_l is used */
#define HC_FIN_CPL 4   /* k_hc_fin: chunks per lane loaded together */
#define HC_NORM_MIN_T 16 /* rows from which hc_pre_norm fuses the norm (k_hc_fin has one block per row there) */

/* One chunk of TH columns of row t (blockIdx.y) in a block of TH threads, a thread per column:
 * part[t·nch + ch][k] = Σ_col fn[k][col]·x[col] (k < NM) and ssp[t·nch + ch] = Σ x² (double),
 * each summed within warps (xor tree) then over the warps in warp order. fn is loaded before
 * the PDL wait (weights), X after. Shared by k_hc_part_s and k_hc_fused (same sums per chunk). */
/* The previous sub-layer's hc_post, folded into the mixes' launch (hc_post_pre_norm): X is then the
 * streams before that hc_post, and Xo receives its output. */
struct HcPostIn {
    const float *f, *post, *comb; /* [T][d], [T][NH], [T][NH²] */
    float *Xo;                    /* [T][NH·d] */
};

/* hc_post of one output element, stream j at column k of a row (§3.2.4: post_j·f + Σ_i comb[i][j]·x_i),
 * x = the row's streams + k. The one expression of k_hc_post_v and the fused partials (explicit
 * roundings, so both compile to the same operations): same bits. */
template <int NH>
__device__ __forceinline__ float hc_post_elem(const float (&xv)[NH], float fv, const float *C, const float *po, int j) {
    float acc = __fmul_rn(po[j], fv);
#pragma unroll
    for (int i = 0; i < NH; i++) acc = __fmaf_rn(C[i * NH + j], xv[i], acc);
    return acc;
}

template <int NM>
struct HcNH { /* n_hc from the mix count n_hc (2 + n_hc) */
    static constexpr int v = NM == 3 ? 1 : NM == 8 ? 2 : NM == 15 ? 3 : 4;
};

template <int NM, int TH, bool POST = false>
__device__ __forceinline__ void hc_chunk_partials(const float *__restrict__ X, int64_t n, const void *fn, int fbf16,
                                                  int nch, float *part, double *ssp, const HcPostIn &pi = HcPostIn{}) {
    __shared__ float sp[TH / 32][NM];
    __shared__ double sq[TH / 32];
    const int t = blockIdx.y, ch = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t i = (int64_t)ch * TH + threadIdx.x;
    pdl_trigger();
    float acc[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) acc[k] = i < n ? cu_ldf(fn, fbf16, (int64_t)k * n + i) : 0.f; /* weights: before the wait */
    pdl_wait();
    float xi = 0.f;
    if (POST) {
        constexpr int NH = HcNH<NM>::v;
        if (i < n) { /* (n = NH·d < 2^31: 32-bit division) */
            const int d = (int)(n / NH), k = (int)i % d, j = (int)i / d;
            float xv[NH];
#pragma unroll
            for (int q = 0; q < NH; q++) xv[q] = X[(int64_t)t * n + (int64_t)q * d + k];
            xi = hc_post_elem<NH>(xv, pi.f[(int64_t)t * d + k], pi.comb + (int64_t)t * NH * NH,
                                  pi.post + (int64_t)t * NH, j);
            pi.Xo[(int64_t)t * n + i] = xi;
        }
    } else {
        xi = i < n ? X[(int64_t)t * n + i] : 0.f;
    }
    double ss = (double)xi * xi;
#pragma unroll
    for (int k = 0; k < NM; k++) acc[k] *= xi;
#pragma unroll
    for (int k = 0; k < NM; k++)
#pragma unroll
        for (int o = 16; o; o >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], o);
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < NM; k++) sp[w][k] = acc[k];
        sq[w] = ss;
    }
    __syncthreads();
    const int64_t o = (int64_t)t * nch + ch;
    if (threadIdx.x < NM) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < TH / 32; j++) s += sp[j][threadIdx.x];
        part[o * NM + threadIdx.x] = s;
    } else if (threadIdx.x == NM) {
        double s = 0;
#pragma unroll
        for (int j = 0; j < TH / 32; j++) s += sq[j];
        ssp[o] = s;
    }
}

template <int NM>
__global__ void __launch_bounds__(HC_S_CH) k_hc_part_s(const float *__restrict__ X, int64_t n, const void *fn,
                                                      int fbf16, int nch, float *part, double *ssp) {
    hc_chunk_partials<NM, HC_S_CH>(X, n, fn, fbf16, nch, part, ssp);
}

/* n % 4 == 0 and X 16-byte aligned (the caller checks). X is staged through
 * shared memory 32 columns at a time (coalesced loads of whole row segments;
 * each thread then reads its own row's values, conflict-free with the padded
 * stride), fn 256 columns at a time (read as broadcasts).
 * PF = 1 (default; DSV4_CUDA_HC_PF=0 gives PF = 0, the kernel before): each
 * thread's 8 float4 of an X tile are loaded in one unrolled batch into
 * registers, and the next tile's batch is issued before the current tile's
 * FMAs, so its loads are in flight during them. Why: with PF = 0 the tile
 * loop (`e = tid; e < 1024; e += 128`, a load then a shared store) kept one
 * 16-byte load per thread in flight: 20 warps x 512 B = 10 KB a SM, about a
 * third of what HBM latency x bandwidth needs (~34 KB a SM), and ncu put the
 * kernel at ~1/3 of the bandwidth bound (396 us for 512 MiB at 8192 rows).
 * Every thread still sums its own row over the chunk's columns in
 * ascending order with the same expressions: bit-identical partials.
 * PF = 1 runs as k_hc_part_lp, bounded to 4 blocks a SM (128 registers;
 * unbounded, ptxas took 160 for NM = 24, room for 3 blocks a SM where shared
 * memory allows 5); PF = 0 as k_hc_part_l, the kernel before. */
template <int NM, int PF>
__device__ __forceinline__ void hc_part_l(const float *__restrict__ X, int T, int64_t n, const void *fn, int fbf16,
                                          int nch, float *part, double *ssp) {
    __shared__ float4 sf[NM][HC_L_SUB / 4];
    __shared__ __align__(16) float sx[HC_L_ROWS * HC_L_XS];
    const int r0 = blockIdx.y * HC_L_ROWS, tid = threadIdx.x, t = r0 + tid, ch = blockIdx.x;
    const int64_t c0 = (int64_t)ch * HC_L_CH;
    float acc[NM];
#pragma unroll
    for (int k = 0; k < NM; k++) acc[k] = 0.f;
    double ss = 0;
    if (PF) {
        constexpr int QPR = HC_L_XT / 4, PER = HC_L_ROWS * QPR / HC_L_ROWS; /* float4 per tile row, per thread */
        const int cend = (int)(n - c0 < HC_L_CH ? n - c0 : HC_L_CH);      /* columns of this chunk (n % 4 == 0) */
        float4 v[PER];
        auto ld_tile = [&](int x0) { /* X[r0.., c0 + x0 ..] into v, zeros outside */
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int e = u * HC_L_ROWS + tid, rr = e / QPR, q = e % QPR;
                v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (r0 + rr < T && x0 + q * 4 < cend) v[u] = *(const float4 *)(X + (int64_t)(r0 + rr) * n + c0 + x0 + q * 4);
            }
        };
        ld_tile(0);
        for (int x0 = 0; x0 < cend; x0 += HC_L_XT) {
            __syncthreads(); /* the previous X tile (and, at a sub-chunk start, fn) consumed */
            const int sx0 = x0 % HC_L_SUB;
            if (sx0 == 0) {
                const int ncols = cend - x0 < HC_L_SUB ? cend - x0 : HC_L_SUB;
                for (int e = tid; e < NM * HC_L_SUB; e += HC_L_ROWS) {
                    const int k = e / HC_L_SUB, j = e % HC_L_SUB;
                    ((float *)sf)[e] = j < ncols ? cu_ldf(fn, fbf16, (int64_t)k * n + c0 + x0 + j) : 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int e = u * HC_L_ROWS + tid;
                *(float4 *)(sx + (e / QPR) * HC_L_XS + (e % QPR) * 4) = v[u];
            }
            if (x0 + HC_L_XT < cend) ld_tile(x0 + HC_L_XT); /* in flight during this tile's FMAs */
            __syncthreads();
            if (t < T) {
                const int nq = (cend - x0 < HC_L_XT ? cend - x0 : HC_L_XT) / 4;
                for (int q = 0; q < nq; q++) {
                    const float4 x = *(const float4 *)(sx + tid * HC_L_XS + q * 4);
                    ss += (double)x.x * x.x;
                    ss += (double)x.y * x.y;
                    ss += (double)x.z * x.z;
                    ss += (double)x.w * x.w;
#pragma unroll
                    for (int k = 0; k < NM; k++) {
                        const float4 f = sf[k][sx0 / 4 + q];
                        acc[k] += f.x * x.x;
                        acc[k] += f.y * x.y;
                        acc[k] += f.z * x.z;
                        acc[k] += f.w * x.w;
                    }
                }
            }
        }
    }
    for (int s0 = 0; !PF && s0 < HC_L_CH && c0 + s0 < n; s0 += HC_L_SUB) {
        const int64_t cs = c0 + s0;
        const int ncols = (int)(n - cs < HC_L_SUB ? n - cs : HC_L_SUB); /* a multiple of 4 */
        __syncthreads(); /* the previous sub-chunk's readers are done */
        for (int e = tid; e < NM * HC_L_SUB; e += HC_L_ROWS) {
            const int k = e / HC_L_SUB, j = e % HC_L_SUB;
            ((float *)sf)[e] = j < ncols ? cu_ldf(fn, fbf16, (int64_t)k * n + cs + j) : 0.f;
        }
        for (int x0 = 0; x0 < ncols; x0 += HC_L_XT) {
            __syncthreads(); /* fn staged; the previous X tile consumed */
            for (int e = tid; e < HC_L_ROWS * (HC_L_XT / 4); e += HC_L_ROWS) {
                const int rr = e / (HC_L_XT / 4), q = e % (HC_L_XT / 4);
                float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
                if (r0 + rr < T && x0 + q * 4 < ncols) v = *(const float4 *)(X + (int64_t)(r0 + rr) * n + cs + x0 + q * 4);
                *(float4 *)(sx + rr * HC_L_XS + q * 4) = v;
            }
            __syncthreads();
            if (t < T) {
                const int nq = (ncols - x0 < HC_L_XT ? ncols - x0 : HC_L_XT) / 4;
                for (int q = 0; q < nq; q++) {
                    const float4 x = *(const float4 *)(sx + tid * HC_L_XS + q * 4);
                    ss += (double)x.x * x.x;
                    ss += (double)x.y * x.y;
                    ss += (double)x.z * x.z;
                    ss += (double)x.w * x.w;
#pragma unroll
                    for (int k = 0; k < NM; k++) {
                        const float4 f = sf[k][x0 / 4 + q];
                        acc[k] += f.x * x.x;
                        acc[k] += f.y * x.y;
                        acc[k] += f.z * x.z;
                        acc[k] += f.w * x.w;
                    }
                }
            }
        }
    }
    if (t >= T) return;
    const int64_t o = (int64_t)t * nch + ch;
#pragma unroll
    for (int k = 0; k < NM; k++) part[o * NM + k] = acc[k];
    ssp[o] = ss;
}
template <int NM>
__global__ void __launch_bounds__(HC_L_ROWS) k_hc_part_l(const float *__restrict__ X, int T, int64_t n,
                                                        const void *fn, int fbf16, int nch, float *part,
                                                        double *ssp) {
    pdl_trigger();
    pdl_wait();
    hc_part_l<NM, 0>(X, T, n, fn, fbf16, nch, part, ssp);
}
template <int NM>
__global__ void __launch_bounds__(HC_L_ROWS, 4) k_hc_part_lp(const float *__restrict__ X, int T, int64_t n,
                                                            const void *fn, int fbf16, int nch, float *part,
                                                            double *ssp) {
    pdl_trigger();
    pdl_wait();
    hc_part_l<NM, 1>(X, T, n, fn, fbf16, nch, part, ssp);
}

/* k_hc_part_lr: k_hc_part_lp with R = 2 or 4 rows a thread (DSV4_CUDA_HC_ROWS=1 gives k_hc_part_lp, 2 is the
 * default, 4 for measuring). Why: k_hc_part_lp ran at 0.31 of the HBM bound and batching its X loads did
 * not move it (bench/results/2026-12-01-prefill-attn-hc-h200.md); for every 4 columns a thread issued 24
 * shared-memory broadcast reads of fn (LDS.128) for 96 FMAs of one row. With R rows a thread each fn read
 * serves R rows (default R = 2 at nm = 24 only: at hc_head's nm = 4 R = 2 measured slower). The block
 * still has 128 threads; it covers 128·R rows (thread tid: rows tid + 128·i) and
 * stages X tiles of 32/R columns, so a tile is the same 8 float4 a thread (batched, next tile in flight
 * during the FMAs, as PF = 1). Shared memory: fn 24 KB + X 20 KB (R = 2) / 24 KB (R = 4), strides 20 / 12
 * floats keep the 16-byte row reads conflict-free. Every (row, mix) is still summed by one thread over the
 * chunk's columns in ascending order with the same expressions, and Σx² likewise: bit-identical partials. */
template <int NM, int R>
__global__ void __launch_bounds__(HC_L_ROWS, R == 2 ? 3 : 2) k_hc_part_lr(const float *__restrict__ X, int T,
                                                                        int64_t n, const void *fn, int fbf16,
                                                                        int nch, float *part, double *ssp) {
    constexpr int XT = HC_L_XT / R, XS = XT + 4, RB = HC_L_ROWS * R; /* tile columns, padded stride, block rows */
    constexpr int QPR = XT / 4, PER = RB * QPR / HC_L_ROWS;         /* float4 per tile row, per thread (8) */
    __shared__ float4 sf[NM][HC_L_SUB / 4];
    __shared__ __align__(16) float sx[RB * XS];
    pdl_trigger();
    pdl_wait();
    const int r0 = blockIdx.y * RB, tid = threadIdx.x, ch = blockIdx.x;
    const int64_t c0 = (int64_t)ch * HC_L_CH;
    float acc[R][NM];
    double ss[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        ss[i] = 0;
#pragma unroll
        for (int k = 0; k < NM; k++) acc[i][k] = 0.f;
    }
    const int cend = (int)(n - c0 < HC_L_CH ? n - c0 : HC_L_CH); /* columns of this chunk (n % 4 == 0) */
    float4 v[PER];
    auto ld_tile = [&](int x0) { /* X[r0.., c0 + x0 ..] into v, zeros outside */
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int e = u * HC_L_ROWS + tid, rr = e / QPR, q = e % QPR;
            v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r0 + rr < T && x0 + q * 4 < cend) v[u] = *(const float4 *)(X + (int64_t)(r0 + rr) * n + c0 + x0 + q * 4);
        }
    };
    ld_tile(0);
    for (int x0 = 0; x0 < cend; x0 += XT) {
        __syncthreads(); /* the previous X tile (and, at a sub-chunk start, fn) consumed */
        const int sx0 = x0 % HC_L_SUB;
        if (sx0 == 0) {
            const int ncols = cend - x0 < HC_L_SUB ? cend - x0 : HC_L_SUB;
            for (int e = tid; e < NM * HC_L_SUB; e += HC_L_ROWS) {
                const int k = e / HC_L_SUB, j = e % HC_L_SUB;
                ((float *)sf)[e] = j < ncols ? cu_ldf(fn, fbf16, (int64_t)k * n + c0 + x0 + j) : 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int e = u * HC_L_ROWS + tid;
            *(float4 *)(sx + (e / QPR) * XS + (e % QPR) * 4) = v[u];
        }
        if (x0 + XT < cend) ld_tile(x0 + XT); /* in flight during this tile's FMAs */
        __syncthreads();
        const int nq = (cend - x0 < XT ? cend - x0 : XT) / 4;
        for (int q = 0; q < nq; q++) {
            float4 x[R];
#pragma unroll
            for (int i = 0; i < R; i++) {
                x[i] = *(const float4 *)(sx + (tid + i * HC_L_ROWS) * XS + q * 4);
                ss[i] += (double)x[i].x * x[i].x;
                ss[i] += (double)x[i].y * x[i].y;
                ss[i] += (double)x[i].z * x[i].z;
                ss[i] += (double)x[i].w * x[i].w;
            }
#pragma unroll
            for (int k = 0; k < NM; k++) {
                const float4 f = sf[k][sx0 / 4 + q];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    acc[i][k] += f.x * x[i].x;
                    acc[i][k] += f.y * x[i].y;
                    acc[i][k] += f.z * x[i].z;
                    acc[i][k] += f.w * x[i].w;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int t = r0 + tid + i * HC_L_ROWS;
        if (t >= T) break;
        const int64_t o = (int64_t)t * nch + ch;
#pragma unroll
        for (int k = 0; k < NM; k++) part[o * NM + k] = acc[i][k];
        ssp[o] = ss[i];
    }
}

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* hc_pre's post and comb = Sinkhorn(logits) from the scaled mixes m
 * (§3.2.4: row softmax + eps, then column / (row, column) passes), by one
 * warp: lane l < NH² holds c[l] (lanes above mirror lane l % NH²). Each row
 * or column sum gathers its NH values by shuffles and adds them in the
 * reference's index order, so every lane gets the reference's sum and does
 * the reference's one division. (One thread doing all of it took ~25 µs a
 * row: 20 iterations of dependent divisions.) */
template <int NH>
__device__ void hc_post_comb(const float *m, const void *base, int bbf16, float s1, float s2, int iters, float eps,
                             float *po, float *C) {
    const int lane = threadIdx.x & 31, l = lane % (NH * NH), i = l / NH, j = l % NH;
    if (lane < NH) po[lane] = 2.0f * sigm(m[NH + lane] * s1 + cu_ldf(base, bbf16, NH + lane));
    float c = m[2 * NH + l] * s2 + cu_ldf(base, bbf16, 2 * NH + l);
    {
        float mx = -INFINITY, s = 0.f;
#pragma unroll
        for (int q = 0; q < NH; q++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, i * NH + q));
        c = expf(c - mx);
#pragma unroll
        for (int q = 0; q < NH; q++) s += __shfl_sync(0xffffffffu, c, i * NH + q);
        c = c / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        float s = 0.f;
        if (it > 0) {
#pragma unroll
            for (int q = 0; q < NH; q++) s += __shfl_sync(0xffffffffu, c, i * NH + q);
            c /= s + eps;
            s = 0.f;
        }
#pragma unroll
        for (int q = 0; q < NH; q++) s += __shfl_sync(0xffffffffu, c, q * NH + j);
        c /= s + eps;
    }
    if (lane < NH * NH) C[lane] = c;
}

/* Warp 0 of a finishing block: the nm mixes m scaled by (Σx²/n + eps)^-½ (ssum in double, as the
 * reference), then pre[h] = sigmoid(m[h]·scale[0] + base[h]) + eps for h < n_hc (§3.2.4). */
__device__ __forceinline__ void hc_scale_pre(float *m, int nm, double ssum, int64_t n, float eps, int n_hc,
                                             const void *base, int bbf16, const void *scale, int sbf16, float *pre) {
    const float r = (float)(1.0 / sqrt(ssum / (double)n + (double)eps));
    if (threadIdx.x < nm) m[threadIdx.x] *= r;
    __syncwarp();
    if (threadIdx.x < n_hc)
        pre[threadIdx.x] = sigm(m[threadIdx.x] * cu_ldf(scale, sbf16, 0) + cu_ldf(base, bbf16, threadIdx.x)) + eps;
}

/* hc_post_comb for n_hc = 1..4 (callers check), by one warp. */
__device__ __forceinline__ void hc_post_comb_n(int n_hc, const float *m, const void *base, int bbf16, float s1, float s2,
                                               int iters, float eps, float *po, float *C) {
    switch (n_hc) {
    case 1: hc_post_comb<1>(m, base, bbf16, s1, s2, iters, eps, po, C); break;
    case 2: hc_post_comb<2>(m, base, bbf16, s1, s2, iters, eps, po, C); break;
    case 3: hc_post_comb<3>(m, base, bbf16, s1, s2, iters, eps, po, C); break;
    default: hc_post_comb<4>(m, base, bbf16, s1, s2, iters, eps, po, C); break;
    }
}

/*
 * Per row (blockIdx.y): m = Σ_chunks partials · r, then hc_pre's pre / post /
 * Sinkhorn(comb) (post != NULL) or hc_head's pre (post == NULL), then
 * y[i] = Σ_h pre[h]·x[h·d + i] for this block's slice of columns. Block x == 0
 * writes post and comb. 256 threads.
 */
__global__ void __launch_bounds__(256) k_hc_fin(const float *part, const double *ssp, int nch, int nm,
                                               const float *X, int64_t n, int n_hc, const void *base, int bbf16,
                                               const void *scale, int sbf16, int iters, float eps, float *y,
                                               float *post, float *comb, const void *nw, int nwbf16, float neps,
                                               int pf) {
    pdl_trigger();
    pdl_wait();
    __shared__ float m[HC_MAXM + 1], pre[4];
    __shared__ double ssum;
    const int t = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *pp = part + (int64_t)t * nch * nm;
    /* value v (< nm: a mix; nm: Σx²) is summed by warp v % 8 (values w + 8q, q < 4: nm < 32):
     * lane-strided over the chunks in ascending order, then a tree. Each lane loads its chunks of
     * all its values first, HC_FIN_CPL per pass, so the loads are in flight together (the loop
     * value by value, chunk by chunk, was a chain of ~16 dependent loads: ~9 us a call at T = 1). */
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    double sd = 0;
    const int wss = w == nm % 8; /* this warp sums Σx² */
    for (int c0 = 0; c0 < nch; c0 += 32 * HC_FIN_CPL) {
        float lv[4][HC_FIN_CPL];
        double ld[HC_FIN_CPL];
#pragma unroll
        for (int k = 0; k < HC_FIN_CPL; k++) {
            const int c = c0 + lane + 32 * k;
#pragma unroll
            for (int q = 0; q < 4; q++) lv[q][k] = c < nch && w + 8 * q < nm ? pp[(int64_t)c * nm + w + 8 * q] : 0.f;
            ld[k] = c < nch && wss ? ssp[(int64_t)t * nch + c] : 0.0;
        }
#pragma unroll
        for (int k = 0; k < HC_FIN_CPL; k++) {
#pragma unroll
            for (int q = 0; q < 4; q++) s[q] += lv[q][k];
            sd += ld[k];
        }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float v = s[q];
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && w + 8 * q < nm) m[w + 8 * q] = v;
    }
    if (wss) {
        for (int o = 16; o; o >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, o);
        if (lane == 0) ssum = sd;
    }
    __syncthreads();
    if (threadIdx.x < 32) hc_scale_pre(m, nm, ssum, n, eps, n_hc, base, bbf16, scale, sbf16, pre); /* warp 0 */
    __syncthreads();
    const int64_t d = n / n_hc;
    const float *x = X + (int64_t)t * n;
    float ss = 0.f;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    /* pf (DSV4_CUDA_HC_PF != 0): 4 of the thread's columns at a time, their 16 stream loads issued before
     * any of their y stores (the compiler may not move a load of X above a store to y, which could alias
     * it, so the plain loop below has only 4 loads in flight); the same columns per thread in the same
     * order with the same expressions as that loop: bit-identical */
    for (; pf && i + 3 * st < d; i += 4 * st) {
        float xv[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int h = 0; h < 4; h++) xv[u][h] = h < n_hc ? x[h * d + i + u * st] : 0.f;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float acc = 0.f;
#pragma unroll
            for (int h = 0; h < 4; h++)
                if (h < n_hc) acc += pre[h] * xv[u][h];
            y[(int64_t)t * d + i + u * st] = acc;
            ss += acc * acc;
        }
    }
    for (; i < d; i += st) {
        float xv[4]; /* n_hc <= 4 (callers check): the stream loads issued together */
#pragma unroll
        for (int h = 0; h < 4; h++) xv[h] = h < n_hc ? x[h * d + i] : 0.f;
        float acc = 0.f;
#pragma unroll
        for (int h = 0; h < 4; h++)
            if (h < n_hc) acc += pre[h] * xv[h];
        y[(int64_t)t * d + i] = acc;
        ss += acc * acc;
    }
    if (nw) { /* hc_pre_norm (one block per row): y = rmsnorm(y)·nw, each thread rescaling what it wrote */
        ss = block_sum(ss);
        const float r = 1.0f / sqrtf(ss / (float)d + neps);
        int64_t i2 = threadIdx.x;
        for (; pf && i2 + 3 * (int64_t)blockDim.x < d; i2 += 4 * (int64_t)blockDim.x) { /* loads first (pf) */
            float v[4], w[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                v[u] = y[(int64_t)t * d + i2 + u * blockDim.x];
                w[u] = cu_ldf(nw, nwbf16, i2 + u * blockDim.x);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) y[(int64_t)t * d + i2 + u * blockDim.x] = v[u] * r * w[u];
        }
        for (; i2 < d; i2 += blockDim.x) {
            float v = y[(int64_t)t * d + i2] * r;
            y[(int64_t)t * d + i2] = v * cu_ldf(nw, nwbf16, i2);
        }
    }
    if (post && blockIdx.x == 0 && threadIdx.x < 32) { /* warp 0 of the row's first block: post, Sinkhorn */
        float *po = post + (int64_t)t * n_hc, *C = comb + (int64_t)t * n_hc * n_hc;
        const float s1 = cu_ldf(scale, sbf16, 1), s2 = cu_ldf(scale, sbf16, 2);
        hc_post_comb_n(n_hc, m, base, bbf16, s1, s2, iters, eps, po, C);
    }
}

static int vec_bf16(const dsv4_tview *v) { return v->dtype == DSV4_DT_BF16; }

/*
 * Small steps (T < HC_NORM_MIN_T rows, decode / verify) in one launch. Why:
 * the two kernels above plus the separate rmsnorm cost ~12.6 us a hc_pre_norm
 * call at T = 1 on an H200 (two calls a layer: 11 % of a 24-layer batch-1
 * step, bench/results/2026-12-02-decode-l2-prefetch-h200.md section 4) for
 * 1.5 MB of fn and 64 KB of X. Measured since (bench/results/2026-12-02-hc-
 * fused-h200.md): one launch instead of three alone saved ~0.6 us a call —
 * the time is in the finish, a chain of dependent steps in one block, with
 * the 20-iteration Sinkhorn last; running the Sinkhorn in its own warp beside
 * y brought the call to ~10.2 us in the stream (was 12.6; batch-1 step -2 %).
 * Grid (n/HC_F_TH chunks, T), HC_F_TH threads:
 *  1. every block: its chunk's nm mix partials and Σx² (as k_hc_part_s, a
 *     thread per column, warp then cross-warp sums in fixed order);
 *  2. the row's last block to arrive (a counter per row in cnt, reset by
 *     that block, so the next call finds zeros) sums the chunk partials in
 *     chunk order (lane-strided then a warp tree, as k_hc_fin), computes pre,
 *     then y for all d <= (HC_F_TH - 32)·HC_F_COLS columns with the thread's
 *     loads issued together and kept in registers and the fused rmsnorm
 *     (nw != NULL; warp sums added in warp order), while the last warp does
 *     post and the Sinkhorn comb.
 * Which block is last varies, but it reads every partial in the same order:
 * deterministic. The sums' order differs from k_hc_part_s + k_hc_fin (512-
 * not 128-column chunks) and from the CPU's; DSV4_CUDA_HC_FUSED=0 runs the
 * three kernels instead (measuring).
 */
#define HC_F_TH 512   /* k_hc_fused: threads = columns per chunk */
#define HC_F_COLS 9   /* k_hc_fused: y columns per thread (d <= 480·9 = 4320) */
#define HC_F_MAXT CU_HC_CNT /* rows with an arrival counter (16 = HC_NORM_MIN_T) */

template <int NM, bool POST = false>
__global__ void __launch_bounds__(HC_F_TH) k_hc_fused(const float *__restrict__ X, int64_t n, const void *fn,
                                                     int fbf16, int nch, float *part, double *ssp, unsigned *cnt,
                                                     int n_hc, const void *base, int bbf16, const void *scale,
                                                     int sbf16, int iters, float eps, float *y, float *post,
                                                     float *comb, const void *nw, int nwbf16, float neps,
                                                     HcPostIn pi) {
    __shared__ float m[HC_MAXM + 1], pre[4];
    __shared__ double ssum;
    __shared__ int last;
    const int t = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    hc_chunk_partials<NM, HC_F_TH, POST>(X, n, fn, fbf16, nch, part, ssp, pi);
    __threadfence(); /* this block's partials are visible before its arrival is counted */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt + t, 1u) == (unsigned)nch - 1;
        if (last) cnt[t] = 0; /* every block of this row has arrived: ready for the next call */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* value v (< NM: a mix, NM: Σx²) summed by warp v % 16 (NM + 1 <= 32 values, 16 warps) */
    {
        const float *pp = part + (int64_t)t * nch * NM;
        const int v0 = w, v1 = w + HC_F_TH / 32;
        float s0 = 0.f, s1 = 0.f;
        double sd = 0;
        for (int c = lane; c < nch; c += 32) {
            if (v0 < NM) s0 += __ldcg(pp + (int64_t)c * NM + v0);
            if (v1 < NM) s1 += __ldcg(pp + (int64_t)c * NM + v1);
            if (v0 == NM || v1 == NM) sd += __ldcg(ssp + (int64_t)t * nch + c);
        }
        for (int q = 16; q; q >>= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, q);
            s1 += __shfl_xor_sync(0xffffffffu, s1, q);
            sd += __shfl_xor_sync(0xffffffffu, sd, q);
        }
        if (lane == 0) {
            if (v0 < NM) m[v0] = s0;
            if (v1 < NM) m[v1] = s1;
            if (v0 == NM || v1 == NM) ssum = sd;
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) hc_scale_pre(m, NM, ssum, n, eps, n_hc, base, bbf16, scale, sbf16, pre); /* warp 0 */
    __syncthreads();
    /* hc_pre: the last warp does post and the Sinkhorn comb (a chain of ~20 dependent iterations)
     * while the other warps compute y, so the two overlap; their reduction uses barrier 1 over the
     * y threads only. hc_head (post NULL): every warp on y. */
    const int yth = post ? HC_F_TH - 32 : HC_F_TH;
    if ((int)threadIdx.x >= yth) {
        float *po = post + (int64_t)t * n_hc, *C = comb + (int64_t)t * n_hc * n_hc;
        const float s1 = cu_ldf(scale, sbf16, 1), s2 = cu_ldf(scale, sbf16, 2);
        hc_post_comb_n(n_hc, m, base, bbf16, s1, s2, iters, eps, po, C);
        return;
    }
    __shared__ float rs[HC_F_TH / 32];
    const int64_t d = n / n_hc;
    /* POST: the streams this launch's blocks wrote (visible after the fences; read from L2) */
    const float *x = (POST ? pi.Xo : X) + (int64_t)t * n;
    float *yr = y + (int64_t)t * d;
    float xv[HC_F_COLS][4], yv[HC_F_COLS], ss = 0.f;
#pragma unroll
    for (int u = 0; u < HC_F_COLS; u++) {
        const int64_t c = threadIdx.x + (int64_t)u * yth;
#pragma unroll
        for (int h = 0; h < 4; h++) xv[u][h] = c < d && h < n_hc ? (POST ? __ldcg(x + h * d + c) : x[h * d + c]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < HC_F_COLS; u++) {
        float a = 0.f;
#pragma unroll
        for (int h = 0; h < 4; h++)
            if (h < n_hc) a += pre[h] * xv[u][h];
        yv[u] = a;
        ss += a * a;
    }
    if (nw) { /* rmsnorm over the row: warp sums, then the warps' sums in warp order (as block_sum) */
        for (int q = 16; q; q >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, q);
        if (lane == 0) rs[w] = ss;
        asm volatile("bar.sync 1, %0;" ::"r"(yth) : "memory");
        float tot = 0.f;
        for (int j = 0; j < yth / 32; j++) tot += rs[j];
        const float r = 1.0f / sqrtf(tot / (float)d + neps);
#pragma unroll
        for (int u = 0; u < HC_F_COLS; u++) {
            const int64_t c = threadIdx.x + (int64_t)u * yth;
            if (c < d) yv[u] = yv[u] * r * cu_ldf(nw, nwbf16, c);
        }
    }
#pragma unroll
    for (int u = 0; u < HC_F_COLS; u++) {
        const int64_t c = threadIdx.x + (int64_t)u * yth;
        if (c < d) yr[c] = yv[u];
    }
}

/* DSV4_CUDA_HC_FUSED=0: the small steps run k_hc_part_s + k_hc_fin (+ rmsnorm) as before (measuring) */
static int hc_fused_on(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("DSV4_CUDA_HC_FUSED");
        v = !(e && e[0] == '0');
    }
    return v;
}

/* hc_pre of T rows of n columns over n_hc <= 4 streams runs as k_hc_fused (hc_run and
 * hc_pre_norm's choice of path must agree, or a wide model below 16 rows would get the slow
 * one-block-per-row finish). */
static int hc_fused_fits(int64_t T, int64_t n, int n_hc) {
    return T < HC_F_MAXT && hc_fused_on() && n_hc > 0 && n / n_hc <= (HC_F_TH - 32) * HC_F_COLS &&
           n_hc * (2 + n_hc) < 32;
}


template <int NM>
static cudaError_t hc_part(dsv4_cuda_ctx *c, int big, unsigned nch, const float *X, int T, int64_t n, const void *fn,
                           int fbf16, float *part, double *ssp, int pf, int rows) {
    if (big && pf && rows == 4)
        return cu_launch(c, k_hc_part_lr<NM, 4>, dim3(nch, (unsigned)((T + 4 * HC_L_ROWS - 1) / (4 * HC_L_ROWS))),
                         dim3(HC_L_ROWS), 0, X, T, n, fn, fbf16, (int)nch, part, ssp);
    if (big && pf && rows == 2)
        return cu_launch(c, k_hc_part_lr<NM, 2>, dim3(nch, (unsigned)((T + 2 * HC_L_ROWS - 1) / (2 * HC_L_ROWS))),
                         dim3(HC_L_ROWS), 0, X, T, n, fn, fbf16, (int)nch, part, ssp);
    if (big && pf)
        return cu_launch(c, k_hc_part_lp<NM>, dim3(nch, (unsigned)((T + HC_L_ROWS - 1) / HC_L_ROWS)),
                         dim3(HC_L_ROWS), 0, X, T, n, fn, fbf16, (int)nch, part, ssp);
    if (big)
        return cu_launch(c, k_hc_part_l<NM>, dim3(nch, (unsigned)((T + HC_L_ROWS - 1) / HC_L_ROWS)), dim3(HC_L_ROWS),
                         0, X, T, n, fn, fbf16, (int)nch, part, ssp);
    return cu_launch(c, k_hc_part_s<NM>, dim3(nch, (unsigned)T), dim3(HC_S_CH), 0, X, n, fn, fbf16, (int)nch, part,
                     ssp);
}

/* k_hc_fused (hc_pre: post != NULL) for T < HC_F_MAXT rows, d <= (HC_F_TH - 32)·HC_F_COLS (hc_run checks). */
static int hc_run_fused(cu_be *cb, const float *X, int T, int64_t n, int n_hc, int nm, const dsv4_tview *fn,
                        const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps, float *y, float *post,
                        float *comb, const dsv4_tview *norm, float neps, const char *what, dsv4_err *err,
                        const HcPostIn *pi = nullptr) {
    const unsigned nch = (unsigned)((n + HC_F_TH - 1) / HC_F_TH);
    const size_t pb = cu_align((size_t)T * nch * nm * sizeof(float));
    void *ws = NULL;
    int rc = cu_arena_alloc(cb->ctx, pb + (size_t)T * nch * sizeof(double), &ws, err);
    if (rc) return rc;
    float *part = (float *)ws;
    double *ssp = (double *)((char *)ws + pb);
    const int fb = fn->dtype == DSV4_DT_BF16;
    const void *nw = norm ? norm->data : NULL;
    const int nwb = norm && vec_bf16(norm);
    dsv4_cuda_ctx *c = cb->ctx;
    const dim3 g(nch, (unsigned)T), bl(HC_F_TH);
    const HcPostIn pin = pi ? *pi : HcPostIn{};
#define HC_F_LAUNCH(NMV)                                                                                             \
    (pi ? cu_launch(c, k_hc_fused<NMV, true>, g, bl, 0, X, n, fn->data, fb, (int)nch, part, ssp, cb->d_hc_cnt, n_hc, \
                    base->data, vec_bf16(base), scale->data, vec_bf16(scale), iters, eps, y, post, comb, nw, nwb,    \
                    neps, pin)                                                                                       \
        : cu_launch(c, k_hc_fused<NMV>, g, bl, 0, X, n, fn->data, fb, (int)nch, part, ssp, cb->d_hc_cnt, n_hc,       \
                    base->data, vec_bf16(base), scale->data, vec_bf16(scale), iters, eps, y, post, comb, nw, nwb,    \
                    neps, pin))
    cudaError_t e;
    switch (nm) { /* n_hc (2 + n_hc) for n_hc = 1..4 */
    case 3: e = HC_F_LAUNCH(3); break;
    case 8: e = HC_F_LAUNCH(8); break;
    case 15: e = HC_F_LAUNCH(15); break;
    default: e = HC_F_LAUNCH(24); break;
    }
#undef HC_F_LAUNCH
    cu_arena_free(cb->ctx, ws);
    CU_TRY(e, err, what);
    return DSV4_OK;
}

/* The mixes and the finish of hc_pre (post, comb != NULL) or hc_head, for n_hc <= 4. */
static int hc_run(cu_be *cb, const float *X, int T, int64_t n, int n_hc, int nm, const dsv4_tview *fn,
                  const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps, float *y, float *post,
                  float *comb, const dsv4_tview *norm, float neps, const char *what, dsv4_err *err) {
    if (T > 65535) return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: %d rows in one call (max 65535)", what, T);
    /* hc_pre only: hc_head (post NULL, once a step) measured no faster fused (one ncu sample: 7.7 us vs 6.9) */
    if (post && hc_fused_fits(T, n, n_hc))
        return hc_run_fused(cb, X, T, n, n_hc, nm, fn, base, scale, iters, eps, y, post, comb, norm, neps, what, err);
    const int big = T >= HC_BIG_T && n % 4 == 0 && ((uintptr_t)X & 15) == 0;
    const unsigned nch = (unsigned)((n + (big ? HC_L_CH : HC_S_CH) - 1) / (big ? HC_L_CH : HC_S_CH));
    /* partials: T·nch·nm floats, then T·nch doubles (stream-ordered scratch, like moe_route's logits) */
    const size_t pb = cu_align((size_t)T * nch * nm * sizeof(float));
    void *ws = NULL;
    int rc = cu_arena_alloc(cb->ctx, pb + (size_t)T * nch * sizeof(double), &ws, err);
    if (rc) return rc;
    float *part = (float *)ws;
    double *ssp = (double *)((char *)ws + pb);
    const int fb = fn->dtype == DSV4_DT_BF16;
    /* DSV4_CUDA_HC_PF=0: k_hc_part_l and k_hc_fin without the batched / prefetched loads (measuring;
     * bit-identical either way) */
    const char *pfe = getenv("DSV4_CUDA_HC_PF");
    const int pf = !(pfe && pfe[0] == '0');
    /* DSV4_CUDA_HC_ROWS=1|2|4: rows a thread in the large-T partials (k_hc_part_lp / k_hc_part_lr<.., R>).
     * Default: 2 for hc_pre's 24 mixes, 1 otherwise. ncu, 8192 rows (bench/results/2026-12-01-prefill-pv-hc-
     * rows-h200.md): nm 24: R=1 388, R=2 358, R=4 397 us; hc_head's nm 4: R=1 150, R=2 236 us. With
     * DSV4_CUDA_HC_PF=0 the old k_hc_part_l runs whatever this says (bit-identical either way) */
    const char *hre = getenv("DSV4_CUDA_HC_ROWS");
    const int hrows = hre && (hre[0] == '1' || hre[0] == '2' || hre[0] == '4') ? hre[0] - '0' : nm == 24 ? 2 : 1;
    dsv4_cuda_ctx *c = cb->ctx;
    cudaError_t e;
    switch (nm) {
    case 1: e = hc_part<1>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    case 2: e = hc_part<2>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    case 3: e = hc_part<3>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    case 4: e = hc_part<4>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    case 8: e = hc_part<8>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    case 15: e = hc_part<15>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break;
    default: e = hc_part<24>(c, big, nch, X, T, n, fn->data, fb, part, ssp, pf, hrows); break; /* nm = 24 (callers check) */
    }
    if (e == cudaSuccess) {
        const int64_t d = n / n_hc, ycols = (d + 255) / 256;
        int64_t yb = T >= 16 || norm ? 1 : 256 / T; /* the fused norm needs the whole row in one block */
        if (yb > ycols) yb = ycols;
        if (yb < 1) yb = 1;
        e = cu_launch(c, k_hc_fin, dim3((unsigned)yb, (unsigned)T), dim3(256), 0, (const float *)part,
                      (const double *)ssp, (int)nch, nm, X, n, n_hc, base->data, vec_bf16(base), scale->data,
                      vec_bf16(scale), iters, eps, y, post, comb, norm ? norm->data : NULL,
                      (int)(norm && vec_bf16(norm)), neps, pf);
    }
    cu_arena_free(cb->ctx, ws);
    CU_TRY(e, err, what);
    return DSV4_OK;
}

/* hc_pre (norm NULL) and hc_pre_norm: the checks, then hc_run. */
static int hc_pre_impl(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                       const dsv4_tview *scale, int n_hc, int iters, float eps, const dsv4_tview *norm, float neps,
                       dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb, dsv4_err *err) {
    if (n_hc <= 0 || n_hc > 16 || iters < 1)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_pre: n_hc %d / iters %d", n_hc, iters);
    if (n_hc > 4)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: hc_pre: n_hc %d > 4 not implemented", n_hc);
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_pre X", err);
    if (!rc && X->cols % n_hc) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_pre: cols %% n_hc");
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc, nm = n_hc * (2 + n_hc);
    if (!rc) rc = cu_be_check_vec(fn, nm * n, "hc fn", err);
    if (!rc) rc = cu_be_check_vec(base, nm, "hc base", err);
    if (!rc) rc = cu_be_check_vec(scale, 3, "hc scale", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "hc_pre y", err);
    if (!rc) rc = cu_be_check(post, DSV4_DT_F32, T, n_hc, "hc_pre post", err);
    if (!rc) rc = cu_be_check(comb, DSV4_DT_F32, T, n_hc * n_hc, "hc_pre comb", err);
    if (!rc && norm) rc = cu_be_check_vec(norm, d, "hc_pre_norm weight", err);
    if (rc) return rc;
    if (!T || !n) return DSV4_OK;
    return hc_run(cube(be), (const float *)X->data, (int)T, n, n_hc, (int)nm, fn, base, scale, iters, eps,
                  (float *)y->data, (float *)post->data, (float *)comb->data, norm, neps,
                  norm ? "hc_pre_norm" : "hc_pre", err);
}

int cu_be_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                 const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y, dsv4_buf *post,
                 dsv4_buf *comb, dsv4_err *err) {
    return hc_pre_impl(be, X, fn, base, scale, n_hc, iters, eps, NULL, 0.f, y, post, comb, err);
}

int cu_be_hc_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                      const dsv4_tview *scale, int n_hc, int iters, float eps, const dsv4_tview *norm, float norm_eps,
                      dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb, dsv4_err *err) {
    if (!norm) return cu_err(err, DSV4_EINVAL, "cuda: hc_pre_norm: no norm weight");
    /* Below HC_NORM_MIN_T rows the finish spreads a row's y over several blocks (one block
     * walking 4096 columns serially cost ~10 us a call at T = 1, more than the kernel it
     * saves: H200, bench/results/2026-12-01-decode-kernels-h200.md), so the two kernels run. */
    if (X && X->rows < HC_NORM_MIN_T && !hc_fused_fits(X->rows, X->cols, n_hc)) { /* (else k_hc_fused fuses it) */
        int rc = cu_be_hc_pre(be, X, fn, base, scale, n_hc, iters, eps, y, post, comb, err);
        return rc ? rc : cu_be_rmsnorm(be, y, norm, (int)y->cols, norm_eps, y, err);
    }
    return hc_pre_impl(be, X, fn, base, scale, n_hc, iters, eps, norm, norm_eps, y, post, comb, err);
}

__global__ void k_hc_post(const float *X, const float *f, const float *post, const float *comb, int n_hc,
                          int64_t d, int64_t total, float *Xo) {
    pdl_trigger();
    pdl_wait();
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total) return;
    const int64_t t = e / (n_hc * d), r = e % (n_hc * d);
    const int j = (int)(r / d);
    const int64_t k = r % d;
    const float *x = X + t * n_hc * d, *C = comb + t * n_hc * n_hc;
    float acc = post[t * n_hc + j] * f[t * d + k];
    for (int i = 0; i < n_hc; i++) acc += C[i * n_hc + j] * x[i * d + k];
    Xo[e] = acc;
}

/* The same for n_hc = NH <= 4: one thread per (row, column k) reads the NH
 * stream values once and writes all NH outputs (same sums, same order); grid
 * (d/256, T). The element-per-thread kernel above re-read each x NH times and
 * paid 64-bit divisions per element: 0.53 ms a call for 4096 rows. */
template <int NH>
__global__ void k_hc_post_v(const float *X, const float *f, const float *post, const float *comb, int64_t d,
                            float *Xo) {
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.y, k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= d) return;
    const float *x = X + t * NH * d + k, *C = comb + t * NH * NH, *po = post + t * NH;
    float xv[NH], c[NH * NH];
#pragma unroll
    for (int i = 0; i < NH; i++) xv[i] = x[i * d];
#pragma unroll
    for (int q = 0; q < NH * NH; q++) c[q] = C[q];
    const float fv = f[t * d + k];
    float *o = Xo + t * NH * d + k;
#pragma unroll
    for (int j = 0; j < NH; j++) o[j * d] = hc_post_elem<NH>(xv, fv, c, po, j);
}

int cu_be_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                  const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_post X", err);
    if (!rc && (n_hc <= 0 || X->cols % n_hc)) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post: n_hc %d", n_hc);
    if (rc) return rc;
    int64_t T = X->rows, d = X->cols / n_hc;
    rc = cu_be_check(f, DSV4_DT_F32, T, d, "hc_post f", err);
    if (!rc) rc = cu_be_check(post, DSV4_DT_F32, T, n_hc, "hc_post post", err);
    if (!rc) rc = cu_be_check(comb, DSV4_DT_F32, T, n_hc * n_hc, "hc_post comb", err);
    if (!rc) rc = cu_be_check(Xout, DSV4_DT_F32, T, X->cols, "hc_post Xout", err);
    if (!rc && Xout->data == X->data) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post: Xout aliases X");
    if (rc) return rc;
    int64_t total = T * X->cols;
    if (!total) return DSV4_OK;
    dsv4_cuda_ctx *c = cube(be)->ctx;
    const float *xp = (const float *)X->data, *fp = (const float *)f->data, *pp = (const float *)post->data,
                *cp = (const float *)comb->data;
    float *op = (float *)Xout->data;
    if (n_hc <= 4 && T <= 65535) {
        const dim3 g(nblk(d, 256), (unsigned)T), th(256);
        cudaError_t e;
        switch (n_hc) {
        case 1: e = cu_launch(c, k_hc_post_v<1>, g, th, 0, xp, fp, pp, cp, d, op); break;
        case 2: e = cu_launch(c, k_hc_post_v<2>, g, th, 0, xp, fp, pp, cp, d, op); break;
        case 3: e = cu_launch(c, k_hc_post_v<3>, g, th, 0, xp, fp, pp, cp, d, op); break;
        default: e = cu_launch(c, k_hc_post_v<4>, g, th, 0, xp, fp, pp, cp, d, op); break;
        }
        CU_TRY(e, err, "hc_post");
        return DSV4_OK;
    }
    CU_TRY(cu_launch(c, k_hc_post, dim3(nblk(total, 256)), dim3(256), 0, xp, fp, pp, cp, n_hc, d, total, op), err,
           "hc_post");
    return DSV4_OK;
}

/* DSV4_CUDA_HC_POSTFUSE=1|0: hc_post_pre_norm folds hc_post into k_hc_fused, or runs hc_post, then
 * hc_pre_norm (same bits). Default CU_HC_POSTFUSE_DEFAULT (cuda_internal.cuh). */
static int hc_postfuse_on(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("DSV4_CUDA_HC_POSTFUSE");
        v = e && e[0] ? e[0] != '0' : CU_HC_POSTFUSE_DEFAULT;
    }
    return v;
}

/*
 * hc_post, then hc_pre_norm on its output (backend.h hc_post_pre_norm). Below
 * HC_F_MAXT rows (decode / verify) one k_hc_fused launch: every thread
 * computes its column's hc_post output as k_hc_post_v does (hc_post_elem),
 * writes it and takes it into the mix partials; the finishing block reads
 * the new streams back from L2. So the hc_post kernel and its 64 KB round
 * trip between launches go (H200, batch 1: ~4.4 us a call in the stream,
 * bench/results/2026-12-02-decode-l2-prefetch-h200.md section 4). Larger
 * steps run the two ops.
 */
int cu_be_hc_post_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                           const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_tview *fn,
                           const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps,
                           const dsv4_tview *norm, float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                           dsv4_err *err) {
    if (!X || !f || !post_in || !comb_in || !Xout || !y || !post || !comb || !norm)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_post_pre_norm: NULL argument");
    if (post->data == post_in->data || comb->data == comb_in->data || y->data == f->data)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_post_pre_norm: post / comb / y alias the hc_post inputs");
    const int64_t T = X->rows, n = X->cols;
    if (!(hc_postfuse_on() && n_hc > 0 && n_hc <= 4 && T > 0 && hc_fused_fits(T, n, n_hc))) {
        int rc = cu_be_hc_post(be, X, f, post_in, comb_in, n_hc, Xout, err);
        return rc ? rc : cu_be_hc_pre_norm(be, Xout, fn, base, scale, n_hc, iters, eps, norm, norm_eps, y, post,
                                           comb, err);
    }
    /* the checks of both ops */
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_post X", err);
    if (!rc && (X->cols % n_hc || iters < 1))
        rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post_pre_norm: cols %lld, n_hc %d, iters %d", (long long)X->cols,
                    n_hc, iters);
    if (rc) return rc;
    const int64_t d = n / n_hc, nm = n_hc * (2 + n_hc);
    rc = cu_be_check(f, DSV4_DT_F32, T, d, "hc_post f", err);
    if (!rc) rc = cu_be_check(post_in, DSV4_DT_F32, T, n_hc, "hc_post post", err);
    if (!rc) rc = cu_be_check(comb_in, DSV4_DT_F32, T, n_hc * n_hc, "hc_post comb", err);
    if (!rc) rc = cu_be_check(Xout, DSV4_DT_F32, T, n, "hc_post Xout", err);
    if (!rc && Xout->data == X->data) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_post_pre_norm: Xout aliases X");
    if (!rc) rc = cu_be_check_vec(fn, nm * n, "hc fn", err);
    if (!rc) rc = cu_be_check_vec(base, nm, "hc base", err);
    if (!rc) rc = cu_be_check_vec(scale, 3, "hc scale", err);
    if (!rc) rc = cu_be_check_vec(norm, d, "hc_pre_norm weight", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "hc_pre y", err);
    if (!rc) rc = cu_be_check(post, DSV4_DT_F32, T, n_hc, "hc_pre post", err);
    if (!rc) rc = cu_be_check(comb, DSV4_DT_F32, T, n_hc * n_hc, "hc_pre comb", err);
    if (rc) return rc;
    const HcPostIn pi = {(const float *)f->data, (const float *)post_in->data, (const float *)comb_in->data,
                         (float *)Xout->data};
    return hc_run_fused(cube(be), (const float *)X->data, (int)T, n, n_hc, (int)nm, fn, base, scale, iters, eps,
                        (float *)y->data, (float *)post->data, (float *)comb->data, norm, norm_eps,
                        "hc_post_pre_norm", err, &pi);
}

int cu_be_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                  const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_head X", err);
    if (!rc && (n_hc <= 0 || n_hc > 16 || X->cols % n_hc)) rc = cu_err(err, DSV4_EINVAL, "cuda: hc_head: n_hc %d", n_hc);
    if (!rc && n_hc > 4) rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: hc_head: n_hc %d > 4 not implemented", n_hc);
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc;
    rc = cu_be_check_vec(fn, n_hc * n, "hc_head fn", err);
    if (!rc) rc = cu_be_check_vec(base, n_hc, "hc_head base", err);
    if (!rc) rc = cu_be_check_vec(scale, 1, "hc_head scale", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "hc_head y", err);
    if (rc) return rc;
    if (!T || !n) return DSV4_OK;
    return hc_run(cube(be), (const float *)X->data, (int)T, n, n_hc, n_hc, fn, base, scale, 1, eps,
                  (float *)y->data, NULL, NULL, NULL, 0.f, "hc_head", err);
}

/* --------------------------------------------------------------- win_store */

/* One block per row. A chunk longer than the ring writes a ring row more than
 * once; the reference's row order keeps the last, so only the last `cap` rows
 * of a segment write (no two blocks race on a ring row). */
__global__ void k_win_store(float *rows, const float *kv, int64_t hd, int cap, const int32_t *pos,
                            const int32_t *slot, const int32_t *r1) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x;
    if (t + cap < r1[t]) return;
    const int64_t r = (int64_t)slot[t] * cap + pos[t] % cap;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) rows[r * hd + i] = kv[(int64_t)t * hd + i];
}

int cu_be_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                    dsv4_err *err) {
    int rc = cu_be_check(kv, DSV4_DT_F32, b->n_rows, -1, "win_store kv", err);
    if (!rc && (!ws || ws->cap <= 0))
        rc = cu_err(err, DSV4_EINVAL, "cuda: win_store: no window state");
    const int coded = !rc && ws->rows.dtype != DSV4_DT_F32; /* records of kvcodec.h (cuda_kvrow.cu) */
    if (!rc && !coded)
        rc = cu_be_check(&ws->rows, DSV4_DT_F32, (int64_t)ws->n_slots * ws->cap, kv->cols, "window ring", err);
    if (rc) return rc;
    for (int t = 0; t < b->n_rows; t++)
        if (b->slot[t] < 0 || b->slot[t] >= ws->n_slots || b->pos[t] < 0)
            return cu_err(err, DSV4_EINVAL, "win_store: slot %d / position %d of row %d out of range", b->slot[t],
                          b->pos[t], t);
    const int32_t *tok, *pos, *slot, *p0, *r0, *r1;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err)) || (rc = cu_be_batch_seg(be, b, &p0, &r0, &r1, err)))
        return rc;
    if (coded) return cu_kv_win_store(be, ws, kv, pos, slot, r1, b->n_rows, err);
    if (!b->n_rows) return DSV4_OK;
    const int th = kv->cols >= 512 ? 512 : (int)((kv->cols + 31) / 32 * 32); /* one pass over a 512-wide row */
    CU_TRY(cu_launch(cube(be)->ctx, k_win_store, dim3(b->n_rows), dim3(th), 0, (float *)ws->rows.data,
                     (const float *)kv->data, kv->cols, ws->cap, pos, slot, r1),
           err, "win_store");
    return DSV4_OK;
}

/* ------------------------------------------------------------- router tail */

/*
 * One warp per row (RT_WARPS rows per block): a = sqrt(softplus(l)) and
 * v = a + bias once per expert into shared memory, then k rounds of a warp
 * argmax over the experts not yet taken (ties -> lower id), or the hash
 * table's ids; weights = a[ids]/Σ · route_scale, Σ in j order (lane 0), as
 * cpu_moe.c. bad[0] is set when a hash id is out of range.
 * The reference's scan (first untaken expert, replaced by any strictly
 * greater value) picks the lowest-id maximum over the non-NaN values unless
 * the first untaken expert's value is NaN, then that expert; the warp
 * reduction computes exactly that. Why: one thread per row (the first
 * version) recomputed the softplus E·k times on one thread (273 µs a call).
 */
#define RT_WARPS 4
#define RT_MAXK 16
#define RT_MAXE 1024 /* the per-lane taken mask has 32 bits */
#define RT_LPL 8     /* k_route: experts per lane whose logits load together */

__global__ void __launch_bounds__(RT_WARPS * 32) k_route(const float *logits, int T, int E, const void *bias,
                                                        int bbf16, const int64_t *tid2eid, const int32_t *tok,
                                                        int k, float route_scale, int32_t *ids, float *wts,
                                                        int *bad) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float rsh[]; /* [RT_WARPS][2][E]: a, v */
    __shared__ int sid[RT_WARPS][RT_MAXK];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * RT_WARPS + w;
    if (t >= T) return; /* whole warps; no block-wide barrier below */
    float *a = rsh + (int64_t)w * 2 * E, *v = a + E;
    const float *l = logits + (int64_t)t * E;
    /* RT_LPL experts per lane loaded together, then computed (a loop load by load waited ~8 times) */
    for (int e0 = 0; e0 < E; e0 += 32 * RT_LPL) {
        float lx[RT_LPL], lb[RT_LPL];
#pragma unroll
        for (int j = 0; j < RT_LPL; j++) {
            const int e = e0 + lane + 32 * j;
            lx[j] = e < E ? l[e] : 0.f;
            lb[j] = e < E && bias ? cu_ldf(bias, bbf16, e) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < RT_LPL; j++) {
            const int e = e0 + lane + 32 * j;
            if (e >= E) break;
            const float x = lx[j];
            a[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
            v[e] = a[e] + lb[j];
        }
    }
    __syncwarp();
    if (tid2eid) {
        if (lane < k) {
            const int64_t e = tid2eid[(int64_t)tok[t] * k + lane];
            int best = (int)e;
            if (e < 0 || e >= E) {
                atomicExch(bad, 1); /* reported by the caller; any valid id keeps the kernel in bounds */
                best = 0;
            }
            sid[w][lane] = best;
            ids[(int64_t)t * k + lane] = best;
        }
    } else {
        uint32_t taken = 0; /* bit q: expert lane + 32q */
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int bi = -1, first = INT_MAX;
            for (int e = lane, q = 0; e < E; e += 32, q++) {
                if (taken >> q & 1u) continue;
                if (first == INT_MAX) first = e;
                const float x = v[e];
                if (x == x && (bi < 0 || x > bv)) {
                    bi = e;
                    bv = x;
                }
            }
            for (int o = 16; o; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o), of = __shfl_xor_sync(0xffffffffu, first, o);
                if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                    bv = ov;
                    bi = oi;
                }
                first = min(first, of);
            }
            const int best = v[first] != v[first] ? first : bi; /* k <= E: some expert is untaken */
            if ((best & 31) == lane) taken |= 1u << (best >> 5);
            if (lane == 0) {
                sid[w][j] = best;
                ids[(int64_t)t * k + j] = best;
            }
        }
    }
    __syncwarp();
    if (lane == 0) {
        float s = 0.f;
        for (int j = 0; j < k; j++) s += a[sid[w][j]];
        for (int j = 0; j < k; j++) wts[(int64_t)t * k + j] = a[sid[w][j]] / s * route_scale;
    }
}

int cu_be_route_tail(dsv4_backend *be, const float *logits, int T, int E, const dsv4_tview *bias,
                     const dsv4_tview *tid2eid, const int32_t *d_token, int k, float route_scale, int32_t *ids,
                     float *weights, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (E <= 0 || E > RT_MAXE || k <= 0 || k > RT_MAXK || k > E)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_route: %d experts top-%d (the kernel takes up to %d "
                      "experts, top-%d)", E, k, RT_MAXE, RT_MAXK);
    if (T <= 0) return DSV4_OK;
    /* hash routing: a bad table entry sets the backend's deferred flag, reported by `sync` */
    int *bad = tid2eid ? cb->d_flags : NULL;
    CU_TRY(cu_launch(cb->ctx, k_route, dim3(nblk(T, RT_WARPS)), dim3(RT_WARPS * 32),
                     (size_t)RT_WARPS * 2 * E * sizeof(float), logits, T, E, bias ? bias->data : NULL,
                     (int)(bias && bias->dtype == DSV4_DT_BF16), tid2eid ? (const int64_t *)tid2eid->data : NULL,
                     d_token, k, route_scale, ids, weights, bad),
           err, "moe_route");
    return DSV4_OK;
}

/* ---------------------------------------------------------------- hc_mean */

/* y[t][col0 + k] = (Σ_h X[t][h*d + k]) / n_hc, summed in h order like the CPU path. */
__global__ void k_hc_mean(const float *X, int n_hc, int64_t d, float *y, int64_t ycols, int64_t col0) {
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.y;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d; k += (int64_t)gridDim.x * blockDim.x) {
        const float *x = X + t * n_hc * d + k;
        float acc = 0.f;
        for (int h = 0; h < n_hc; h++) acc += x[h * d];
        y[t * ycols + col0 + k] = acc / (float)n_hc;
    }
}

int cu_be_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err) {
    int rc = cu_be_check(X, DSV4_DT_F32, -1, -1, "hc_mean X", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, X->rows, -1, "hc_mean y", err);
    if (rc) return rc;
    if (n_hc <= 0 || X->cols % n_hc) return cu_err(err, DSV4_EINVAL, "cuda: hc_mean: %lld columns, %d streams",
                                                   (long long)X->cols, n_hc);
    int64_t d = X->cols / n_hc;
    if (col0 < 0 || col0 + d > y->cols)
        return cu_err(err, DSV4_EINVAL, "cuda: hc_mean: columns [%lld,%lld) outside y (%lld)", (long long)col0,
                      (long long)(col0 + d), (long long)y->cols);
    if (!X->rows || !d) return DSV4_OK;
    dim3 grid((unsigned)((d + 255) / 256 < 16 ? (d + 255) / 256 : 16), (unsigned)X->rows);
    CU_TRY(cu_launch(cube(be)->ctx, k_hc_mean, grid, dim3(256), 0, (const float *)X->data, n_hc, d, (float *)y->data,
                     y->cols, col0),
           err, "hc_mean");
    return DSV4_OK;
}
