/*
 * KV row codecs (src/model/kvcodec.h). Each record format is three small
 * functions in the table at the end; the FP8 one follows spec/MODEL.md §4.3
 * byte for byte.
 */
#include "model/kvcodec.h"

#include <math.h>
#include <string.h>

#include "model/formats.h"

#define FP8_BLOCK 64

static int nope_blocks(int dim, int rope_dim) { return (dim - rope_dim + FP8_BLOCK - 1) / FP8_BLOCK; }

/* ---- F32 ---------------------------------------------------------------- */

static int64_t f32_bytes(int dim, int rope_dim) {
    (void)rope_dim;
    return (int64_t)dim * 4;
}
static void f32_enc(int dim, int rope_dim, const float *x, uint8_t *rec) {
    (void)rope_dim;
    memcpy(rec, x, sizeof(float) * (size_t)dim);
}
static void f32_dec(int dim, int rope_dim, const uint8_t *rec, float *x) {
    (void)rope_dim;
    memcpy(x, rec, sizeof(float) * (size_t)dim);
}

/* ---- BF16 (little-endian halves) ---------------------------------------- */

static int64_t bf16_bytes(int dim, int rope_dim) {
    (void)rope_dim;
    return (int64_t)dim * 2;
}
static void put_bf16(uint8_t *p, float f) {
    uint16_t h = dsv4_f32_to_bf16(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}
static float get_bf16(const uint8_t *p) { return dsv4_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static void bf16_enc(int dim, int rope_dim, const float *x, uint8_t *rec) {
    (void)rope_dim;
    for (int i = 0; i < dim; i++) put_bf16(rec + 2 * i, x[i]);
}
static void bf16_dec(int dim, int rope_dim, const uint8_t *rec, float *x) {
    (void)rope_dim;
    for (int i = 0; i < dim; i++) x[i] = get_bf16(rec + 2 * i);
}

/* ---- fp8_ds_mla (§4.3): [nope E4M3][rope BF16][UE8M0 per 64 nope dims, zero-padded to 8k] */

static int64_t fp8_bytes(int dim, int rope_dim) {
    int nb = nope_blocks(dim, rope_dim);
    return (int64_t)(dim - rope_dim) + 2 * (int64_t)rope_dim + (int64_t)((nb + 7) / 8 * 8);
}

static void fp8_enc(int dim, int rope_dim, const float *x, uint8_t *rec) {
    int nope = dim - rope_dim, nb = nope_blocks(dim, rope_dim);
    uint8_t *scales = rec + nope + 2 * rope_dim;
    memset(scales, 0, (size_t)((nb + 7) / 8 * 8));
    for (int b = 0; b < nb; b++) {
        int k0 = b * FP8_BLOCK, n = nope - k0 < FP8_BLOCK ? nope - k0 : FP8_BLOCK;
        float amax = 0;
        for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[k0 + i]));
        float s = dsv4_pow2_ceil(fmaxf(amax, 1e-4f) / DSV4_E4M3_MAX); /* the QAT scale, §3.4.2.3 */
        int e;
        frexpf(s, &e); /* s = 0.5 * 2^e = 2^(e-1) */
        scales[b] = (uint8_t)(e - 1 + 127);
        for (int i = 0; i < n; i++) {
            float v = x[k0 + i] / s;
            v = v > DSV4_E4M3_MAX ? DSV4_E4M3_MAX : v < -DSV4_E4M3_MAX ? -DSV4_E4M3_MAX : v;
            rec[k0 + i] = dsv4_f32_to_e4m3(v);
        }
    }
    for (int i = 0; i < rope_dim; i++) put_bf16(rec + nope + 2 * i, x[nope + i]);
}

static void fp8_dec(int dim, int rope_dim, const uint8_t *rec, float *x) {
    int nope = dim - rope_dim;
    const uint8_t *scales = rec + nope + 2 * rope_dim;
    for (int i = 0; i < nope; i++) x[i] = ldexpf(dsv4_e4m3_to_f32(rec[i]), (int)scales[i / FP8_BLOCK] - 127);
    for (int i = 0; i < rope_dim; i++) x[nope + i] = get_bf16(rec + nope + 2 * i);
}

/* ---- the table ---------------------------------------------------------- */

static const struct codec {
    const char *name;
    int64_t (*bytes)(int dim, int rope_dim);
    void (*enc)(int dim, int rope_dim, const float *x, uint8_t *rec);
    void (*dec)(int dim, int rope_dim, const uint8_t *rec, float *x);
} codecs[DSV4_KV_COUNT] = {
    [DSV4_KV_F32] = {"f32", f32_bytes, f32_enc, f32_dec},
    [DSV4_KV_BF16] = {"bf16", bf16_bytes, bf16_enc, bf16_dec},
    [DSV4_KV_FP8_DS_MLA] = {"fp8_ds_mla", fp8_bytes, fp8_enc, fp8_dec},
};

int dsv4_kv_dtype_parse(const char *s, dsv4_kv_dtype *out, dsv4_err *err) {
    return dsv4_kv_dtype_parse_for(s, 0, out, err);
}

int dsv4_kv_dtype_parse_for(const char *s, int gpu, dsv4_kv_dtype *out, dsv4_err *err) {
    if (!s || !strcmp(s, "auto")) *out = gpu ? DSV4_KV_FP8_DS_MLA : DSV4_KV_F32;
    else if (!strcmp(s, "f32") || !strcmp(s, "float32")) *out = DSV4_KV_F32;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = DSV4_KV_BF16;
    /* vLLM: for DeepSeek V3.2-style sparse MLA "fp8" / "fp8_e4m3" mean the fp8_ds_mla record */
    else if (!strcmp(s, "fp8_ds_mla") || !strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3")) *out = DSV4_KV_FP8_DS_MLA;
    else
        return dsv4_err_set(err, DSV4_EINVAL,
                            "kv cache dtype '%s' is not one of auto, f32, bf16 (bfloat16), fp8_ds_mla (fp8, fp8_e4m3)",
                            s);
    return DSV4_OK;
}

const char *dsv4_kv_dtype_name(dsv4_kv_dtype t) {
    return (unsigned)t < DSV4_KV_COUNT ? codecs[t].name : "invalid";
}

int64_t dsv4_kvcodec_row_bytes(dsv4_kv_dtype t, int dim, int rope_dim) {
    if ((unsigned)t >= DSV4_KV_COUNT || dim <= 0 || rope_dim < 0 || rope_dim > dim) return -1;
    return codecs[t].bytes(dim, rope_dim);
}

int dsv4_kvcodec_rope_dim(dsv4_kv_dtype t, int dim, int64_t width) {
    if (t != DSV4_KV_FP8_DS_MLA) return dsv4_kvcodec_row_bytes(t, dim, 0) == width ? 0 : -1;
    for (int r = 0; r <= dim; r += 2) /* smallest match (unique while the nope part has <= 8 blocks, dim <= 512 + rope) */
        if (dsv4_kvcodec_row_bytes(t, dim, r) == width) return r;
    return -1;
}

void dsv4_kvcodec_encode(dsv4_kv_dtype t, int dim, int rope_dim, const float *x, uint8_t *rec) {
    codecs[t].enc(dim, rope_dim, x, rec);
}

void dsv4_kvcodec_decode(dsv4_kv_dtype t, int dim, int rope_dim, const uint8_t *rec, float *x) {
    codecs[t].dec(dim, rope_dim, rec, x);
}
