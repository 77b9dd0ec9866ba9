/*
 * The load-time seam for routed experts (backend.h experts_ready; issue 7,
 * docs/REVIEW-2026-12-01.md S1/S2): a GPU backend assembles each block's
 * experts into one set when they are uploaded, so that the KV pool is sized
 * after it and no forward allocates. Checked here on the CPU backend with a
 * recording experts_ready / moe_experts (the CUDA assembly itself needs a
 * GPU: tests/gpu/gpu_conformance.c and the serving runs):
 *  - dsv4_model_create calls experts_ready once per target layer, with that
 *    layer's own w1/w3/w2 arrays and n_routed_experts, and DSpark stages
 *    (dsv4_dspark_create) once each; all through the dummy-weight wrapper;
 *  - every moe_experts of a forward gets arrays that experts_ready saw
 *    before the forward (the CUDA backend keys its sets by the w1 array);
 *  - a failing experts_ready fails the load, naming the layer.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/dspark.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/weights.h"
#include "test.h"

#define DIR_0731 DSV4_SOURCE_DIR "/configs/deepseek-v4-flash-0731"
static const char *SMALL_0731 =
    "{\"num_hidden_layers\": 4, \"hidden_size\": 256, \"num_attention_heads\": 4, \"head_dim\": 128, "
    "\"q_lora_rank\": 128, \"o_groups\": 2, \"o_lora_rank\": 64, \"moe_intermediate_size\": 128, "
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 16, \"index_n_heads\": 4, "
    "\"index_topk\": 4, \"vocab_size\": 1024, \"num_hash_layers\": 2, \"dspark_noise_token_id\": 1000, "
    "\"dspark_markov_rank\": 32}";

/* What the recording ops saw. */
enum { MAX_SETS = 64 };
static struct {
    const dsv4_linear *w1[MAX_SETS], *w3[MAX_SETS], *w2[MAX_SETS];
    int n_exp[MAX_SETS], n;
    int fail_at;     /* experts_ready call (0-based) that fails, -1 none */
    int moe_calls, moe_unknown;
    int (*real_moe)(dsv4_backend *, const dsv4_buf *, const dsv4_linear *, const dsv4_linear *,
                    const dsv4_linear *, int, const dsv4_buf *, const dsv4_buf *, float, dsv4_buf *, dsv4_err *);
} rec;

static int rec_ready(dsv4_backend *be, const dsv4_linear *w1, const dsv4_linear *w3, const dsv4_linear *w2,
                     int n_exp, dsv4_err *err) {
    (void)be;
    if (rec.n == rec.fail_at) return dsv4_err_set(err, DSV4_ENOMEM, "recording backend: no memory for the set");
    if (rec.n < MAX_SETS) {
        rec.w1[rec.n] = w1;
        rec.w3[rec.n] = w3;
        rec.w2[rec.n] = w2;
        rec.n_exp[rec.n] = n_exp;
    }
    rec.n++;
    return DSV4_OK;
}

static int rec_moe(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1, const dsv4_linear *w3,
                   const dsv4_linear *w2, int n_exp, const dsv4_buf *ids, const dsv4_buf *wts, float limit,
                   dsv4_buf *y, dsv4_err *err) {
    int known = 0;
    for (int i = 0; i < rec.n && i < MAX_SETS; i++)
        known |= rec.w1[i] == w1 && rec.w3[i] == w3 && rec.w2[i] == w2 && rec.n_exp[i] == n_exp;
    rec.moe_calls++;
    rec.moe_unknown += !known;
    return rec.real_moe(be, x, w1, w3, w2, n_exp, ids, wts, limit, y, err);
}

/* The CPU backend with the recording ops, behind the dummy-weight wrapper (as --load-format dummy). */
static dsv4_backend *open_be(dsv4_dummy *d, dsv4_err *err) {
    dsv4_backend *cpu = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, err);
    if (!cpu) return NULL;
    CHECK(cpu->experts_ready == NULL); /* the CPU runs on the linears as uploaded */
    rec.real_moe = cpu->moe_experts;
    cpu->moe_experts = rec_moe;
    cpu->experts_ready = rec_ready;
    return dsv4_dummy_backend(d, cpu, err);
}

/* The small 0731 config with dummy weights bound, and open_be over them, recording afresh
 * (experts_ready call fail_at fails, -1 none); *d NULL when that failed. */
