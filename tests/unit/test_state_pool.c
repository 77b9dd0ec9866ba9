/*
 * The paged state pool (issue 5) over the real CPU forward on tiny-flash
 * (compress ratios 4 and 128, so both main and indexer rows are paged).
 * Pages of 128 tokens so that short prompts span several pages.
 *  1. Paged == unpaged: the same requests, batched, through a runner with a
 *     page pool give exactly the greedy tokens of solo runs on a runner with
 *     per-slot state (no pool), and every page is given back at the end.
 *  2. A pool of 3 pages for requests needing 2, 2 and 3 pages: requests are
 *     preempted (recomputed), and each output, read while it is produced,
 *     still equals its solo run — nothing lost, nothing handed out twice.
 *     Run with prefix caching on, so cached histories' pages are evicted too.
 *  3. A request that cannot fit even alone is refused at submit.
 *  4. The pool shows in the stats and the Prometheus text.
 *  6. The same under DSpark speculation (tiny-dspark, k = 3).
 *  5. (1b) with fp8_ds_mla storage, batched runs with preemptions equal
 *     solo runs on per-slot state.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/kvcodec.h"
#include "server/metrics.h"
#include "test.h"
#include "test_models.h"

#define N 3
#define NGEN 40
#define MAXT 64

static const int lens[N] = {100, 120, 200}; /* + NGEN: 140, 160, 240 tokens = 2 pages of 128 each */

static void params(dsv4_gen_params *gp) {
    dsv4_gen_params_default(gp);
    gp->sampling.temperature = 0;
    gp->max_tokens = NGEN;
    gp->ignore_eos = 1;
}

static dsv4_model_runner *open_runner_spec(const char *dir, int n_pages, dsv4_kv_dtype kv, int k) {
    dsv4_model_runner_opts mo = {.n_slots = 4, .max_len = 512, .max_spec = k, .numerics = DSV4_NUMERICS_REFERENCE,
                                 .block_size = 128, .n_pages = n_pages, .kv_dtype = (int)kv};
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    if (dsv4_model_runner_open(dir, &mo, &mr, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    return mr;
}

static dsv4_model_runner *open_runner_kv(const char *dir, int n_pages, dsv4_kv_dtype kv) {
    return open_runner_spec(dir, n_pages, kv, 0);
}
static dsv4_model_runner *open_runner(const char *dir, int n_pages) { return open_runner_kv(dir, n_pages, DSV4_KV_F32); }

/* Submit all, step to the end, reading each request's tokens after every step. */
static void run_batch(dsv4_engine *e, int32_t prompts[N][256], int32_t out[N][MAXT], int *got) {
    dsv4_request *r[N];
    dsv4_err err = {0};
    dsv4_gen_params gp;
    params(&gp);
    for (int i = 0; i < N; i++) {
        got[i] = 0;
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r[i], &err), 0);
    }
    int live;
    do {
        live = dsv4_engine_step(e, &err);
        CHECK_MSG(live >= 0, "%s", err.msg);
        for (int i = 0; i < N; i++) {
            dsv4_finish f;
            got[i] += dsv4_request_poll(r[i], out[i] + got[i], MAXT - got[i], &f, 0);
        }
    } while (live > 0);
    for (int i = 0; i < N; i++) dsv4_request_release(r[i]);
}

static char models[512];

