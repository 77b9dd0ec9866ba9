/*
 * cuda_backend.h — the CUDA implementation of the backend op table
 * (src/backend/backend.h, docs/BACKEND.md), built on the kernels of
 * dsv4_cuda.h plus plain kernels for the small ops.
 *
 * Why a separate header: backend.h is the interface every backend shares;
 * this only adds the constructor, which exists only when the library is
 * built with nvcc (DSV4_HAVE_CUDA).
 */
#ifndef DSV4_CUDA_BACKEND_H
#define DSV4_CUDA_BACKEND_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * dsv4_backend_cuda_create — a backend on GPU `device` (name "cuda:N").
 * Activations are F32 device buffers (act_dtype F32). Weights: `upload`
 * copies a view to device memory; `upload_linear` uploads a whole linear
 * (FP4 repacked into the kernels' tile order) and returns a dsv4_linear whose
 * data pointers only this backend's linear / MoE ops understand.
 *
 * Implemented ops: buffers, upload, upload_linear, batch_begin, sync, embed,
 * add, rmsnorm, rope, qat_fp8, qat_hadamard_fp4, linear (FP8/FP4 W8A8 in
 * reference numerics; BF16; F32), linear_grouped (FP8/BF16/F32), hc_pre,
 * hc_post, hc_head, win_store, moe_route, moe_experts (FP4 experts, limit 10,
 * reference numerics), swiglu. Not yet: compress, indexer_select, attention,
 * FP8/FP4 linears and experts in HF numerics — these return
 * DSV4_EUNSUPPORTED with the op's name, never a wrong result.
 *
 * Errors: DSV4_EBACKEND (no such device, driver failure), DSV4_EUNSUPPORTED
 * (compute capability below 8.9), DSV4_ENOMEM. Returns NULL on failure.
 */
dsv4_backend *dsv4_backend_cuda_create(dsv4_numerics numerics, int device, dsv4_err *err);

/*
 * Tensor parallelism over the GPUs of one host (src/parallel/tp_runner.c,
 * cuda_tp.cu). dsv4_cuda_device_count — GPUs this process sees, or -1 with
 * err set (DSV4_EBACKEND: no driver / no device). dsv4_cuda_bind — make GPU
 * `device` the calling thread's current device (a rank's thread does this
 * before each call so its backend's runtime calls land on its GPU); returns
 * 0 or DSV4_EBACKEND.
 */
int dsv4_cuda_device_count(dsv4_err *err);
int dsv4_cuda_bind(int device, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
