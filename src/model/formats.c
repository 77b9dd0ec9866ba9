/*
 * Number formats (spec/MODEL.md §2.3) and activation quantisers (§2.4).
 *
 * Encoders go through frexpf/nearbyintf instead of bit tricks: the default
 * floating-point rounding mode is round-to-nearest-even, so nearbyintf gives
 * RNE on an exactly scaled value (scaling by a power of two is exact), which
 * keeps each encoder a few obviously-correct lines. Speed is the CUDA
 * backend's business; these are the definitions it is tested against.
 */
#include "model/formats.h"

#include <math.h>
#include <string.h>

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- BF16 ---- */

float dsv4_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dsv4_f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    /* RNE on the low 16 bits; a carry into the exponent is the correct
     * rounding up (to the next binade or to Inf). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

void dsv4_bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dsv4_bf16_to_f32(src[i]);
}

void dsv4_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = dsv4_f32_to_bf16(src[i]);
}

float dsv4_round_bf16(float f) { return dsv4_bf16_to_f32(dsv4_f32_to_bf16(f)); }

/* ---- E4M3FN ---- */

float dsv4_e4m3_to_f32(uint8_t code) {
    int s = code >> 7, e = (code >> 3) & 0xf, m = code & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9); /* subnormal: m * 2^-9 */
    else
        v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

uint8_t dsv4_f32_to_e4m3(float f) {
    uint8_t sign = (f2u(f) >> 31) ? 0x80 : 0;
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= DSV4_E4M3_MAX) return (uint8_t)(sign | 0x7e); /* saturate (also Inf) */
    if (a < 0x1p-6f) {
        /* Subnormal range, quantum 2^-9. q == 8 is the smallest normal, whose
         * code is also 8 (exponent field 1, mantissa 0). */
        int q = (int)nearbyintf(a * 512.0f);
        return (uint8_t)(sign | q);
    }
    int ex;
    frexpf(a, &ex); /* a = fr * 2^ex, fr in [0.5, 1) */
    int E = ex - 1; /* a in [2^E, 2^(E+1)), E in [-6, 8] */
    int q = (int)nearbyintf(ldexpf(a, 3 - E)); /* 8..16, mantissa quantum 2^(E-3) */
    if (q == 16) {
        q = 8;
        E++;
    }
    /* a < 448 rounds to at most 448 = code 0x7e, never into the NaN code. */
    return (uint8_t)(sign | ((E + 7) << 3) | (q - 8));
}

/* ---- E8M0 ---- */

float dsv4_e8m0_to_f32(uint8_t e) {
    if (e == 255) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

/* ---- E2M1 ---- */

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float dsv4_e2m1_to_f32(uint8_t nibble) {
    float v = e2m1_mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

uint8_t dsv4_f32_to_e2m1(float f) {
    if (isnan(f)) return 0;
    uint8_t sign = (f2u(f) >> 31) ? 8 : 0;
    float a = fabsf(f);
    if (a >= 6.0f) return (uint8_t)(sign | 7);
    /* Nearest magnitude; on an exact tie prefer the even code. Midpoints of
     * the table are exact in fp32, so the comparison is exact. */
    int best = 0;
    float bd = a;
    for (int c = 1; c < 8; c++) {
        float d = fabsf(a - e2m1_mag[c]);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)(sign | best);
}

/* ---- dequantisation ---- */

void dsv4_fp8_dequant_rows(const uint8_t *w, const uint8_t *scale, int64_t out_dim, int64_t in_dim,
                           int64_t r0, int64_t r1, float *out) {
    (void)out_dim;
    float lut[256];
    for (int c = 0; c < 256; c++) lut[c] = dsv4_e4m3_to_f32((uint8_t)c);
    int64_t sc_cols = (in_dim + 127) / 128;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * in_dim;
        const uint8_t *sr = scale + (r / 128) * sc_cols;
        float *o = out + (r - r0) * in_dim;
        for (int64_t k = 0; k < in_dim; k++) o[k] = lut[wr[k]] * dsv4_e8m0_to_f32(sr[k / 128]);
    }
}

void dsv4_fp4_dequant_row(const uint8_t *w, const uint8_t *scale, int64_t in_dim, int64_t r,
                          float *out) {
    const uint8_t *wr = w + r * (in_dim / 2);
    const uint8_t *sr = scale + r * (in_dim / 32);
    for (int64_t j = 0; j < in_dim / 2; j++) {
        float s = dsv4_e8m0_to_f32(sr[(2 * j) / 32]);
        out[2 * j] = dsv4_e2m1_to_f32(wr[j] & 0xf) * s;      /* low nibble: even column */
        out[2 * j + 1] = dsv4_e2m1_to_f32(wr[j] >> 4) * s;   /* high nibble: odd column */
    }
}

static int shape2(const dsv4_tview *v, int64_t a, int64_t b) {
    return v->ndim == 2 && v->shape[0] == a && v->shape[1] == b && v->data != NULL;
}

int dsv4_linear_dequant_rows(const dsv4_linear *lin, int64_t r0, int64_t r1, float *out,
                             dsv4_err *err) {
    const char *nm = lin->w.name ? lin->w.name : "(linear)";
    if (r0 < 0 || r1 < r0 || r1 > lin->out)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: rows [%lld, %lld) outside [0, %lld)", nm,
                            (long long)r0, (long long)r1, (long long)lin->out);
    int64_t O = lin->out, I = lin->in;
    switch (lin->w.dtype) {
    case DSV4_DT_F8_E4M3:
        if (!shape2(&lin->w, O, I) || lin->scale.dtype != DSV4_DT_F8_E8M0 ||
            !shape2(&lin->scale, (O + 127) / 128, (I + 127) / 128))
            return dsv4_err_set(err, DSV4_EINVAL, "%s: FP8 weight/scale shapes inconsistent", nm);
        dsv4_fp8_dequant_rows(lin->w.data, lin->scale.data, O, I, r0, r1, out);
        return DSV4_OK;
    case DSV4_DT_I8:
    case DSV4_DT_U8:
        if (I % 32 != 0 || !shape2(&lin->w, O, I / 2) || lin->scale.dtype != DSV4_DT_F8_E8M0 ||
            !shape2(&lin->scale, O, I / 32))
            return dsv4_err_set(err, DSV4_EINVAL, "%s: FP4 weight/scale shapes inconsistent", nm);
        for (int64_t r = r0; r < r1; r++)
            dsv4_fp4_dequant_row(lin->w.data, lin->scale.data, I, r, out + (r - r0) * I);
        return DSV4_OK;
    case DSV4_DT_BF16:
        if (!shape2(&lin->w, O, I))
            return dsv4_err_set(err, DSV4_EINVAL, "%s: BF16 weight shape inconsistent", nm);
        dsv4_bf16_to_f32_n((const uint16_t *)lin->w.data + r0 * I, out, (r1 - r0) * I);
        return DSV4_OK;
    case DSV4_DT_F32:
        if (!shape2(&lin->w, O, I))
            return dsv4_err_set(err, DSV4_EINVAL, "%s: F32 weight shape inconsistent", nm);
        memcpy(out, (const float *)lin->w.data + r0 * I, (size_t)((r1 - r0) * I) * sizeof(float));
        return DSV4_OK;
    default:
        return dsv4_err_set(err, DSV4_EINVAL, "%s: cannot dequantise dtype %s", nm,
                            dsv4_dtype_name(lin->w.dtype));
    }
}

