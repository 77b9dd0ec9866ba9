/*
 * cuda_internal.cuh — what the backend's .cu files share: the context
 * struct, error helpers (CUDA / cuBLAS status -> dsv4_err, never exit) and
 * the device-side number-format helpers (spec/MODEL.md §2.3).
 */
#ifndef DSV4_CUDA_INTERNAL_CUH
#define DSV4_CUDA_INTERNAL_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/dsv4_cuda.h"

#define CU_ARENA_MAX 256 /* live arena entries */
#define CU_LT_CACHE_MAX 256 /* cuBLASLt algorithms kept (cu_lt_algo) */

/* A cuBLASLt problem but for its row count n (cu_lt_algo): y (dtype, R x n, ld ldd) = op(A) · B, B btype
 * K x n (ld ldb); batch > 1: strided batches (B, D strides sb, sd elements; A's layout the caller's). */
typedef struct cu_lt_shape {
    int kind; /* CU_LT_* */
    int R, K;
    cudaDataType_t btype, dtype;
    int64_t ldb, ldd;
    int batch;
    int64_t sb, sd;
} cu_lt_shape;
typedef struct cu_lt_entry {
    cu_lt_shape sh;
    int nb; /* the row bucket */
    cublasLtMatmulAlgo_t algo;
} cu_lt_entry;
enum { CU_LT_FP8_BLOCK = 1, CU_LT_BF16 = 2, CU_LT_ROWS = 3 };

struct dsv4_cuda_ctx {
    int device;
    int pdl; /* programmatic dependent launch (sm_90+): see cu_launch */
    int fuseq_max; /* rows up to which linears quantise x inside the GEMV */
    int moe_persistent; /* DSV4_CUDA_MOE_PERSISTENT: one-wave expert kernels (k_moe_fp4) */
    int moe_fq;         /* DSV4_CUDA_MOE_FQ: quantise x / H inside the expert kernels */
    int moe_minb3;      /* DSV4_CUDA_MOE_MINB3: expert kernels capped for 3 blocks / SM */
    cudaStream_t stream;
    cublasHandle_t cublas;
    cublasLtHandle_t cublaslt;
    void *blas_ws;   /* cuBLAS workspace set with cublasSetWorkspace (cuda_ctx.cu), or NULL */
    size_t blas_ws_bytes;
    int bf16_mode;   /* DSV4_CUDA_BF16_GEMV: 0 old GEMV one by one, 1 new GEMV one by one, 2 grouped (cuda_dense.cu) */
    cudaDeviceProp prop;
    void *ws;        /* scratch area (dsv4_cuda_workspace_reserve) */
    size_t ws_bytes;
    void **ws_old;   /* earlier areas, kept until the context is freed: captured graphs use them */
    int n_ws_old;
    /* Scratch arena (cu_arena_alloc): one area, bump-allocated, entries popped from the top when freed */
    int ar_mode;     /* 1: arena on; 0: off (DSV4_CUDA_SCRATCH_MB=0: pool + zeroing, the old behaviour) */
    int ar_poison;   /* DSV4_CUDA_SCRATCH_POISON: fill every scratch allocation with 0xff (NaN) */
    unsigned char *ar_base;
    size_t ar_cap, ar_top, ar_peak;
    int ar_n, ar_fallbacks;
    struct { size_t off, end; int live; } ar_ent[CU_ARENA_MAX];
    /* cuBLASLt algorithms per power-of-two row bucket (cu_lt_algo, cuda_fp8_lt.cu) */
    int lt_bucket;   /* DSV4_CUDA_LT_BUCKET: 1 (default) bucketed + cached; 0 as before (see cu_lt_algo) */
    cu_lt_entry lt_cache[CU_LT_CACHE_MAX];
    int n_lt_cache;
};

/* The backend does not depend on dsv4core's err.c (static-library order):
 * it formats its own messages into the same record. */
