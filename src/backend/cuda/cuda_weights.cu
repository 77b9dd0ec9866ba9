/*
 * cuda_weights.cu — upload of stored linears (spec/MODEL.md §2.2-2.3).
 *
 * FP8 and BF16 go up as stored. FP4 is repacked on the device into the
 * order the expert kernel's tensor-core fragments consume it, because the
 * E2M1 scale changes every 32 columns of a row: one m16n8k32 step must see,
 * for each of its 16 rows, the 32 values of one scale group, and in the
 * stored order those 16 bytes sit in one lane. Repacked, each lane streams
 * 32 contiguous bytes per 16x128 tile with nothing to shuffle.
 *
 * Repacked layout of an FP4 matrix [R, K] (R % 16 == 0, K % 128 == 0),
 * T = R/16 row tiles, C = K/128 column chunks, one 1024-byte block per
 * (tile, chunk) in tile-major order; inside it lane L = 4g + t owns bytes
 * [32L, 32L+32): for step s = 0..3 (scale group 4c+s), 4 bytes of row
 * 16·tile+g then 4 bytes of row 16·tile+g+8, both the stored bytes
 * [64c + 16s + 4t, +4) of that row (8 values: columns 128c+32s+8t .. +7).
 * Scales: one 64-byte block per (tile, chunk): byte 8g + 4h + s is the E8M0
 * scale of row 16·tile + g + 8h, group 4c + s.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <string.h>

__global__ void k_repack_fp4(const uint8_t *src, uint32_t *dst, int64_t R, int64_t K) {
    int64_t C = K / 128, words = R * K / 8;
    int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= words) return;
    int64_t tc = o >> 8;
    int w = (int)(o & 255), lane = w >> 3, s = (w & 7) >> 1, h = w & 1;
    int64_t tile = tc / C, c = tc % C;
    int g = lane >> 2, t = lane & 3;
    int64_t row = tile * 16 + g + 8 * h;
    const uint8_t *p = src + row * (K / 2) + c * 64 + 16 * s + 4 * t;
    dst[o] = *(const uint32_t *)p;
}

__global__ void k_repack_fp4_scale(const uint8_t *src, uint8_t *dst, int64_t R, int64_t K) {
    int64_t C = K / 128, n = R * K / 32;
    int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n) return;
    int64_t tc = o >> 6;
    int b = (int)(o & 63), g = b >> 3, h = (b >> 2) & 1, s = b & 3;
    int64_t tile = tc / C, c = tc % C;
    int64_t row = tile * 16 + g + 8 * h;
    dst[o] = src[row * (K / 32) + c * 4 + s];
}

static const char *tname(const dsv4_tview *t) { return t->name ? t->name : "(unnamed tensor)"; }

/* dtype names without a link dependency on dsv4core (see cu_err). */
static const char *dt_name(dsv4_dtype d) {
    switch (d) {
    case DSV4_DT_F32: return "F32";
    case DSV4_DT_BF16: return "BF16";
    case DSV4_DT_F16: return "F16";
    case DSV4_DT_F8_E4M3: return "F8_E4M3";
    case DSV4_DT_F8_E8M0: return "F8_E8M0";
    case DSV4_DT_I8: return "I8";
    case DSV4_DT_U8: return "U8";
    case DSV4_DT_I32: return "I32";
    case DSV4_DT_I64: return "I64";
    default: return "INVALID";
    }
}

