/*
 * dsv4_state_copy_slot (prefix caching, spec/SERVING.md §8.7) on a random
 * in-memory model (tests/unit/synth_model.h: W = 8, ratio 4 / 128 / 4
 * layers, indexer top-3): a slot is prefilled to 147, then speculative rows
 * 147..150 are written and rejected; the slot is copied, and the copy resumed
 * at 147 with the true tokens gives the logits of one long prefill (so do
 * decode rows after it) — through window ring, compressor token rings,
 * emitted rows (the ratio-128 window ended at 127) and indexer keys. A slot
 * that was not copied (reset) gives different logits, so the check can fail.
 */
#include "synth_model.h"
#include "test.h"

enum { N = 154, V = 64, R = 147 };
static int32_t toks[N], junk[N];
static float ref[N][V], got[N][V];
static dsv4_model *model;
static dsv4_state *st;

static int run(int slot, int pos0, int n, const int32_t *tk, float (*out)[V]) {
    static tu_batch tb;
    tu_batch_init(&tb);
    tu_batch_add(&tb, slot, pos0, n, tk);
    int32_t rows[N];
    static float lg[N * V];
    for (int t = 0; t < n; t++) rows[t] = t;
    dsv4_err e = {0};
    int rc = dsv4_forward(model, st, &tb.b, rows, n, lg, NULL, &e);
    if (rc) fprintf(stderr, "forward: %s\n", e.msg);
    for (int k = 0; out && k < n; k++) memcpy(out[pos0 + k], lg + (size_t)k * V, sizeof(float) * V);
    return rc;
}

static double maxdiff(int from, int to) {
    double m = 0;
    for (int p = from; p < to; p++)
        for (int v = 0; v < V; v++) m = fmax(m, fabs(got[p][v] - ref[p][v]));
    return m;
}

int main(void) {
    static synth s;
    synth_build(&s, 7);
    for (int p = 0; p < N; p++) {
        toks[p] = (int32_t)((p * 37 + 11) % V);
        junk[p] = (int32_t)((p * 13 + 5) % V);
    }
    dsv4_err e = {0};
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
    CHECK_EQ_INT(dsv4_model_create(&s.cfg, &s.w, be, &model, &e), 0);
    int ratios[4] = {0, 4, 128, 4};
    CHECK_EQ_INT(dsv4_state_create(be, &s.cfg, ratios, 4, 4, 256, 4, &st, &e), 0);
    if (!model || !st) {
        fprintf(stderr, "%s\n", e.msg);
        return TEST_REPORT();
    }
    CHECK_EQ_INT(run(3, 0, N, toks, ref), 0); /* one long prefill */

    CHECK_EQ_INT(run(0, 0, R, toks, NULL), 0);
    CHECK_EQ_INT(run(0, R, 4, junk, NULL), 0); /* rejected speculative rows 147..150 */
    CHECK_EQ_INT(dsv4_state_copy_slot(st, 0, 1, R + 4, &e), 0);
    CHECK_EQ_INT(dsv4_state_reset_slot(st, 0, &e), 0); /* the copy must not depend on the source any more */
    CHECK_EQ_INT(run(1, R, 3, toks, got), 0);
    for (int p = R + 3; p < N; p++) CHECK_EQ_INT(run(1, p, 1, toks, got), 0);
    double d = maxdiff(R, N);
    CHECK_MSG(d < 2e-4, "copied slot resumed at %d vs one prefill: %g", R, d);

    /* control: the same rows in a slot that holds nothing */
    CHECK_EQ_INT(dsv4_state_reset_slot(st, 2, &e), 0);
    CHECK_EQ_INT(run(2, R, 3, toks, got), 0);
    d = maxdiff(R, R + 3);
    CHECK_MSG(d > 1e-2, "an empty slot gives the same logits (%g): the check is blind", d);

    /* errors */
    CHECK_EQ_INT(dsv4_state_copy_slot(st, 1, 1, 10, &e), DSV4_EINVAL);
    CHECK_EQ_INT(dsv4_state_copy_slot(st, 0, 4, 10, &e), DSV4_EINVAL);
    CHECK_EQ_INT(dsv4_state_copy_slot(st, 0, 1, 257, &e), DSV4_EINVAL);

    dsv4_state_free(st);
    dsv4_model_free(model);
    be->free(be);
    synth_free(&s);
    return TEST_REPORT();
}
