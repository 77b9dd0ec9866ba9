/*
 * Tensor parallelism on CPU (issue 7 "Parallelism"): the local communicator,
 * the divisibility rules on the tiny and the real Flash shapes, and TP = 2
 * against TP = 1 on models/tiny-flash and models/tiny-dspark — logits within
 * a stated tolerance, greedy tokens identical over a generation with
 * speculation on and off, and every rank's logits bit-identical to rank 0's
 * at every step (the runner's check_ranks); a rank failing inside a
 * collective aborts its peers instead of hanging; and the multi-node step
 * plans (tp_plan.h), where rank 1 learns every call only through the
 * communicator, give the same tokens. A step stalled on one rank is reported
 * by the runner's watchdog with each rank's collective counts (the laggard
 * has entered fewer), and DSV4_TP_TRACE logs every job per rank. With the paged KV pool (issue 5) every
 * rank holds the same pool and the engine's page mapping reaches all ranks
 * (through the TP runner, and as step plans): TP = 2 on a pool small enough
 * to preempt gives TP = 1's greedy tokens on per-slot state.
 *
 * Tolerances. In HF numerics (no W8A8 emulation) a TP rank computes exactly
 * the same products as TP = 1; only the order of the fp32 sums changes (the
 * heads' and the experts' partials are added after the per-rank dots instead
 * of inside one dot), so the logits agree to a few fp32 ulps amplified by
 * depth: |Δ| <= 1e-4 · max|logit| + 1e-5. In reference numerics the tiny
 * models split wo_b's and w2's 128-wide inputs inside one activation-
 * quantisation block (tp_shard.c banner), so each half gets its own
 * power-of-two FP8 scale; where a half's amax falls in a lower binade than
 * the whole block's, that half is quantised finer — a real (if rare)
 * difference of FP8 size on those elements. Measured 9.7e-6 of a max logit
 * 7.3 (most blocks keep the same scale); bound 2e-3 · max|logit| + 1e-5, and
 * the greedy tokens must agree. On the real Flash shapes every split is a multiple of 128,
 * so only the summation order differs there too.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "parallel/tp_plan.h"
#include "parallel/tp_runner.h"
#include "parallel/tp_shard.h"
#include "test.h"
#include "test_engine_util.h"

#define MAXT 16

/* ---------- the local communicator, 3 threads ---------- */

typedef struct {
    dsv4_comm *c;
    dsv4_backend *be;
    int rc_reduce, rc_gather, rc_bcast, rc_abort, rc_bf16;
    uint16_t bf16[4];
    float red[5], gat[2 * 3];
    char bc[8];
} crank;

static void *comm_thread(void *arg) {
    crank *k = arg;
    dsv4_err err = {0};
    dsv4_backend *be = k->be;
    int r = k->c->rank;
    dsv4_buf b, o;
    be->buf_alloc(be, DSV4_DT_F32, 1, 5, &b, &err);
    float v[5];
    for (int i = 0; i < 5; i++) v[i] = (float)((r + 1) * (i + 1)) * 0.1f;
    be->buf_write(be, &b, v, &err);
    k->rc_reduce = k->c->all_reduce_sum(k->c, be, &b, &err);
    be->buf_read(be, &b, k->red, &err);
    be->buf_free(be, &b);
    /* BF16: summed in fp32, rounded once (small integers: exact) */
    uint16_t hb[4];
    for (int i = 0; i < 4; i++) {
        float f = (float)((r + 1) * (i + 1));
        uint32_t u;
        memcpy(&u, &f, 4);
        hb[i] = (uint16_t)(u >> 16);
    }
    be->buf_alloc(be, DSV4_DT_BF16, 1, 4, &b, &err);
    be->buf_write(be, &b, hb, &err);
    k->rc_bf16 = k->c->all_reduce_sum(k->c, be, &b, &err);
    be->buf_read(be, &b, k->bf16, &err);
    be->buf_free(be, &b);
    be->buf_alloc(be, DSV4_DT_F32, 2, 1, &b, &err);
    be->buf_alloc(be, DSV4_DT_F32, 2, 3, &o, &err);
    float g[2] = {(float)r, (float)(10 + r)};
    be->buf_write(be, &b, g, &err);
    k->rc_gather = k->c->all_gather(k->c, be, &b, &o, &err);
    be->buf_read(be, &o, k->gat, &err);
    be->buf_free(be, &b);
    be->buf_free(be, &o);
    if (r == 1) memcpy(k->bc, "rank1!", 7);
    k->rc_bcast = k->c->broadcast(k->c, k->bc, 7, 1, &err);
    /* rank 2 fails before the collective: the others must not hang */
    if (r == 2) {
        k->c->abort(k->c);
        k->rc_abort = DSV4_EBACKEND;
    } else {
        be->buf_alloc(be, DSV4_DT_F32, 1, 5, &b, &err);
        k->rc_abort = k->c->all_reduce_sum(k->c, be, &b, &err);
        be->buf_free(be, &b);
    }
    return NULL;
}

