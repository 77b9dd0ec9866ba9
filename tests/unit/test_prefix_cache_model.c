/*
 * Prefix caching over the real CPU forward on the tiny checkpoints (issue 5,
 * spec/SERVING.md §8.7): with the cache on, a warm run of a request reuses
 * the kept state (cached tokens > 0) and gives exactly the greedy tokens of a
 * cold run with the cache off; so does a longer prompt that extends a kept
 * one, a multi-turn continuation of a finished request, and a prompt that
 * diverges early (a miss: the kept window rings no longer hold the rows below
 * the shared prefix). Prompts cross a ratio-128 compressor window and emit
 * more ratio-4 rows than the indexer's top-k, so compressor, indexer and
 * window state are all exercised. Covered with no speculation, DSpark (k = 3,
 * tiny-dspark) and MTP (k = 1, tiny-flash), so the drafters' rings resume
 * exactly too (a misaligned drafter context fails its commit: counted in
 * spec_draft_failures).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "test.h"
#include "test_engine_util.h"

#define MAXT 16
#define NGEN 6

static int generate(dsv4_engine *e, const int32_t *p, int n, int32_t *out, int *cached) {
    return tu_generate_greedy(e, p, n, NGEN, out, MAXT, cached);
}

enum { NP = 4, LMAX = 130 };

/* cold[NP][MAXT]: the cache-off outputs; computed here unless have_cold (the
 * same checkpoint's outputs without speculation: greedy speculation gives
 * the same tokens, tests/unit/test_engine_model.c). */
static void check_model(const char *dir, int k, int LA, int32_t cold[NP][MAXT], int have_cold) {
    dsv4_model_runner_opts mo = {.n_slots = 3, .max_len = 512, .max_spec = k, .numerics = DSV4_NUMERICS_REFERENCE,
                                 .device = tu_test_device()};
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    if (dsv4_model_runner_open(dir, &mo, &mr, &err)) {
        fprintf(stderr, "%s (run scripts/setup.sh to generate the tiny checkpoints)\n", err.msg);
        CHECK(0);
        return;
    }
    dsv4_runner run = dsv4_model_runner_iface(mr);
    dsv4_drafter dr;
    int has = k > 0 && dsv4_model_runner_drafter(mr, &dr);
    CHECK_EQ_INT(has, k > 0);
    int V = run.vocab;

    /* p[0]: A; p[1]: A + 8 new tokens; p[2]: filled below (A + its output + 4);
     * p[3]: the first half of A, then different tokens */
    static int32_t p[NP][LMAX + 32];
    int len[NP] = {LA, LA + 8, 0, LA};
    for (int j = 0; j < LA + 8; j++) p[0][j] = p[1][j] = 2 + (int32_t)((j * 37 + j * j * 11) % (V - 2));
    for (int j = 0; j < LA; j++) p[3][j] = j < LA / 2 ? p[0][j] : 2 + (int32_t)((j * 53 + 7) % (V - 2));

    /* cold references: cache off, same speculation */
    int32_t out[MAXT];
    dsv4_engine_stats st;
    dsv4_engine *e = NULL;
    if (!have_cold) {
        dsv4_engine_opts off = {1, 16, 512, k, 1, {{0}}, 0, 0};
        CHECK_EQ_INT(dsv4_engine_create(&off, &run, has ? &dr : NULL, &e, &err), 0);
        if (!e) goto done;
        CHECK_EQ_INT(generate(e, p[0], len[0], cold[0], NULL), NGEN);
    }
    memcpy(p[2], p[0], sizeof(int32_t) * (size_t)LA);
    memcpy(p[2] + LA, cold[0], sizeof(int32_t) * NGEN);
    for (int j = 0; j < 4; j++) p[2][LA + NGEN + j] = 3 + j;
    len[2] = LA + NGEN + 4;
    if (!have_cold) {
        for (int i = 1; i < NP; i++) CHECK_EQ_INT(generate(e, p[i], len[i], cold[i], NULL), NGEN);
        dsv4_engine_get_stats(e, &st);
        CHECK_EQ_INT(st.prefix_queries + st.prefix_hits, 0);
        CHECK_EQ_INT(st.spec_draft_failures, 0);
        dsv4_engine_free(e);
    }

    /* cache on: one running request, two slots to keep states in; 16-row chunks */
    dsv4_engine_opts on = {1, 16, 512, k, 1, {{0}}, 0, 1};
    CHECK_EQ_INT(dsv4_engine_create(&on, &run, has ? &dr : NULL, &e, &err), 0);
    int c = -1;
    CHECK_EQ_INT(generate(e, p[0], len[0], out, &c), NGEN); /* cold */
    CHECK_EQ_INT(c, 0);
    CHECK_MSG(!memcmp(out, cold[0], sizeof out[0] * NGEN), "%s k=%d: first run != cache-off run", dir, k);
    CHECK_EQ_INT(generate(e, p[0], len[0], out, &c), NGEN); /* warm: the kept prompt state */
    CHECK_EQ_INT(c, LA - 1);
    CHECK_MSG(!memcmp(out, cold[0], sizeof out[0] * NGEN), "%s k=%d: warm run != cold run", dir, k);
    CHECK_EQ_INT(generate(e, p[1], len[1], out, &c), NGEN); /* extends the kept prompt */
    CHECK_EQ_INT(c, LA);
    CHECK_MSG(!memcmp(out, cold[1], sizeof out[0] * NGEN), "%s k=%d: longer prompt != cold", dir, k);
    CHECK_EQ_INT(generate(e, p[2], len[2], out, &c), NGEN); /* continues a finished request */
    CHECK_MSG(c >= (k ? LA : LA + NGEN - 1), "%s k=%d: multi-turn reused %d tokens", dir, k, c);
    CHECK_MSG(!memcmp(out, cold[2], sizeof out[0] * NGEN), "%s k=%d: multi-turn != cold", dir, k);
    CHECK_EQ_INT(generate(e, p[3], len[3], out, &c), NGEN); /* diverges halfway: rings past it */
    CHECK_EQ_INT(c, 0);
    CHECK_MSG(!memcmp(out, cold[3], sizeof out[0] * NGEN), "%s k=%d: diverging prompt != cold", dir, k);
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_draft_failures, 0);
    CHECK(st.prefix_hits >= (uint64_t)(3 * LA));
    CHECK(st.prefix_snapshots >= 2);
    if (k) CHECK(st.spec_drafts > 0);
    dsv4_engine_free(e);
done:
    dsv4_model_runner_free(mr);
}

int main(void) {
    static int32_t flash[NP][MAXT], dspark[NP][MAXT];
    /* 130 tokens: past a ratio-128 window end, 32 ratio-4 rows (index_topk 4) */
    check_model("models/tiny-flash", 0, 130, flash, 0);
    check_model("models/tiny-flash", 1, 130, flash, 1); /* MTP, k = 1 */
    check_model("models/tiny-dspark", 3, 48, dspark, 0); /* 48 > sliding_window + γ */
    return TEST_REPORT();
}
