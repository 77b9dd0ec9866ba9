/*
 * dsv4_cuda.h — the CUDA backend's C interface: device context, device
 * buffers, upload of stored (quantised) weights, and the ops that dominate a
 * decode step (spec/PERFORMANCE.md §6): FP8 block-scaled linears (W8A8), the
 * FP4 routed-expert MoE over the tokens of a step, BF16 linears, RMSNorm.
 *
 * Why a C interface over CUDA C++: the engine is C11; every function here is
 * callable from C and returns a dsv4 status (never exits). Kernels live in
 * the .cu files beside this header.
 *
 * Conventions
 *  - Activations on the device are fp32, row-major [n, dim] (n = tokens of
 *    the step). Rounding to bf16 where the official reference stores bf16 is
 *    asked for with DSV4_CUDA_OUT_BF16 (values stay fp32 in memory but are
 *    exactly bf16-representable), so one dtype flows between ops.
 *  - All ops are enqueued on the context's stream and are asynchronous;
 *    errors from a launch are reported by the call, errors inside a kernel by
 *    the next dsv4_cuda_sync(). No op synchronises the host, so every op can
 *    be captured in a CUDA graph once its workspace is reserved.
 *  - Requires compute capability >= 8.9 (FP8 tensor-core mma.sync); Hopper
 *    (sm_90) is the target, sm_100/sm_120/sm_121 build and should run.
 */
#ifndef DSV4_CUDA_H
#define DSV4_CUDA_H

#include "dsv4/common.h"
#include "model/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_cuda_ctx dsv4_cuda_ctx;

/* Output flags of the ops. */
enum {
    DSV4_CUDA_OUT_BF16 = 1, /* round each output element to the nearest bf16 (RNE) */
    DSV4_CUDA_MOE_BF16 = 2, /* dsv4_cuda_moe: bf16 g, u, h and expert outputs (official) */
};

/*
 * dsv4_cuda_ctx_create — open GPU `device`, create a stream and cuBLAS /
 * cuBLASLt handles. Fails with DSV4_EBACKEND if there is no such device or
 * the driver fails, DSV4_EUNSUPPORTED below compute capability 8.9.
 */
int dsv4_cuda_ctx_create(int device, dsv4_cuda_ctx **out, dsv4_err *err);
void dsv4_cuda_ctx_free(dsv4_cuda_ctx *ctx);

/* The context's cudaStream_t (as void *, so this header needs no CUDA headers). */
void *dsv4_cuda_stream(dsv4_cuda_ctx *ctx);
/* Device name and multiprocessor count, for reports. */
const char *dsv4_cuda_device_name(const dsv4_cuda_ctx *ctx);
int dsv4_cuda_sm_count(const dsv4_cuda_ctx *ctx);

/* Wait for the stream; reports any asynchronous kernel error (DSV4_EBACKEND). */
int dsv4_cuda_sync(dsv4_cuda_ctx *ctx, dsv4_err *err);

/* Device memory. dsv4_cuda_free(NULL) is a no-op. Sizes in bytes. */
int dsv4_cuda_alloc(dsv4_cuda_ctx *ctx, size_t bytes, void **out, dsv4_err *err);
void dsv4_cuda_free(dsv4_cuda_ctx *ctx, void *p);
/* Synchronous copies host -> device and device -> host (stream-ordered, then waits). */
int dsv4_cuda_upload(dsv4_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, dsv4_err *err);
int dsv4_cuda_download(dsv4_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, dsv4_err *err);

/*
 * dsv4_cuda_workspace_reserve — grow the context's scratch area to at least
 * `bytes` (ops grow it on demand outside graph capture; during capture an op
 * that needs more than is reserved fails with DSV4_ERANGE). Stream-ordered
 * (cudaMallocAsync from the device pool): no host synchronisation, safe in the
 * middle of a tensor-parallel step. The area at least doubles when it grows;
 * earlier areas stay allocated until the context is freed, because graphs
 * captured before the growth still use them (cuda_ctx.cu says why).
 */