static void test_local_comm(void) {
    dsv4_comm *c[3];
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_comm_local_create(3, c, &err), 0);
    crank k[3];
    pthread_t th[3];
    memset(k, 0, sizeof k);
    for (int i = 0; i < 3; i++) {
        k[i].c = c[i];
        k[i].be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
        pthread_create(&th[i], NULL, comm_thread, &k[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(k[i].rc_reduce, 0);
        /* rank order on every rank: (p0 + p1) + p2, computed here the same way */
        for (int j = 0; j < 5; j++) {
            float p0 = 1 * (j + 1) * 0.1f, p1 = 2 * (j + 1) * 0.1f, p2 = 3 * (j + 1) * 0.1f;
            float want = (p0 + p1) + p2;
            CHECK(!memcmp(&k[i].red[j], &want, sizeof want));
        }
        CHECK_EQ_INT(k[i].rc_bf16, 0);
        for (int j = 0; j < 4; j++) {
            uint32_t u = (uint32_t)k[i].bf16[j] << 16;
            float f;
            memcpy(&f, &u, 4);
            CHECK(f == (float)(6 * (j + 1))); /* (1 + 2 + 3)(j+1) */
        }
        CHECK_EQ_INT(k[i].rc_gather, 0);
        float want_g[6] = {0, 1, 2, 10, 11, 12};
        CHECK(!memcmp(k[i].gat, want_g, sizeof want_g));
        CHECK_EQ_INT(k[i].rc_bcast, 0);
        CHECK_STR(k[i].bc, "rank1!");
        CHECK_EQ_INT(k[i].rc_abort, DSV4_EBACKEND);
    }
    dsv4_comm_local_recover(c[0]);
    for (int i = 0; i < 3; i++) {
        c[i]->free(c[i]);
        k[i].be->free(k[i].be);
    }
}

/* ---------- divisibility ---------- */

static void test_check(void) {
    dsv4_config cfg;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_config_load("models/tiny-flash", &cfg, &err), 0);
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 1, &err), 0);
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 2, &err), 0);
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 3, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "does not divide num_attention_heads 4");
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 4, &err), DSV4_EINVAL); /* 4 heads, but 2 output groups */
    CHECK_CONTAINS(err.msg, "o_groups 2");
    /* the real DeepSeek-V4-Flash shapes (spec/MODEL.md §1) */
    cfg.num_attention_heads = 64;
    cfg.head_dim = 512;
    cfg.o_groups = 8;
    cfg.o_lora_rank = 1024;
    cfg.moe_intermediate_size = 2048;
    cfg.n_shared_experts = 1;
    for (int tp = 1; tp <= 8; tp *= 2) CHECK_MSG(dsv4_tp_check(&cfg, tp, &err) == 0, "Flash TP=%d: %s", tp, err.msg);
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 16, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "o_groups 8");
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 6, &err), DSV4_EINVAL);
    /* a width that splits an FP8 scale block */
    cfg.num_attention_heads = 6;
    cfg.head_dim = 96;
    cfg.o_groups = 6;
    CHECK_EQ_INT(dsv4_tp_check(&cfg, 2, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "128x128");
}

/* ---------- the slices: views where rows are split, copies where columns are ---------- */

static void test_shard_shapes(void) {
    dsv4_config cfg;
    dsv4_ckpt *ck = NULL;
    dsv4_weights *w = NULL;
    dsv4_tp_shard *s = NULL;
    dsv4_err err = {0};
    int rc = dsv4_ckpt_open("models/tiny-flash", &ck, &err);
    if (!rc) rc = dsv4_config_load("models/tiny-flash", &cfg, &err);
    if (!rc) rc = dsv4_config_set_drafts(&cfg, ck, &err);
    if (!rc) rc = dsv4_weights_bind(&cfg, ck, &w, &err);
    if (!rc) rc = dsv4_tp_shard_create(&cfg, w, 1, 2, &s, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        const dsv4_block_w *a = &w->layers[2], *b = &s->w.layers[2]; /* a ratio-128 layer */
        CHECK_EQ_INT(s->cfg.num_attention_heads, 2);
        CHECK_EQ_INT(s->cfg.o_groups, 1);
        /* wq_b: heads 2..3 = rows 256..511, a view 256 rows into the checkpoint's bytes */
        CHECK_EQ_INT(b->attn.wq_b.out, 256);
        CHECK((const uint8_t *)b->attn.wq_b.w.data == (const uint8_t *)a->attn.wq_b.w.data + 256 * a->attn.wq_b.in);
        CHECK_EQ_INT(b->attn.wq_b.scale.shape[0], 2);
        /* wo_a: group 1 = rows 64..127, inside scale block 0; wo_b: columns 64..127, a copy */
        CHECK_EQ_INT(b->attn.wo_a.out, 64);
        CHECK_EQ_INT(b->attn.wo_a.scale.shape[0], 1);
        CHECK_EQ_INT(b->attn.wo_b.in, 64);
        CHECK_EQ_INT(b->attn.wo_b.w.shape[1], 64);
        CHECK(b->attn.wo_b.w.data != a->attn.wo_b.w.data);
        CHECK(!memcmp(b->attn.wo_b.w.data, (const uint8_t *)a->attn.wo_b.w.data + 64, 64));
        CHECK_EQ_INT(b->attn.sink.shape[0], 2);
        /* replicated: the KV head, the compressor */
        CHECK(b->attn.wkv.w.data == a->attn.wkv.w.data && b->attn.wkv.out == a->attn.wkv.out);
        CHECK(b->attn.compressor.wkv.w.data == a->attn.compressor.wkv.w.data);
        /* shared expert and every routed expert: half the intermediate width */
        CHECK_EQ_INT(b->ffn.shared.w1.out, 64);
        CHECK_EQ_INT(b->ffn.shared.w2.in, 64);
        CHECK_EQ_INT(b->ffn.experts[7].w1.out, 64);
        CHECK_EQ_INT(b->ffn.experts[7].w3.out, 64);
        CHECK_EQ_INT(b->ffn.experts[7].w2.in, 64);
        CHECK_EQ_INT(b->ffn.experts[7].w2.scale.shape[1], 2); /* FP4: 64 / 32 */
        /* the source weights are untouched */
        CHECK_EQ_INT(a->attn.wq_b.out, 512);
        CHECK_EQ_INT(a->ffn.experts[7].w2.in, 128);
        /* vocabulary-parallel head: rows 256..511 */
        CHECK_EQ_INT(s->head_split, 1);
        CHECK_EQ_INT(s->w.head.out, 256);
        CHECK_EQ_INT(w->head.out, 512);
    }
    dsv4_tp_shard_free(s);
    dsv4_weights_free(w);
    dsv4_ckpt_free(ck);
}