static dsv4_backend *open_model(int fail_at, dsv4_config *c, dsv4_dummy **d, dsv4_weights **w, dsv4_err *err) {
    memset(&rec, 0, sizeof rec);
    rec.fail_at = fail_at;
    *d = NULL;
    *w = NULL;
    if (dsv4_config_load_ex(DIR_0731, SMALL_0731, c, err) || dsv4_dummy_create(c, 3, d, err) ||
        dsv4_weights_bind(c, dsv4_dummy_ckpt(*d), w, err)) {
        fprintf(stderr, "%s\n", err->msg);
        CHECK(0);
        dsv4_dummy_free(*d);
        *d = NULL;
        return NULL;
    }
    return open_be(*d, err);
}

static void test_load_and_forward(void) {
    dsv4_err err = {0};
    dsv4_config c;
    dsv4_dummy *d;
    dsv4_weights *w;
    dsv4_backend *be = open_model(-1, &c, &d, &w, &err);
    if (!d) return;
    CHECK(be != NULL);
    if (!be) goto out;
    CHECK(be->experts_ready == rec_ready); /* the dummy wrapper passes the op on */
    dsv4_model *m = NULL;
    CHECK_EQ_INT(dsv4_model_create(&c, w, be, &m, &err), 0);
    if (!m) goto out_be;
    int L = m->n_layers;
    CHECK_EQ_INT(L, 4);
    CHECK_EQ_INT(rec.n, L); /* every layer is MoE (hash layers too) */
    for (int l = 0; l < L && l < rec.n; l++) {
        CHECK(rec.w1[l] == m->layers[l].w1 && rec.w3[l] == m->layers[l].w3 && rec.w2[l] == m->layers[l].w2);
        CHECK_EQ_INT(rec.n_exp[l], c.n_routed_experts);
    }
    CHECK_EQ_INT(rec.moe_calls, 0); /* nothing ran yet */

    /* DSpark stages are blocks too: one set each, at creation */
    dsv4_dspark *ds = NULL;
    CHECK_EQ_INT(dsv4_dspark_create(&c, w, m, 1, &ds, &err), 0);
    if (ds) {
        CHECK(ds->n_stages >= 1);
        CHECK_EQ_INT(rec.n, L + ds->n_stages);
        for (int s = 0; s < ds->n_stages && L + s < rec.n; s++) CHECK(rec.w1[L + s] == ds->stages[s].w1);
    }

    /* a forward: each layer's moe_experts gets arrays experts_ready saw */
    int *ratios = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++) ratios[l] = dsv4_config_layer_ratio(&c, l);
    dsv4_state *st = NULL;
    CHECK_EQ_INT(dsv4_state_create(be, &c, ratios, L, 1, 64, 0, &st, &err), 0);
    free(ratios);
    if (st) {
        enum { T = 5 };
        int32_t tok[T], pos[T], slot[T], sidx[T], cu[2] = {0, T}, sslot = 0, spos0 = 0, row = T - 1;
        for (int t = 0; t < T; t++) tok[t] = 3 + 17 * t, pos[t] = t, slot[t] = 0, sidx[t] = 0;
        dsv4_batch b = {T, 1, tok, pos, slot, sidx, cu, &sslot, &spos0};
        float *lg = malloc(sizeof(float) * (size_t)c.vocab_size);
        int rc = dsv4_forward(m, st, &b, &row, 1, lg, NULL, &err);
        if (rc) fprintf(stderr, "%s\n", err.msg);
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(rec.moe_calls, L);
        CHECK_EQ_INT(rec.moe_unknown, 0);
        free(lg);
        dsv4_state_free(st);
    }
    dsv4_dspark_free(ds);
    dsv4_model_free(m);
out_be:
    be->free(be);
out:
    dsv4_weights_free(w);
    dsv4_dummy_free(d);
}

/* A set that cannot be made fails the load (before any pool is sized), naming the layer. */
static void test_failure(void) {
    dsv4_err err = {0};
    dsv4_config c;
    dsv4_dummy *d;
    dsv4_weights *w;
    dsv4_backend *be = open_model(2, &c, &d, &w, &err);
    if (!d) return;
    CHECK(be != NULL);
    if (be) {
        dsv4_model *m = NULL;
        CHECK_EQ_INT(dsv4_model_create(&c, w, be, &m, &err), DSV4_ENOMEM);
        CHECK(m == NULL);
        CHECK_CONTAINS(err.msg, "layer 2: ");
        CHECK_CONTAINS(err.msg, "assembling the 8 routed experts");
        CHECK_CONTAINS(err.msg, "no memory for the set");
        be->free(be);
    }
    dsv4_weights_free(w);
    dsv4_dummy_free(d);
}

int main(void) {
    test_load_and_forward();
    test_failure();
    return TEST_REPORT();
}
