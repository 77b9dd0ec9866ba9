/*
 * CPU backend ops against direct math on small inputs (spec/MODEL.md §2.3-2.4,
 * §3.2-3.5): RoPE/YaRN, RMSNorm, linears (FP8/FP4/BF16, W8A8), HC pre/post.
 * Attention, compressor, indexer and MoE are in test_cpu_ops_attn.c / _moe.c.
 */
#include "backend/cpu/cpu_num.h"
#include "cpu_test_util.h"
#include "test.h"

#include <math.h>

static dsv4_backend *be;

/* §3.4.3: the YaRN frequency list for θ=160000 (measured from transformers, quoted in the spec). */
static void test_rope(void) {
    static const double want[32] = {1, 0.6877, 0.4729, 0.3252, 0.2236, 0.1538, 0.1057, 0.07271, 0.05, 0.03438,
        0.02364, 0.01626, 0.01118, 0.007688, 0.005287, 0.003636, 0.002266, 0.001397, 0.0008497, 0.0005081,
        0.000297, 0.0001682, 9.087e-05, 4.544e-05, 1.953e-05, 5.372e-06, 3.694e-06, 2.54e-06, 1.747e-06,
        1.201e-06, 8.261e-07, 5.681e-07};
    dsv4_rope r;
    CHECK_EQ_INT(dsv4_rope_init(&r, 64, 160000, 16, 65536, 32, 1, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 32; i++)
        if (fabs(r.freq[i] - want[i]) > 5e-4 * want[i] + 1e-9) bad++;
    CHECK_EQ_INT(bad, 0);
    dsv4_rope plain;
    dsv4_rope_init(&plain, 64, 10000, 1, 65536, 32, 1, NULL);
    CHECK_NEAR(plain.freq[1], pow(10000, -2.0 / 64), 1e-7);
    CHECK(dsv4_rope_init(&r, 63, 10000, 1, 1, 1, 1, NULL) == DSV4_EINVAL);

    /* inverse(rope(x)) == x; nope dims untouched; pair norms preserved */
    tu_batch tb;
    tu_batch_init(&tb);
    tu_batch_add(&tb, 0, 1000, 3, NULL);
    tu_batch_add(&tb, 1, 70000, 2, NULL);
    dsv4_rope_init(&r, 64, 160000, 16, 65536, 32, 1, NULL);
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, 5, 2 * 128);
    tu_fill(tu_f(&x), 5 * 256, 1);
    float orig[5 * 256];
    memcpy(orig, x.data, sizeof orig);
    CHECK_EQ_INT(be->rope(be, &x, 128, &r, &tb.b, 0, NULL), 0);
    int untouched = 1, norms = 1, moved = 0;
    for (int h = 0; h < 10; h++)
        for (int k = 0; k < 128; k++) {
            float a = tu_f(&x)[h * 128 + k], o = orig[h * 128 + k];
            if (k < 64 && a != o) untouched = 0;
            if (k >= 64 && a != o) moved = 1;
            if (k >= 64 && !(k & 1)) {
                float b = tu_f(&x)[h * 128 + k + 1], ob = orig[h * 128 + k + 1];
                if (fabsf(a * a + b * b - o * o - ob * ob) > 1e-5f) norms = 0;
            }
        }
    CHECK(untouched && moved && norms);
    /* pair 0 of row 0 (position 1000) rotated by exactly 1000·freq[0] */
    float c = cosf(1000.0f * r.freq[0]), s = sinf(1000.0f * r.freq[0]);
    CHECK_NEAR(tu_f(&x)[64], orig[64] * c - orig[65] * s, 1e-5);
    CHECK_EQ_INT(be->rope(be, &x, 128, &r, &tb.b, 1, NULL), 0);
    double md = 0;
    for (int i = 0; i < 5 * 256; i++) md = fmax(md, fabs(tu_f(&x)[i] - orig[i]));
    CHECK_NEAR(md, 0, 1e-5);
    be->buf_free(be, &x);
}