/* ---------- TP = 2 vs TP = 1 ---------- */

typedef struct {
    dsv4_model_runner *mr;
    dsv4_tp_runner *tp;
    dsv4_runner run;
    dsv4_drafter dr;
    int has_dr;
} opened;

/* n_pages < 0: per-slot state; > 0: a pool of that many 128-token pages */
static int open_runner_pool(const char *dir, int tp, int k, dsv4_numerics num, int n_pages, opened *o) {
    dsv4_model_runner_opts mo = {
        .n_slots = 4, .max_len = 256, .max_spec = k, .numerics = num, .block_size = 128, .n_pages = n_pages};
    dsv4_err err = {0};
    memset(o, 0, sizeof *o);
    int rc;
    if (tp == 1) {
        rc = dsv4_model_runner_open(dir, &mo, &o->mr, &err);
        if (!rc) {
            o->run = dsv4_model_runner_iface(o->mr);
            o->has_dr = dsv4_model_runner_drafter(o->mr, &o->dr);
        }
    } else {
        dsv4_tp_runner_opts to = {.tp_size = tp, .check_ranks = 1};
        rc = dsv4_tp_runner_open(dir, &mo, NULL, &to, &o->tp, &err);
        if (!rc) {
            o->run = dsv4_tp_runner_iface(o->tp);
            o->has_dr = dsv4_tp_runner_drafter(o->tp, &o->dr);
        }
    }
    if (rc) fprintf(stderr, "open %s TP=%d: %s\n", dir, tp, err.msg);
    return rc;
}

static int open_runner(const char *dir, int tp, int k, dsv4_numerics num, opened *o) {
    return open_runner_pool(dir, tp, k, num, -1, o);
}

static void close_runner(opened *o) {
    dsv4_model_runner_free(o->mr);
    dsv4_tp_runner_free(o->tp);
}

/* One prefill of T rows with logits on every row; returns the max |Δ| and the logit range. */
static void compare_logits(const char *dir, dsv4_numerics num, double rel_tol, double abs_tol) {
    enum { T = 24 };
    opened a, b;
    if (open_runner(dir, 1, 0, num, &a)) {
        CHECK(0);
        return;
    }
    if (open_runner(dir, 2, 0, num, &b)) {
        CHECK(0);
        close_runner(&a);
        return;
    }
    int V = a.run.vocab;
    CHECK_EQ_INT(b.run.vocab, V);
    int32_t tok[T], pos[T], slot[T], sidx[T], rows[T], cu[2] = {0, T}, sslot = 1, spos0 = 0;
    for (int t = 0; t < T; t++) {
        tok[t] = 2 + (t * 37 + 11) % (V - 2);
        pos[t] = t;
        slot[t] = 1;
        sidx[t] = 0;
        rows[t] = t;
    }
    dsv4_batch bt = {T, 1, tok, pos, slot, sidx, cu, &sslot, &spos0};
    float *la = malloc(sizeof(float) * T * (size_t)V), *lb = malloc(sizeof(float) * T * (size_t)V);
    dsv4_err err = {0};
    CHECK_EQ_INT(a.run.forward(a.run.ctx, &bt, rows, T, la, &err), 0);
    int rc = b.run.forward(b.run.ctx, &bt, rows, T, lb, &err);
    CHECK_MSG(rc == 0, "TP=2 forward: %s", err.msg);
    double maxd = 0, maxa = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        double d = fabs((double)la[i] - lb[i]);
        if (d > maxd) maxd = d;
        if (fabs(la[i]) > maxa) maxa = fabs(la[i]);
    }
    printf("%s %s: TP=2 vs TP=1 logits max|diff| %.3g, max|logit| %.3g\n", dir,
           num == DSV4_NUMERICS_HF ? "HF" : "reference", maxd, maxa);
    CHECK_MSG(maxd <= rel_tol * maxa + abs_tol, "%s: max|diff| %g > %g", dir, maxd, rel_tol * maxa + abs_tol);
    free(la);
    free(lb);
    close_runner(&a);
    close_runner(&b);
}

