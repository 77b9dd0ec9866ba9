/*
 * CPU attention-side ops against direct math (spec/MODEL.md §3.4.4-3.4.7):
 * sink attention over ring + batch rows + compressed rows vs a naive softmax,
 * the compressor's overlapping pooling vs its definition, chunk and
 * speculative-rewrite invariance of the compressor state, and the indexer's
 * top-k vs brute force.
 */
#include "backend/cpu/cpu_internal.h"
#include "cpu_test_util.h"
#include "test.h"

#include <math.h>

static dsv4_backend *be;

enum { HD = 16, NHEAD = 2, WIN = 4, NPOS = 12 };
static float kvfull[2][NPOS][HD], qfull[2][NPOS][NHEAD * HD], cmprows[2][3][HD], sinks[NHEAD];

/* o for (slot, p) by the definition: softmax over window rows + visible compressed rows + sink. */
static void naive_attention(int slot, int p, int use_cmp, float *o) {
    for (int h = 0; h < NHEAD; h++) {
        const float *keys[16];
        int n = 0;
        for (int pp = p - WIN + 1 < 0 ? 0 : p - WIN + 1; pp <= p; pp++) keys[n++] = kvfull[slot][pp];
        if (use_cmp)
            for (int w = 0; w < (p + 1) / 4; w++) keys[n++] = cmprows[slot][w];
        double s[16], mx = sinks[h], den;
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int k = 0; k < HD; k++) acc += (double)qfull[slot][p][h * HD + k] * keys[j][k];
            s[j] = acc / sqrt((double)HD);
            mx = fmax(mx, s[j]);
        }
        den = exp(sinks[h] - mx);
        for (int j = 0; j < n; j++) den += exp(s[j] - mx);
        for (int k = 0; k < HD; k++) {
            double acc = 0;
            for (int j = 0; j < n; j++) acc += exp(s[j] - mx) / den * keys[j][k];
            o[h * HD + k] = (float)acc;
        }
    }
}

/* Run attention for a batch, store its window rows, return max |o − naive|. */
static double run_attention(dsv4_win_state *ws, dsv4_cmp_state *cs, tu_batch *tb) {
    int T = tb->b.n_rows;
    dsv4_buf q = tu_buf(be, DSV4_DT_F32, T, NHEAD * HD), kv = tu_buf(be, DSV4_DT_F32, T, HD),
             o = tu_buf(be, DSV4_DT_F32, T, NHEAD * HD);
    for (int t = 0; t < T; t++) {
        memcpy(tu_f(&q) + t * NHEAD * HD, qfull[tb->slot[t]][tb->pos[t]], sizeof(float) * NHEAD * HD);
        memcpy(tu_f(&kv) + t * HD, kvfull[tb->slot[t]][tb->pos[t]], sizeof(float) * HD);
    }
    dsv4_tview sv = tu_view(DSV4_DT_F32, sinks, 1, NHEAD, 0);
    CHECK_EQ_INT(be->batch_begin(be, &tb->b, NULL), 0);
    CHECK_EQ_INT(be->attention(be, &q, &kv, ws, cs, NULL, &sv, NHEAD, &tb->b, &o, NULL), 0);
    CHECK_EQ_INT(be->win_store(be, ws, &kv, &tb->b, NULL), 0);
    double md = 0;
    for (int t = 0; t < T; t++) {
        float want[NHEAD * HD];
        naive_attention(tb->slot[t], tb->pos[t], cs != NULL, want);
        for (int k = 0; k < NHEAD * HD; k++) md = fmax(md, fabs(want[k] - tu_f(&o)[t * NHEAD * HD + k]));
    }
    be->buf_free(be, &q);
    be->buf_free(be, &kv);
    be->buf_free(be, &o);
    return md;
}