static inline int cu_err(dsv4_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int cu_err(dsv4_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

/* Check a CUDA runtime call; on failure fill err and return from the caller. */
#define CU_TRY(call, err, what)                                                              \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return cu_err((err), DSV4_EBACKEND, "cuda: %s: %s (%s)", (what),                 \
                          cudaGetErrorString(e_), cudaGetErrorName(e_));                     \
    } while (0)

/* After a kernel launch: configuration errors show up here. */
#define CU_LAUNCHED(err, what) CU_TRY(cudaGetLastError(), err, what)

#define CUBLAS_TRY(call, err, what)                                                          \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return cu_err((err), DSV4_EBACKEND, "cublas: %s: %s", (what),                    \
                          cublasGetStatusString(s_));                                        \
    } while (0)

/* Scratch of at least `bytes`, 256-byte aligned; grows outside graph capture. */
int cu_workspace(dsv4_cuda_ctx *ctx, size_t bytes, void **out, dsv4_err *err);

static inline size_t cu_align(size_t x) { return (x + 255) & ~(size_t)255; }

/*
 * Stream-ordered scratch with undefined contents (cuda_ctx.cu). Why: a
 * decode layer allocated ~25 buffers; each cudaMallocAsync + memset +
 * cudaFreeAsync became three nodes of the captured graph, about half the
 * graph's nodes (issue 7). The arena is one area reserved outside capture
 * (cu_arena_reserve, DSV4_CUDA_SCRATCH_MB, default 512); an allocation bumps
 * its top, a free pops freed entries off the top (any free order works, the
 * space comes back when everything above it is freed). Reuse is ordered by
 * the context's one stream, as cudaFreeAsync's is. A request that does not
 * fit (prefill-sized) comes from the device pool, as before.
 */
int cu_arena_reserve(dsv4_cuda_ctx *c, dsv4_err *err);
int cu_arena_alloc(dsv4_cuda_ctx *c, size_t bytes, void **out, dsv4_err *err);
void cu_arena_free(dsv4_cuda_ctx *c, void *p);
/* 1 if p lies in the arena (a pointer from cu_arena_alloc that did not fall back). */
static inline int cu_arena_owns(const dsv4_cuda_ctx *c, const void *p) {
    return c->ar_base && (const unsigned char *)p >= c->ar_base && (const unsigned char *)p < c->ar_base + c->ar_cap;
}

/* ------------------------------------------------------------ device helpers */

/* E8M0 scale byte -> fp32 2^(e-127); e = 0 is 2^-127, a subnormal (§2.3). */
__device__ __forceinline__ float e8m0_to_f32(uint32_t e) {
    return e ? __uint_as_float(e << 23) : __uint_as_float(0x00400000u);
}

/* Smallest power of two >= r, for normal positive r (W8A8 scale, §2.4). */
__device__ __forceinline__ float pow2_ceil(float r) {
    uint32_t b = __float_as_uint(r);
    uint32_t e = (b >> 23) & 0xffu;
    if (b & 0x7fffffu) e += 1;
    return __uint_as_float(e << 23);
}

/* The shared expert's clamped SwiGLU of one element (§3.5): silu(min(g, limit))·clamp(u, ±limit), with
 * expf and an IEEE division (the CPU's expression). One definition for k_swiglu and k_act_quant, which
 * fuses it (same bits). */
__device__ __forceinline__ float cu_swiglu1(float g, float u, float limit) {
    const float gv = fminf(g, limit), uv = fminf(fmaxf(u, -limit), limit);
    return gv / (1.0f + expf(-gv)) * uv;
}

/* Internal flag of the small-n FP8 GEMV (k_fp8_small), above the public DSV4_CUDA_* output flags: its
 * output is added to y's old value. */
enum { CU_LIN_ADD_OUT = 1 << 9 };

__device__ __forceinline__ float round_bf16(float v) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