static int generate(dsv4_engine *e, const int32_t *p, int n, int max_tokens, int32_t *out) {
    return tu_generate_greedy(e, p, n, max_tokens, out, MAXT, NULL);
}

/* Greedy tokens of 2 prompts (one request after the other, the second reusing a slot) under TP = tp. */
static void gen_run(dsv4_runner *run, const dsv4_drafter *dr, int k, int32_t out[3][MAXT]) {
    dsv4_engine_opts eo = {.max_num_seqs = 4, .max_num_batched_tokens = 16, .max_model_len = 256, .spec_k = k, .eos_id = 1};
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_create(&eo, run, dr, &e, &err), 0);
    if (!e) return;
    int lens[3] = {7, 30, 18};
    for (int i = 0; i < 2; i++) {
        int32_t p[64];
        for (int j = 0; j < lens[i]; j++) p[j] = 2 + (int32_t)((i * 131 + j * 17 + j * j) % 500);
        CHECK_EQ_INT(generate(e, p, lens[i], MAXT, out[i]), MAXT);
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_draft_failures, 0);
    if (k > 0) CHECK(st.spec_drafts > 0);
    dsv4_engine_free(e);
}

static void gen_all(const char *dir, int tp, int k, int32_t out[3][MAXT]) {
    opened o;
    if (open_runner(dir, tp, k, DSV4_NUMERICS_REFERENCE, &o)) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(o.has_dr, k > 0);
    gen_run(&o.run, o.has_dr ? &o.dr : NULL, k, out);
    close_runner(&o);
}

/* ---------- the KV pool under TP: preemption ---------- */

/* Prompts of 100, 120, 140 tokens + PGEN: with POOL pages of 128 tokens the
 * second request crosses into its second page while the first holds the
 * other one, so a request is preempted (and recomputed) — checked, not hoped. */
#define PN 3
#define PGEN 12
#define POOL 2
static const int plens[PN] = {100, 120, 140};

/* All PN requests batched; out[i] their greedy tokens; returns the engine's preemptions. */
static long pool_run(dsv4_runner *run, const dsv4_drafter *dr, int k, int32_t out[PN][PGEN]) {
    dsv4_engine_opts eo = {.max_num_seqs = PN, .max_num_batched_tokens = 64, .max_model_len = 256, .spec_k = k, .eos_id = 1};
    dsv4_engine *e = NULL;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_engine_create(&eo, run, dr, &e, &err), 0);
    if (!e) return -1;
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = PGEN;
    gp.ignore_eos = 1;
    dsv4_request *r[PN] = {0};
    int got[PN] = {0};
    for (int i = 0; i < PN; i++) {
        int32_t p[256];
        for (int j = 0; j < plens[i]; j++) p[j] = 2 + (int32_t)((j * 37 + j * j * 11 + i * 5) % 500);
        CHECK_EQ_INT(dsv4_engine_submit(e, p, plens[i], &gp, &r[i], &err), 0);
    }
    int live;
    do {
        live = dsv4_engine_step(e, &err);
        CHECK_MSG(live >= 0, "engine: %s", err.msg);
        for (int i = 0; i < PN; i++) {
            dsv4_finish f;
            if (r[i]) got[i] += dsv4_request_poll(r[i], out[i] + got[i], PGEN - got[i], &f, 0);
        }
    } while (live > 0);
    for (int i = 0; i < PN; i++) {
        CHECK_EQ_INT(got[i], PGEN);
        dsv4_request_release(r[i]);
    }
    dsv4_engine_stats st;
    dsv4_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_draft_failures, 0);
    CHECK_EQ_INT(st.kv_pages_used, 0); /* every page given back */
    dsv4_engine_free(e);
    return (long)st.preemptions;
}

/* TP = 1 on per-slot state vs TP = 2 on a POOL-page pool; want gets TP = 1's tokens. */
static void compare_pool(const char *dir, int k, int32_t want[PN][PGEN]) {
    static int32_t got[PN][PGEN];
    memset(want, 0, sizeof(int32_t) * PN * PGEN);
    memset(got, 0, sizeof got);
    opened a, b;
    if (open_runner(dir, 1, k, DSV4_NUMERICS_REFERENCE, &a)) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(a.run.page_tokens, 0);
    CHECK_EQ_INT((int)pool_run(&a.run, a.has_dr ? &a.dr : NULL, k, want), 0);
    close_runner(&a);
    if (open_runner_pool(dir, 2, k, DSV4_NUMERICS_REFERENCE, POOL, &b)) {
        CHECK(0);
        return;
    }
    /* rank 0's pool, mapped on every rank through the TP runner */
    CHECK_EQ_INT(b.run.page_tokens, 128);
    CHECK_EQ_INT(b.run.n_pages, POOL);
    CHECK(b.run.page_bytes > 0 && b.run.set_pages != NULL);
    long pre = pool_run(&b.run, b.has_dr ? &b.dr : NULL, k, got);
    printf("%s k=%d: TP=2 on a %d-page pool: %ld preemptions\n", dir, k, POOL, pre);
    CHECK_MSG(pre > 0, "%s: no preemption with a %d-page pool", dir, POOL);
    for (int i = 0; i < PN; i++)
        CHECK_MSG(!memcmp(got[i], want[i], sizeof got[i]), "%s k=%d prompt %d: pooled TP=2 tokens != TP=1", dir, k, i);
    close_runner(&b);
}

