/*
 * cuda_kvrow.cuh — stored KV rows in the --kv-cache-dtype record formats on
 * the GPU (issue 7 + the state pool): the device side of src/model/kvcodec.h.
 *
 * Why here and not in each kernel: the window ring, the main compressed rows
 * and (in attention) the batch's own rows are all read and written as the
 * same record, so one set of loaders / one encoder keeps the three users
 * byte-compatible with the CPU codec (the reference):
 *   F32         dim x f32
 *   BF16        dim x bf16 (RNE)
 *   FP8_DS_MLA  [nope E4M3 (blocks of 64, power-of-two scale)][rope BF16]
 *               [one UE8M0 byte per block, zero-padded to 8] (spec/MODEL.md §4.3)
 * Loaders return dims of a row as floats (4, 2 or 1 at a time); the encoder is
 * block-cooperative. FP8 codes are decoded by moving bits: code s.eeee.mmm
 * placed as float bits s.0eeee.mmm0... is the code's value times 2^-120
 * (normals and subnormals alike: needs denormals kept, i.e. no -ftz), so a
 * multiply by 2^120 and one by the block scale 2^(b-127) give the decoded
 * value exactly (the CPU's ldexpf(e4m3, b-127)). Code 0x7f (NaN) decodes to
 * 480·scale instead; the encoder never writes it.
 */
#ifndef DSV4_CUDA_KVROW_CUH
#define DSV4_CUDA_KVROW_CUH

#include "backend/cuda/cuda_be_internal.cuh"
#include "model/kvcodec.h"

/* A row store's format (host): t, dim, rope (FP8 only), bytes per row, nope dims,
 * offset of the scale bytes (FP8). */
typedef struct cu_kvfmt {
    int t;
    int dim, rope, nope, scoff;
    int64_t bytes;
} cu_kvfmt;

/*
 * cu_kv_fmt_of — recognise a KV row buffer of `dim`-value rows (rows >= 0:
 * also its row count): F32/BF16 [rows][dim] or U8 [rows][fp8_ds_mla bytes].
 * Errors: DSV4_EINVAL (no such format, missing buffer), DSV4_EUNSUPPORTED
 * (an FP8 nope part that is not a multiple of 8, which the vector loads need).
 */
int cu_kv_fmt_of(const dsv4_buf *b, int64_t rows, int64_t dim, const char *what, cu_kvfmt *f, dsv4_err *err);

/* Encode `n` F32 rows x[n][dim] into dense records out[n][f->bytes] on the stream (attention's
 * batch rows as the store will hold them). */
int cu_kv_encode_rows(cudaStream_t st, const cu_kvfmt *f, const float *x, int64_t n, uint8_t *out, dsv4_err *err);

/* The launch of win_store for coded rings: cuda_be_ops.cu's win_store checks the batch (backend.h
 * contract), takes the device mirror's pos / slot / segment ends and hands non-F32 rings here;
 * this checks the ring's record format and writes the n_rows rows of kv [n_rows, dim] F32. */
int cu_kv_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const int32_t *pos,
                    const int32_t *slot, const int32_t *r1, int n_rows, dsv4_err *err);

/* ---- device loaders: row = record base (16-byte aligned for F32, 8 for the others) ---- */

__device__ __forceinline__ float kv_e4m3x(uint32_t c) { /* the E4M3 value of code c (low byte), exactly */
    return __uint_as_float(((c & 0x7fu) << 20) | ((c & 0x80u) << 24)) * 0x1p120f;
}
__device__ __forceinline__ float kv_scale(const uint8_t *row, int scoff, int d) { /* 2^(b-127) of dim d's block */
    return __uint_as_float((uint32_t)row[scoff + (d >> 6)] << 23);
}
__device__ __forceinline__ float kv_bf(uint32_t h) { return __uint_as_float(h << 16); }

/* dims 4*i4 .. 4*i4+3 */
template <int FMT>
__device__ __forceinline__ float4 kv_ld4(const uint8_t *row, int i4, int nope, int scoff) {
    if (FMT == DSV4_KV_F32) return ((const float4 *)row)[i4];
    if (FMT == DSV4_KV_BF16) {
        const uint2 w = ((const uint2 *)row)[i4];
        return make_float4(kv_bf(w.x & 0xffffu), kv_bf(w.x >> 16), kv_bf(w.y & 0xffffu), kv_bf(w.y >> 16));
    }
    const int d = 4 * i4;
    if (d < nope) {
        const uint32_t w = *(const uint32_t *)(row + d);
        const float s = kv_scale(row, scoff, d);
        return make_float4(kv_e4m3x(w) * s, kv_e4m3x(w >> 8) * s, kv_e4m3x(w >> 16) * s, kv_e4m3x(w >> 24) * s);
    }
    const uint2 w = *(const uint2 *)(row + nope + 2 * (d - nope));
    return make_float4(kv_bf(w.x & 0xffffu), kv_bf(w.x >> 16), kv_bf(w.y & 0xffffu), kv_bf(w.y >> 16));
}