/*
 * Four packed E2M1 values per byte-pair -> E4M3 bytes, by moving bits: an
 * E2M1 nibble s.e1e0.m placed as s.0 e1e0.m00 in E4M3 has the same sign and
 * is exactly 2^-6 times the E2M1 value (normals and the 0.5 subnormal alike),
 * so the scale absorbs 2^6. `w` holds 8 nibbles (4 bytes); lo -> the 4
 * even columns, hi -> the 4 odd columns, each in byte order.
 */
__device__ __forceinline__ void fp4x8_to_e4m3(uint32_t w, uint32_t &lo, uint32_t &hi) {
    lo = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
    hi = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
}

/*
 * D += A·B on the tensor cores, m16n8k32, E4M3 x E4M3 -> fp32 (sm_89+).
 * A 16x32 row-major (4 regs), B 32x8 column-major (2 regs), fragment
 * layout of the PTX ISA "mma.m16n8k32": lane = 4·g + t holds A rows g and
 * g+8 at k = 4t..4t+3 (regs 0,1) and 16+4t.. (regs 2,3), B column g at the
 * same k, and D rows g, g+8 at columns 2t, 2t+1.
 */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    /* Unreachable: dsv4_cuda_ctx_create refuses devices below 8.9. */
    (void)a0; (void)a1; (void)a2; (void)a3; (void)b0; (void)b1;
    d[0] = d[1] = d[2] = d[3] = __int_as_float(0x7fc00000);
#endif
}

/*
 * The same 8 E2M1 values -> four FP16x2 fragment registers for the native
 * FP16 mma (m16n8k16). Why: on sm_90 the FP8 mma.sync above is not native;
 * ptxas lowers each to 2 FP16 HMMAs, E4M3->F16 conversions and 4 FADDs that
 * add the (zero) C afterwards (bench/results/
 * 2026-12-01-moe-decode-kernels-h200.md). Doing the conversion here, once
 * per fragment, and calling the FP16 mma directly keeps the conversions and
 * drops the FADDs. Route: the E4M3 bit move above (5 ops), then one
 * cvt.f16x2.e4m3x2 per pair: 9 ops per 8 values. A direct E2M1 -> FP16 bit
 * move (s<<15 | e1e0m<<9 is exactly 2^-14 x the value) needs ~16 ops in
 * this nibble order (sign and magnitude move by different distances):
 * measured statically, more instructions per chunk, so not used.
 * Values are 2^-6 x the E2M1 value, as fp4x8_to_e4m3's. Order (w byte j =
 * column 2j in the low nibble, 2j+1 in the high one): f[0] = columns (0, 2),
 * f[1] = (1, 3), f[2] = (4, 6), f[3] = (5, 7), low half first: the k split
 * in which ptxas lowers the FP8 m16n8k32 into two k16 HMMAs (f[0], f[1]
 * feed the first as a0/a2, f[2], f[3] the second), so the HMMA inputs are
 * the FP8 path's and the result is the same bit for bit.
 */
__device__ __forceinline__ void fp4x8_to_f16(uint32_t w, uint32_t (&f)[4]) {
    uint32_t lo, hi;
    fp4x8_to_e4m3(w, lo, hi);
    asm("{.reg .b16 l, h;\n"
        " mov.b32 {l, h}, %4;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %2, h;\n"
        " mov.b32 {l, h}, %5;\n cvt.rn.f16x2.e4m3x2 %1, l;\n cvt.rn.f16x2.e4m3x2 %3, h;}\n"
        : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
        : "r"(lo), "r"(hi));
}

/*
 * Eight E4M3 bytes (x: columns 0..3, y: 4..7) -> the four FP16x2 B registers
 * in fp4x8_to_f16's column order (exact: every E4M3 value is an fp16).
 */
__device__ __forceinline__ void e4m3x8_to_f16(uint32_t x, uint32_t y, uint32_t (&f)[4]) {
    const uint32_t p0 = __byte_perm(x, 0, 0x3120), p1 = __byte_perm(y, 0, 0x3120);
    asm("{.reg .b16 l, h;\n"
        " mov.b32 {l, h}, %4;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n"
        " mov.b32 {l, h}, %5;\n cvt.rn.f16x2.e4m3x2 %2, l;\n cvt.rn.f16x2.e4m3x2 %3, h;}\n"
        : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
        : "r"(p0), "r"(p1));
}