int dsv4_cuda_workspace_reserve(dsv4_cuda_ctx *ctx, size_t bytes, dsv4_err *err);

/* ------------------------------------------------------------------ weights */

typedef enum dsv4_cuda_wkind {
    DSV4_CUDA_W_NONE = 0,
    DSV4_CUDA_W_BF16, /* w bf16 [out, in]                                            */
    DSV4_CUDA_W_FP8,  /* w e4m3 [out, in] as stored; scale e8m0 [out/128, in/128]    */
    DSV4_CUDA_W_FP4,  /* w e2m1 repacked into the kernel's tile order (below);
                         scale e8m0 repacked alike                                    */
} dsv4_cuda_wkind;

/*
 * A linear weight resident on the device. For FP4 the bytes are not in the
 * checkpoint order: they are repacked at upload into 16-row x 128-column
 * tiles laid out as the tensor-core fragments read them (cuda_weights.cu), so
 * every lane of a warp streams 32 contiguous bytes per tile.
 */
typedef struct dsv4_cuda_weight {
    dsv4_cuda_wkind kind;
    int64_t out, in;  /* logical dims (in counts values, not bytes)     */
    void *w;          /* device                                           */
    void *scale;      /* device; NULL for BF16                            */
    size_t w_bytes, scale_bytes;
} dsv4_cuda_weight;

/*
 * dsv4_cuda_weight_upload — copy a stored linear (model/tensor.h
 * dsv4_linear; spec/MODEL.md §2.2-2.3) to the device:
 *   F8_E4M3 w [out,in] + F8_E8M0 scale [ceil(out/128), ceil(in/128)] -> FP8
 *   I8 w [out,in/2] (FP4 pairs, low nibble first) + F8_E8M0 [out,in/32] -> FP4
 *   BF16 w [out,in] (no scale) -> BF16
 * Constraints (all hold for Flash): FP8/FP4 need out % 16 == 0 and
 * in % 128 == 0 (FP8 also out % 128 == 0); BF16 needs in % 8 == 0.
 * Errors: DSV4_EINVAL (shape/dtype/size mismatch, message names the tensor),
 * DSV4_EUNSUPPORTED (other dtypes or shapes), DSV4_ENOMEM / DSV4_EBACKEND.
 */
int dsv4_cuda_weight_upload(dsv4_cuda_ctx *ctx, const dsv4_linear *lin, dsv4_cuda_weight *out,
                            dsv4_err *err);
void dsv4_cuda_weight_free(dsv4_cuda_ctx *ctx, dsv4_cuda_weight *w);

/*
 * Routed experts of one MoE layer, FP4 (spec/MODEL.md §2.2 `ffn.experts.E`):
 * per expert w1 (gate) and w3 (up) [d_ff, d_model], w2 (down) [d_model, d_ff],
 * each repacked as for DSV4_CUDA_W_FP4 and stored expert after expert.
 */
typedef struct dsv4_cuda_experts {
    int n_experts;
    int64_t d_model, d_ff; /* 4096, 2048 for Flash */
    void *w1, *w3, *w2;    /* device, expert-major */
    void *s1, *s3, *s2;
    size_t bytes;          /* total device bytes  */
} dsv4_cuda_experts;

/*
 * dsv4_cuda_experts_upload — upload `n_experts` experts; w1[e], w3[e], w2[e]
 * are the stored I8 + F8_E8M0 views of expert e. All experts must share
 * shapes; d_ff and d_model must be multiples of 128.
 * Errors as dsv4_cuda_weight_upload, naming the expert and tensor.
 */
int dsv4_cuda_experts_upload(dsv4_cuda_ctx *ctx, int n_experts, const dsv4_linear *w1,
                             const dsv4_linear *w3, const dsv4_linear *w2,
                             dsv4_cuda_experts *out, dsv4_err *err);
void dsv4_cuda_experts_free(dsv4_cuda_ctx *ctx, dsv4_cuda_experts *e);

/* ---------------------------------------------------------------------- ops */

