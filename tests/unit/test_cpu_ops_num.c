/* CPU backend number formats (spec/MODEL.md §2.3, §3.4.2, §3.4.6): decode tables,
 * rounding grids and the QAT round-trips, checked against their definitions. */
#include "backend/cpu/cpu_num.h"
#include "model/formats.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>

static void test_decode(void) {
    CHECK_NEAR(dsv4_cpu_e4m3_to_f32(0x38), 1.0, 0);
    CHECK_NEAR(dsv4_cpu_e4m3_to_f32(0x7E), 448.0, 0);
    CHECK_NEAR(dsv4_cpu_e4m3_to_f32(0x01), ldexp(1, -9), 0);
    CHECK_NEAR(dsv4_cpu_e4m3_to_f32(0xB8), -1.0, 0);
    CHECK_NEAR(dsv4_cpu_e4m3_to_f32(0x7F), 0.0, 0); /* NaN code decodes to 0 */
    CHECK_NEAR(dsv4_cpu_e8m0_to_f32(127), 1.0, 0);
    CHECK_NEAR(dsv4_cpu_e8m0_to_f32(130), 8.0, 0);
    CHECK_NEAR(dsv4_cpu_e2m1_to_f32(7), 6.0, 0);
    CHECK_NEAR(dsv4_cpu_e2m1_to_f32(9), -0.5, 0);
    CHECK_NEAR(dsv4_cpu_bf16_to_f32(0x3f80), 1.0, 0);
    CHECK_NEAR(dsv4_cpu_round_bf16(1.0f + ldexpf(1, -8)), 1.0, 0);        /* tie -> even */
    CHECK_NEAR(dsv4_cpu_round_bf16(1.0f + 3 * ldexpf(1, -8)), 1.0 + ldexp(1, -6), 0);
}

/* Every representable value is a fixed point; every midpoint goes to the even code. */
static void test_grids(void) {
    int bad = 0;
    for (int b = 0; b < 0x7F; b++) {
        float v = dsv4_cpu_e4m3_to_f32((uint8_t)b);
        if (dsv4_cpu_round_e4m3(v) != v || dsv4_cpu_round_e4m3(-v) != -v) bad++;
        if (b + 1 < 0x7F) {
            float w = dsv4_cpu_e4m3_to_f32((uint8_t)(b + 1)), mid = (v + w) / 2;
            float want = (b & 1) ? w : v; /* the even code wins */
            if (dsv4_cpu_round_e4m3(mid) != want) bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(dsv4_cpu_round_e4m3(1000.0f), 448.0, 0);
    bad = 0;
    for (unsigned c = 0; c < 7; c++) {
        float v = dsv4_cpu_e2m1_to_f32(c), w = dsv4_cpu_e2m1_to_f32(c + 1), mid = (v + w) / 2;
        if (dsv4_cpu_round_e2m1(v) != v) bad++;
        if (dsv4_cpu_round_e2m1(mid) != ((c & 1) ? w : v)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(dsv4_cpu_round_e2m1(-9.0f), -6.0, 0);
}

static void test_roundtrips(void) {
    float x[128], y[128];
    srand(3);
    for (int i = 0; i < 128; i++) x[i] = y[i] = (float)(rand() % 2001 - 1000) / 37.0f;
    dsv4_cpu_fp8_roundtrip(y, 128);
    float amax = 0;
    for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = exp2f(ceilf(log2f(amax / 448)));
    int bad = 0;
    for (int i = 0; i < 128; i++) {
        if (dsv4_cpu_round_e4m3(y[i] / s) != y[i] / s) bad++;          /* on the scaled grid */
        if (fabsf(y[i] - x[i]) > fabsf(x[i]) / 16 + s * ldexpf(1, -9)) bad++; /* half an ulp of 3 bits */
    }
    CHECK_EQ_INT(bad, 0);
    for (int i = 0; i < 32; i++) y[i] = x[i];
    dsv4_cpu_fp4_roundtrip(y, 32);
    amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    s = exp2f(ceilf(log2f(amax / 6)));
    bad = 0;
    for (int i = 0; i < 32; i++)
        if (dsv4_cpu_round_e2m1(y[i] / s) != y[i] / s || fabsf(y[i] - x[i]) > s) bad++;
    CHECK_EQ_INT(bad, 0);
}

static void test_hadamard(void) {
    float x[128], y[128];
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 128; i++) {
        x[i] = y[i] = sinf(i * 0.7f) + (i % 5);
        n0 += x[i] * x[i];
    }
    dsv4_cpu_hadamard(y, 128);
    for (int i = 0; i < 128; i++) n1 += y[i] * y[i];
    CHECK_NEAR(n1 / n0, 1.0, 1e-5); /* orthonormal */
    /* first output = sum / sqrt(n) */
    double sum = 0;
    for (int i = 0; i < 128; i++) sum += x[i];
    CHECK_NEAR(y[0], sum / sqrt(128.0), 1e-4);
    dsv4_cpu_hadamard(y, 128); /* symmetric + orthonormal: H·H = I */
    double md = 0;
    for (int i = 0; i < 128; i++) md = fmax(md, fabs(y[i] - x[i]));
    CHECK_NEAR(md, 0.0, 1e-5);
}

/* Against the loader's independent quantisers (src/model/formats.c, checked there against
 * ml_dtypes goldens), including block maxima just above a power of two times 448. */
static void test_against_formats(void) {
    float x[256], a[256], b[256];
    int bad8 = 0, bad4 = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < 256; i++) x[i] = (float)((rand() % 20001) - 10000) / (1 + trial % 37);
        if (trial % 2) x[trial % 256] = 448.0f * ldexpf(1.0f + ldexpf(1, -23), trial % 20 - 10); /* just above 2^k·448 */
        for (int blk = 64; blk <= 128; blk *= 2) {
            memcpy(a, x, sizeof x);
            for (int k = 0; k < 256; k += blk) dsv4_cpu_fp8_roundtrip(a + k, blk);
            dsv4_act_roundtrip_e4m3(x, b, 256, blk);
            bad8 += memcmp(a, b, sizeof a) != 0;
        }
        memcpy(a, x, sizeof x);
        for (int k = 0; k < 256; k += 32) dsv4_cpu_fp4_roundtrip(a + k, 32);
        dsv4_act_roundtrip_e2m1(x, b, 256, 32);
        bad4 += memcmp(a, b, sizeof a) != 0;
    }
    CHECK_EQ_INT(bad8, 0);
    CHECK_EQ_INT(bad4, 0);
}

int main(void) {
    test_decode();
    test_grids();
    test_roundtrips();
    test_hadamard();
    test_against_formats();
    return TEST_REPORT();
}
