/*
 * cuda_fill.cu — fill_dummy / fill_dummy_linear of the CUDA op table
 * (backend.h; --load-format dummy, src/model/dummy.h): dummy weights are
 * generated on the device, one thread per element (or per 4-byte word), so
 * the ~160 GB model never exists on the host and nothing crosses PCIe.
 *
 * Values: element i of a tensor is dsv4_fill_*(spec, i) of
 * backend/dummy_fill.h, the same functions the CPU backend runs, so a dummy
 * model is bit-identical on both backends.
 *
 * Linears end up exactly as `upload_linear` leaves checkpoint tensors
 * (cuda_weights.cu, cuda_backend.cu cu_lin records): FP8 and BF16 as
 * stored; FP4 in the repacked tile order. For FP4 each thread writes one
 * word of the repacked layout and computes which stored bytes that word
 * holds (the inverse of k_repack_fp4 / k_repack_fp4_scale), then the values
 * of those logical elements — no staging copy. If the repacked layout in
 * cuda_weights.cu changes, the two index maps below must follow it; a
 * mismatch would still give legal i.i.d. values, only no longer the CPU's.
 */
#include "backend/cuda/cuda_be_internal.cuh"
#include "backend/dummy_fill.h"

#include <stdlib.h>

enum { ST_F32 = 0, ST_BF16, ST_BYTE, ST_I64, ST_I32 };

__global__ void k_fill(dsv4_fill f, int st, void *p, int64_t n, int64_t k) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        switch (st) {
        case ST_F32: ((float *)p)[i] = dsv4_fill_uniform(&f, (uint64_t)i); break;
        case ST_BF16: ((uint16_t *)p)[i] = dsv4_fill_bf16(dsv4_fill_uniform(&f, (uint64_t)i)); break;
        case ST_I64: ((int64_t *)p)[i] = dsv4_fill_index(&f, (uint64_t)i, k); break;
        case ST_I32: ((int32_t *)p)[i] = (int32_t)dsv4_fill_index(&f, (uint64_t)i, k); break;
        default: ((uint8_t *)p)[i] = dsv4_fill_byte(&f, (uint64_t)i); break;
        }
    }
}

/* FP4 weight [R, K/2] bytes in the repacked order (cuda_weights.cu banner):
 * word o of the repacked buffer holds stored bytes [src, src+4). */
__global__ void k_fill_fp4_packed(dsv4_fill f, uint32_t *dst, int64_t R, int64_t K) {
    int64_t C = K / 128, words = R * K / 8;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < words; o += (int64_t)gridDim.x * blockDim.x) {
        int64_t tc = o >> 8;
        int w = (int)(o & 255), lane = w >> 3, s = (w & 7) >> 1, h = w & 1;
        int64_t tile = tc / C, c = tc % C;
        int g = lane >> 2, t = lane & 3;
        int64_t row = tile * 16 + g + 8 * h;
        /* a slice's map keeps runs of 4 bytes 4-aligned (tp_shard.c checks), so this stays one hash */
        uint64_t src = dsv4_fill_map(&f, (uint64_t)(row * (K / 2) + c * 64 + 16 * s + 4 * t));
        /* src % 4 == 0, so its 4 bytes are half of one 8-byte hash (dsv4_fill_byte, BYTES) */
        dst[o] = (uint32_t)(dsv4_fill_hash(f.seed, src >> 3) >> (8 * (src & 7)));
    }
}

/* FP4 scales [R, K/32] in the repacked order: byte o holds stored scale src. */
__global__ void k_fill_fp4_scale_packed(dsv4_fill f, uint8_t *dst, int64_t R, int64_t K) {
    int64_t C = K / 128, n = R * K / 32;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += (int64_t)gridDim.x * blockDim.x) {
        int64_t tc = o >> 6;
        int b = (int)(o & 63), g = b >> 3, h = (b >> 2) & 1, s = b & 3;
        int64_t tile = tc / C, c = tc % C;
        int64_t row = tile * 16 + g + 8 * h;
        dst[o] = dsv4_fill_byte(&f, (uint64_t)(row * (K / 32) + c * 4 + s));
    }
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

static int64_t numel(const dsv4_tview *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
    return n;
}

/* Storage class of a (kind, dtype) pair, or -1 when they do not fit. */
static int storage(const dsv4_fill *f, dsv4_dtype dt) {
    switch (f->kind) {
    case DSV4_FILL_UNIFORM: return dt == DSV4_DT_F32 ? ST_F32 : dt == DSV4_DT_BF16 ? ST_BF16 : -1;
    case DSV4_FILL_E4M3: return dt == DSV4_DT_F8_E4M3 && f->hi >= 0 && f->hi <= 0x7e ? ST_BYTE : -1;
    case DSV4_FILL_E8M0: return dt == DSV4_DT_F8_E8M0 && f->lo >= 0 && f->lo <= f->hi && f->hi <= 254 ? ST_BYTE : -1;
    case DSV4_FILL_BYTES: return dt == DSV4_DT_I8 || dt == DSV4_DT_U8 ? ST_BYTE : -1;
    case DSV4_FILL_INDEX: return f->hi <= 0 ? -1 : dt == DSV4_DT_I64 ? ST_I64 : dt == DSV4_DT_I32 ? ST_I32 : -1;
    default: return -1;
    }
}

static size_t st_size(int st) { return st == ST_F32 || st == ST_I32 ? 4 : st == ST_BF16 ? 2 : st == ST_I64 ? 8 : 1; }