/* Validate a stored linear against §2.2; returns the kind or fails. */
static int check_linear(const dsv4_linear *lin, dsv4_cuda_wkind *kind, dsv4_err *err) {
    const dsv4_tview *w = &lin->w, *s = &lin->scale;
    int64_t o = lin->out, i = lin->in;
    if (o <= 0 || i <= 0)
        return cu_err(err, DSV4_EINVAL, "%s: bad logical shape [%lld, %lld]", tname(w),
                      (long long)o, (long long)i);
    if (!w->data) return cu_err(err, DSV4_EINVAL, "%s: no data", tname(w));
    if (w->dtype == DSV4_DT_BF16) {
        if (w->ndim != 2 || w->shape[0] != o || w->shape[1] != i || w->nbytes != (size_t)(o * i * 2))
            return cu_err(err, DSV4_EINVAL, "%s: BF16 weight shape/size does not match [%lld, %lld]",
                          tname(w), (long long)o, (long long)i);
        if (i % 8)
            return cu_err(err, DSV4_EUNSUPPORTED, "%s: BF16 in-dim %lld not a multiple of 8",
                          tname(w), (long long)i);
        *kind = DSV4_CUDA_W_BF16;
        return DSV4_OK;
    }
    if (w->dtype != DSV4_DT_F8_E4M3 && w->dtype != DSV4_DT_I8)
        return cu_err(err, DSV4_EUNSUPPORTED, "%s: weight dtype %s not supported by the CUDA backend",
                      tname(w), dt_name(w->dtype));
    if (s->dtype != DSV4_DT_F8_E8M0 || !s->data)
        return cu_err(err, DSV4_EINVAL, "%s: quantised weight without an F8_E8M0 scale", tname(w));
    if (o % 16 || i % 128)
        return cu_err(err, DSV4_EUNSUPPORTED,
                      "%s: shape [%lld, %lld] not a multiple of 16 x 128 (CUDA tile)", tname(w),
                      (long long)o, (long long)i);
    if (w->dtype == DSV4_DT_F8_E4M3) {
        if (o % 128)
            return cu_err(err, DSV4_EUNSUPPORTED, "%s: FP8 out-dim %lld not a multiple of 128",
                          tname(w), (long long)o);
        if (w->ndim != 2 || w->shape[0] != o || w->shape[1] != i || w->nbytes != (size_t)(o * i))
            return cu_err(err, DSV4_EINVAL, "%s: FP8 weight shape/size does not match [%lld, %lld]",
                          tname(w), (long long)o, (long long)i);
        if (s->ndim != 2 || s->shape[0] != o / 128 || s->shape[1] != i / 128 ||
            s->nbytes != (size_t)(o / 128 * (i / 128)))
            return cu_err(err, DSV4_EINVAL, "%s: FP8 scale shape is not [%lld, %lld]", tname(s),
                          (long long)(o / 128), (long long)(i / 128));
        *kind = DSV4_CUDA_W_FP8;
    } else {
        if (w->ndim != 2 || w->shape[0] != o || w->shape[1] != i / 2 || w->nbytes != (size_t)(o * i / 2))
            return cu_err(err, DSV4_EINVAL, "%s: FP4 weight shape/size is not [%lld, %lld] bytes",
                          tname(w), (long long)o, (long long)(i / 2));
        if (s->ndim != 2 || s->shape[0] != o || s->shape[1] != i / 32 || s->nbytes != (size_t)(o * (i / 32)))
            return cu_err(err, DSV4_EINVAL, "%s: FP4 scale shape is not [%lld, %lld]", tname(s),
                          (long long)o, (long long)(i / 32));
        *kind = DSV4_CUDA_W_FP4;
    }
    return DSV4_OK;
}

/* Upload an FP4 matrix through `staging` (>= raw bytes) into repacked dst. */
static int upload_fp4(dsv4_cuda_ctx *c, const dsv4_linear *lin, void *staging, void *dw, void *ds,
                      dsv4_err *err) {
    int64_t R = lin->out, K = lin->in;
    size_t wb = (size_t)(R * K / 2), sb = (size_t)(R * K / 32);
    CU_TRY(cudaMemcpyAsync(staging, lin->w.data, wb, cudaMemcpyHostToDevice, c->stream), err,
           lin->w.name ? lin->w.name : "fp4 weight");
    int64_t words = R * K / 8;
    k_repack_fp4<<<(unsigned)((words + 255) / 256), 256, 0, c->stream>>>((const uint8_t *)staging,
                                                                       (uint32_t *)dw, R, K);
    CU_LAUNCHED(err, "fp4 repack");
    uint8_t *sstage = (uint8_t *)staging + cu_align(wb);
    CU_TRY(cudaMemcpyAsync(sstage, lin->scale.data, sb, cudaMemcpyHostToDevice, c->stream), err,
           lin->scale.name ? lin->scale.name : "fp4 scale");
    k_repack_fp4_scale<<<(unsigned)((sb + 255) / 256), 256, 0, c->stream>>>(sstage, (uint8_t *)ds, R, K);
    CU_LAUNCHED(err, "fp4 scale repack");
    /* the staging area is reused by the next call: wait */
    CU_TRY(cudaStreamSynchronize(c->stream), err, "fp4 upload (synchronize)");
    return DSV4_OK;
}

