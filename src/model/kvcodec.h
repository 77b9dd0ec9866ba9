/*
 * KV row codec (issue 5, `--kv-cache-dtype`): how one stored attention row —
 * an emitted compressed row or a sliding-window row, `dim` floats whose last
 * `rope_dim` are the RoPE'd dims — is laid out in the state's memory.
 *
 * Why a codec per row and not per tensor: the state is addressed row by row
 * (window ring slot, page row through DSV4_CMP_ROW), so an op decodes exactly
 * the rows it gathers and encodes the rows it emits; nothing else needs to
 * know the record format.
 *
 *   F32          dim × f32 (today's layout; 4·dim bytes)
 *   BF16         dim × bf16, round to nearest even (2·dim bytes)
 *   FP8_DS_MLA   vLLM's fp8_ds_mla record (spec/MODEL.md §4.3): the nope dims
 *                [0, dim-rope_dim) as FP8 E4M3 in blocks of 64 with a
 *                power-of-two scale 2^ceil(log2(max(amax,1e-4)/448)), then the
 *                rope dims as BF16, then one UE8M0 exponent byte per block
 *                (value 2^(b-127)) and zero padding to a multiple of 8 scale
 *                bytes. dim 512 / rope 64 gives the 584-byte record
 *                (448 + 128 + 7 + 1). The quantisation is the reference QAT
 *                round-trip (§3.4.2.3), so a row that already went through it
 *                (reference numerics) decodes to the same nope values.
 *
 * A new record (e.g. a 4-bit one, §4.4) is one more enum value plus an entry
 * in the table of kvcodec.c (bytes / encode / decode).
 */
#ifndef DSV4_KVCODEC_H
#define DSV4_KVCODEC_H

#include <stdint.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsv4_kv_dtype {
    DSV4_KV_F32 = 0,
    DSV4_KV_BF16,
    DSV4_KV_FP8_DS_MLA,
    DSV4_KV_COUNT
} dsv4_kv_dtype;

/*
 * dsv4_kv_dtype_parse_for — `--kv-cache-dtype` value for a run on the GPU
 * (gpu != 0) or the CPU: "auto"/NULL = fp8_ds_mla on the GPU (vLLM's default
 * for DeepSeek V3.2-style sparse MLA: its config hook turns "auto" and "fp8"
 * into the custom fp8_ds_mla cache; 584 bytes a row instead of 2048, so ~3.5x
 * the pool tokens and a quarter of the key bytes read at long context) and F32
 * on the CPU (the reference storage; token-identical to unpaged f32 state);
 * "f32"/"float32"; "bf16"/"bfloat16"; "fp8_ds_mla", "fp8", "fp8_e4m3" (vLLM's
 * names for the same record on this model). Errors: DSV4_EINVAL naming the
 * value and the choices (e.g. "fp8_e5m2": no such record for this model).
 * dsv4_kv_dtype_parse = dsv4_kv_dtype_parse_for(s, 0, ...).
 */
int dsv4_kv_dtype_parse_for(const char *s, int gpu, dsv4_kv_dtype *out, dsv4_err *err);
int dsv4_kv_dtype_parse(const char *s, dsv4_kv_dtype *out, dsv4_err *err);
const char *dsv4_kv_dtype_name(dsv4_kv_dtype t); /* "f32", "bf16", "fp8_ds_mla" */

/*
 * dsv4_kvcodec_row_bytes — bytes of one stored row of `dim` values with the
 * last rope_dim RoPE'd (rope_dim only matters to FP8_DS_MLA), or -1 when the
 * geometry is invalid (dim <= 0, rope_dim outside [0, dim]). An FP8 nope
 * part that is not a multiple of 64 ends in a shorter block (toy shapes).
 */
int64_t dsv4_kvcodec_row_bytes(dsv4_kv_dtype t, int dim, int rope_dim);

/*
 * dsv4_kvcodec_rope_dim — the rope_dim that makes row_bytes(t, dim, rope) ==
 * width (how a backend recovers the split from a buffer's row width), or -1.
 * For FP8_DS_MLA the smallest even rope_dim that matches (the only one while
 * the nope part has at most 8 blocks of 64, as for every DeepSeek-V4 row).
 * For F32/BF16 the width does not depend on rope_dim: returns 0 when width
 * matches.
 */
int dsv4_kvcodec_rope_dim(dsv4_kv_dtype t, int dim, int64_t width);

/* Encode x[dim] into rec[row_bytes] / decode rec into x[dim]. Geometry must be
 * valid (row_bytes >= 0); no allocation, thread-safe. */
void dsv4_kvcodec_encode(dsv4_kv_dtype t, int dim, int rope_dim, const float *x, uint8_t *rec);
void dsv4_kvcodec_decode(dsv4_kv_dtype t, int dim, int rope_dim, const uint8_t *rec, float *x);

#ifdef __cplusplus
}
#endif
#endif