static void test_rmsnorm(void) {
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, 3, 16), y = tu_buf(be, DSV4_DT_F32, 3, 16);
    tu_fill(tu_f(&x), 48, 2);
    float w[8];
    tu_fill(w, 8, 1);
    dsv4_tview wv = tu_view(DSV4_DT_F32, w, 1, 8, 0);
    CHECK_EQ_INT(be->rmsnorm(be, &x, &wv, 8, 1e-6f, &y, NULL), 0);
    double md = 0;
    for (int g = 0; g < 6; g++) {
        double ss = 0;
        for (int i = 0; i < 8; i++) ss += tu_f(&x)[g * 8 + i] * tu_f(&x)[g * 8 + i];
        for (int i = 0; i < 8; i++)
            md = fmax(md, fabs(tu_f(&y)[g * 8 + i] - tu_f(&x)[g * 8 + i] / sqrt(ss / 8 + 1e-6) * w[i]));
    }
    CHECK_NEAR(md, 0, 1e-5);
    dsv4_err e = {0};
    CHECK(be->rmsnorm(be, &x, &wv, 5, 1e-6f, &y, &e) == DSV4_EINVAL);
    be->buf_free(be, &x);
    be->buf_free(be, &y);
}

/* y = x·Wᵀ with W decoded by the spec's rules; W8A8 = x quantised per 128 first. */
static void check_linear(const dsv4_linear *L, const float *Wreal, int T, const char *what) {
    int64_t in = L->in, out = L->out;
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, T, in), y = tu_buf(be, DSV4_DT_F32, T, out);
    tu_fill(tu_f(&x), (size_t)(T * in), 3);
    float *xq = malloc((size_t)(T * in) * sizeof(float));
    memcpy(xq, x.data, (size_t)(T * in) * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int64_t k = 0; k < in; k += 128) dsv4_cpu_fp8_roundtrip(xq + t * in + k, 128);
    for (int mode = 0; mode < 2; mode++) {
        be->numerics = mode ? DSV4_NUMERICS_REFERENCE : DSV4_NUMERICS_HF;
        CHECK_EQ_INT(be->linear(be, &x, L, &y, NULL), 0);
        const float *xs = mode ? xq : tu_f(&x);
        double md = 0, mdiff = 0;
        for (int t = 0; t < T; t++)
            for (int64_t o = 0; o < out; o++) {
                double acc = 0, acc_other = 0;
                for (int64_t k = 0; k < in; k++) {
                    acc += (double)xs[t * in + k] * Wreal[o * in + k];
                    acc_other += (double)(mode ? tu_f(&x) : xq)[t * in + k] * Wreal[o * in + k];
                }
                md = fmax(md, fabs(tu_f(&y)[t * out + o] - acc));
                mdiff = fmax(mdiff, fabs(acc - acc_other));
            }
        CHECK_MSG(md < 1e-3, "%s mode %d: max diff %g", what, mode, md);
        CHECK_MSG(mdiff > 1e-3, "%s: W8A8 should change the result", what); /* the emulation is real */
    }
    be->numerics = DSV4_NUMERICS_HF;
    free(xq);
    be->buf_free(be, &x);
    be->buf_free(be, &y);
}