/* ---- activation quantisers ---- */

float dsv4_pow2_ceil(float v) {
    /* Official fast_log2_ceil/fast_pow2: exponent + (mantissa != 0). For a
     * normal v that is frexp's exponent unless v is an exact power of two. */
    int ex;
    float fr = frexpf(v, &ex); /* v = fr * 2^ex, fr in [0.5, 1) */
    return fr == 0.5f ? ldexpf(1.0f, ex - 1) : ldexpf(1.0f, ex);
}

void dsv4_act_quant_e4m3(const float *x, int64_t n, int block, uint8_t *q, float *scale) {
    /* The reference multiplies by the fp32 constant 1/448 (fast_round_scale
     * (amax, fp8_max_inv)); we do the same so the ceil-log2 boundary cases
     * agree bit for bit. */
    const float inv_max = 1.0f / DSV4_E4M3_MAX;
    for (int64_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 0.0f;
        for (int64_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        amax = fmaxf(amax, 1e-4f);
        float s = dsv4_pow2_ceil(amax * inv_max);
        scale[bi] = s;
        for (int64_t i = b0; i < b1; i++) {
            float v = x[i] / s;
            if (v > DSV4_E4M3_MAX) v = DSV4_E4M3_MAX;
            if (v < -DSV4_E4M3_MAX) v = -DSV4_E4M3_MAX;
            q[i] = dsv4_f32_to_e4m3(v);
        }
    }
}

void dsv4_act_roundtrip_e4m3(const float *x, float *y, int64_t n, int block) {
    const float inv_max = 1.0f / DSV4_E4M3_MAX;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 0.0f;
        for (int64_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        amax = fmaxf(amax, 1e-4f);
        float s = dsv4_pow2_ceil(amax * inv_max);
        for (int64_t i = b0; i < b1; i++) {
            float v = x[i] / s;
            if (v > DSV4_E4M3_MAX) v = DSV4_E4M3_MAX;
            if (v < -DSV4_E4M3_MAX) v = -DSV4_E4M3_MAX;
            y[i] = dsv4_e4m3_to_f32(dsv4_f32_to_e4m3(v)) * s;
        }
    }
}

void dsv4_act_roundtrip_e2m1(const float *x, float *y, int64_t n, int block) {
    const float inv_max = 1.0f / 6.0f;
    const float floor_amax = 6.0f * 0x1p-126f;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 0.0f;
        for (int64_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        amax = fmaxf(amax, floor_amax);
        float s = dsv4_pow2_ceil(amax * inv_max);
        for (int64_t i = b0; i < b1; i++) {
            float v = x[i] / s;
            if (v > 6.0f) v = 6.0f;
            if (v < -6.0f) v = -6.0f;
            y[i] = dsv4_e2m1_to_f32(dsv4_f32_to_e2m1(v)) * s;
        }
    }
}
