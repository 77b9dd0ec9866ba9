/*
 * Forward-pass invariances on a random in-memory model (tests/unit/synth_model.h),
 * spec/MODEL.md §3.8 and DESIGN.md "Rules": for one 150-token sequence
 * (crossing ratio-4 windows, the first ratio-128 window at p = 127, window
 * eviction at W = 8, indexer pruning with top-3), the logits of every row are
 * the same whether it is computed
 *   - in one prefill,
 *   - in chunks split anywhere (37 + 1 + 60 + 52),
 *   - as decode steps after a prefill,
 *   - next to other requests in the same batch (mixed prefill + decode),
 *   - after speculative rows were written and rejected (re-written).
 * Checked in both HF and reference numerics.
 */
#include "synth_model.h"
#include "test.h"

enum { N = 150, V = 64 };
static int32_t toks[N], other[N];
static float ref[N][V];

static dsv4_model *model;
static dsv4_state *st;

/* Run one batch; copy logits of every row into out_by_pos (by slot filter) */
typedef struct seg { int slot, pos0, n; const int32_t *toks; float (*out)[V]; } seg;

static int run(const seg *segs, int ns) {
    tu_batch *tb = malloc(sizeof *tb);
    tu_batch_init(tb);
    for (int i = 0; i < ns; i++) tu_batch_add(tb, segs[i].slot, segs[i].pos0, segs[i].n, segs[i].toks);
    int T = tb->b.n_rows;
    int32_t *rows = malloc(sizeof(int32_t) * T);
    float *lg = malloc(sizeof(float) * T * V);
    for (int t = 0; t < T; t++) rows[t] = t;
    dsv4_err e = {0};
    int rc = dsv4_forward(model, st, &tb->b, rows, T, lg, NULL, &e);
    if (rc) fprintf(stderr, "forward: %s\n", e.msg);
    for (int i = 0, r = 0; i < ns; i++)
        for (int k = 0; k < segs[i].n; k++, r++)
            if (segs[i].out) memcpy(segs[i].out[segs[i].pos0 + k], lg + (size_t)r * V, sizeof(float) * V);
    free(rows);
    free(lg);
    free(tb);
    return rc;
}

static double maxdiff(float (*a)[V], int from, int to) {
    double m = 0;
    for (int p = from; p < to; p++)
        for (int v = 0; v < V; v++) m = fmax(m, fabs(a[p][v] - ref[p][v]));
    return m;
}