static void test_attention(void) {
    tu_fill(&kvfull[0][0][0], sizeof kvfull / 4, 1.5f);
    tu_fill(&qfull[0][0][0], sizeof qfull / 4, 1.5f);
    tu_fill(&cmprows[0][0][0], sizeof cmprows / 4, 1.5f);
    tu_fill(sinks, NHEAD, 1);
    for (int with_cmp = 0; with_cmp < 2; with_cmp++) {
        dsv4_win_state ws = {.window = WIN, .cap = WIN + 2, .n_slots = 2};
        ws.rows = tu_buf(be, DSV4_DT_F32, 2 * ws.cap, HD);
        dsv4_cmp_state cs = {.ratio = 4, .overlap = 1, .out_dim = HD, .n_slots = 2, .max_rows = 3};
        cs.rows = tu_buf(be, DSV4_DT_F32, 2 * 3, HD);
        memcpy(cs.rows.data, cmprows, sizeof cmprows);
        /* step 1: two prefills; step 2: a 3-row verify segment and a decode row, reading the ring */
        tu_batch tb;
        tu_batch_init(&tb);
        tu_batch_add(&tb, 0, 0, 6, NULL);
        tu_batch_add(&tb, 1, 0, 5, NULL);
        CHECK_NEAR(run_attention(&ws, with_cmp ? &cs : NULL, &tb), 0, 1e-5);
        tu_batch_init(&tb);
        tu_batch_add(&tb, 1, 5, 3, NULL);
        tu_batch_add(&tb, 0, 6, 1, NULL);
        CHECK_NEAR(run_attention(&ws, with_cmp ? &cs : NULL, &tb), 0, 1e-5);
        /* reference numerics: bf16 probabilities, so close but not identical */
        be->numerics = DSV4_NUMERICS_REFERENCE;
        tu_batch_init(&tb);
        tu_batch_add(&tb, 0, 7, 2, NULL);
        double md = run_attention(&ws, with_cmp ? &cs : NULL, &tb);
        CHECK(md < 2e-2 && md > 0);
        be->numerics = DSV4_NUMERICS_HF;
        be->buf_free(be, &ws.rows);
        be->buf_free(be, &cs.rows);
    }
}

/* ---- compressor ---- */
enum { D = 8, RD = 4, NP = 13 };
static float Kp[NP][2 * D], Zp[NP][2 * D], ape[4][2 * D], normw[D];

static void compress_rows(dsv4_cmp_state *cs, int slot, int p0, int n, const dsv4_rope *r, float garbage) {
    tu_batch tb;
    tu_batch_init(&tb);
    tu_batch_add(&tb, slot, p0, n, NULL);
    int cw = cs->overlap ? 2 * D : D;
    dsv4_buf K = tu_buf(be, DSV4_DT_F32, n, cw), Z = tu_buf(be, DSV4_DT_F32, n, cw);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < cw; j++) {
            tu_f(&K)[i * cw + j] = Kp[p0 + i][j] + garbage;
            tu_f(&Z)[i * cw + j] = Zp[p0 + i][j] - garbage;
        }
    dsv4_tview av = tu_view(DSV4_DT_F32, ape, 2, cs->ratio, cw), nv = tu_view(DSV4_DT_F32, normw, 1, D, 0);
    CHECK_EQ_INT(be->compress(be, cs, &K, &Z, &av, &nv, 1e-6f, r, DSV4_QAT_FP8_NOPE, &tb.b, NULL), 0);
    be->buf_free(be, &K);
    be->buf_free(be, &Z);
}

