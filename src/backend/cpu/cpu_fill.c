/*
 * CPU fill_dummy (backend.h; --load-format dummy): dummy weights are
 * generated straight into host memory owned by the backend — the CPU
 * backend's "backend memory" — element by element from
 * backend/dummy_fill.h, so they equal the CUDA backend's bit for bit.
 *
 * Ownership: `upload` on this backend is the identity (the checkpoint's mmap
 * is the backend memory), so the backend owned nothing until now. Filled
 * tensors are kept on a list hung from be->ctx and released by `free`.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/dummy_fill.h"

typedef struct fill_block {
    struct fill_block *next;
    uint64_t pad[7]; /* 64-byte header: the data after it keeps malloc's alignment */
} fill_block;

void dsv4_cpu_fill_release(dsv4_backend *be) {
    for (fill_block *b = be->ctx, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    be->ctx = NULL;
}

static int64_t numel(const dsv4_tview *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
    return n;
}

/* Fill n elements of dtype dt at p per how (row length k for INDEX). */
static void fill_range(const dsv4_fill *how, dsv4_dtype dt, void *p, int64_t n, int64_t k) {
    switch (how->kind) {
    case DSV4_FILL_UNIFORM:
        if (dt == DSV4_DT_F32) {
            float *f = p;
#pragma omp parallel for if (n > DSV4_CPU_PAR_MIN)
            for (int64_t i = 0; i < n; i++) f[i] = dsv4_fill_uniform(how, (uint64_t)i);
        } else {
            uint16_t *h = p;
#pragma omp parallel for if (n > DSV4_CPU_PAR_MIN)
            for (int64_t i = 0; i < n; i++) h[i] = dsv4_fill_bf16(dsv4_fill_uniform(how, (uint64_t)i));
        }
        return;
    case DSV4_FILL_INDEX:
        if (dt == DSV4_DT_I64) {
            int64_t *q = p;
            for (int64_t i = 0; i < n; i++) q[i] = dsv4_fill_index(how, (uint64_t)i, k);
        } else {
            int32_t *q = p;
            for (int64_t i = 0; i < n; i++) q[i] = (int32_t)dsv4_fill_index(how, (uint64_t)i, k);
        }
        return;
    case DSV4_FILL_BYTES: { /* one hash per 8 bytes (dsv4_fill_byte); a slice's map: byte by byte */
        uint8_t *b = p;
        int64_t words = how->map_off || how->map_cols ? 0 : n / 8;
#pragma omp parallel for if (n > DSV4_CPU_PAR_MIN)
        for (int64_t w = 0; w < words; w++) {
            uint64_t h = dsv4_fill_hash(how->seed, (uint64_t)w);
            for (int k = 0; k < 8; k++) b[8 * w + k] = (uint8_t)(h >> (8 * k));
        }
        for (int64_t i = 8 * words; i < n; i++) b[i] = dsv4_fill_byte(how, (uint64_t)i);
        return;
    }
    default: {
        uint8_t *b = p;
#pragma omp parallel for if (n > DSV4_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) b[i] = dsv4_fill_byte(how, (uint64_t)i);
        return;
    }
    }
}

/* Does `how` suit dtype dt (backend.h fill_dummy)? */
static int kind_fits(const dsv4_fill *how, dsv4_dtype dt) {
    switch (how->kind) {
    case DSV4_FILL_UNIFORM: return dt == DSV4_DT_F32 || dt == DSV4_DT_BF16;
    case DSV4_FILL_E4M3: return dt == DSV4_DT_F8_E4M3 && how->hi >= 0 && how->hi <= 0x7e;
    case DSV4_FILL_E8M0: return dt == DSV4_DT_F8_E8M0 && how->lo >= 0 && how->lo <= how->hi && how->hi <= 254;
    case DSV4_FILL_BYTES: return dt == DSV4_DT_I8 || dt == DSV4_DT_U8;
    case DSV4_FILL_INDEX: return (dt == DSV4_DT_I64 || dt == DSV4_DT_I32) && how->hi > 0;
    default: return 0;
    }
}

int dsv4_cpu_fill_dummy(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err) {
    const char *nm = dev && dev->name ? dev->name : "tensor";
    if (!how || !dev || dev->ndim < 1 || dev->ndim > DSV4_MAX_DIMS)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: fill_dummy: %s: bad arguments", nm);
    int64_t n = numel(dev);
    size_t es = dsv4_dtype_size(dev->dtype);
    if (!kind_fits(how, dev->dtype) || n < 0 || !es || dev->nbytes != (size_t)n * es)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: fill_dummy: %s: fill kind %d does not fit %s with %zu bytes", nm,
                            (int)how->kind, dsv4_dtype_name(dev->dtype), dev->nbytes);
    fill_block *b = malloc(sizeof *b + (dev->nbytes ? dev->nbytes : 1));
    if (!b) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: fill_dummy: %s: %zu bytes", nm, dev->nbytes);
    void *p = b + 1;
    fill_range(how, dev->dtype, p, n, dev->shape[dev->ndim - 1]);
    b->next = be->ctx;
    be->ctx = b;
    dev->data = p;
    return DSV4_OK;
}