/* ---------- step plans: rank 1 sees only what the communicator carries ---------- */

typedef struct {
    dsv4_comm *c;
    const char *dir;
    int k, n_pages, warm, rc, warm_steps;
    char msg[DSV4_ERR_MSG_MAX];
} follower;

/*
 * warm: the start-up warm-up's options (shape-static steps padded to sizes 1 and 2, rows 1 and
 * k+1: cuda_graphs 2 runs them on any backend) — what dsv4_service derives on every node.
 */
static dsv4_model_runner_opts plan_opts(int k, int n_pages, int warm) {
    static const int sizes[2] = {1, 2};
    static int rows[2];
    rows[0] = 1;
    rows[1] = k + 1;
    dsv4_model_runner_opts mo = {.n_slots = 4, .max_len = 256, .max_spec = k, .numerics = DSV4_NUMERICS_REFERENCE,
                                 .block_size = 128, .n_pages = n_pages};
    if (warm) {
        mo.cuda_graphs = 2;
        mo.graph_sizes = sizes;
        mo.n_graph_sizes = 2;
        mo.graph_rows = rows;
        mo.n_graph_rows = k > 0 ? 2 : 1;
        mo.warm_rows = 200; /* a prefill-sized warm-up step of 200 rows: 2 pages of 128 (one borrowed) */
    }
    return mo;
}

static void *follow_thread(void *arg) {
    follower *f = arg;
    dsv4_model_runner_opts mo = plan_opts(f->k, f->n_pages, f->warm);
    dsv4_model_runner *mr = NULL;
    dsv4_err err = {0};
    f->rc = dsv4_model_runner_open_tp(f->dir, &mo, NULL, 1, 2, f->c, &mr, &err);
    if (!f->rc) {
        dsv4_runner run = dsv4_model_runner_iface(mr);
        f->rc = dsv4_plan_follow(f->c, &run, &err);
        f->warm_steps = dsv4_model_runner_warm_steps(mr);
    }
    snprintf(f->msg, sizeof f->msg, "%s", err.msg);
    dsv4_model_runner_free(mr);
    return NULL;
}

/* Two ranks over a local communicator: the follower thread (f, its fields set by the caller) and rank 0's
 * runner with the plan options of (k, n_pages, warm). Returns open's code; *mr NULL when it failed. */
static int open_pair(follower *f, dsv4_comm *c[2], pthread_t *th, int warm, dsv4_model_runner **mr, dsv4_err *err) {
    CHECK_EQ_INT(dsv4_comm_local_create(2, c, err), 0);
    f->c = c[1];
    pthread_create(th, NULL, follow_thread, f);
    dsv4_model_runner_opts mo = plan_opts(f->k, f->n_pages, warm);
    *mr = NULL;
    int rc = dsv4_model_runner_open_tp(f->dir, &mo, NULL, 0, 2, c[0], mr, err);
    CHECK_MSG(rc == 0, "%s", err->msg);
    return rc;
}

/* want: TP = 1's tokens of gen_run (n_pages < 0, per-slot state) or of pool_run (n_pages = POOL, set_pages as plans);
 * warm: both nodes hold the warm-up's options and node 0 runs it as a plan first (the follower joins its
 * forwards' all-reduces), the tokens after it still TP = 1's */
static void test_step_plans(const char *dir, int k, int n_pages, int warm, int32_t want[3][MAXT],
                            int32_t want_pool[PN][PGEN]) {
    static int32_t got[3][MAXT], got_pool[PN][PGEN];
    memset(got, 0, sizeof got);
    memset(got_pool, 0, sizeof got_pool);
    dsv4_comm *c[2];
    dsv4_err err = {0};
    follower f = {NULL, dir, k, n_pages, warm, -1, -1, ""};
    pthread_t th;
    dsv4_model_runner *mr;
    int rc = open_pair(&f, c, &th, warm, &mr, &err);
    dsv4_plan_leader *l = NULL;
    if (!rc) {
        dsv4_runner inner = dsv4_model_runner_iface(mr), run;
        dsv4_drafter dr;
        int has = dsv4_model_runner_drafter(mr, &dr);
        CHECK_EQ_INT(has, k > 0);
        CHECK_EQ_INT(dsv4_plan_leader_create(c[0], &inner, 256, &l, &run, &err), 0);
        CHECK_EQ_INT(run.warmup != NULL, warm);
        if (warm) {
            int ng = -1;
            CHECK_MSG(run.warmup(run.ctx, &ng, &err) == 0, "step-plan warm-up: %s", err.msg);
            CHECK_EQ_INT(ng, 0); /* cuda_graphs 2: shapes fixed, nothing captured */
            CHECK(dsv4_model_runner_warm_steps(mr) > 0);
        }
        if (n_pages > 0) {
            CHECK_EQ_INT(run.n_pages, n_pages);
            CHECK(run.set_pages != NULL);
            CHECK_MSG(pool_run(&run, has ? &dr : NULL, k, got_pool) > 0, "%s: step plans: no preemption", dir);
        } else {
            gen_run(&run, has ? &dr : NULL, k, got);
        }
        /* a bad batch is refused before it is broadcast: the follower keeps following */
        int32_t tok = 3, pos = 256, sl = 0, si = 0, cu[2] = {0, 1}, r0 = 0;
        dsv4_batch bad = {1, 1, &tok, &pos, &sl, &si, cu, &sl, &pos};
        float lg[1];
        CHECK_EQ_INT(run.forward(run.ctx, &bad, &r0, 0, lg, &err), DSV4_ERANGE);
        CHECK_CONTAINS(err.msg, "position 256 beyond max length 256");
    }
    dsv4_plan_leader_free(l); /* sends the quit plan */
    if (rc) c[0]->abort(c[0]);
    pthread_join(th, NULL);
    CHECK_MSG(f.rc == 0, "follower: %s", f.msg);
    /* the follower ran the same warm-up forwards (0 without one) */
    CHECK_EQ_INT(f.warm_steps, mr ? dsv4_model_runner_warm_steps(mr) : -2);
    for (int i = 0; n_pages <= 0 && i < 2; i++)
        CHECK_MSG(!memcmp(got[i], want[i], sizeof got[i]), "%s k=%d prompt %d: step-plan TP=2 tokens != TP=1", dir, k,
                  i);
    for (int i = 0; n_pages > 0 && i < PN; i++)
        CHECK_MSG(!memcmp(got_pool[i], want_pool[i], sizeof got_pool[i]),
                  "%s k=%d prompt %d: pooled step-plan TP=2 tokens != TP=1", dir, k, i);
    dsv4_model_runner_free(mr);
    c[0]->free(c[0]);
    c[1]->free(c[1]);
}

