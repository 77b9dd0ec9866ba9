/*
 * cuda_subtile.cuh — what the tiled CUDA kernels do not take (not a public
 * header): quantised linears narrower than the 128-wide tiles (zero padding,
 * cuda_subtile.cu) and routed experts with BF16 weights (a plain per-output
 * kernel, cuda_moe_generic.cu). Both are for small models — the tiny test
 * checkpoints, their TP slices and dequantised copies; Flash never takes them.
 */
#ifndef DSV4_CUDA_SUBTILE_CUH
#define DSV4_CUDA_SUBTILE_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "model/tensor.h"

/* 1 when `lin` is FP8 (F8_E4M3) or FP4 (I8/U8) and out or in is not a
 * multiple of 128: it is then uploaded padded (cu_subtile_pad). */
int cu_subtile_needed(const dsv4_linear *lin);

/* A host copy of the quantised linear `host` zero-padded to out, in rounded
 * up to multiples of 128 (FP8 weight [Po, Pi] with the unchanged scale
 * [Po/128, Pi/128]; FP4 weight [Po, Pi/2] bytes + scale [Po, Pi/32], padded
 * groups scale 1). *padded views *bytes (one malloc; the caller frees it
 * after the upload) and host's unpadded scale (FP8). Numerics: exact
 * (cuda_subtile.cu banner). Errors: DSV4_EINVAL (sizes do not match the
 * shape), DSV4_EUNSUPPORTED (FP4 in % 32), DSV4_ENOMEM. */
int cu_subtile_pad(const dsv4_linear *host, dsv4_linear *padded, void **bytes, dsv4_err *err);

/* y [n][out] = the linear of x [n][in] (F32, device) with a weight uploaded
 * padded (cw->out >= out, cw->in >= in): x is copied into zero-padded rows,
 * dsv4_cuda_linear runs at the padded shape, the first `out` columns of
 * each row are copied to y. Stream-ordered scratch (graph-capturable). */
int cu_subtile_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *cw, int64_t out, int64_t in, const float *x,
                      int64_t n, float *y, dsv4_err *err);

/* Routed experts with BF16 weights (spec/MODEL.md §3.5), fp32 math as the
 * CPU reference (no activation quantisation for unquantised weights):
 * for each row t and slot j with expert e = ids[t][j] in [0, n_exp):
 *   h = w[t][j] · silu(min(g, limit)) · clamp(u, ±limit), g = W1[e]·x[t], u = W3[e]·x[t]
 *   y[t] = Σ_j W2[e]·h, summed in ascending expert order (as the CPU's loop);
 * slots with ids outside [0, n_exp) add nothing. w1p/w3p/w2p: device arrays of
 * n_exp device pointers (BF16 [F][d], [F][d], [d][F]). x [T][d], ids/wts
 * [T][k] (k <= 16), y [T][d], all device. Errors: DSV4_EUNSUPPORTED (k > 16),
 * DSV4_EBACKEND. */
int cu_moe_generic_bf16(dsv4_cuda_ctx *c, const void *const *w1p, const void *const *w3p, const void *const *w2p,
                        int n_exp, const float *x, int64_t T, int64_t d, int64_t F, const int32_t *ids,
                        const float *wts, int k, float limit, float *y, dsv4_err *err);

#endif
