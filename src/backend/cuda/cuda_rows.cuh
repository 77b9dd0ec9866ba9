/*
 * cuda_rows.cuh — the fp32-activation linears of the CUDA op table
 * (cuda_rows.cu): linear_grouped (the attention output projection wo_a,
 * spec/MODEL.md §3.4.8), F32-weight linears and the router gate logits
 * (§3.5). Not a public header.
 */
#ifndef DSV4_CUDA_ROWS_CUH
#define DSV4_CUDA_ROWS_CUH

#include "backend/cuda/cuda_internal.cuh"

/* Weight storage of cu_rows_linear. */
enum { CU_ROWS_F32 = 0, CU_ROWS_BF16 = 1, CU_ROWS_FP8 = 2 };

/*
 * cu_rows_linear — y[t][o] = Σ_k x[t·xstride + (o / out_g)·in + k] · W[o][k]
 * for t < T, o < out, k < in; y is F32 [T][out] (row stride out).
 * W: [out][in] F32, BF16, or E4M3 with E8M0 128x128 block scales `ws`
 * ([ceil(out/128)][ceil(in/128)]), dequantised: the activations are never
 * quantised (the official wo_a path, spec/MODEL.md §3.4.8; §2.4 for the
 * formats). out_g divides out: output rows [g·out_g, (g+1)·out_g) read
 * columns [g·in, (g+1)·in) of x (out_g = out: a plain linear).
 *
 * Numerics. F32 / BF16 weights: fp32 products and sums (CUDA-core GEMV for
 * T <= 16, cuBLAS SGEMM above), like the CPU reference up to summation order.
 * FP8 weights: tensor cores on x = hi + mid + lo (three bf16 parts, x held
 * to ~2^-27 relative, below fp32's own rounding) against the exactly
 * dequantised bf16 weights with fp32 accumulation (the hi + lo trick of the
 * BF16 linears, cuda_dense.cu, with one more part): an own mma.sync kernel
 * for T <= 64 (slabs of up to 48 tokens), cuBLAS bf16 GEMMs above. Measured
 * on H200 against the CPU op at the wo_a shape: normalised error 5.8e-7
 * (mma) / 2.4e-6 (cuBLAS), exact fp32 GEMV 4.2e-7. Shapes no fast path takes
 * (unaligned x, odd in-dims) and BF16 / F32 linears under 2^20 weights
 * (the tiny checkpoints' gate: launch-bound) use one warp per output (exact
 * fp32, the kernel this file replaced); small FP8 ones take the mma path.
 *
 * Scratch of the T > 64 / T > 16 paths comes from the stream-ordered pool
 * (capturable in a CUDA graph). Errors: DSV4_ENOMEM (scratch), DSV4_EBACKEND
 * (launch / cuBLAS failure).
 */
int cu_rows_linear(dsv4_cuda_ctx *c, int kind, const void *W, const uint8_t *ws, int64_t out, int64_t in,
                   const float *x, int64_t xstride, int64_t T, int64_t out_g, float *y, dsv4_err *err);

#endif