/* Allocate and fill one tensor in its stored layout. */
static int fill_raw(cu_be *cb, const dsv4_fill *f, const dsv4_tview *v, void **out, dsv4_err *err) {
    const char *nm = v->name ? v->name : "tensor";
    int st = storage(f, v->dtype);
    int64_t n = numel(v);
    if (st < 0 || v->ndim < 1 || n < 0 || v->nbytes != (size_t)n * st_size(st))
        return cu_err(err, DSV4_EINVAL, "cuda: fill_dummy: %s: fill kind %d does not fit dtype %d with %zu bytes", nm,
                      (int)f->kind, (int)v->dtype, v->nbytes);
    void *p = NULL;
    int rc = dsv4_cuda_alloc(cb->ctx, v->nbytes ? v->nbytes : 1, &p, err);
    if (rc) return rc;
    k_fill<<<grid_for(n), 256, 0, cb->ctx->stream>>>(*f, st, p, n, v->shape[v->ndim - 1]);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        dsv4_cuda_free(cb->ctx, p);
        return cu_err(err, DSV4_EBACKEND, "cuda: fill_dummy: %s: %s", nm, cudaGetErrorString(e));
    }
    *out = p;
    return DSV4_OK;
}

int cu_be_fill_dummy(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!how || !dev) return cu_err(err, DSV4_EINVAL, "cuda: fill_dummy: NULL");
    if (cb->nviews == cb->capviews) { /* the list `upload` keeps, freed with the backend */
        int cap = cb->capviews ? 2 * cb->capviews : 64;
        void **nv = (void **)realloc(cb->views, (size_t)cap * sizeof *nv);
        if (!nv) return cu_err(err, DSV4_ENOMEM, "cuda: fill_dummy: out of memory");
        cb->views = nv;
        cb->capviews = cap;
    }
    void *p = NULL;
    int rc = fill_raw(cb, how, dev, &p, err);
    if (rc) return rc;
    cb->views[cb->nviews++] = p;
    dev->data = p;
    return DSV4_OK;
}

int cu_be_fill_dummy_linear(dsv4_backend *be, const dsv4_fill *wfill, const dsv4_fill *sfill,
                                       dsv4_linear *dev, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!wfill || !dev) return cu_err(err, DSV4_EINVAL, "cuda: fill_dummy_linear: NULL");
    const dsv4_tview *w = &dev->w, *s = &dev->scale;
    const char *nm = w->name ? w->name : "linear";
    int64_t o = dev->out, i = dev->in;
    dsv4_cuda_weight cw;
    memset(&cw, 0, sizeof cw);
    cw.out = o;
    cw.in = i;
    float *f32 = NULL;
    int rc = DSV4_OK;
    /* the shape rules of upload_linear (cuda_weights.cu check_linear) */
    if (w->dtype == DSV4_DT_F32) {
        void *p = NULL;
        rc = fill_raw(cb, wfill, w, &p, err);
        f32 = (float *)p;
    } else if (w->dtype == DSV4_DT_BF16) {
        if (i % 8) return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: BF16 in-dim %lld not a multiple of 8", nm, (long long)i);
        cw.kind = DSV4_CUDA_W_BF16;
        cw.w_bytes = w->nbytes;
        rc = fill_raw(cb, wfill, w, &cw.w, err);
    } else if (w->dtype == DSV4_DT_F8_E4M3 || w->dtype == DSV4_DT_I8) {
        int fp4 = w->dtype == DSV4_DT_I8;
        if (!sfill || s->dtype != DSV4_DT_F8_E8M0)
            return cu_err(err, DSV4_EINVAL, "cuda: %s: quantised dummy weight without an F8_E8M0 scale", nm);
        if (o % 16 || i % 128 || (!fp4 && o % 128))
            return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: shape [%lld, %lld] does not fit the CUDA tiles", nm,
                          (long long)o, (long long)i);
        cw.w_bytes = w->nbytes;
        cw.scale_bytes = s->nbytes;
        if (!fp4) {
            cw.kind = DSV4_CUDA_W_FP8;
            rc = fill_raw(cb, wfill, w, &cw.w, err);
            if (!rc) rc = fill_raw(cb, sfill, s, &cw.scale, err);
        } else {
            cw.kind = DSV4_CUDA_W_FP4;
            if (storage(wfill, w->dtype) != ST_BYTE || storage(sfill, s->dtype) != ST_BYTE ||
                w->nbytes != (size_t)(o * i / 2) || s->nbytes != (size_t)(o * i / 32))
                return cu_err(err, DSV4_EINVAL, "cuda: %s: FP4 dummy weight/scale sizes or fills do not match [%lld, %lld]",
                              nm, (long long)o, (long long)i);
            rc = dsv4_cuda_alloc(cb->ctx, cw.w_bytes, &cw.w, err);
            if (!rc) rc = dsv4_cuda_alloc(cb->ctx, cw.scale_bytes, &cw.scale, err);
            if (!rc) {
                k_fill_fp4_packed<<<grid_for(o * i / 8), 256, 0, cb->ctx->stream>>>(*wfill, (uint32_t *)cw.w, o, i);
                k_fill_fp4_scale_packed<<<grid_for(o * i / 32), 256, 0, cb->ctx->stream>>>(*sfill, (uint8_t *)cw.scale,
                                                                                          o, i);
                cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess)
                    rc = cu_err(err, DSV4_EBACKEND, "cuda: fill_dummy_linear: %s: %s", nm, cudaGetErrorString(e));
            }
        }
    } else {
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: dummy weight dtype %d not supported", nm, (int)w->dtype);
    }
    if (!rc) rc = cu_be_adopt_linear(be, dev, f32 ? NULL : &cw, f32, dev, err);
    if (rc) {
        dsv4_cuda_weight_free(cb->ctx, &cw);
        dsv4_cuda_free(cb->ctx, f32);
    }
    return rc;
}
