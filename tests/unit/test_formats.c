/*
 * Number formats (spec/MODEL.md §2.3-2.4): every code of every format, from
 * the definitions and against ml_dtypes goldens (tools/gen_format_goldens.py
 * -> tests/fixtures/formats/).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/formats.h"
#include "test.h"

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void *load(const char *name, size_t *n_bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/formats/%s", DSV4_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "missing golden %s (run tools/gen_format_goldens.py)\n", path);
        *n_bytes = 0;
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)sz + 1);
    if (fread(p, 1, (size_t)sz, f) != (size_t)sz) sz = 0;
    fclose(f);
    *n_bytes = (size_t)sz;
    return p;
}

/* Same value, or both NaN. */
static int same(float a, float b) { return (isnan(a) && isnan(b)) || fbits(a) == fbits(b); }

static void test_e4m3(void) {
    size_t nb;
    float *g = load("e4m3_decode.f32", &nb);
    CHECK(g && nb == 256 * 4);
    int bad = 0, nan = 0;
    for (int c = 0; c < 256; c++) {
        float v = dsv4_e4m3_to_f32((uint8_t)c);
        /* definition, independent of the implementation's structure */
        int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
        double want = e == 0 ? m / 512.0 : (1 + m / 8.0) * pow(2, e - 7);
        if (s) want = -want;
        if (e == 15 && m == 7) {
            nan++;
            if (!isnan(v)) bad++;
        } else if ((double)v != want || (g && !same(v, g[c]))) {
            bad++;
            fprintf(stderr, "e4m3 code 0x%02x: %g want %g\n", c, v, want);
        }
        /* encode(decode(c)) == c for every non-NaN code */
        if (!isnan(v) && dsv4_f32_to_e4m3(v) != c) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(nan, 2);
    CHECK(isnan(dsv4_e4m3_to_f32(0x7f)) && isnan(dsv4_e4m3_to_f32(0xff)));
    CHECK(dsv4_e4m3_to_f32(0x7e) == 448.0f && dsv4_e4m3_to_f32(0xfe) == -448.0f);
    CHECK(dsv4_e4m3_to_f32(0x01) == 0x1p-9f);
    free(g);

    /* encode against ml_dtypes (RNE, inside +-464) */
    size_t ni, no;
    float *in = load("e4m3_enc_in.f32", &ni);
    uint8_t *want = load("e4m3_enc_out.u8", &no);
    CHECK(in && want && ni / 4 == no && no > 1000);
    bad = 0;
    for (size_t i = 0; in && want && i < no; i++)
        if (dsv4_f32_to_e4m3(in[i]) != want[i]) {
            if (bad++ < 5)
                fprintf(stderr, "e4m3 enc %.9g: 0x%02x want 0x%02x\n", in[i],
                        dsv4_f32_to_e4m3(in[i]), want[i]);
        }
    CHECK_EQ_INT(bad, 0);
    free(in);
    free(want);

    /* ties (to the even code) and saturation, from the definition */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(1.0625f), 0x38);   /* 1 | 1.125 -> 1 (even m=0) */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(1.1875f), 0x3a);   /* 1.125 | 1.25 -> 1.25 (m=2) */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(432.0f), 0x7e);    /* 416 | 448 -> 448 (m=6) */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(0x1p-10f), 0x00);  /* 0 | 2^-9 -> 0 */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(3 * 0x1p-10f), 0x02); /* 2^-9 | 2^-8 -> 2^-8 */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(15 * 0x1p-10f), 0x08); /* 7*2^-9 | 2^-6: to normal */
    CHECK_EQ_INT(dsv4_f32_to_e4m3(449.0f), 0x7e);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(464.0f), 0x7e);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(1e30f), 0x7e);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(INFINITY), 0x7e);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(-INFINITY), 0xfe);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(-500.0f), 0xfe);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(NAN), 0x7f);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(-0.0f), 0x80);
    CHECK_EQ_INT(dsv4_f32_to_e4m3(1e-30f), 0x00);
}

static void test_e8m0(void) {
    size_t nb;
    float *g = load("e8m0_decode.f32", &nb);
    CHECK(g && nb == 256 * 4);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        float v = dsv4_e8m0_to_f32((uint8_t)e);
        if (e == 255) {
            if (!isnan(v)) bad++;
            continue;
        }
        if ((double)v != ldexp(1.0, e - 127)) bad++;
        if (e >= 1 && fbits(v) != (uint32_t)e << 23) bad++; /* §2.3: bits = e << 23 */
        if (g && !same(v, g[e])) bad++;
    }
    CHECK(g && isnan(g[255]));
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(fbits(dsv4_e8m0_to_f32(0)), 0x00400000u); /* ds4's 2^-127 pattern */
    free(g);
}