static void check_mode(dsv4_numerics num, float (*hf_ref)[V]) {
    model->be->numerics = num;
    static float got[N][V];
    const char *mode = num == DSV4_NUMERICS_HF ? "HF" : "reference";
    for (int s = 0; s < 4; s++) dsv4_state_reset_slot(st, s, NULL);
    /* one long prefill in slot 0 is the reference */
    seg one = {0, 0, N, toks, ref};
    CHECK_EQ_INT(run(&one, 1), 0);
    /* the ratio-128 layer emitted its first row, so the HCA path was exercised */
    const float *hca = (const float *)st->layers[2].cmp.rows.data;
    CHECK(hca[0] != 0 || hca[1] != 0);

    /* chunked prefill in slot 1 */
    int cuts[5] = {0, 37, 38, 98, N};
    for (int i = 0; i < 4; i++) {
        seg s = {1, cuts[i], cuts[i + 1] - cuts[i], toks, got};
        CHECK_EQ_INT(run(&s, 1), 0);
    }
    double d = maxdiff(got, 0, N);
    CHECK_MSG(d < 2e-4, "%s chunked vs one pass: %g", mode, d);

    /* prefill 120 then decode, in slot 2 */
    seg pre = {2, 0, 120, toks, got};
    CHECK_EQ_INT(run(&pre, 1), 0);
    for (int p = 120; p < N; p++) {
        seg s = {2, p, 1, toks, got};
        CHECK_EQ_INT(run(&s, 1), 0);
    }
    d = maxdiff(got, 0, N);
    CHECK_MSG(d < 2e-4, "%s decode vs prefill: %g", mode, d);

    /* mixed batches: slot 3 shares steps with an unrelated request in slot 0 */
    dsv4_state_reset_slot(st, 0, NULL);
    seg m1[2] = {{0, 0, 64, other, NULL}, {3, 0, 100, toks, got}};
    CHECK_EQ_INT(run(m1, 2), 0);
    seg m2[2] = {{3, 100, 50, toks, got}, {0, 64, 1, other, NULL}};
    CHECK_EQ_INT(run(m2, 2), 0);
    d = maxdiff(got, 0, N);
    CHECK_MSG(d < 2e-4, "%s mixed batch vs alone: %g", mode, d);

    /* speculative verify in slot 1: rows 100..103 with 3 wrong drafts, then continue from 101 */
    dsv4_state_reset_slot(st, 1, NULL);
    seg s0 = {1, 0, 100, toks, got};
    CHECK_EQ_INT(run(&s0, 1), 0);
    int32_t draft[N];
    memcpy(draft, toks, sizeof draft);
    for (int p = 101; p < 104; p++) draft[p] = (toks[p] + 5) % V;
    seg s1 = {1, 100, 4, draft, NULL};
    CHECK_EQ_INT(run(&s1, 1), 0);
    seg s2 = {1, 101, N - 101, toks, got};
    CHECK_EQ_INT(run(&s2, 1), 0);
    d = maxdiff(got, 101, N);
    CHECK_MSG(d < 2e-4, "%s after rejected drafts: %g", mode, d);

    if (hf_ref) { /* the emulations are real: reference numerics move the logits */
        double m = 0;
        for (int p = 0; p < N; p++)
            for (int v = 0; v < V; v++) m = fmax(m, fabs(hf_ref[p][v] - ref[p][v]));
        CHECK_MSG(m > 1e-3, "reference vs HF numerics differ by only %g", m);
    }
}