extern "C" int dsv4_cuda_weight_upload(dsv4_cuda_ctx *c, const dsv4_linear *lin,
                                       dsv4_cuda_weight *out, dsv4_err *err) {
    if (!c || !lin || !out) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_weight_upload: NULL argument");
    memset(out, 0, sizeof *out);
    dsv4_cuda_wkind kind;
    int rc = check_linear(lin, &kind, err);
    if (rc) return rc;
    dsv4_cuda_weight w;
    memset(&w, 0, sizeof w);
    w.kind = kind;
    w.out = lin->out;
    w.in = lin->in;
    w.w_bytes = lin->w.nbytes;
    w.scale_bytes = kind == DSV4_CUDA_W_BF16 ? 0 : lin->scale.nbytes;
    if ((rc = dsv4_cuda_alloc(c, w.w_bytes, &w.w, err))) return rc;
    if (w.scale_bytes && (rc = dsv4_cuda_alloc(c, w.scale_bytes, &w.scale, err))) {
        dsv4_cuda_weight_free(c, &w);
        return rc;
    }
    if (kind == DSV4_CUDA_W_FP4) {
        void *stage = NULL;
        rc = cu_workspace(c, cu_align(w.w_bytes) + w.scale_bytes, &stage, err);
        if (!rc) rc = upload_fp4(c, lin, stage, w.w, w.scale, err);
    } else {
        rc = dsv4_cuda_upload(c, w.w, lin->w.data, w.w_bytes, err);
        if (!rc && w.scale_bytes) rc = dsv4_cuda_upload(c, w.scale, lin->scale.data, w.scale_bytes, err);
    }
    if (rc) {
        dsv4_cuda_weight_free(c, &w);
        return rc;
    }
    *out = w;
    return DSV4_OK;
}

extern "C" void dsv4_cuda_weight_free(dsv4_cuda_ctx *c, dsv4_cuda_weight *w) {
    if (!w) return;
    dsv4_cuda_free(c, w->w);
    dsv4_cuda_free(c, w->scale);
    memset(w, 0, sizeof *w);
}

extern "C" int dsv4_cuda_experts_upload(dsv4_cuda_ctx *c, int n_experts, const dsv4_linear *w1,
                                        const dsv4_linear *w3, const dsv4_linear *w2,
                                        dsv4_cuda_experts *out, dsv4_err *err) {
    if (!c || !w1 || !w3 || !w2 || !out || n_experts <= 0)
        return cu_err(err, DSV4_EINVAL, "dsv4_cuda_experts_upload: bad argument");
    memset(out, 0, sizeof *out);
    int64_t dm = w1[0].in, dff = w1[0].out;
    for (int e = 0; e < n_experts; e++) {
        const dsv4_linear *l[3] = {&w1[e], &w3[e], &w2[e]};
        for (int k = 0; k < 3; k++) {
            dsv4_cuda_wkind kind;
            int rc = check_linear(l[k], &kind, err);
            if (rc) return rc;
            int64_t eo = k == 2 ? dm : dff, ei = k == 2 ? dff : dm;
            if (kind != DSV4_CUDA_W_FP4 || l[k]->out != eo || l[k]->in != ei)
                return cu_err(err, DSV4_EINVAL,
                              "expert %d %s (%s): expected FP4 [%lld, %lld], got %s [%lld, %lld]", e,
                              k == 0 ? "w1" : k == 1 ? "w3" : "w2", tname(&l[k]->w), (long long)eo,
                              (long long)ei, dt_name(l[k]->w.dtype), (long long)l[k]->out,
                              (long long)l[k]->in);
        }
    }
    dsv4_cuda_experts x;
    memset(&x, 0, sizeof x);
    x.n_experts = n_experts;
    x.d_model = dm;
    x.d_ff = dff;
    size_t wb = (size_t)(dm * dff / 2), sb = (size_t)(dm * dff / 32);
    size_t tw = wb * n_experts, ts = sb * n_experts;
    int rc = 0;
    void **bufs[6] = {&x.w1, &x.w3, &x.w2, &x.s1, &x.s3, &x.s2};
    for (int k = 0; k < 6 && !rc; k++) rc = dsv4_cuda_alloc(c, k < 3 ? tw : ts, bufs[k], err);
    void *stage = NULL;
    if (!rc) rc = cu_workspace(c, cu_align(wb) + sb, &stage, err);
    for (int e = 0; e < n_experts && !rc; e++) {
        rc = upload_fp4(c, &w1[e], stage, (uint8_t *)x.w1 + e * wb, (uint8_t *)x.s1 + e * sb, err);
        if (!rc) rc = upload_fp4(c, &w3[e], stage, (uint8_t *)x.w3 + e * wb, (uint8_t *)x.s3 + e * sb, err);
        if (!rc) rc = upload_fp4(c, &w2[e], stage, (uint8_t *)x.w2 + e * wb, (uint8_t *)x.s2 + e * sb, err);
    }
    if (rc) {
        dsv4_cuda_experts_free(c, &x);
        return rc;
    }
    x.bytes = 3 * (tw + ts);
    *out = x;
    return DSV4_OK;
}

extern "C" void dsv4_cuda_experts_free(dsv4_cuda_ctx *c, dsv4_cuda_experts *x) {
    if (!x) return;
    void *p[6] = {x->w1, x->w3, x->w2, x->s1, x->s3, x->s2};
    for (int k = 0; k < 6; k++) dsv4_cuda_free(c, p[k]);
    memset(x, 0, sizeof *x);
}
