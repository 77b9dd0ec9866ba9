/*
 * Number formats of the DeepSeek-V4 checkpoint (spec/MODEL.md §2.3) and the
 * official activation quantisers (spec/MODEL.md §2.4, §3.4.2, §3.4.6).
 *
 * Why scalar, table-free C: these functions are the definition every other
 * implementation (CPU forward, CUDA kernels, the Python fixture writer) is
 * tested against, so they follow the bit-level definitions literally. The
 * tests (tests/unit/test_formats.c) enumerate every code of every format.
 *
 * Rounding is round-to-nearest-even (RNE) everywhere. All functions are pure
 * and thread-safe.
 */
#ifndef DSV4_MODEL_FORMATS_H
#define DSV4_MODEL_FORMATS_H

#include <stdint.h>

#include "dsv4/common.h"
#include "model/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- BF16 ------------------------------------------------------------- */

/* bfloat16 bits -> float (exact: the top 16 bits of the fp32 pattern). */
float dsv4_bf16_to_f32(uint16_t h);
/* float -> bfloat16 bits, RNE. NaN stays NaN (quiet, sign kept); ±Inf stays
 * ±Inf; values that round past the largest finite bf16 become ±Inf (IEEE). */
uint16_t dsv4_f32_to_bf16(float f);
/* Bulk versions over n elements. */
void dsv4_bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n);
void dsv4_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n);
/* Round a float to the nearest bf16 value and back (RNE). */
float dsv4_round_bf16(float f);

/* ---- E4M3FN (FP8 weights and activations) ------------------------------ */

#define DSV4_E4M3_MAX 448.0f

/* E4M3FN code -> float: sign bit 7, exponent bits 6..3 (bias 7), mantissa
 * bits 2..0; exponent 0 is subnormal (m * 2^-9); no infinities; 0x7F and
 * 0xFF are NaN (returned as a quiet NaN with the code's sign). */
float dsv4_e4m3_to_f32(uint8_t code);
/* float -> E4M3FN code, RNE (ties to the even code), *saturating*: finite
 * values and ±Inf beyond ±448 give ±448 (0x7E / 0xFE). NaN -> 0x7F (0xFF
 * if the NaN's sign bit is set). -0.0 -> 0x80. This is the "satfinite"
 * cast the official quantisers perform after clamping to ±448. */
uint8_t dsv4_f32_to_e4m3(float f);

/* ---- E8M0 (power-of-two scales) --------------------------------------- */

/* E8M0 code -> float: 2^(e-127); e = 0 -> 2^-127 (an fp32 subnormal);
 * e = 255 -> NaN (must not occur in a checkpoint; spec/MODEL.md §2.3). */
float dsv4_e8m0_to_f32(uint8_t e);

/* ---- E2M1 (FP4 routed-expert weights) ---------------------------------- */

/* FP4 nibble (low 4 bits of code) -> float, table of spec/MODEL.md §2.3:
 * 0:+0 1:+0.5 2:+1 3:+1.5 4:+2 5:+3 6:+4 7:+6, 8..15 the same negated. */
float dsv4_e2m1_to_f32(uint8_t nibble);
/* float -> FP4 nibble, RNE with ties to the even code (e.g. 0.25 -> 0,
 * 0.75 -> 1.0, 2.5 -> 2, 5 -> 4), saturating to ±6. The sign is kept
 * (-0.0 -> 8, -0.1 -> 8). NaN -> 0 (E2M1 has no NaN). */
uint8_t dsv4_f32_to_e2m1(float f);

/* ---- dequantisation of stored weights ---------------------------------- */

/*
 * dsv4_linear_dequant_rows — dequantise rows [r0, r1) of a stored linear
 * weight into fp32: out is [(r1-r0), lin->in] row-major.
 *   FP8  (w F8_E4M3 [out,in], scale F8_E8M0 [ceil(out/128), ceil(in/128)]):
 *        out[r][k] = e4m3(w[r][k]) * e8m0(scale[r/128][k/128])  (§2.3)
 *   FP4  (w I8 [out,in/2], scale F8_E8M0 [out, in/32]), low nibble = even
 *        column: out[r][k] = e2m1(nib(r,k)) * e8m0(scale[r][k/32])   (§2.3)
 *   BF16 / F32 (no scale): converted.
 * Returns DSV4_OK, or DSV4_EINVAL (with a message naming lin->w.name) when
 * the rows are out of range, the dtype is not one of the above, or the view
 * shapes are inconsistent with lin->out/lin->in. The binder
 * (model/weights.h) has already checked shapes, so in the engine this
 * cannot fail.
 */
int dsv4_linear_dequant_rows(const dsv4_linear *lin, int64_t r0, int64_t r1, float *out,
                             dsv4_err *err);

/* FP8 block dequantisation of rows [r0,r1) (the FP8 case above, unchecked:
 * w/scale must be valid views). out [(r1-r0), in]. */
void dsv4_fp8_dequant_rows(const uint8_t *w, const uint8_t *scale, int64_t out_dim, int64_t in_dim,
                           int64_t r0, int64_t r1, float *out);
/* FP4 dequantisation of one row r (the FP4 case above, unchecked): w is the
 * packed [out, in/2] byte matrix, scale [out, in/32]; in_dim is the logical
 * column count (multiple of 32). out [in_dim]. */
void dsv4_fp4_dequant_row(const uint8_t *w, const uint8_t *scale, int64_t in_dim, int64_t r,
                          float *out);

/* ---- activation quantisers (reference numerics) ------------------------ */

/*
 * dsv4_act_quant_e4m3 — the official W8A8 activation quantiser
 * (spec/MODEL.md §2.4; block 128 for FP8/FP4 linears, block 64 for the KV
 * round-trip of §3.4.2). For each block of `block` consecutive elements of
 * x[0..n) (the last block may be shorter):
 *   amax = max(max|x|, 1e-4)          (fp32)
 *   s    = 2^ceil(log2(amax / 448))   (fp32 division, exact ceil-log2 of the
 *                                      fp32 quotient: power-of-two scale)
 *   q    = e4m3_RNE(clamp(x / s, -448, 448))
 * Writes q[n] codes and scale[ceil(n/block)] (the fp32 values s).
 * NaN inputs give NaN codes. block must be > 0.
 */
void dsv4_act_quant_e4m3(const float *x, int64_t n, int block, uint8_t *q, float *scale);

/* Quantise-dequantise in one pass ("FP8 simulate"): y[i] = e4m3(q[i]) * s of
 * its block, same rules as dsv4_act_quant_e4m3. x and y may alias. */
void dsv4_act_roundtrip_e4m3(const float *x, float *y, int64_t n, int block);

/* FP4 activation round-trip of the indexer (spec/MODEL.md §3.4.6, official
 * fp4_act_quant): blocks of `block` (32); amax floored at 6*2^-126;
 * s = 2^ceil(log2(amax/6)); y = e2m1_RNE(clamp(x/s, -6, 6)) * s.
 * x and y may alias. */
void dsv4_act_roundtrip_e2m1(const float *x, float *y, int64_t n, int block);

/* Exact 2^ceil(log2(v)) for a positive finite fp32 v (used by the
 * quantisers above; exposed so kernels can be tested against it). */
float dsv4_pow2_ceil(float v);

#ifdef __cplusplus
}
#endif
#endif