static void test_linear(void) {
    enum { O = 256, I = 256 };
    static uint8_t q8[O * I], s8[2 * 2], q4[O * I / 2], s4[O * I / 32];
    static float W[O * I];
    for (int i = 0; i < O * I; i++) {
        q8[i] = (uint8_t)(tu_state % 255);
        tu_rand();
        if ((q8[i] & 0x7F) == 0x7F) q8[i] = 0x30;
    }
    s8[0] = 120; s8[1] = 121; s8[2] = 119; s8[3] = 122;
    dsv4_linear L = {0};
    L.w = tu_view(DSV4_DT_F8_E4M3, q8, 2, O, I);
    L.scale = tu_view(DSV4_DT_F8_E8M0, s8, 2, 2, 2);
    L.out = O;
    L.in = I;
    for (int r = 0; r < O; r++)
        for (int k = 0; k < I; k++) {
            int b = q8[r * I + k], e = (b >> 3) & 15, m = b & 7;
            double v = e ? ldexp(1 + m / 8.0, e - 7) : ldexp(m, -9);
            W[r * I + k] = (float)((b & 0x80 ? -v : v) * ldexp(1, s8[(r / 128) * 2 + k / 128] - 127));
        }
    check_linear(&L, W, 3, "fp8");

    static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < O * I / 2; i++) {
        q4[i] = (uint8_t)(tu_state & 255);
        tu_rand();
    }
    for (int i = 0; i < O * I / 32; i++) s4[i] = (uint8_t)(120 + i % 5);
    L.w = tu_view(DSV4_DT_I8, q4, 2, O, I / 2);
    L.scale = tu_view(DSV4_DT_F8_E8M0, s4, 2, O, I / 32);
    for (int r = 0; r < O; r++)
        for (int k = 0; k < I; k++) {
            int byte = q4[r * (I / 2) + k / 2], nib = k % 2 ? byte >> 4 : byte & 15; /* low = even */
            float v = mag[nib & 7] * (nib & 8 ? -1 : 1);
            W[r * I + k] = v * ldexpf(1, s4[r * (I / 32) + k / 32] - 127);
        }
    check_linear(&L, W, 2, "fp4");

    /* BF16 weight: no activation quantisation in either mode */
    static uint16_t wb[64 * 32];
    for (int i = 0; i < 64 * 32; i++) {
        W[i] = dsv4_cpu_round_bf16(tu_rand());
        uint32_t u;
        memcpy(&u, &W[i], 4);
        wb[i] = (uint16_t)(u >> 16);
    }
    dsv4_linear B = {.w = tu_view(DSV4_DT_BF16, wb, 2, 64, 32), .out = 64, .in = 32};
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, 2, 32 * 4), y = tu_buf(be, DSV4_DT_F32, 2, 64), x1 = tu_buf(be, DSV4_DT_F32, 2, 32);
    tu_fill(tu_f(&x), 2 * 128, 1);
    /* grouped: 4 groups of 16 rows each read their own 32 input columns (§3.4.8) */
    CHECK_EQ_INT(be->linear_grouped(be, &x, &B, 4, &y, NULL), 0);
    double md = 0;
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 64; o++) {
            double acc = 0;
            for (int k = 0; k < 32; k++) acc += (double)tu_f(&x)[t * 128 + (o / 16) * 32 + k] * W[o * 32 + k];
            md = fmax(md, fabs(acc - tu_f(&y)[t * 64 + o]));
        }
    CHECK_NEAR(md, 0, 1e-5);
    be->numerics = DSV4_NUMERICS_REFERENCE;
    memcpy(x1.data, x.data, 32 * sizeof(float));
    CHECK_EQ_INT(be->linear(be, &x1, &B, &y, NULL), 0);
    double acc = 0;
    for (int k = 0; k < 32; k++) acc += (double)tu_f(&x1)[k] * W[5 * 32 + k];
    CHECK_NEAR(tu_f(&y)[5], acc, 1e-5);
    be->numerics = DSV4_NUMERICS_HF;
    dsv4_err e = {0};
    B.w.name = "layers.0.attn.wkv.weight";
    CHECK(be->linear(be, &x, &B, &y, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "layers.0.attn.wkv.weight");
    be->buf_free(be, &x);
    be->buf_free(be, &x1);
    be->buf_free(be, &y);
}