/*
 * Node 0 has a warm-up, the follower was started without one (another --device / --enforce-eager):
 * both fail at start with the follower's reason, nobody waits in a collective.
 */
static void test_warmup_refused(const char *dir) {
    dsv4_comm *c[2];
    dsv4_err err = {0};
    follower f = {NULL, dir, 0, -1, 0, -1, -1, ""}; /* no warm-up on rank 1 */
    pthread_t th;
    dsv4_model_runner *mr;
    int rc = open_pair(&f, c, &th, 1, &mr, &err);
    dsv4_plan_leader *l = NULL;
    if (!rc) {
        dsv4_runner inner = dsv4_model_runner_iface(mr), run;
        CHECK_EQ_INT(dsv4_plan_leader_create(c[0], &inner, 256, &l, &run, &err), 0);
        int ng = 0;
        CHECK(run.warmup && run.warmup(run.ctx, &ng, &err) != 0);
        CHECK_CONTAINS(err.msg, "aborted");
    }
    if (rc) c[0]->abort(c[0]);
    pthread_join(th, NULL);
    CHECK(f.rc != 0);
    CHECK_CONTAINS(f.msg, "rank 1: step plan: node 0 runs a start-up warm-up but this rank has none");
    dsv4_plan_leader_free(l); /* its quit plan fails on the aborted communicator: logged, not fatal */
    dsv4_model_runner_free(mr);
    c[0]->free(c[0]);
    c[1]->free(c[1]);
}

/* TP = 2 greedy tokens equal TP = 1's; a gets TP = 1's. */
static void compare_tokens(const char *dir, int k, int32_t a[3][MAXT]) {
    static int32_t b[3][MAXT];
    memset(a, 0, sizeof(int32_t) * 3 * MAXT);
    memset(b, 0, sizeof b);
    gen_all(dir, 1, k, a);
    gen_all(dir, 2, k, b);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(!memcmp(a[i], b[i], sizeof a[i]), "%s k=%d prompt %d: TP=2 greedy tokens != TP=1", dir, k, i);
}

/* NCCL is loaded at run time: a missing library is a clear error, not a link failure. */
static void test_nccl_missing(void) {
    setenv("DSV4_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    uint8_t id[DSV4_NCCL_ID_BYTES];
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_nccl_unique_id(id, &err), DSV4_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "/nonexistent/libnccl.so.2");
    CHECK_CONTAINS(err.msg, "DSV4_NCCL_LIB");
    dsv4_comm *c = NULL;
    CHECK_EQ_INT(dsv4_comm_nccl_create(0, 2, id, &c, &err), DSV4_EUNSUPPORTED);
    CHECK(c == NULL);
    unsetenv("DSV4_NCCL_LIB");
}

/* A communicator that fails rank 1's n-th all-reduce without entering the
 * collective: the runner must abort the peers (no hang), report rank 1's
 * error, and work again once the group is recovered. */
typedef struct {
    dsv4_comm c;
    dsv4_comm *in;
    int fail_at, count;
} flaky;
static int fl_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *b, dsv4_err *err) {
    flaky *f = (flaky *)c;
    if (c->rank == 1 && ++f->count == f->fail_at) return dsv4_err_set(err, DSV4_EBACKEND, "injected failure");
    return f->in->all_reduce_sum(f->in, be, b, err);
}
static int fl_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *i, dsv4_buf *o, dsv4_err *err) {
    return ((flaky *)c)->in->all_gather(((flaky *)c)->in, be, i, o, err);
}
static int fl_bcast(dsv4_comm *c, void *h, size_t n, int root, dsv4_err *err) {
    return ((flaky *)c)->in->broadcast(((flaky *)c)->in, h, n, root, err);
}
static int fl_barrier(dsv4_comm *c, dsv4_err *err) { return ((flaky *)c)->in->barrier(((flaky *)c)->in, err); }
static void fl_abort(dsv4_comm *c) { ((flaky *)c)->in->abort(((flaky *)c)->in); }
static void fl_free(dsv4_comm *c) {
    ((flaky *)c)->in->free(((flaky *)c)->in);
    free(c);
}