static void test_e2m1(void) {
    static const float table[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
    size_t nb;
    float *g = load("e2m1_decode.f32", &nb);
    CHECK(g && nb == 16 * 4);
    int bad = 0;
    for (int c = 0; c < 16; c++) {
        float v = dsv4_e2m1_to_f32((uint8_t)c);
        if (fbits(v) != fbits(table[c])) bad++;
        if (g && fbits(v) != fbits(g[c])) bad++;
        if (dsv4_f32_to_e2m1(v) != c) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    free(g);
    size_t ni, no;
    float *in = load("e2m1_enc_in.f32", &ni);
    uint8_t *want = load("e2m1_enc_out.u8", &no);
    CHECK(in && want && ni / 4 == no);
    bad = 0;
    for (size_t i = 0; in && want && i < no; i++)
        if (dsv4_f32_to_e2m1(in[i]) != want[i]) {
            if (bad++ < 5)
                fprintf(stderr, "e2m1 enc %g: %d want %d\n", in[i], dsv4_f32_to_e2m1(in[i]), want[i]);
        }
    CHECK_EQ_INT(bad, 0);
    free(in);
    free(want);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(0.25f), 0);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(0.75f), 2);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(1.25f), 2);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(1.75f), 4);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(2.5f), 4);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(3.5f), 6);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(5.0f), 6);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(-5.0f), 14);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(100.0f), 7);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(-INFINITY), 15);
    CHECK_EQ_INT(dsv4_f32_to_e2m1(-0.1f), 8);
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dsv4_bf16_to_f32((uint16_t)h);
        if (fbits(f) != h << 16) bad++;
        uint16_t back = dsv4_f32_to_bf16(f);
        if (isnan(f)) {
            if (!isnan(dsv4_bf16_to_f32(back)) || (back & 0x8000) != (h & 0x8000)) bad++;
        } else if (back != h) {
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    size_t ni, no;
    float *in = load("bf16_enc_in.f32", &ni);
    uint16_t *want = load("bf16_enc_out.u16", &no);
    CHECK(in && want && ni / 4 == no / 2 && no > 1000);
    bad = 0;
    for (size_t i = 0; in && want && i < no / 2; i++)
        if (dsv4_f32_to_bf16(in[i]) != want[i]) bad++;
    CHECK_EQ_INT(bad, 0);
    free(in);
    free(want);
    /* ties: 1 + 2^-8 is halfway between 1 and 1+2^-7 -> even (1) */
    CHECK_EQ_INT(dsv4_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    CHECK_EQ_INT(dsv4_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CHECK_EQ_INT(dsv4_f32_to_bf16(INFINITY), 0x7f80);
    CHECK(dsv4_round_bf16(3.0e38f) == INFINITY || dsv4_round_bf16(3.0e38f) > 3.0e38f);
}

static void test_dequant(void) {
    /* FP8 linear [300, 200]: partial edge blocks in both dims (scale [3, 2]). */
    enum { O = 300, I = 200 };
    uint8_t *w = malloc(O * I), sc[6];
    uint32_t seed = 12345;
    for (int i = 0; i < O * I; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint8_t c = (uint8_t)(seed >> 24);
        if ((c & 0x7f) == 0x7f) c = 0x10;
        w[i] = c;
    }
    for (int i = 0; i < 6; i++) sc[i] = (uint8_t)(120 + i);
    dsv4_linear lin = {0};
    lin.w = (dsv4_tview){"x.weight", DSV4_DT_F8_E4M3, 2, {O, I}, w, O * I};
    lin.scale = (dsv4_tview){"x.scale", DSV4_DT_F8_E8M0, 2, {3, 2}, sc, 6};
    lin.out = O;
    lin.in = I;
    float *out = malloc(sizeof(float) * 200 * I);
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_linear_dequant_rows(&lin, 100, 300, out, &err), 0);
    int bad = 0;
    for (int r = 100; r < 300; r++)
        for (int k = 0; k < I; k++) {
            double want = (double)dsv4_e4m3_to_f32(w[r * I + k]) * ldexp(1.0, sc[(r / 128) * 2 + k / 128] - 127);
            if ((double)out[(r - 100) * I + k] != want) bad++;
        }
    CHECK_EQ_INT(bad, 0);
    CHECK(dsv4_linear_dequant_rows(&lin, 0, 301, out, &err) != 0);
    CHECK_CONTAINS(err.msg, "x.weight");
    lin.scale.shape[0] = 2;
    CHECK(dsv4_linear_dequant_rows(&lin, 0, 1, out, &err) != 0);

    /* FP4 [2, 64]: packed [2, 32], scale [2, 2]; low nibble = even column. */
    uint8_t p[64], s4[4] = {127, 128, 126, 130};
    for (int i = 0; i < 64; i++) p[i] = (uint8_t)((i * 7 + 3) & 0xff);
    p[0] = 0x21; /* col 0 = +0.5, col 1 = +1 */
    p[1] = 0xf9; /* col 2 = -0.5, col 3 = -6 */
    dsv4_linear l4 = {0};
    l4.w = (dsv4_tview){"e.weight", DSV4_DT_I8, 2, {2, 32}, p, 64};
    l4.scale = (dsv4_tview){"e.scale", DSV4_DT_F8_E8M0, 2, {2, 2}, s4, 4};
    l4.out = 2;
    l4.in = 64;
    float o4[128];
    CHECK_EQ_INT(dsv4_linear_dequant_rows(&l4, 0, 2, o4, &err), 0);
    CHECK(o4[0] == 0.5f && o4[1] == 1.0f && o4[2] == -0.5f && o4[3] == -6.0f);
    bad = 0;
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 64; k++) {
            uint8_t b = p[r * 32 + k / 2];
            uint8_t nib = (k & 1) ? b >> 4 : b & 15;
            double want = dsv4_e2m1_to_f32(nib) * ldexp(1.0, s4[r * 2 + k / 32] - 127);
            if ((double)o4[r * 64 + k] != want) bad++;
        }
    CHECK_EQ_INT(bad, 0);

    /* BF16 linear passes values through */
    uint16_t hb[4] = {0x3f80, 0xc000, 0x0000, 0x4040};
    dsv4_linear lb = {0};
    lb.w = (dsv4_tview){"b.weight", DSV4_DT_BF16, 2, {2, 2}, hb, 8};
    lb.out = 2;
    lb.in = 2;
    float ob[4];
    CHECK_EQ_INT(dsv4_linear_dequant_rows(&lb, 1, 2, ob, &err), 0);
    CHECK(ob[0] == 0.0f && ob[1] == 3.0f);
    free(w);
    free(out);
}

