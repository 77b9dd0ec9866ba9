/* Number formats: decode and round-trip (spec/MODEL.md §2.3, §2.4, §3.4.2, §3.4.6). */
#include "backend/cpu/cpu_num.h"

#include <math.h>
#include <string.h>

float dsv4_cpu_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dsv4_cpu_round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf / nan unchanged */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Built from bits rather than ldexp: this decode runs once per weight element. */
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dsv4_cpu_e4m3_to_f32(uint8_t b) {
    uint32_t s = (uint32_t)(b >> 7) << 31, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return 0.0f; /* NaN codes: never produced by a valid checkpoint */
    if (e == 0) { /* subnormal: m · 2^-9 */
        float v = (float)m * 0.001953125f;
        return s ? -v : v;
    }
    return from_bits(s | (e - 7 + 127) << 23 | m << 20);
}

float dsv4_cpu_e8m0_to_f32(uint8_t b) {
    return b ? from_bits((uint32_t)b << 23) : from_bits(0x00400000u); /* e = 0: 2^-127 */
}

float dsv4_cpu_e2m1_to_f32(unsigned nib) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[nib & 7];
    return (nib & 8) ? -v : v;
}

/* rint() rounds half to even in the default rounding mode, which is what
 * both formats need: a tie goes to the even mantissa (= the even code). */
float dsv4_cpu_round_e4m3(float x) {
    float a = fabsf(x);
    if (a >= 448.0f) return x < 0 ? -448.0f : 448.0f;
    float step;
    if (a < 0.015625f) { /* below 2^-6: subnormal grid of 2^-9 */
        step = 0.001953125f;
    } else {
        int e;
        frexpf(a, &e);                /* a = f·2^e, f in [0.5,1) */
        step = ldexpf(1.0f, e - 1 - 3);
    }
    float q = rintf(a / step) * step;
    if (q > 448.0f) q = 448.0f;
    return x < 0 ? -q : q;
}

float dsv4_cpu_round_e2m1(float x) {
    float a = fabsf(x);
    float step = a < 2.0f ? 0.5f : a < 4.0f ? 1.0f : 2.0f;
    float q = rintf(a / step) * step;
    if (q > 6.0f) q = 6.0f;
    return x < 0 ? -q : q;
}

static float amax_of(const float *x, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* 2^ceil(log2(v)) exactly, for positive finite v. (exp2f(ceilf(log2f(v))) is wrong when v is
 * just above a power of two: log2f rounds down onto the integer and the scale halves.) */
static float pow2_ceil(float v) {
    int e;
    float m = frexpf(v, &e); /* v = m·2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

void dsv4_cpu_fp8_roundtrip(float *x, int n) {
    float amax = fmaxf(amax_of(x, n), 1e-4f);
    float s = pow2_ceil(amax / 448.0f);
    for (int i = 0; i < n; i++) x[i] = dsv4_cpu_round_e4m3(x[i] / s) * s;
}

void dsv4_cpu_fp4_roundtrip(float *x, int n) {
    float amax = fmaxf(amax_of(x, n), 6.0f * ldexpf(1.0f, -126));
    float s = pow2_ceil(amax / 6.0f);
    for (int i = 0; i < n; i++) x[i] = dsv4_cpu_round_e2m1(x[i] / s) * s;
}

void dsv4_cpu_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

float dsv4_cpu_load_f(const void *data, dsv4_dtype dt, int64_t i) {
    switch (dt) {
    /* memcpy: checkpoint tensors are not necessarily aligned to their element size */
    case DSV4_DT_F32: {
        float f;
        memcpy(&f, (const char *)data + 4 * i, 4);
        return f;
    }
    case DSV4_DT_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)data + 2 * i, 2);
        return dsv4_cpu_bf16_to_f32(h);
    }
    case DSV4_DT_F16: {
        uint16_t h;
        memcpy(&h, (const char *)data + 2 * i, 2);
        int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? INFINITY : ldexpf(1.0f + m / 1024.0f, e - 15);
        return s ? -v : v;
    }
    default: return 0.0f;
    }
}