int main(void) {
    static synth s;
    synth_build(&s, 42);
    for (int p = 0; p < N; p++) {
        toks[p] = (int32_t)((p * 37 + 11) % V);
        other[p] = (int32_t)((p * 13 + 5) % V);
    }
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_HF, &e);
    CHECK_EQ_INT(dsv4_model_create(&s.cfg, &s.w, be, &model, &e), 0);
    int ratios[4] = {0, 4, 128, 4};
    CHECK_EQ_INT(dsv4_state_create(be, &s.cfg, ratios, 4, 4, 256, 4, &st, &e), 0);
    if (!model || !st) {
        fprintf(stderr, "%s\n", e.msg);
        return TEST_REPORT();
    }
    static float hf[N][V];
    check_mode(DSV4_NUMERICS_HF, NULL);
    memcpy(hf, ref, sizeof hf);
    check_mode(DSV4_NUMERICS_REFERENCE, hf);

    /* DSpark taps (DSPARK.md §2.2): the hc-mean of a layer's output streams. Layer 3 is the
     * last, so its tap is the mean of the final streams; layer 1's equals the final streams
     * of the same model cut after two layers. */
    {
        enum { T = 24 };
        static float taps[T * 2 * 64], streams[T * 4 * 64], cut[T * 4 * 64];
        int tap_layers[2] = {3, 1};
        tu_batch tb1;
        tu_batch_init(&tb1);
        tu_batch_add(&tb1, 0, 0, T, toks);
        dsv4_state_reset_slot(st, 0, NULL);
        dsv4_fwd_out out = {.streams = streams, .tap_layers = tap_layers, .n_taps = 2, .taps = taps};
        CHECK_EQ_INT(dsv4_forward_ex(model, st, &tb1.b, &out, &e), 0);
        dsv4_state_reset_slot(st, 0, NULL);
        model->n_layers = 2;
        st->n_layers = 2;
        dsv4_fwd_out out2 = {.streams = cut};
        CHECK_EQ_INT(dsv4_forward_ex(model, st, &tb1.b, &out2, &e), 0);
        model->n_layers = 4;
        st->n_layers = 4;
        double d3 = 0, d1 = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 64; k++) {
                float m3 = 0, m1 = 0;
                for (int h = 0; h < 4; h++) {
                    m3 += streams[(t * 4 + h) * 64 + k] / 4;
                    m1 += cut[(t * 4 + h) * 64 + k] / 4;
                }
                d3 = fmax(d3, fabs(m3 - taps[(t * 2 + 0) * 64 + k]));
                d1 = fmax(d1, fabs(m1 - taps[(t * 2 + 1) * 64 + k]));
            }
        CHECK_NEAR(d3, 0, 1e-5);
        CHECK_NEAR(d1, 0, 1e-5);
        int bad_tap[1] = {4};
        dsv4_fwd_out out3 = {.tap_layers = bad_tap, .n_taps = 1, .taps = taps};
        CHECK(dsv4_forward_ex(model, st, &tb1.b, &out3, &e) == DSV4_EINVAL);
    }

    /* The hc carry (forward.c, block.c): where the backend has hc_post_pre_norm, each block's last hc_post
     * runs fused with the next block's first hc_pre, except after a tap layer and the last layer. The CPU's op
     * is the same ops in the same order, so logits, streams and taps are the same bits as with the op
     * removed (each hc_post then run on its own): a wrong post / comb pair, a lost or doubled hc_post or a
     * tap read before its hc_post would show here. */
    {
        enum { T = 9 };
        CHECK(be->hc_post_pre_norm != NULL);
        static float lg2[2][T * V], st2[2][T * 4 * 64], tp2[2][T * 64];
        int32_t rows2[T], tap1[1] = {1};
        for (int t = 0; t < T; t++) rows2[t] = t;
        const dsv4_backend keep = *be;
        for (int v = 0; v < 2; v++) {
            if (v) be->hc_post_pre_norm = NULL;
            tu_batch tb2;
            tu_batch_init(&tb2);
            tu_batch_add(&tb2, 0, 0, T, toks + 5);
            dsv4_state_reset_slot(st, 0, NULL);
            dsv4_fwd_out o = {.logit_rows = rows2, .n_logits = T, .logits = lg2[v], .streams = st2[v],
                              .tap_layers = tap1, .n_taps = 1, .taps = tp2[v]};
            CHECK_EQ_INT(dsv4_forward_ex(model, st, &tb2.b, &o, &e), 0);
        }
        be->hc_post_pre_norm = keep.hc_post_pre_norm;
        CHECK(memcmp(lg2[0], lg2[1], sizeof lg2[0]) == 0);
        CHECK(memcmp(st2[0], st2[1], sizeof st2[0]) == 0);
        CHECK(memcmp(tp2[0], tp2[1], sizeof tp2[0]) == 0);
        double mx = 0; /* (and the logits are real numbers, not two equal empty buffers) */
        for (int i = 0; i < T * V; i++) mx = isfinite(lg2[0][i]) ? fmax(mx, fabs(lg2[0][i])) : INFINITY;
        CHECK(mx > 0 && isfinite(mx));
    }

    /* errors name what is wrong */
    tu_batch tb;
    tu_batch_init(&tb);
    int32_t bad[2] = {1, 999};
    tu_batch_add(&tb, 0, 0, 2, bad);
    float lg[2 * V];
    int32_t rows[2] = {0, 1};
    dsv4_state_reset_slot(st, 0, NULL);
    CHECK(dsv4_forward(model, st, &tb.b, rows, 2, lg, NULL, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "999");
    tu_batch_init(&tb);
    tu_batch_add(&tb, 7, 0, 1, toks);
    CHECK(dsv4_forward(model, st, &tb.b, rows, 1, lg, NULL, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "slot 7");
    tu_batch_init(&tb);
    tu_batch_add(&tb, 0, 256, 1, NULL);
    CHECK(dsv4_forward(model, st, &tb.b, rows, 1, lg, NULL, &e) == DSV4_ERANGE);

    dsv4_state_free(st);
    dsv4_model_free(model);
    be->free(be);
    synth_free(&s);
    return TEST_REPORT();
}
