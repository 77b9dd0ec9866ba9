/*
 * cuda_gemm.cuh — what the prefill-sized (many-row) GEMM kernels of
 * cuda_linear.cu (FP8) and cuda_moe.cu (FP4 experts) share: asynchronous
 * global -> shared copies (cp.async, sm_80+) for their multi-stage tile
 * pipelines, and the row thresholds at which they take over.
 *
 * Why cp.async: a tile of weights and activation rows is staged in shared
 * memory once and read there by every warp of the block, so weights are
 * fetched from HBM/L2 once per 32..64 token rows instead of once per 8
 * (the decode GEMV kernels); the copies of the next stages run while the
 * tensor cores work on the current one.
 */
#ifndef DSV4_CUDA_GEMM_CUH
#define DSV4_CUDA_GEMM_CUH

#include <stdint.h>
#include <stdlib.h>

/* 16 bytes global -> shared; valid == false writes 16 zero bytes (src unread). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
/* 4 bytes global -> shared; valid == false writes zero. */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/*
 * Thresholds (host side). Environment overrides, read per call so that a
 * harness can compare both paths in one process:
 *   DSV4_CUDA_FP8_GEMM_MIN  rows n from which FP8 linears use the tiled GEMM
 *   DSV4_CUDA_MOE_GEMM_MIN  average rows per expert (n·topk / n_experts)
 *                           from which the routed experts use the grouped GEMM
 * A large value turns the GEMM path off; 1 forces it (tests).
 */
static inline int cu_env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

#endif