/*
 * dsv4_cuda_linear — y[n, out] = x[n, in] · Wᵀ (device fp32 x, y; y must not
 * alias x). Numerics follow spec/MODEL.md §2.4:
 *   FP8: W8A8. Each row of x is quantised to E4M3 in blocks of 128 with a
 *        power-of-two scale 2^ceil(log2(max(amax,1e-4)/448)) (RNE, ±448);
 *        FP8 x FP8 products on the tensor cores, fp32 accumulation per
 *        128-block, scaled by weight-block and activation-block scales.
 *   FP4: the same W8A8 activation path against E2M1 weights (per-32 scales).
 *   BF16: fp32 x against bf16 weights, fp32 accumulation (the official
 *        compressor / router / head upcast; n <= 4 exact, larger n through
 *        cuBLAS with x split into bf16 hi + lo parts: ~2^-17 relative).
 * flags: DSV4_CUDA_OUT_BF16 rounds y to bf16 (the official linear output).
 * Errors: DSV4_EINVAL (n < 0, NULL pointers, unknown kind), DSV4_ERANGE
 * (workspace too small during graph capture), DSV4_EBACKEND (launch/cuBLAS).
 */
int dsv4_cuda_linear(dsv4_cuda_ctx *ctx, const dsv4_cuda_weight *w, const float *x, int n,
                     float *y, int flags, dsv4_err *err);

/*
 * dsv4_cuda_linear_swiglu_add — y [n][out] += W·h, h = silu(min(g, limit))·
 * clamp(u, ±limit) (g, u [n][in] F32 device; the shared expert's w2,
 * spec/MODEL.md §3.5), for an FP8 weight and n <= 8: h is made inside the
 * activation quantiser and the add inside the GEMV, the same bits as
 * swiglu, dsv4_cuda_linear and an add. flags: as dsv4_cuda_linear (applied
 * to W·h before the add). DSV4_EUNSUPPORTED (nothing launched) for other
 * weights or more rows: compose the ops. DSV4_EINVAL on NULL arguments.
 */
int dsv4_cuda_linear_swiglu_add(dsv4_cuda_ctx *ctx, const dsv4_cuda_weight *w, const float *g, const float *u,
                                float limit, int n, float *y, int flags, dsv4_err *err);

/*
 * dsv4_cuda_linear_q — dsv4_cuda_linear for FP8/FP4 weights from activations
 * already quantised by dsv4_cuda_act_quant (xq [n, in] E4M3, xs [n, in/128]),
 * so linears that share an input (wq_a and wkv; shared w1, w3 and the routed
 * experts) quantise it once. Same result, bit for bit, as dsv4_cuda_linear.
 * Errors: DSV4_EINVAL (BF16 weight, NULL), DSV4_EBACKEND.
 */
int dsv4_cuda_linear_q(dsv4_cuda_ctx *ctx, const dsv4_cuda_weight *w, const uint8_t *xq,
                       const float *xs, int n, float *y, int flags, dsv4_err *err);

/*
 * dsv4_cuda_linear_group — y[i] = x · w[i]ᵀ for nw weights that read the same
 * input (wq_a and wkv; shared w1 and w3), in one launch when all are FP8 with
 * the same in-dim and n <= 8 (x quantised once); when all are BF16 with the
 * same in-dim, up to 8 weights per GEMV launch (n <= 4) or x split into
 * bf16 hi + lo once (more rows; DSV4_CUDA_BF16_GEMV=0/1: one by one);
 * otherwise one dsv4_cuda_linear per weight. Same results as separate
 * dsv4_cuda_linear calls. Errors as dsv4_cuda_linear.
 */
int dsv4_cuda_linear_group(dsv4_cuda_ctx *ctx, int nw, const dsv4_cuda_weight *const *w,
                           const float *x, int n, float *const *y, int flags, dsv4_err *err);

/*
 * dsv4_cuda_act_quant — the W8A8 activation quantiser on its own (exposed for
 * tests and for fusing): x [n, dim] fp32 -> q [n, dim] E4M3 bytes and
 * s [n, dim/128] fp32 power-of-two scales (x ≈ q · s). dim % 128 == 0.
 */