static void test_act_quant(void) {
    CHECK(dsv4_pow2_ceil(1.0f) == 1.0f);
    CHECK(dsv4_pow2_ceil(1.0000001f) == 2.0f);
    CHECK(dsv4_pow2_ceil(0.75f) == 1.0f);
    CHECK(dsv4_pow2_ceil(0x1p-100f) == 0x1p-100f);
    size_t ni, nq, ns;
    float *x = load("actq_in.f32", &ni);
    uint8_t *q = load("actq_q.u8", &nq);
    float *s = load("actq_s.f32", &ns);
    CHECK(x && q && s && ni / 4 == nq && nq == 8 * 300 && ns / 4 == 8 * 3);
    if (!(x && q && s && nq == 2400)) return;
    uint8_t myq[300];
    float mys[3], y[300];
    int bad = 0, bads = 0, badrt = 0;
    for (int r = 0; r < 8; r++) {
        dsv4_act_quant_e4m3(x + r * 300, 300, 128, myq, mys);
        for (int i = 0; i < 300; i++) bad += myq[i] != q[r * 300 + i];
        for (int b = 0; b < 3; b++) bads += fbits(mys[b]) != fbits(s[r * 3 + b]);
        dsv4_act_roundtrip_e4m3(x + r * 300, y, 300, 128);
        for (int i = 0; i < 300; i++)
            badrt += y[i] != dsv4_e4m3_to_f32(myq[i]) * mys[i / 128];
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bads, 0);
    CHECK_EQ_INT(badrt, 0);
    /* all-zero block: amax floor 1e-4 -> s = 2^ceil(log2(1e-4/448)) = 2^-22 */
    float z[4] = {0, 0, 0, 0};
    uint8_t zq[4];
    float zs;
    dsv4_act_quant_e4m3(z, 4, 128, zq, &zs);
    CHECK(zs == 0x1p-22f && zq[0] == 0);
    /* FP4 round-trip: block amax 6 -> s = 1, values snap to the table */
    float a[32], b[32];
    for (int i = 0; i < 32; i++) a[i] = (float)(i % 13) * 0.5f - 3.0f;
    a[0] = 6.0f;
    a[1] = 2.5f; /* tie -> 2 */
    dsv4_act_roundtrip_e2m1(a, b, 32, 32);
    CHECK(b[0] == 6.0f && b[1] == 2.0f);
    for (int i = 0; i < 32; i++) CHECK(dsv4_f32_to_e2m1(b[i]) == dsv4_f32_to_e2m1(a[i]));
    free(x);
    free(q);
    free(s);
}

int main(void) {
    test_e4m3();
    test_e8m0();
    test_e2m1();
    test_bf16();
    test_dequant();
    test_act_quant();
    return TEST_REPORT();
}
