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
 * (FP4 repacked into the kernels' tile order; FP8 / FP4 linears with out or
 * in not a multiple of 128 zero-padded to it, exact: cuda_subtile.cu) and
 * returns a dsv4_linear whose data pointers only this backend's linear / MoE
 * ops understand.
 *
 * Implemented ops: buffers, upload, upload_linear, batch_begin, sync, embed,
 * add, rmsnorm, rope, qat_fp8, qat_hadamard_fp4, linear (FP8/FP4 W8A8 in
 * reference numerics; BF16; F32), linear_grouped (FP8/BF16/F32), hc_pre,
 * hc_post, hc_head, win_store, moe_route, moe_experts (FP4 experts, limit 10,
 * reference numerics; BF16 experts, any limit, either numerics:
 * cuda_moe_generic.cu), swiglu. Not yet: compress, indexer_select, attention,
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

/*
 * One-shot all-reduce over NVLink peer memory (cuda_allreduce.cu banner:
 * NCCL's LL idea, data and epoch flag in one 16-byte peer store), for the
 * small messages of decode steps; NCCL stays the path for large ones
 * (spec/PERFORMANCE.md §1).
 * dsv4_cuda_oneshot_create — ranks[r] for GPU r of 0..n-1 (n in [2,8]):
 *   peer access enabled between every pair; on each GPU a receive area of
 *   2 parities x n ranks x cap_bytes*2 bytes (16-byte lines carrying 8 data
 *   bytes each), an epoch counter, and a pinned abort word. Errors:
 *   DSV4_EINVAL n or cap_bytes out of range; DSV4_EUNSUPPORTED a pair of GPUs
 *   without peer access; DSV4_EBACKEND / DSV4_ENOMEM.
 * dsv4_cuda_oneshot_capacity — the largest message in bytes (0 for NULL).
 * dsv4_cuda_oneshot_all_reduce — x[0..n) (F32, or BF16 when bf16 != 0, in
 *   GPU r's memory) := Σ over ranks in rank order 0..N-1, in F32 and rounded
 *   once to the dtype (bit-identical on every rank), in place, one kernel
 *   queued on `stream` (a cudaStream_t of GPU r; capturable in a CUDA graph:
 *   the epoch advances on the device). Every rank must make the same
 *   sequence of calls with the same n and dtype. Errors: DSV4_EINVAL message
 *   over capacity; DSV4_EBACKEND launch failure.
 * dsv4_cuda_oneshot_abort — make this rank's queued or running all-reduces
 *   stop waiting for peers (their sums are then wrong); any thread.
 * dsv4_cuda_oneshot_free — one rank's handle (after its stream's work). NULL-safe.
 */
typedef struct dsv4_cuda_oneshot dsv4_cuda_oneshot;
int dsv4_cuda_oneshot_create(int n, int64_t cap_bytes, dsv4_cuda_oneshot **ranks, dsv4_err *err);
int64_t dsv4_cuda_oneshot_capacity(const dsv4_cuda_oneshot *h);
int dsv4_cuda_oneshot_all_reduce(dsv4_cuda_oneshot *h, void *x, int64_t n, int bf16, void *stream, dsv4_err *err);
void dsv4_cuda_oneshot_abort(dsv4_cuda_oneshot *h);
void dsv4_cuda_oneshot_free(dsv4_cuda_oneshot *h);

#ifdef __cplusplus
}
#endif
#endif