int dsv4_cuda_act_quant(dsv4_cuda_ctx *ctx, const float *x, int n, int dim, uint8_t *q, float *s,
                        dsv4_err *err);

/*
 * dsv4_cuda_rmsnorm — y[r] = x[r] · (mean(x[r]²) + eps)^(-1/2) · w, per row of
 * x [n, dim] (fp32 math, one rounding at the end when flags has
 * DSV4_CUDA_OUT_BF16: spec/MODEL.md §3.10 "RMSNorm"). w: device bf16 [dim]
 * or NULL for the unweighted norm (§3.2 step 2, §3.4.1 step 3). y may alias x.
 */
int dsv4_cuda_rmsnorm(dsv4_cuda_ctx *ctx, const float *x, const uint16_t *w, int n, int dim,
                      float eps, float *y, int flags, dsv4_err *err);

/*
 * dsv4_cuda_moe — routed experts of one MoE layer for the n tokens of a step
 * (spec/MODEL.md §3.5), grouped: every selected expert's weights are read
 * once per step for all the tokens that chose it.
 *   x    [n, d_model] fp32 (the ffn_norm output)
 *   ids  [n, topk] int32 expert ids in [0, n_experts) (out-of-range ids are
 *        skipped); wts [n, topk] fp32 routing weights (already × 1.5)
 *   shared [n, d_model] fp32 or NULL: the shared expert's output, added in
 *   y    [n, d_model] fp32 = Σ_k out_{E_k} (+ shared), fp32 sum in ascending
 *        expert id (the CPU reference's order); DSV4_CUDA_OUT_BF16 rounds the sum.
 * Per expert: g = x·w1ᵀ, u = x·w3ᵀ (W8A8), h = silu(min(g,10)) · clamp(u,±10)
 * · w_k, out = h·w2ᵀ (W8A8 again), all fp32 like the CPU reference; with
 * DSV4_CUDA_MOE_BF16, g, u, h and out are rounded to bf16 (the official code).
 * Errors: DSV4_EINVAL (shapes, topk > 16, NULL), DSV4_ERANGE, DSV4_EBACKEND.
 */
int dsv4_cuda_moe(dsv4_cuda_ctx *ctx, const dsv4_cuda_experts *ex, const float *x, int n,
                  const int32_t *ids, const float *wts, int topk, const float *shared, float *y,
                  int flags, dsv4_err *err);

/*
 * dsv4_cuda_moe_q — dsv4_cuda_moe with x already quantised (xq [n, d_model]
 * E4M3, xs [n, d_model/128] from dsv4_cuda_act_quant); x is still passed
 * (fp32) for the variants that quantise in the kernel. Same result as
 * dsv4_cuda_moe.
 */
int dsv4_cuda_moe_q(dsv4_cuda_ctx *ctx, const dsv4_cuda_experts *ex, const float *x,
                    const uint8_t *xq, const float *xs, int n, const int32_t *ids,
                    const float *wts, int topk, const float *shared, float *y, int flags,
                    dsv4_err *err);

/* ---------------------------------------------------------------- measuring */

/*
 * dsv4_cuda_measure_hbm — the ceilings of spec/PERFORMANCE.md §1 on this GPU:
 * a streaming read of `bytes` (GB/s of bytes read) and a device-to-device copy
 * (GB/s counting read + write). Allocates 2 x bytes temporarily.
 */
int dsv4_cuda_measure_hbm(dsv4_cuda_ctx *ctx, size_t bytes, double *read_gbs, double *copy_gbs,
                          dsv4_err *err);

/*
 * dsv4_cuda_read_bytes — enqueue one streaming read of `bytes` (multiple of
 * 16) at device pointer p: the speed-of-light reference for a kernel that
 * must read the same bytes (benchmarks only).
 */
/* Open (on=1) or close (0) the profiler's collection range (cudaProfilerStart /
 * Stop: ncu / nsys --profile-from-start off). For benchmarks; errors ignored. */
void dsv4_cuda_profiler(int on);
int dsv4_cuda_read_bytes(dsv4_cuda_ctx *ctx, const void *p, size_t bytes, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