int main(void) {
    static const char *const need[] = {"tiny-flash", "tiny-dspark"};
    tm_find_models(models, sizeof models, need, (int)(sizeof need / sizeof need[0]));
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tiny-flash", models);
    dsv4_err err = {0};

    /* solo references on per-slot state (no pool) */
    dsv4_model_runner *mr = open_runner(dir, -1);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    dsv4_runner run = dsv4_model_runner_iface(mr);
    CHECK_EQ_INT(run.page_tokens, 0);
    static int32_t prompts[N][256];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < lens[i]; j++) prompts[i][j] = 2 + (int32_t)((j * 37 + j * j * 11 + i * 5) % (run.vocab - 2));
    int32_t solo[N][MAXT], out[N][MAXT];
    int got[N];
    dsv4_engine *e = NULL;
    dsv4_engine_opts eo = {1, 64, 512, 0, 1, {{0}}, 0, 0};
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, NULL, &e, &err), 0);
    for (int i = 0; i < N && e; i++) {
        dsv4_request *r;
        dsv4_gen_params gp;
        params(&gp);
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r, &err), 0);
        while (dsv4_engine_step(e, &err) > 0) {}
        dsv4_finish f;
        CHECK_EQ_INT(dsv4_request_poll(r, solo[i], MAXT, &f, 0), NGEN);
        dsv4_request_release(r);
    }
    dsv4_engine_free(e);
    dsv4_model_runner_free(mr);

    /* 1. default pool (every slot at max_len): paged == unpaged, batched */
    mr = open_runner(dir, 0);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    CHECK_EQ_INT(run.page_tokens, 128);
    CHECK_EQ_INT(run.n_pages, 4 * 4); /* 4 slots x 512/128 */
    dsv4_engine_opts eb = {3, 64, 512, 0, 1, {{0}}, 0, 0};
    CHECK_EQ_INT(dsv4_engine_create(&eb, &run, NULL, &e, &err), 0);
    if (e) {
        run_batch(e, prompts, out, got);
        for (int i = 0; i < N; i++)
            CHECK_MSG(got[i] == NGEN && !memcmp(out[i], solo[i], sizeof(int32_t) * NGEN), "paged request %d != solo", i);
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        CHECK_EQ_INT(st.kv_pages_total, 16);
        CHECK_EQ_INT(st.kv_page_tokens, 128);
        CHECK_EQ_INT(st.kv_pages_used, 0);
        CHECK_EQ_INT((int)st.preemptions, 0);
        CHECK(st.kv_page_bytes > 0);
        dsv4_engine_free(e);
    }
    dsv4_model_runner_free(mr);

    /* 1b. fp8_ds_mla storage of window and compressed rows (kvcodec.h). The
     * nope dims were already FP8 round-tripped with the same block scales
     * (test_kvcodec), but the record keeps the rope dims in BF16 while this
     * fp32 reference keeps them in fp32, so tokens may differ from f32
     * storage (printed, not asserted). Asserted: with coded storage too, solo
     * runs on per-slot state equal batched runs through a 3-page pool with
     * preemptions (in-batch rows are read in stored precision, so chunk
     * boundaries do not matter). */
    int32_t solo8[N][MAXT];
    mr = open_runner_kv(dir, -1, DSV4_KV_FP8_DS_MLA);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, NULL, &e, &err), 0);
    int same = 0;
    for (int i = 0; i < N && e; i++) {
        dsv4_request *r;
        dsv4_gen_params gp;
        params(&gp);
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r, &err), 0);
        while (dsv4_engine_step(e, &err) > 0) {}
        dsv4_finish f;
        CHECK_EQ_INT(dsv4_request_poll(r, solo8[i], MAXT, &f, 0), NGEN);
        dsv4_request_release(r);
        int k = 0;
        while (k < NGEN && solo8[i][k] == solo[i][k]) k++;
        same += k;
    }
    fprintf(stderr, "fp8_ds_mla vs f32 storage: %d of %d greedy tokens agree before the first difference\n", same,
            N * NGEN);
    dsv4_engine_free(e);
    dsv4_model_runner_free(mr);
    mr = open_runner_kv(dir, 3, DSV4_KV_FP8_DS_MLA);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    CHECK(run.page_bytes > 0);
    dsv4_engine_opts e8 = {3, 64, 512, 0, 1, {{0}}, 0, 1};
    CHECK_EQ_INT(dsv4_engine_create(&e8, &run, NULL, &e, &err), 0);
    if (e) {
        run_batch(e, prompts, out, got);
        for (int i = 0; i < N; i++)
            CHECK_MSG(got[i] == NGEN && !memcmp(out[i], solo8[i], sizeof(int32_t) * NGEN),
                      "fp8_ds_mla request %d through the pool != its solo run", i);
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        CHECK(st.preemptions > 0);
        dsv4_engine_free(e);
    }
    dsv4_model_runner_free(mr);

    /* 2-4. a pool of 3 pages: preemption, refusal, metrics */
    mr = open_runner(dir, 3);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    CHECK_EQ_INT(run.n_pages, 3);
    dsv4_engine_opts es = {3, 64, 512, 0, 1, {{0}}, 0, 1};
    CHECK_EQ_INT(dsv4_engine_create(&es, &run, NULL, &e, &err), 0);
    if (e) {
        run_batch(e, prompts, out, got);
        for (int i = 0; i < N; i++)
            CHECK_MSG(got[i] == NGEN && !memcmp(out[i], solo[i], sizeof(int32_t) * NGEN),
                      "request %d under preemption != solo (%d tokens)", i, got[i]);
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        CHECK(st.preemptions > 0);
        CHECK_EQ_INT(st.kv_pages_used, 0);
        CHECK_EQ_INT(st.kv_pages_total, 3);
        fprintf(stderr, "preemptions: %llu\n", (unsigned long long)st.preemptions);

        /* 3. 10 + 400 tokens need 4 pages of 128: more than the whole pool */
        dsv4_gen_params gp;
        params(&gp);
        gp.max_tokens = 400;
        dsv4_request *r = NULL;
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[0], 10, &gp, &r, &err), DSV4_ERANGE);
        CHECK(r == NULL);
        CHECK_CONTAINS(err.msg, "KV cache pool");
        gp.max_tokens = 300; /* 310 tokens: 3 pages, fits */
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[0], 10, &gp, &r, &err), 0);
        dsv4_request_cancel(r);
        while (dsv4_engine_step(e, &err) > 0) {}
        dsv4_request_release(r);

        /* 4. Prometheus text */
        dsv4_metrics *m = dsv4_metrics_create("tiny", 0);
        CHECK(m != NULL);
        if (m) {
            dsv4_metrics_set_cache_config(m, "auto", 1);
            dsv4_engine_get_stats(e, &st);
            st.kv_pages_used = 1; /* a running request's page */
            char *txt = dsv4_metrics_render(m, &st);
            CHECK(txt != NULL);
            if (txt) {
                CHECK_CONTAINS(txt, "vllm:cache_config_info{model_name=\"tiny\",engine=\"0\",block_size=\"128\","
                                    "num_gpu_blocks=\"3\",cache_dtype=\"auto\",enable_prefix_caching=\"True\"");
                CHECK_CONTAINS(txt, "vllm:kv_cache_usage_perc{model_name=\"tiny\",engine=\"0\"} 0.333");
                char want[128];
                snprintf(want, sizeof want, "vllm:num_preemptions_total{model_name=\"tiny\",engine=\"0\"} %llu",
                         (unsigned long long)st.preemptions);
                CHECK_CONTAINS(txt, want);
                free(txt);
            }
            dsv4_metrics_free(m);
        }
        dsv4_engine_free(e);
    }
    dsv4_model_runner_free(mr);

    /* 6. DSpark speculation (k = 3, tiny-dspark) through a 3-page pool: a
     * preempted request's drafter state is dropped and rebuilt by the
     * re-prefill; outputs equal solo runs without speculation (greedy
     * speculation is lossless) and the drafter never fails. */
    snprintf(dir, sizeof dir, "%s/tiny-dspark", models);
    mr = open_runner(dir, -1);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, NULL, &e, &err), 0);
    for (int i = 0; i < N && e; i++) {
        dsv4_request *r;
        dsv4_gen_params gp;
        params(&gp);
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r, &err), 0);
        while (dsv4_engine_step(e, &err) > 0) {}
        dsv4_finish f;
        CHECK_EQ_INT(dsv4_request_poll(r, solo[i], MAXT, &f, 0), NGEN);
        dsv4_request_release(r);
    }
    dsv4_engine_free(e);
    dsv4_model_runner_free(mr);
    mr = open_runner_spec(dir, 3, DSV4_KV_F32, 3);
    CHECK(mr != NULL);
    if (!mr) return TEST_REPORT();
    run = dsv4_model_runner_iface(mr);
    dsv4_drafter dr;
    CHECK_EQ_INT(dsv4_model_runner_drafter(mr, &dr), 1);
    dsv4_engine_opts ek = {3, 64, 512, 3, 1, {{0}}, 0, 1};
    CHECK_EQ_INT(dsv4_engine_create(&ek, &run, &dr, &e, &err), 0);
    if (e) {
        run_batch(e, prompts, out, got);
        for (int i = 0; i < N; i++)
            CHECK_MSG(got[i] == NGEN && !memcmp(out[i], solo[i], sizeof(int32_t) * NGEN),
                      "dspark request %d through the pool != its solo run", i);
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        CHECK(st.preemptions > 0);
        CHECK(st.spec_drafts > 0);
        CHECK_EQ_INT((int)st.spec_draft_failures, 0);
        dsv4_engine_free(e);
    }
    dsv4_model_runner_free(mr);
    return TEST_REPORT();
}