/* dims k, k+1 (k even) */
template <int FMT>
__device__ __forceinline__ float2 kv_ld2(const uint8_t *row, int k, int nope, int scoff) {
    if (FMT == DSV4_KV_F32) return *(const float2 *)(row + 4 * k);
    if (FMT == DSV4_KV_BF16) {
        const uint32_t w = *(const uint32_t *)(row + 2 * k);
        return make_float2(kv_bf(w & 0xffffu), kv_bf(w >> 16));
    }
    if (k < nope) {
        const uint32_t w = *(const uint16_t *)(row + k);
        const float s = kv_scale(row, scoff, k);
        return make_float2(kv_e4m3x(w) * s, kv_e4m3x(w >> 8) * s);
    }
    const uint32_t w = *(const uint32_t *)(row + nope + 2 * (k - nope));
    return make_float2(kv_bf(w & 0xffffu), kv_bf(w >> 16));
}

/* dim k */
template <int FMT>
__device__ __forceinline__ float kv_ld1(const uint8_t *row, int k, int nope, int scoff) {
    if (FMT == DSV4_KV_F32) return ((const float *)row)[k];
    if (FMT == DSV4_KV_BF16) return kv_bf(((const uint16_t *)row)[k]);
    if (k < nope) return kv_e4m3x(row[k]) * kv_scale(row, scoff, k);
    return kv_bf(*(const uint16_t *)(row + nope + 2 * (k - nope)));
}

/* Coded rows hold values that are exact in bf16 (bf16 itself; E4M3 times a power of two, and the
 * bf16 rope dims, for fp8_ds_mla), so the tensor-core attention can feed them to a bf16 MMA as they
 * are, with no hi/lo split: the bf16 bits of dim k (kv_raw1) or of dims k, k+1 packed, k in the low
 * half (kv_raw2, k even). Not for F32 rows. */
template <int FMT>
__device__ __forceinline__ uint32_t kv_raw1(const uint8_t *row, int k, int nope, int scoff) {
    if (FMT == DSV4_KV_BF16) return ((const uint16_t *)row)[k];
    if (k < nope) return __float_as_uint(kv_e4m3x(row[k]) * kv_scale(row, scoff, k)) >> 16;
    return *(const uint16_t *)(row + nope + 2 * (k - nope));
}
template <int FMT>
__device__ __forceinline__ uint32_t kv_raw2(const uint8_t *row, int k, int nope, int scoff) {
    if (FMT == DSV4_KV_BF16) return *(const uint32_t *)(row + 2 * k);
    if (k < nope) {
        const uint32_t w = *(const uint16_t *)(row + k);
        const float s = kv_scale(row, scoff, k);
        return (__float_as_uint(kv_e4m3x(w) * s) >> 16) | (__float_as_uint(kv_e4m3x(w >> 8) * s) & 0xffff0000u);
    }
    return *(const uint32_t *)(row + nope + 2 * (k - nope));
}

/*
 * Encode x[dim] (global or shared memory) into rec: every thread of the block
 * calls it (blockDim a multiple of 32); rec must not alias x. FP8 follows
 * kvcodec.c's fp8_enc operation for operation (amax, scale
 * 2^ceil(log2(max(amax,1e-4)/448)), x/s clamped to ±448, RNE E4M3), so the
 * bytes are the CPU's.
 */
__device__ __forceinline__ void kv_encode_row(int t, const float *x, uint8_t *rec, int dim, int nope, int scoff) {
    if (t == DSV4_KV_F32) {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) ((float *)rec)[j] = x[j];
        return;
    }
    if (t == DSV4_KV_BF16) {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) ((__nv_bfloat16 *)rec)[j] = __float2bfloat16_rn(x[j]);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, rope = dim - nope;
    const int nb = (nope + 63) / 64;
    for (int b = warp; b < nb; b += nwarps) {
        const int k0 = b * 64, n = nope - k0 < 64 ? nope - k0 : 64;
        float amax = 0.f;
        for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(x[k0 + i]));
        for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float s = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
        if (lane == 0) rec[scoff + b] = (uint8_t)(__float_as_uint(s) >> 23);
        for (int i = lane; i < n; i += 32) {
            float v = x[k0 + i] / s;
            v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
            __nv_fp8_e4m3 q(v);
            rec[k0 + i] = (uint8_t)q.__x;
        }
    }
    for (int i = threadIdx.x; i < rope; i += blockDim.x)
        ((__nv_bfloat16 *)(rec + nope))[i] = __float2bfloat16_rn(x[nope + i]);
    for (int b = nb + threadIdx.x; b < (nb + 7) / 8 * 8; b += blockDim.x) rec[scoff + b] = 0;
}

#endif
