/*
 * Views of checkpoint tensors, shared by the loader, the weight binder, the
 * CPU reference and the CUDA uploader. A view never owns its bytes: they
 * belong to the mmap'd checkpoint (or to whoever built the view).
 */
#ifndef DSV4_MODEL_TENSOR_H
#define DSV4_MODEL_TENSOR_H

#include "dsv4/common.h"

#define DSV4_MAX_DIMS 4

/* One tensor as stored: dtype, shape (row-major, PyTorch order), raw bytes.
 * dtype == DSV4_DT_INVALID marks an absent tensor (e.g. no scale). */
typedef struct dsv4_tview {
    const char *name; /* checkpoint name; NULL for synthetic views */
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[DSV4_MAX_DIMS];
    const void *data; /* little-endian element bytes */
    size_t nbytes;
} dsv4_tview;

/*
 * A linear layer's weight as stored (spec/MODEL.md §2.2-2.4), y = x · Wᵀ:
 *   FP8:  w F8_E4M3 [out, in],    scale F8_E8M0 [ceil(out/128), ceil(in/128)]
 *   FP4:  w I8      [out, in/2],  scale F8_E8M0 [out, in/32]  (low nibble = even column)
 *   BF16/F32: w [out, in], scale absent.
 * out/in are the logical dims (in counts FP4 values, not bytes).
 */
typedef struct dsv4_linear {
    dsv4_tview w;
    dsv4_tview scale;
    int64_t out, in;
} dsv4_linear;

#endif