/* §3.2: Sinkhorn ends on a column normalisation; pre/post ranges; collapse = Σ pre_h X_h. */
static void test_hc(void) {
    enum { T = 3, NH = 4, D = 32, NM = NH * (2 + NH) };
    static float fn[NM * NH * D], base[NM], scale[3] = {0.7f, 1.3f, 0.9f};
    tu_fill(fn, NM * NH * D, 0.5f);
    tu_fill(base, NM, 1.5f);
    dsv4_tview vf = tu_view(DSV4_DT_F32, fn, 2, NM, NH * D), vb = tu_view(DSV4_DT_F32, base, 1, NM, 0),
               vs = tu_view(DSV4_DT_F32, scale, 1, 3, 0);
    dsv4_buf X = tu_buf(be, DSV4_DT_F32, T, NH * D), y = tu_buf(be, DSV4_DT_F32, T, D),
             post = tu_buf(be, DSV4_DT_F32, T, NH), comb = tu_buf(be, DSV4_DT_F32, T, NH * NH);
    tu_fill(tu_f(&X), T * NH * D, 2);
    CHECK_EQ_INT(be->hc_pre(be, &X, &vf, &vb, &vs, NH, 20, 1e-6f, &y, &post, &comb, NULL), 0);
    double col = 0, row = 0, yd = 0;
    int ranges = 1;
    for (int t = 0; t < T; t++) {
        const float *C = tu_f(&comb) + t * 16, *x = tu_f(&X) + t * NH * D;
        for (int j = 0; j < NH; j++) {
            double cs = 0, rs = 0;
            for (int i = 0; i < NH; i++) {
                cs += C[i * NH + j];
                rs += C[j * NH + i];
                if (C[i * NH + j] <= 0) ranges = 0;
            }
            col = fmax(col, fabs(cs - 1));
            row = fmax(row, fabs(rs - 1));
            float p = tu_f(&post)[t * NH + j];
            if (!(p > 0 && p < 2)) ranges = 0;
        }
        /* direct: m = fn·x / rms(x); pre = σ(m·scale0 + base) + eps */
        double ss = 0;
        for (int i = 0; i < NH * D; i++) ss += x[i] * x[i];
        double pre[NH];
        for (int h = 0; h < NH; h++) {
            double m = 0;
            for (int i = 0; i < NH * D; i++) m += fn[h * NH * D + i] * x[i];
            m /= sqrt(ss / (NH * D) + 1e-6);
            pre[h] = 1 / (1 + exp(-(m * scale[0] + base[h]))) + 1e-6;
        }
        for (int i = 0; i < D; i++) {
            double acc = 0;
            for (int h = 0; h < NH; h++) acc += pre[h] * x[h * D + i];
            yd = fmax(yd, fabs(acc - tu_f(&y)[t * D + i]));
        }
    }
    CHECK_NEAR(col, 0, 1e-5);     /* column sums exactly 1 (up to eps) */
    CHECK_NEAR(row, 0, 1e-2);     /* rows approximately */
    CHECK(ranges);
    CHECK_NEAR(yd, 0, 1e-4);

    /* post: X'_j = post_j f + Σ_i C[i][j] X_i (Cᵀ, not C) */
    dsv4_buf f = tu_buf(be, DSV4_DT_F32, T, D), X2 = tu_buf(be, DSV4_DT_F32, T, NH * D);
    tu_fill(tu_f(&f), T * D, 1);
    CHECK_EQ_INT(be->hc_post(be, &X, &f, &post, &comb, NH, &X2, NULL), 0);
    double pd = 0, asym = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < NH; j++)
            for (int k = 0; k < D; k++) {
                const float *C = tu_f(&comb) + t * 16;
                double acc = tu_f(&post)[t * NH + j] * tu_f(&f)[t * D + k], wrong = acc;
                for (int i = 0; i < NH; i++) {
                    acc += C[i * NH + j] * tu_f(&X)[t * NH * D + i * D + k];
                    wrong += C[j * NH + i] * tu_f(&X)[t * NH * D + i * D + k];
                }
                pd = fmax(pd, fabs(acc - tu_f(&X2)[t * NH * D + j * D + k]));
                asym = fmax(asym, fabs(acc - wrong));
            }
    CHECK_NEAR(pd, 0, 1e-4);
    CHECK(asym > 1e-3); /* the orientation is actually tested */
    CHECK(be->hc_post(be, &X, &f, &post, &comb, NH, &X, NULL) == DSV4_EINVAL);

    /* head: same collapse with its own 4-row fn, no Sinkhorn */
    dsv4_tview hf = tu_view(DSV4_DT_F32, fn, 2, NH, NH * D), hb = tu_view(DSV4_DT_F32, base, 1, NH, 0),
               hs = tu_view(DSV4_DT_F32, scale, 1, 1, 0);
    dsv4_buf y2 = tu_buf(be, DSV4_DT_F32, T, D);
    CHECK_EQ_INT(be->hc_head(be, &X, &hf, &hb, &hs, NH, 1e-6f, &y2, NULL), 0);
    CHECK_NEAR(tu_f(&y2)[D + 3], tu_f(&y)[D + 3], 1e-4); /* same fn rows 0..3, base, scale[0] as pre */
    be->buf_free(be, &X); be->buf_free(be, &y); be->buf_free(be, &post); be->buf_free(be, &comb);
    be->buf_free(be, &f); be->buf_free(be, &X2); be->buf_free(be, &y2);
}

int main(void) {
    be = dsv4_backend_cpu_create(DSV4_NUMERICS_HF, NULL);
    test_rope();
    test_rmsnorm();
    test_linear();
    test_hc();
    be->free(be);
    return TEST_REPORT();
}
