/*
 * Backend logit_top on the CPU reference (backend.h; issue 7): the greedy id
 * it returns is the host sampler's (dsv4_sampling_probs at temperature 0,
 * src/engine/sampler.c) on every row — ties to the lowest id, -inf rows,
 * a NaN at id 0 or elsewhere — and its top-k ids and log-softmax values are
 * dsv4_token_logprob_compute's, bit for bit, so the engine's greedy-ids path
 * emits the tokens (and could report the logprobs) of the host path. Bad
 * shapes are refused. The CUDA kernel is held to this op by the conformance
 * harness (src/backend/conformance.c, tests/gpu/gpu_conformance.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/sampler.h"
#include "test.h"

#define ROWS 12

static uint32_t rng = 2463534242u;
static uint32_t xs(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* Row r of [ROWS][V]: coarse values (many exact ties), with special rows. */
static void fill(float *x, int V) {
    for (int r = 0; r < ROWS; r++) {
        float *row = x + (size_t)r * V;
        for (int v = 0; v < V; v++) row[v] = (float)((int)(xs() % 9) - 4) * 0.5f; /* 9 levels: ties everywhere */
        if (V < 12) continue; /* the planted cases need room (row 1 all equal is then the whole row) */
        switch (r) {
        case 1: for (int v = 0; v < V; v++) row[v] = 1.25f; break;                  /* all equal: id 0 */
        case 2: row[V - 1] = 100.f; break;                                          /* max at the end */
        case 3: row[0] = -INFINITY, row[5] = -INFINITY; break;
        case 4: row[7] = 3.f, row[3] = 3.f, row[V - 2] = 3.f; break;                /* tie above the rest: 3 */
        case 5: row[V / 2] = 1e30f, row[V / 2 + 1] = 1e30f; break;
        case 6: row[2] = -0.0f, row[9] = 0.0f; break;                               /* signed zeros tie */
        default: break;
        }
    }
}

static int run_top(dsv4_backend *be, const float *x, int V, int k, int32_t *ids, float *lp, dsv4_err *err) {
    dsv4_buf bx = {0}, bi = {0}, bl = {0};
    int rc = be->buf_alloc(be, DSV4_DT_F32, ROWS, V, &bx, err);
    if (!rc) rc = be->buf_write(be, &bx, x, err);
    if (!rc) rc = be->buf_alloc(be, DSV4_DT_I32, ROWS, k, &bi, err);
    if (!rc && lp) rc = be->buf_alloc(be, DSV4_DT_F32, ROWS, k, &bl, err);
    if (!rc) rc = be->logit_top(be, &bx, &bi, lp ? &bl : NULL, err);
    if (!rc) rc = be->buf_read(be, &bi, ids, err);
    if (!rc && lp) rc = be->buf_read(be, &bl, lp, err);
    be->buf_free(be, &bx);
    be->buf_free(be, &bi);
    be->buf_free(be, &bl);
    return rc;
}

static void test_against_sampler(dsv4_backend *be, int V) {
    float *x = malloc(sizeof(float) * ROWS * (size_t)V), *probs = malloc(sizeof(float) * (size_t)V);
    void *scratch = malloc(dsv4_sampling_scratch_bytes(V));
    int32_t ids[ROWS * 8];
    float lp[ROWS * 8];
    dsv4_err err = {0};
    dsv4_sampling sp;
    dsv4_sampling_default(&sp);
    sp.temperature = 0;
    for (int round = 0; round < 4; round++) {
        fill(x, V);
        CHECK_EQ_INT(run_top(be, x, V, 1, ids, NULL, &err), 0);
        for (int r = 0; r < ROWS; r++) {
            int32_t want = dsv4_sampling_probs(&sp, x + (size_t)r * V, V, NULL, 0, NULL, 0, probs, scratch);
            CHECK_MSG(ids[r] == want, "V=%d row %d: logit_top %d, sampler %d", V, r, ids[r], want);
        }
        int k = V < 8 ? V : 8;
        CHECK_EQ_INT(run_top(be, x, V, k, ids, lp, &err), 0);
        for (int r = 0; r < ROWS; r++) {
            dsv4_token_logprob ref;
            const float *row = x + (size_t)r * V;
            int32_t am = dsv4_sampling_probs(&sp, row, V, NULL, 0, NULL, 0, probs, scratch);
            dsv4_token_logprob_compute(row, V, am, k, &ref);
            CHECK_EQ_INT(ref.n_top, k);
            int same = ids[r * k] == am && !memcmp(lp + r * k, &ref.logprob, sizeof(float));
            for (int j = 0; j < k; j++)
                same &= ids[r * k + j] == ref.top_ids[j] && !memcmp(&lp[r * k + j], &ref.top_logprobs[j], sizeof(float));
            CHECK_MSG(same, "V=%d row %d: top-%d ids / logprobs differ from the host's", V, r, k);
        }
    }
    free(x);
    free(probs);
    free(scratch);
}