/* Definition (§3.4.5): window w pools Ka,Za of w−1 and Kb,Zb of w, per channel. */
static void naive_window(int w, const dsv4_rope *r, float *out) {
    for (int j = 0; j < D; j++) {
        double z[8], k[8], mx = -INFINITY, den = 0, acc = 0;
        int n = 0;
        for (int p = (w - 1) * 4; p < w * 4; p++)
            if (p >= 0) {
                z[n] = Zp[p][j] + ape[p % 4][j];
                k[n++] = Kp[p][j];
            }
        for (int p = w * 4; p < w * 4 + 4; p++) {
            z[n] = Zp[p][D + j] + ape[p % 4][D + j];
            k[n++] = Kp[p][D + j];
        }
        for (int i = 0; i < n; i++) mx = fmax(mx, z[i]);
        for (int i = 0; i < n; i++) {
            den += exp(z[i] - mx);
            acc += exp(z[i] - mx) * k[i];
        }
        out[j] = (float)(acc / den);
    }
    double ss = 0;
    for (int j = 0; j < D; j++) ss += out[j] * out[j];
    for (int j = 0; j < D; j++) out[j] = (float)(out[j] / sqrt(ss / D + 1e-6) * normw[j]);
    dsv4_cpu_rope_row(out, D, r, 4 * w, 0);
}

static void test_compress(void) {
    tu_fill(&Kp[0][0], sizeof Kp / 4, 2);
    tu_fill(&Zp[0][0], sizeof Zp / 4, 2);
    tu_fill(&ape[0][0], sizeof ape / 4, 1);
    for (int j = 0; j < D; j++) normw[j] = 1 + 0.3f * tu_rand();
    dsv4_rope r;
    dsv4_rope_init(&r, RD, 160000, 16, 65536, 32, 1, NULL);
    dsv4_cmp_state cs = {.ratio = 4, .overlap = 1, .out_dim = D, .cap = 8 + 3, .n_slots = 3, .max_rows = 4};
    cs.kv = tu_buf(be, DSV4_DT_F32, 3 * cs.cap, 2 * D);
    cs.score = tu_buf(be, DSV4_DT_F32, 3 * cs.cap, 2 * D);
    cs.rows = tu_buf(be, DSV4_DT_F32, 3 * 4, D);
    compress_rows(&cs, 0, 0, NP, &r, 0);               /* slot 0: one pass            */
    compress_rows(&cs, 1, 0, 5, &r, 0);                /* slot 1: chunks 5 + 1 + 7    */
    compress_rows(&cs, 1, 5, 1, &r, 0);
    compress_rows(&cs, 1, 6, 7, &r, 0);
    compress_rows(&cs, 2, 0, 7, &r, 0);                /* slot 2: 7 real rows,        */
    compress_rows(&cs, 2, 7, 3, &r, 5.0f);             /* 3 rejected (garbage) rows,  */
    compress_rows(&cs, 2, 7, 6, &r, 0);                /* then the real 7..12         */
    double md = 0, mchunk = 0, mspec = 0;
    for (int w = 0; w < 3; w++) {
        float want[D];
        naive_window(w, &r, want);
        const float *r0 = tu_f(&cs.rows) + (0 * 4 + w) * D, *r1 = tu_f(&cs.rows) + (1 * 4 + w) * D,
                    *r2 = tu_f(&cs.rows) + (2 * 4 + w) * D;
        for (int j = 0; j < D; j++) {
            md = fmax(md, fabs(want[j] - r0[j]));
            mchunk = fmax(mchunk, fabs(r1[j] - r0[j]));
            mspec = fmax(mspec, fabs(r2[j] - r0[j]));
        }
    }
    CHECK_NEAR(md, 0, 1e-5);
    CHECK_NEAR(mchunk, 0, 1e-6);
    CHECK_NEAR(mspec, 0, 1e-6);
    /* reference numerics: the nope dims (0..3) land on the FP8 grid of their block */
    be->numerics = DSV4_NUMERICS_REFERENCE;
    compress_rows(&cs, 1, 0, NP, &r, 0);
    be->numerics = DSV4_NUMERICS_HF;
    const float *q = tu_f(&cs.rows) + (1 * 4 + 2) * D;
    float blk[4] = {q[0], q[1], q[2], q[3]};
    float again[4] = {blk[0], blk[1], blk[2], blk[3]};
    dsv4_cpu_fp8_roundtrip(again, 4);
    CHECK(memcmp(again, blk, sizeof blk) == 0); /* idempotent: already quantised */
    CHECK(q[0] != tu_f(&cs.rows)[(0 * 4 + 2) * D] || q[1] != tu_f(&cs.rows)[(0 * 4 + 2) * D + 1]);
    be->buf_free(be, &cs.kv);
    be->buf_free(be, &cs.score);
    be->buf_free(be, &cs.rows);
}

