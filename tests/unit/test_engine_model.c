/*
 * The engine over the real CPU forward on the tiny checkpoints (issue 5
 * "Tests"): concurrent greedy requests each equal their single-stream output,
 * chunked prefill under a small token budget changes nothing, and a slot
 * reused after a finished request starts clean.
 */
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/forward.h"
#include "model/mtp.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test.h"
#include "test_engine_util.h"

#define MAXT 64

static dsv4_device tdev = DSV4_DEVICE_CPU; /* tu_test_device(): DSV4_TEST_DEVICE */

static int generate(dsv4_engine *e, const int32_t *p, int n, int max_tokens, int32_t *out) {
    return tu_generate_greedy(e, p, n, max_tokens, out, MAXT, NULL);
}

int main(void) {
    tdev = tu_test_device();
    const char *dir = "models/tiny-flash";
    dsv4_model_runner_opts mo = {.n_slots = 4, .max_len = 512, .max_spec = 0,
        .numerics = DSV4_NUMERICS_REFERENCE, .device = tdev};
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
    dsv4_engine_opts eo = {4, 256, 512, 0, 1, {{0}}, 0, 0};
    dsv4_engine *e;
    CHECK_EQ_INT(dsv4_engine_create(&eo, &run, NULL, &e, &err), 0);
    for (int i = 0; i < N; i++) CHECK_EQ_INT(generate(e, prompts[i], lens[i], maxt[i], single[i]), maxt[i]);
    /* the same request again in a reused slot gives the same tokens */
    CHECK_EQ_INT(generate(e, prompts[1], lens[1], maxt[1], out), maxt[1]);
    CHECK(!memcmp(out, single[1], sizeof(int32_t) * (size_t)maxt[1]));
    dsv4_engine_free(e);

    /* all four at once, 9-token budget: prefill chunks of 9 mixed with decode rows */
    dsv4_engine_opts eo2 = {4, 9, 512, 0, 1, {{0}}, 0, 0};
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

    /* DSpark speculation on the tiny DSpark checkpoint: greedy tokens equal
     * plain decoding, single and batched (issue 5 "Tests"); drafts are made
     * and verified every decode step, and the drafter never fails. */
    for (int k = 0; k <= 3; k += 3) {
        dsv4_model_runner_opts so = {.n_slots = 4, .max_len = 512, .max_spec = k,
            .numerics = DSV4_NUMERICS_REFERENCE, .device = tdev};
        CHECK_EQ_INT(dsv4_model_runner_open("models/tiny-dspark", &so, &mr, &err), 0);
        if (!mr) break;
        run = dsv4_model_runner_iface(mr);
        dsv4_drafter dr;
        int has = dsv4_model_runner_drafter(mr, &dr);
        CHECK_EQ_INT(has, k > 0);
        dsv4_engine_opts eo3 = {4, 9, 512, k, 1, {{0}}, 0, 0};
        CHECK_EQ_INT(dsv4_engine_create(&eo3, &run, has ? &dr : NULL, &e, &err), 0);
        static int32_t spec_out[2][N][MAXT];
        for (int i = 0; i < N; i++) CHECK_EQ_INT(generate(e, prompts[i], lens[i], maxt[i], spec_out[k > 0][i]), maxt[i]);
        /* all at once too */
        for (int i = 0; i < N; i++) {
            dsv4_gen_params gp;
            dsv4_gen_params_default(&gp);
            gp.sampling.temperature = 0;
            gp.max_tokens = maxt[i];
            gp.ignore_eos = 1;
            dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r[i], &err);
        }
        while (dsv4_engine_step(e, &err) > 0) {}
        for (int i = 0; i < N; i++) {
            dsv4_finish f;
            int n = dsv4_request_poll(r[i], out, MAXT, &f, 0);
            CHECK_MSG(n == maxt[i] && !memcmp(out, spec_out[k > 0][i], sizeof(int32_t) * (size_t)n),
                      "dspark k=%d request %d: batched != single", k, i);
            dsv4_request_release(r[i]);
        }
        if (k > 0)
            for (int i = 0; i < N; i++)
                CHECK_MSG(!memcmp(spec_out[1][i], spec_out[0][i], sizeof(int32_t) * (size_t)maxt[i]),
                          "request %d: speculative greedy != plain greedy", i);
        dsv4_engine_get_stats(e, &st);
        CHECK_EQ_INT(st.spec_draft_failures, 0);
        if (k > 0) CHECK(st.spec_drafts > 0 && st.spec_draft_tokens == 3 * st.spec_drafts);
        /* DSPARK.md §5.7: with one k for all, every verify step verified positions 0..k-1; timing accrues */
        if (k > 0)
            CHECK(st.spec_draft_per_pos[0] == st.spec_drafts && st.spec_draft_per_pos[2] == st.spec_drafts &&
                  st.spec_draft_per_pos[3] == 0 && st.spec_draft_seconds > 0 && st.spec_verify_seconds > 0);
        dsv4_engine_free(e);
        dsv4_model_runner_free(mr);
        mr = NULL;
    }

    /* Sampled drafting (draft_sample_method "probabilistic", DSPARK.md §4.3):
     * at temperature > 0 the drafter hands q to the verifier; a request is
     * reproducible from its seed (same tokens twice, alone and batched with
     * another), and drafts are made and verified without failures. */
    for (int mi = 0; mi < 2; mi++) { /* DSpark k = 3, MTP k = 1 */
        int ks = mi ? 1 : 3;
        dsv4_model_runner_opts so = {.n_slots = 4, .max_len = 512, .max_spec = ks,
                                     .numerics = DSV4_NUMERICS_REFERENCE, .device = tdev, .draft_sampled = 1};
        CHECK_EQ_INT(dsv4_model_runner_open(mi ? "models/tiny-flash" : "models/tiny-dspark", &so, &mr, &err), 0);
        dsv4_drafter dr;
        if (mr && dsv4_model_runner_drafter(mr, &dr)) {
            run = dsv4_model_runner_iface(mr);
            dsv4_engine_opts eo4 = {4, 9, 512, ks, 1, {{0}}, 0, 0};
            CHECK_EQ_INT(dsv4_engine_create(&eo4, &run, &dr, &e, &err), 0);
            int32_t got[3][MAXT];
            for (int pass = 0; pass < 3; pass++) {
                dsv4_gen_params gp;
                dsv4_gen_params_default(&gp);
                gp.sampling.temperature = 0.8f;
                gp.sampling.seed = 1234;
                gp.max_tokens = 16;
                gp.ignore_eos = 1;
                dsv4_request *rq = NULL, *other = NULL;
                CHECK_EQ_INT(dsv4_engine_submit(e, prompts[1], lens[1], &gp, &rq, &err), 0);
                if (pass == 2) { /* a neighbour with another seed in the same steps */
                    gp.sampling.seed = 99;
                    CHECK_EQ_INT(dsv4_engine_submit(e, prompts[0], lens[0], &gp, &other, &err), 0);
                }
                while (dsv4_engine_step(e, &err) > 0) {}
                dsv4_finish f;
                CHECK_EQ_INT(dsv4_request_poll(rq, got[pass], MAXT, &f, 0), 16);
                dsv4_request_release(rq);
                if (other) dsv4_request_release(other);
            }
            CHECK_MSG(!memcmp(got[0], got[1], sizeof(int32_t) * 16), "sampled drafting: same seed, other tokens");
            CHECK_MSG(!memcmp(got[0], got[2], sizeof(int32_t) * 16), "sampled drafting: a neighbour changed tokens");
            dsv4_engine_get_stats(e, &st);
            CHECK_EQ_INT(st.spec_draft_failures, 0);
            CHECK(st.spec_drafts > 0 && st.spec_draft_tokens == (uint64_t)ks * st.spec_drafts);
            dsv4_engine_free(e);
            e = NULL;
        } else {
            CHECK_MSG(0, "model %d has no drafter", mi);
        }
        dsv4_model_runner_free(mr);
        mr = NULL;
    }

    /* MTP speculation (k = 1) on tiny-flash: equals the plain greedy tokens
     * computed above, single and batched; the drafter never fails. */
    {
        dsv4_model_runner_opts so = {.n_slots = 4, .max_len = 512, .max_spec = 1,
            .numerics = DSV4_NUMERICS_REFERENCE, .device = tdev};
        CHECK_EQ_INT(dsv4_model_runner_open(dir, &so, &mr, &err), 0);
        run = dsv4_model_runner_iface(mr);
        dsv4_drafter dr;
        CHECK_EQ_INT(dsv4_model_runner_drafter(mr, &dr), 1);
        CHECK_EQ_INT(dr.max_k, 1);
        dsv4_engine_opts eo4 = {4, 9, 512, 1, 1, {{0}}, 0, 0};
        CHECK_EQ_INT(dsv4_engine_create(&eo4, &run, &dr, &e, &err), 0);
        for (int i = 0; i < N; i++) {
            CHECK_EQ_INT(generate(e, prompts[i], lens[i], maxt[i], out), maxt[i]);
            CHECK_MSG(!memcmp(out, single[i], sizeof(int32_t) * (size_t)maxt[i]), "mtp request %d != plain", i);
        }
        for (int i = 0; i < N; i++) {
            dsv4_gen_params gp;
            dsv4_gen_params_default(&gp);
            gp.sampling.temperature = 0;
            gp.max_tokens = maxt[i];
            gp.ignore_eos = 1;
            dsv4_engine_submit(e, prompts[i], lens[i], &gp, &r[i], &err);
        }
        while (dsv4_engine_step(e, &err) > 0) {}
        for (int i = 0; i < N; i++) {
            dsv4_finish f;
            int n = dsv4_request_poll(r[i], out, MAXT, &f, 0);
            CHECK_MSG(n == maxt[i] && !memcmp(out, single[i], sizeof(int32_t) * (size_t)n),
                      "mtp batched request %d != plain", i);
            dsv4_request_release(r[i]);
        }
        dsv4_engine_get_stats(e, &st);
        CHECK_EQ_INT(st.spec_draft_failures, 0);
        CHECK(st.spec_drafts > 0 && st.spec_draft_tokens == st.spec_drafts);
        dsv4_engine_free(e);
        e = NULL;

        /* The drafter's alignment (MODEL.md §3.9): after a prefill of L tokens in two
         * chunks, the draft for anchor a at position L must be the MTP block's argmax
         * for rows i = 0..L-1 fed (H_i, token i+1) with token L = a, computed here in
         * one call on a fresh MTP block. */
        enum { L = 23 };
        int32_t ids[L + 1];
        for (int j = 0; j < L; j++) ids[j] = prompts[1][j];
        ids[L] = 7; /* any anchor */
        int32_t pos[L], sl[L], sidx[L], cu[3] = {0, 10, L}, sslot[2] = {2, 2}, spos0[2] = {0, 10}, lrow = L - 1;
        for (int j = 0; j < L; j++) pos[j] = j, sl[j] = 2, sidx[j] = j >= 10;
        float *lg = malloc(sizeof(float) * (size_t)run.vocab);
        dsv4_batch b1 = {10, 1, ids, pos, sl, sidx, cu, sslot, spos0};
        int32_t cu2[2] = {0, L - 10}, sidx2[L] = {0};
        dsv4_batch b2 = {L - 10, 1, ids + 10, pos + 10, sl + 10, sidx2, cu2, sslot + 1, spos0 + 1};
        int64_t len1 = 10, len2 = L, apos = L;
        int32_t slot2 = 2, anchor = ids[L];
        float tmp = 0;
        uint64_t sd = 0;
        float *qn = NULL;
        int qv = 0;
        int32_t lrow2 = L - 10 - 1;
        int32_t page0 = 0; /* the runner's state pool: the caller maps slot 2's page (runner.h) */
        if (run.set_pages) CHECK_EQ_INT(run.set_pages(run.ctx, 2, 1, &page0, &err), 0);
        CHECK_EQ_INT(run.forward(run.ctx, &b1, &lrow, 0, lg, &err), 0);
        CHECK_EQ_INT(dr.commit(dr.ctx, 1, &slot2, &len1, &err), 0);
        CHECK_EQ_INT(run.forward(run.ctx, &b2, &lrow2, 1, lg, &err), 0);
        CHECK_EQ_INT(dr.commit(dr.ctx, 1, &slot2, &len2, &err), 0);
        enum { NA = 12 };
        int32_t drafts_a[NA], anchors[NA];
        for (int a = 0; a < NA; a++) {
            anchors[a] = anchor = (int32_t)(7 + 37 * a) % run.vocab;
            CHECK_EQ_INT(dr.propose(dr.ctx, 1, &slot2, &anchor, &apos, 1, &tmp, &sd, &drafts_a[a], &qn, &qv, &err), 0);
        }

        dsv4_model_runner_free(mr);

        /* independent: a fresh model, the whole prompt, then the MTP block over all rows */
        dsv4_model_runner_opts so2 = {.n_slots = 1, .max_len = 512, .max_spec = 1,
            .numerics = DSV4_NUMERICS_REFERENCE, .device = tdev};
        CHECK_EQ_INT(dsv4_model_runner_open(dir, &so2, &mr, &err), 0);
        dsv4_model_runner_free(mr);
        dsv4_config cfg2;
        dsv4_ckpt *ck = NULL;
        dsv4_weights *w = NULL;
        dsv4_backend *be = NULL;
        dsv4_model *m = NULL;
        dsv4_state *stt = NULL;
        dsv4_mtp *mtp = NULL;
        int rc = dsv4_ckpt_open(dir, &ck, &err);
        if (!rc) rc = dsv4_config_load(dir, &cfg2, &err);
        if (!rc) rc = dsv4_config_set_drafts(&cfg2, ck, &err);
        if (!rc) rc = dsv4_weights_bind(&cfg2, ck, &w, &err);
        if (!rc) be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
        if (!rc && be) rc = dsv4_model_create(&cfg2, w, be, &m, &err);
        int ratios[16];
        for (int l = 0; l < cfg2.num_hidden_layers; l++) ratios[l] = dsv4_config_layer_ratio(&cfg2, l);
        if (!rc) rc = dsv4_state_create(be, &cfg2, ratios, cfg2.num_hidden_layers, 1, 512, 0, &stt, &err);
        if (!rc) rc = dsv4_mtp_create(&cfg2, w, m, 1, 512, 0, &mtp, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (!rc) {
            size_t HD = (size_t)cfg2.hc_mult * (size_t)cfg2.hidden_size;
            float *H = malloc(sizeof(float) * HD * L), *ml = malloc(sizeof(float) * (size_t)L * (size_t)cfg2.vocab_size);
            int32_t z[L] = {0}, cuf[2] = {0, L}, s0 = 0, p0 = 0, sidxf[L] = {0};
            dsv4_batch bf = {L, 1, ids, pos, z, sidxf, cuf, &s0, &p0};
            rc = dsv4_forward(m, stt, &bf, NULL, 0, NULL, H, &err);
            int agree = 0, distinct = 0;
            for (int a = 0; a < NA && !rc; a++) {
                ids[L] = anchors[a];
                dsv4_batch bm = {L, 1, ids + 1, pos, z, sidxf, cuf, &s0, &p0}; /* row i pairs H_i with token i+1 */
                rc = dsv4_mtp_forward(mtp, &bm, H, ml, NULL, &err);
                const float *last = ml + (size_t)(L - 1) * (size_t)cfg2.vocab_size;
                int32_t want = 0;
                for (int v = 1; v < cfg2.vocab_size; v++)
                    if (last[v] > last[want]) want = v;
                agree += want == drafts_a[a];
                distinct += a > 0 && drafts_a[a] != drafts_a[0];
            }
            CHECK_MSG(rc == 0, "%s", err.msg);
            CHECK_EQ_INT(agree, NA);
            CHECK(distinct > 0); /* the anchor matters: the test can tell drafts apart */
            free(H);
            free(ml);
        }
        dsv4_mtp_free(mtp);
        dsv4_state_free(stt);
        dsv4_model_free(m);
        if (be) be->free(be);
        dsv4_weights_free(w);
        dsv4_ckpt_free(ck);
        free(lg);
        mr = NULL;
    }
    return TEST_REPORT();
}