/* D += A·B, m16n8k16, FP16 x FP16 -> fp32 (native on sm_80+). Fragments as
 * in the PTX ISA: lane 4·g + t holds A rows g, g+8 at k = 2t, 2t+1 (a0, a1)
 * and 2t+8, 2t+9 (a2, a3), B column g at the same k (b0, b1). */
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Four E4M3 bytes -> two FP16x2: lo = bytes (0, 1), hi = bytes (2, 3). */
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t &lo, uint32_t &hi) {
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
}

/*
 * d = A·B from zero with mma_e4m3's fragments, through the FP16 mma: the
 * k split ptxas uses for mma_e4m3 on sm_90 (bytes 0-1 of every register,
 * then bytes 2-3), without the FADDs it adds for C. Same result bit for
 * bit as mma_e4m3 from a zero d (a -0 sum may come out -0 instead of +0).
 */
__device__ __forceinline__ void mma_e4m3_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    uint32_t f[6][2];
    e4m3x4_to_f16(a0, f[0][0], f[0][1]);
    e4m3x4_to_f16(a1, f[1][0], f[1][1]);
    e4m3x4_to_f16(a2, f[2][0], f[2][1]);
    e4m3x4_to_f16(a3, f[3][0], f[3][1]);
    e4m3x4_to_f16(b0, f[4][0], f[4][1]);
    e4m3x4_to_f16(b1, f[5][0], f[5][1]);
    mma_f16(d, f[0][0], f[1][0], f[2][0], f[3][0], f[4][0], f[5][0]);
    mma_f16(d, f[0][1], f[1][1], f[2][1], f[3][1], f[4][1], f[5][1]);
}

/* Streaming 16-byte weight load: read once per step, keep it out of L1. */
__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/*
 * Programmatic dependent launch (PDL, sm_90+). Why: at decode a layer is
 * ~20 short kernels and the gap between two of them (launch, ramp-up, the
 * last loads draining) costs as much as streaming megabytes of weights
 * (spec/PERFORMANCE.md §6.2). With PDL a kernel is launched while its
 * predecessor still runs: it issues its first weight loads (weights never
 * depend on earlier kernels), then pdl_wait() blocks until the predecessor
 * has finished and its writes are visible. Rules every kernel here keeps:
 * pdl_trigger() at entry (lets the successor launch), and pdl_wait() in
 * every block before it reads activations or writes anything. Both are
 * no-ops when the kernel was launched without the attribute.
 */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* Launch `k` on the context's stream, with PDL where the device has it. */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch(dsv4_cuda_ctx *c, void (*k)(KArgs...), dim3 grid, dim3 block,
                                    size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, ((KArgs)args)...);
}

/*
 * Fused W8A8 activation quantisation (spec/MODEL.md §2.4) for the mma
 * B fragments: the 4 lanes of a quad (same g) hold the 128 columns of one
 * block between them, 32 each; v[] are this lane's 32 values. Returns the
 * block scale (identical in the quad) and the E4M3 bytes packed 4 per
 * word in the order of v[]. Every lane of the warp must call it.
 */
/* Four fp32 -> four E4M3 bytes (RNE, saturating at ±448), first value in the
 * low byte; two paired conversions (cvt ...e4m3x2). */
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

/* `valid` false: the quad's row does not exist; v must be zeros and the
 * conversions are skipped (q = 0). */
__device__ __forceinline__ float quant_quad(const float (&v)[32], uint32_t (&q)[8], bool valid) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    amax = fmaxf(amax, 1e-4f);
    const float sc = pow2_ceil(amax / 448.0f);
    const float inv = 1.0f / sc;
    if (valid) {
#pragma unroll
        for (int w = 0; w < 8; w++)
            q[w] = pack_e4m3x4(v[4 * w] * inv, v[4 * w + 1] * inv, v[4 * w + 2] * inv, v[4 * w + 3] * inv);
    } else {
#pragma unroll
        for (int w = 0; w < 8; w++) q[w] = 0;
    }
    return sc;
}