/* NaN: never wins, except at id 0 where the host scan starts (and keeps it). */
static void test_nan(dsv4_backend *be) {
    enum { V = 16 };
    float x[ROWS * V], probs[V];
    void *scratch = malloc(dsv4_sampling_scratch_bytes(V));
    int32_t ids[ROWS * 3];
    dsv4_err err = {0};
    for (int i = 0; i < ROWS * V; i++) x[i] = (float)(i % 5);
    x[0 * V + 0] = NAN;            /* row 0: NaN at id 0 -> 0 */
    x[1 * V + 3] = NAN;            /* row 1 ((16+v) % 5): NaN at the first 4 -> the next 4 (id 8) */
    for (int v = 0; v < V; v++) x[2 * V + v] = NAN; /* row 2: all NaN -> 0, then nothing */
    CHECK_EQ_INT(run_top(be, x, V, 1, ids, NULL, &err), 0);
    dsv4_sampling sp;
    dsv4_sampling_default(&sp);
    sp.temperature = 0;
    for (int r = 0; r < ROWS; r++)
        CHECK_EQ_INT(ids[r], dsv4_sampling_probs(&sp, x + r * V, V, NULL, 0, NULL, 0, probs, scratch));
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[1], 8);
    CHECK_EQ_INT(ids[2], 0);
    CHECK_EQ_INT(run_top(be, x, V, 3, ids, NULL, &err), 0);
    CHECK(ids[0] == 0 && ids[1] == 4 && ids[2] == 9); /* row 0 (v % 5), after its NaN pick: the non-NaN order */
    CHECK(ids[3] == 8 && ids[4] == 13 && ids[5] == 2);
    CHECK(ids[6] == 0 && ids[7] == -1 && ids[8] == -1);
    free(scratch);
}

static void test_refusals(dsv4_backend *be) {
    dsv4_err err = {0};
    dsv4_buf x = {0}, i0 = {0}, ibig = {0}, lpbad = {0}, ii = {0};
    CHECK_EQ_INT(be->buf_alloc(be, DSV4_DT_F32, 2, 40, &x, &err), 0);
    CHECK_EQ_INT(be->buf_alloc(be, DSV4_DT_I32, 2, DSV4_LOGIT_TOP_MAX + 1, &ibig, &err), 0);
    CHECK_EQ_INT(be->buf_alloc(be, DSV4_DT_I32, 3, 1, &i0, &err), 0);
    CHECK_EQ_INT(be->buf_alloc(be, DSV4_DT_I32, 2, 2, &ii, &err), 0);
    CHECK_EQ_INT(be->buf_alloc(be, DSV4_DT_F32, 2, 3, &lpbad, &err), 0);
    CHECK_EQ_INT(be->logit_top(be, &x, &ibig, NULL, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "logit_top");
    CHECK_EQ_INT(be->logit_top(be, &x, &i0, NULL, &err), DSV4_EINVAL); /* rows differ */
    CHECK_EQ_INT(be->logit_top(be, &x, &ii, &lpbad, &err), DSV4_EINVAL); /* lp not [n][k] */
    CHECK_EQ_INT(be->logit_top(be, &x, &ii, NULL, &err), DSV4_OK);
    be->buf_free(be, &x);
    be->buf_free(be, &i0);
    be->buf_free(be, &ibig);
    be->buf_free(be, &ii);
    be->buf_free(be, &lpbad);
}

int main(void) {
    dsv4_err err = {0};
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
    CHECK(be && be->logit_top);
    if (!be || !be->logit_top) return TEST_REPORT();
    test_against_sampler(be, 1);
    test_against_sampler(be, 37);
    test_against_sampler(be, 4099);
    test_nan(be);
    test_refusals(be);
    be->free(be);
    return TEST_REPORT();
}