static void test_rank_failure(void) {
    dsv4_comm *in[2], *wrap[2];
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_comm_local_create(2, in, &err), 0);
    dsv4_comm *inner0 = in[0];
    for (int r = 0; r < 2; r++) {
        flaky *f = calloc(1, sizeof *f);
        f->c = (dsv4_comm){"flaky", r, 2, f, fl_reduce, fl_gather, fl_bcast, fl_barrier, fl_abort, fl_free, 0};
        f->in = in[r];
        f->fail_at = 3; /* layer 1's attention all-reduce */
        wrap[r] = &f->c;
    }
    dsv4_model_runner_opts mo = {.n_slots = 2, .max_len = 64, .numerics = DSV4_NUMERICS_REFERENCE, .n_pages = -1};
    dsv4_tp_runner_opts to = {.tp_size = 2, .comms = wrap, .check_ranks = 1};
    dsv4_tp_runner *t = NULL;
    CHECK_EQ_INT(dsv4_tp_runner_open("models/tiny-flash", &mo, NULL, &to, &t, &err), 0);
    if (!t) return;
    dsv4_runner run = dsv4_tp_runner_iface(t);
    int32_t tok[3] = {5, 6, 7}, pos[3] = {0, 1, 2}, slot[3] = {0, 0, 0}, sidx[3] = {0}, cu[2] = {0, 3}, ss = 0, p0 = 0;
    int32_t rows[1] = {2};
    dsv4_batch b = {3, 1, tok, pos, slot, sidx, cu, &ss, &p0};
    float *lg1 = malloc(sizeof(float) * (size_t)run.vocab), *lg2 = malloc(sizeof(float) * (size_t)run.vocab);
    CHECK_EQ_INT(run.forward(run.ctx, &b, rows, 1, lg1, &err), DSV4_EBACKEND);
    CHECK_CONTAINS(err.msg, "rank 1: ");
    CHECK_CONTAINS(err.msg, "injected failure");
    dsv4_comm_local_recover(inner0); /* the runner recovers only communicators it made */
    CHECK_EQ_INT(run.forward(run.ctx, &b, rows, 1, lg1, &err), 0);
    /* a bad batch fails on every rank before any collective, names the row, and leaves the runner usable */
    pos[2] = 1000;
    CHECK(run.forward(run.ctx, &b, rows, 1, lg2, &err) != 0);
    CHECK_CONTAINS(err.msg, "position 1000");
    pos[2] = 2;
    CHECK_EQ_INT(run.forward(run.ctx, &b, rows, 1, lg2, &err), 0);
    CHECK(!memcmp(lg1, lg2, sizeof(float) * (size_t)run.vocab));
    free(lg1);
    free(lg2);
    dsv4_tp_runner_free(t);
}

/* A communicator whose rank 1 stalls for `stall_s` after its n-th all-reduce
 * returned — what a rank stuck between two collectives (compute, a CUDA
 * call) looks like to its peers, which wait inside the next one. */
typedef struct {
    dsv4_comm c;
    dsv4_comm *in;
    int stall_at, count;
    double stall_s;
} stally;
static int st_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *b, dsv4_err *err) {
    stally *f = (stally *)c;
    int rc = f->in->all_reduce_sum(f->in, be, b, err);
    if (c->rank == 1 && ++f->count == f->stall_at) usleep((useconds_t)(f->stall_s * 1e6));
    return rc;
}
static int st_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *i, dsv4_buf *o, dsv4_err *err) {
    return ((stally *)c)->in->all_gather(((stally *)c)->in, be, i, o, err);
}
static int st_bcast(dsv4_comm *c, void *h, size_t n, int root, dsv4_err *err) {
    return ((stally *)c)->in->broadcast(((stally *)c)->in, h, n, root, err);
}
static int st_barrier(dsv4_comm *c, dsv4_err *err) { return ((stally *)c)->in->barrier(((stally *)c)->in, err); }
static void st_abort(dsv4_comm *c) { ((stally *)c)->in->abort(((stally *)c)->in); }
static void st_free(dsv4_comm *c) {
    ((stally *)c)->in->free(((stally *)c)->in);
    free(c);
}

/* The runner's diagnostics for a hung step (the 2x H200 TP hang logged nothing):
 * DSV4_TP_WATCHDOG_S names the busy ranks with their collective counts while
 * rank 1 stalls between its 2nd and 3rd all-reduce (rank 0 waits inside the
 * 3rd: 3 entered / 2 returned; rank 1: 2 entered / 1 returned, since the
 * stall sits in its 2nd call here), and DSV4_TP_TRACE logs each rank's job. */