/* Internal launchers shared between files (cuda_linear.cu). */
/* u != NULL: quantise h = cu_swiglu1(x, u, limit) instead of x (the shared expert's w2 input). */
int cu_act_quant(dsv4_cuda_ctx *ctx, const float *x, int n, int dim, uint8_t *q, float *s,
                 dsv4_err *err, const float *u = nullptr, float limit = 0.f);
/* FP4 GEMV over a token list (cuda_moe.cu uses it for dense FP4 linears too). */
int cu_fp4_linear(dsv4_cuda_ctx *ctx, const dsv4_cuda_weight *w, const float *x,
                  const uint8_t *xq, const float *xs, int n, float *y, int flags, dsv4_err *err);
/* Default rows up to which the dense linears quantise activations inside the
 * GEMV (one launch) rather than in a separate act_quant pass; the
 * environment variable DSV4_CUDA_FUSEQ_MAX overrides it (for measuring). */
/*
 * cu_lt_algo — the cuBLASLt algorithm for an n-row problem (cuda_fp8_lt.cu).
 * op / la: the caller's matmul descriptor (scale modes and pointers set) and
 * weight layout; sh: the rest of the problem (B, C = D layouts) but n. The
 * heuristic runs once per (shape, bucket), bucket = n rounded
 * up to a power of two (>= 16), and its first answer serves every n of the
 * bucket. Why: cuBLAS picks, and on first use prepares, a kernel per exact
 * problem size, and that cost (15-20 ms over a 24-layer prefill chunk on H200)
 * landed on every prompt whose last chunk had a row count not seen before
 * (bench/results/2026-12-01-warmup-prefill-h200.md); with buckets the start-up
 * warm-up can touch every one. DSV4_CUDA_LT_BUCKET=0: as before (the FP8
 * path asks the heuristic for the exact n on every call, BF16 linears go
 * through cublasGemmEx). Returns DSV4_OK or DSV4_EUNSUPPORTED (no algorithm:
 * the caller falls back).
 */
/* y (sh->dtype, R x n) = Aᵀ·B + beta·y through cuBLASLt with the bucket's algorithm (cu_lt_algo), fp32
 * compute, on the context's cuBLAS workspace: A is the weight, sh->btype, K x R column-major with leading
 * dimension lda (batch stride sa when sh->batch > 1); B as sh says. DSV4_OK, or DSV4_EUNSUPPORTED with
 * nothing launched (no workspace, DSV4_CUDA_LT_BUCKET=0, no algorithm, the bucket's algorithm refuses this
 * n): the caller uses the plain cuBLAS call. */
int cu_lt_gemm(dsv4_cuda_ctx *c, const cu_lt_shape *sh, int64_t lda, int64_t sa, const void *A, const void *B, int n,
               float beta, float *y);
/* B (K x n) and D (R x n) layouts of sh for n rows. DSV4_OK or DSV4_EUNSUPPORTED. */
int cu_lt_layouts(const cu_lt_shape *sh, int n, cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *ld);
int cu_lt_algo(dsv4_cuda_ctx *c, const cu_lt_shape *sh, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, int n,
               size_t ws_bytes, cublasLtMatmulAlgo_t *algo);

#define CU_FUSED_QUANT_MAX 0 /* measured: fusing was slower (bench/results) */
/* The decode fusions of hc_post into the next hc_pre_norm (hc_post_pre_norm) and of the shared expert's
 * swiglu + add into its w2 (linear_swiglu_add): on by default once checked and measured on a GPU
 * (DSV4_CUDA_HC_POSTFUSE / DSV4_CUDA_SHARED_FUSE override). */
#define CU_HC_POSTFUSE_DEFAULT 0
#define CU_SHARED_FUSE_DEFAULT 0

#endif
