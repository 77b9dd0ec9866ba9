/*
 * The engine over the real CPU forward on the tiny checkpoints (issue 5
 * "Tests"): concurrent greedy requests each equal their single-stream output,
 * chunked prefill under a small token budget changes nothing, and a slot
 * reused after a finished request starts clean.
 */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "test.h"

#define MAXT 64

static int generate(dsv4_engine *e, const int32_t *p, int n, int max_tokens, int32_t *out) {
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = max_tokens;
    gp.ignore_eos = 1;
    dsv4_request *r;
    dsv4_err err = {0};
    if (dsv4_engine_submit(e, p, n, &gp, &r, &err)) return -1;
    while (dsv4_engine_step(e, &err) > 0) {}
    dsv4_finish f;
    int got = dsv4_request_poll(r, out, MAXT, &f, 0);
    dsv4_request_release(r);
    return got;
}

int main(void) {
    const char *dir = "models/tiny-flash";
    dsv4_model_runner_opts mo = {4, 512, 0, DSV4_NUMERICS_REFERENCE};
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    if (dsv4_model_runner_open(dir, &mo, &mr, &err)) {
        fprintf(stderr, "%s (run scripts/setup.sh to generate the tiny checkpoints)\n", err.msg);
        CHECK(0);
        return TEST_REPORT();
    }
    dsv4_runner run = dsv4_model_runner_iface(mr);
    const dsv4_config *cfg = dsv4_model_runner_config(mr);
    CHECK_EQ_INT(run.vocab, cfg->vocab_size);

    enum { N = 4 };
    int lens[N] = {5, 23, 40, 12}, maxt[N] = {12, 6, 4, 10};
    int32_t prompts[N][64], single[N][MAXT], out[MAXT];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < lens[i]; j++) prompts[i][j] = 2 + (int32_t)((i * 131 + j * 17 + j * j) % (cfg->vocab_size - 2));

    /* single-stream reference, one request at a time, generous budget */
    dsv4_engine_opts eo = {4, 256, 512, 0, 1};
    dsv4_engine *e;
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, NULL, &e, &err), 0);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(generate(e, prompts[i], lens[i], maxt[i], single[i]), maxt[i]);
    /* the same request again in a reused slot gives the same tokens */
    CHECK_EQ_INT(generate(e, prompts[1], lens[1], maxt[1], out), maxt[1]);
    CHECK(!memcmp(out, single[1], sizeof(int32_t) * (size_t)maxt[1]));
    dsv4_engine_free(e);

    /* all four at once, 9-token budget: prefill chunks of 9 mixed with decode rows */
    dsv4_engine_opts eo2 = {4, 9, 512, 0, 1};
    CHECK_EQ_INT(dsv4_engine_create(&eo2, &run, NULL, &e, &err), 0);
    dsv4_request *r[N];
    for (int i = 0; i < N; i++) {
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = maxt[i];
        gp.ignore_eos = 1;
        CHECK_EQ_INT(dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r[i], &err), 0);
    }
    while (dsv4_engine_step(e, &err) > 0) {}
    for (int i = 0; i < N; i++) {
        dsv4_finish f;
        int n = dsv4_request_poll(r[i], out, MAXT, &f, 0);
        CHECK_EQ_INT(n, maxt[i]);
        CHECK_MSG(!memcmp(out, single[i], sizeof(int32_t) * (size_t)maxt[i]), "request %d: batched != single", i);
        dsv4_request_release(r[i]);
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.prompt_tokens, 5 + 23 + 40 + 12);
    dsv4_engine_free(e);
    dsv4_model_runner_free(mr);
    return TEST_REPORT();
}