static void test_indexer(void) {
    enum { H = 3, DK = 8, TOPK = 2 };
    dsv4_cmp_state idx = {.ratio = 4, .overlap = 1, .out_dim = DK, .n_slots = 1, .max_rows = 5};
    idx.rows = tu_buf(be, DSV4_DT_F32, 5, DK);
    tu_fill(tu_f(&idx.rows), 5 * DK, 1);
    tu_batch tb;
    tu_batch_init(&tb);
    tu_batch_add(&tb, 0, 14, 3, NULL); /* p = 14, 15, 16 → 3, 4, 4 visible rows */
    dsv4_buf qi = tu_buf(be, DSV4_DT_F32, 3, H * DK), g = tu_buf(be, DSV4_DT_F32, 3, H),
             sel = tu_buf(be, DSV4_DT_I32, 3, TOPK);
    tu_fill(tu_f(&qi), 3 * H * DK, 1);
    tu_fill(tu_f(&g), 3 * H, 1);
    CHECK_EQ_INT(be->indexer_select(be, &qi, &g, 0.5f, &idx, TOPK, &tb.b, &sel, NULL), 0);
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        int nv = (14 + t + 1) / 4;
        double sc[5];
        for (int w = 0; w < nv; w++) {
            sc[w] = 0;
            for (int h = 0; h < H; h++) {
                double dot = 0;
                for (int k = 0; k < DK; k++) dot += tu_f(&qi)[t * H * DK + h * DK + k] * tu_f(&idx.rows)[w * DK + k];
                sc[w] += 0.5 * tu_f(&g)[t * H + h] * (dot > 0 ? dot : 0);
            }
        }
        /* each selected row must beat every unselected visible row */
        const int32_t *s = (const int32_t *)sel.data + t * TOPK;
        for (int w = 0; w < nv; w++) {
            int picked = s[0] == w || s[1] == w;
            for (int j = 0; j < TOPK; j++)
                if (!picked && sc[w] > sc[s[j]]) ok = 0;
        }
        if (s[0] == s[1] || s[0] < 0 || s[1] >= nv) ok = 0;
    }
    CHECK(ok);
    tu_batch_init(&tb);
    tu_batch_add(&tb, 0, 4, 1, NULL); /* 1 visible row <= topk: it, then −1 */
    dsv4_buf sel1 = tu_buf(be, DSV4_DT_I32, 1, TOPK);
    CHECK_EQ_INT(be->indexer_select(be, &qi, &g, 0.5f, &idx, TOPK, &tb.b, &sel1, NULL), DSV4_EINVAL); /* qi rows != T */
    dsv4_buf qi1 = tu_buf(be, DSV4_DT_F32, 1, H * DK), g1 = tu_buf(be, DSV4_DT_F32, 1, H);
    CHECK_EQ_INT(be->indexer_select(be, &qi1, &g1, 0.5f, &idx, TOPK, &tb.b, &sel1, NULL), 0);
    CHECK_EQ_INT(((int32_t *)sel1.data)[0], 0);
    CHECK_EQ_INT(((int32_t *)sel1.data)[1], -1);
    be->buf_free(be, &idx.rows); be->buf_free(be, &qi); be->buf_free(be, &g); be->buf_free(be, &sel);
    be->buf_free(be, &sel1); be->buf_free(be, &qi1); be->buf_free(be, &g1);
}

int main(void) {
    be = dsv4_backend_cpu_create(DSV4_NUMERICS_HF, NULL);
    test_attention();
    test_compress();
    test_indexer();
    be->free(be);
    return TEST_REPORT();
}