static void test_watchdog(void) {
    dsv4_comm *in[2], *wrap[2];
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_comm_local_create(2, in, &err), 0);
    for (int r = 0; r < 2; r++) {
        stally *f = calloc(1, sizeof *f);
        f->c = (dsv4_comm){"stally", r, 2, f, st_reduce, st_gather, st_bcast, st_barrier, st_abort, st_free, 0};
        f->in = in[r];
        f->stall_at = 2;
        f->stall_s = 1.5;
        wrap[r] = &f->c;
    }
    setenv("DSV4_TP_WATCHDOG_S", "0.3", 1);
    setenv("DSV4_TP_TRACE", "1", 1);
    dsv4_model_runner_opts mo = {.n_slots = 2, .max_len = 64, .numerics = DSV4_NUMERICS_REFERENCE, .n_pages = -1};
    dsv4_tp_runner_opts to = {.tp_size = 2, .comms = wrap};
    dsv4_tp_runner *t = NULL;
    int orc = dsv4_tp_runner_open("models/tiny-flash", &mo, NULL, &to, &t, &err);
    unsetenv("DSV4_TP_WATCHDOG_S");
    unsetenv("DSV4_TP_TRACE");
    CHECK_EQ_INT(orc, 0);
    if (!t) return;
    dsv4_runner run = dsv4_tp_runner_iface(t);
    int32_t tok[3] = {5, 6, 7}, pos[3] = {0, 1, 2}, slot[3] = {0, 0, 0}, sidx[3] = {0}, cu[2] = {0, 3}, ss = 0, p0 = 0;
    int32_t rows[1] = {2};
    dsv4_batch b = {3, 1, tok, pos, slot, sidx, cu, &ss, &p0};
    float *lg = malloc(sizeof(float) * (size_t)run.vocab);
    /* the log goes to stderr: catch it in a file for the duration of the step */
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    CHECK(tmp != NULL && saved >= 0);
    if (!tmp || saved < 0) return;
    dup2(fileno(tmp), 2);
    int frc = run.forward(run.ctx, &b, rows, 1, lg, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_EQ_INT(frc, 0);
    static char log[65536];
    rewind(tmp);
    size_t n = fread(log, 1, sizeof log - 1, tmp);
    log[n] = 0;
    fclose(tmp);
    CHECK_CONTAINS(log, "tensor parallel: job #");
    CHECK_CONTAINS(log, "forward (3 rows, 1 seqs, 1 logit rows; row 0 slot 0 pos 0) not finished after");
    CHECK_CONTAINS(log, "rank 0 busy (collectives 3 entered / 2 returned, graph path eager)");
    CHECK_CONTAINS(log, "rank 1 busy (collectives 2 entered / 1 returned, graph path eager)");
    CHECK_CONTAINS(log, "tp trace: job #");
    CHECK_CONTAINS(log, "rank 0: rc 0 in ");
    CHECK_CONTAINS(log, "rank 1: rc 0 in ");
    free(lg);
    dsv4_tp_runner_free(t);
}

int main(void) {
    test_nccl_missing();
    test_local_comm();
    test_check();
    test_rank_failure();
    test_watchdog();
    test_shard_shapes();
    /* TP = 4 does not divide the tiny models (o_groups 2): refused before loading */
    {
        dsv4_model_runner_opts mo = {.n_slots = 2, .max_len = 64, .numerics = DSV4_NUMERICS_REFERENCE, .n_pages = -1};
        dsv4_tp_runner_opts to = {.tp_size = 4, .check_ranks = 1};
        dsv4_tp_runner *t = NULL;
        dsv4_err err = {0};
        CHECK_EQ_INT(dsv4_tp_runner_open("models/tiny-flash", &mo, NULL, &to, &t, &err), DSV4_EINVAL);
        CHECK_CONTAINS(err.msg, "o_groups");
        CHECK(t == NULL);
        /* given communicators are the runner's even when open fails (ASan sees a leak otherwise) */
        dsv4_comm *cc[2];
        CHECK_EQ_INT(dsv4_comm_local_create(2, cc, &err), 0);
        dsv4_tp_runner_opts to2 = {.tp_size = 2, .comms = cc};
        CHECK(dsv4_tp_runner_open("models/no-such-model", &mo, NULL, &to2, &t, &err) != 0);
        CHECK_CONTAINS(err.msg, "models/no-such-model");
    }
    compare_logits("models/tiny-flash", DSV4_NUMERICS_HF, 1e-4, 1e-5);
    compare_logits("models/tiny-dspark", DSV4_NUMERICS_HF, 1e-4, 1e-5);
    compare_logits("models/tiny-flash", DSV4_NUMERICS_REFERENCE, 2e-3, 1e-5);
    static int32_t tp1[3][MAXT];
    compare_tokens("models/tiny-flash", 0, tp1);
    compare_tokens("models/tiny-flash", 1, tp1); /* MTP drafter on rank 0 */
    compare_tokens("models/tiny-dspark", 3, tp1); /* DSpark drafter on rank 0 */
    test_step_plans("models/tiny-dspark", 3, -1, 0, tp1, NULL);
    test_step_plans("models/tiny-dspark", 3, -1, 1, tp1, NULL); /* the warm-up as a plan first */
    test_warmup_refused("models/tiny-flash");
    static int32_t pool1[PN][PGEN];
    compare_pool("models/tiny-flash", 0, pool1);
    compare_pool("models/tiny-dspark", 3, pool1); /* DSpark drafter on rank 0, pages on both */
    test_step_plans("models/tiny-dspark", 3, POOL, 0, tp1, pool1);
    test_step_plans("models/tiny-dspark", 3, POOL, 1, tp1, pool1);
    return TEST_REPORT();
}
