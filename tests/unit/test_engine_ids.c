/*
 * The engine's greedy-ids path on the real CPU forward (issue 7): with the
 * runner's forward_ids (backend logit_top where the logits are) the engine
 * emits exactly the tokens of the host path (DSV4_DEVICE_ARGMAX=0: every
 * row's logits read back and sampled on the host) — plain decode on
 * tiny-flash, MTP verify (k = 1) on tiny-flash and DSpark verify (k = 3) on
 * tiny-dspark — for an all-greedy batch (served from ids alone, counted in
 * greedy_id_steps) and for a mixed batch (a sampled request and one with
 * logprobs next to greedy ones: such steps take the full logits; tokens and
 * logprobs equal the host path's bit for bit).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "test.h"

#define N 3
#define MAXT 8

typedef struct result {
    int32_t tok[N][MAXT];
    int n[N];
    dsv4_token_logprob lp[MAXT];
    int n_lp;
    dsv4_engine_stats st;
} result;

/* Run N requests at once; mixed = request 1 samples (seeded), request 2 asks logprobs. */
static void run_batch(dsv4_runner *run, dsv4_drafter *dr, int k, int ids_on, int mixed, int vocab, result *res) {
    if (!ids_on) setenv("DSV4_DEVICE_ARGMAX", "0", 1);
    dsv4_engine_opts eo = {N, 16, 256, k, 1, {{0}}, 0, 0};
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    int rc = dsv4_engine_create(&eo, run, dr, &e, &err);
    unsetenv("DSV4_DEVICE_ARGMAX");
    CHECK_MSG(rc == 0, "engine: %s", err.msg);
    if (rc) return;
    dsv4_request *r[N];
    for (int i = 0; i < N; i++) {
        int32_t p[24];
        int len = 5 + 7 * i;
        for (int j = 0; j < len; j++) p[j] = 2 + (int32_t)((i * 131 + j * 17 + j * j) % (vocab - 2));
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = MAXT;
        gp.ignore_eos = 1;
        if (mixed && i == 1) gp.sampling.temperature = 0.8f, gp.sampling.seed = 77;
        if (mixed && i == 2) gp.logprobs = 1, gp.top_logprobs = 4;
        CHECK_EQ_INT(dsv4_engine_submit(e, p, len, &gp, &r[i], &err), 0);
    }
    while (dsv4_engine_step(e, &err) > 0) {}
    for (int i = 0; i < N; i++) {
        dsv4_finish f;
        res->n[i] = dsv4_request_poll(r[i], res->tok[i], MAXT, &f, 0);
        CHECK_EQ_INT(res->n[i], MAXT);
    }
    res->n_lp = dsv4_request_logprobs(r[2], 0, MAXT, res->lp);
    for (int i = 0; i < N; i++) dsv4_request_release(r[i]);
    dsv4_engine_get_stats(e, &res->st);
    dsv4_engine_free(e);
}

static void check_model(const char *dir, int k) {
    dsv4_model_runner_opts mo = {.n_slots = N, .max_len = 256, .max_spec = k, .numerics = DSV4_NUMERICS_REFERENCE};
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    if (dsv4_model_runner_open(dir, &mo, &mr, &err)) {
        fprintf(stderr, "%s (run scripts/setup.sh to generate the tiny checkpoints)\n", err.msg);
        CHECK(0);
        return;
    }
    dsv4_runner run = dsv4_model_runner_iface(mr);
    CHECK_MSG(run.forward_ids != NULL, "%s: the CPU runner offers forward_ids", dir);
    dsv4_drafter dr;
    int has = k > 0 && dsv4_model_runner_drafter(mr, &dr);
    CHECK_EQ_INT(has, k > 0);
    int vocab = dsv4_model_runner_config(mr)->vocab_size;
    static result host, dev;
    for (int mixed = 0; mixed < 2; mixed++) {
        memset(&host, 0, sizeof host);
        memset(&dev, 0, sizeof dev);
        run_batch(&run, has ? &dr : NULL, k, 0, mixed, vocab, &host);
        run_batch(&run, has ? &dr : NULL, k, 1, mixed, vocab, &dev);
        for (int i = 0; i < N; i++)
            CHECK_MSG(host.n[i] == dev.n[i] && !memcmp(host.tok[i], dev.tok[i], sizeof(int32_t) * (size_t)host.n[i]),
                      "%s k=%d %s batch, request %d: greedy-ids path differs from the host path", dir, k,
                      mixed ? "mixed" : "greedy", i);
        CHECK_EQ_INT(host.st.greedy_id_steps, 0);
        CHECK_EQ_INT(host.st.spec_accepted_tokens, dev.st.spec_accepted_tokens);
        CHECK_EQ_INT(host.st.steps, dev.st.steps);
        if (k > 0) CHECK(dev.st.spec_drafts > 0);
        if (!mixed) {
            /* every step that made tokens went through ids: all but the prefill-only steps */
            CHECK(dev.st.greedy_id_steps > 0);
            CHECK_EQ_INT(host.n_lp, 0);
        } else {
            CHECK_EQ_INT(host.n_lp, MAXT);
            CHECK_EQ_INT(dev.n_lp, MAXT);
            for (int g = 0; g < MAXT; g++) { /* the filled fields (entries past n_top are not written) */
                const dsv4_token_logprob *a = &host.lp[g], *b = &dev.lp[g];
                int same = a->token == b->token && !memcmp(&a->logprob, &b->logprob, sizeof(float)) &&
                           a->n_top == b->n_top && a->n_top == 4 &&
                           !memcmp(a->top_ids, b->top_ids, sizeof(int32_t) * 4) &&
                           !memcmp(a->top_logprobs, b->top_logprobs, sizeof(float) * 4);
                CHECK_MSG(same, "%s k=%d: logprob record %d differs between the paths", dir, k, g);
            }
        }
        printf("%s k=%d %s batch: %llu steps, %llu from greedy ids, %llu drafts accepted\n", dir, k,
               mixed ? "mixed" : "greedy", (unsigned long long)dev.st.steps,
               (unsigned long long)dev.st.greedy_id_steps, (unsigned long long)dev.st.spec_accepted_tokens);
    }
    dsv4_model_runner_free(mr);
}

int main(void) {
    check_model("models/tiny-flash", 0);
    check_model("models/tiny-flash", 1);  /* MTP */
    check_model("models/tiny-dspark", 3); /* DSpark */
    return TEST_REPORT();
}
