/*
 * Dummy weights under tensor parallelism (issue 7; src/parallel/tp_shard.c
 * banner, model/dummy.h dsv4_dummy_slice): each rank's slice of a dummy
 * tensor is filled on its own backend, and must hold exactly the bytes the
 * unsharded dummy tensor has there — row slices (wq_b, wo_a, expert and
 * shared w1/w3 with their scales, the vocabulary-parallel head, the sinks)
 * and column slices (wo_b, w2 with their scales). Then the whole path: a
 * TP = 2 runner over dummy weights (CPU ranks, check_ranks on) gives the
 * TP = 1 runner's greedy tokens, speculation off and on.
 *
 * The small config is the real 0731 one shrunk so that every TP = 2 slice
 * also fits the CUDA tiles (o_lora_rank 128, moe_intermediate_size 256): the
 * same overrides run on 2 GPUs in tests/gpu/run_tp2_h200.sh. Also: NCCL that
 * cannot be loaded is refused with the path tried and the variable to set.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/dummy.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "parallel/tp_runner.h"
#include "parallel/tp_shard.h"
#include "test.h"
#include "test_engine_util.h"

#define DIR_0731 DSV4_SOURCE_DIR "/configs/deepseek-v4-flash-0731"
static const char *SMALL =
    "{\"num_hidden_layers\": 4, \"hidden_size\": 256, \"num_attention_heads\": 4, \"head_dim\": 128, "
    "\"q_lora_rank\": 128, \"o_groups\": 2, \"o_lora_rank\": 128, \"moe_intermediate_size\": 256, "
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 16, \"index_n_heads\": 4, "
    "\"index_topk\": 4, \"vocab_size\": 1024, \"num_hash_layers\": 2, \"dspark_noise_token_id\": 1000, "
    "\"dspark_markov_rank\": 32}";

/* The bytes of a (whole or sliced) dummy view, made through the dummy backend. */
static uint8_t *fill(dsv4_backend *be, const dsv4_tview *v) {
    dsv4_err err = {0};
    dsv4_tview dev;
    if (be->upload(be, v, &dev, &err)) {
        fprintf(stderr, "upload %s: %s\n", v->name ? v->name : "?", err.msg);
        return NULL;
    }
    return (uint8_t *)dev.data; /* CPU backend: owned by the backend until free */
}

/* shard == rows [r*n, +n) of whole (row_bytes per row) */
static int same_rows(dsv4_backend *be, const dsv4_tview *whole, const dsv4_tview *part, int64_t r0) {
    uint8_t *a = fill(be, whole), *b = fill(be, part);
    if (!a || !b) return 0;
    size_t rb = whole->nbytes / (size_t)whole->shape[0];
    return part->nbytes == (size_t)part->shape[0] * rb && !memcmp(a + (size_t)r0 * rb, b, part->nbytes);
}

/* shard == columns [c0, +nc) (in elements of the view) of every row of whole */
static int same_cols(dsv4_backend *be, const dsv4_tview *whole, const dsv4_tview *part, int64_t c0) {
    uint8_t *a = fill(be, whole), *b = fill(be, part);
    if (!a || !b || part->shape[0] != whole->shape[0]) return 0;
    size_t es = dsv4_dtype_size(whole->dtype), wrow = (size_t)whole->shape[1] * es, prow = (size_t)part->shape[1] * es;
    for (int64_t i = 0; i < whole->shape[0]; i++)
        if (memcmp(a + (size_t)i * wrow + (size_t)c0 * es, b + (size_t)i * prow, prow)) return 0;
    return 1;
}

static void test_slices_are_the_whole_tensors_bytes(void) {
    dsv4_err err = {0};
    dsv4_config cfg;
    CHECK_EQ_INT(dsv4_config_load_ex(DIR_0731, SMALL, &cfg, &err), 0);
    dsv4_dummy *d = NULL;
    dsv4_weights *w = NULL;
    CHECK_EQ_INT(dsv4_dummy_create(&cfg, 7, &d, &err), 0);
    CHECK_EQ_INT(dsv4_weights_bind(&cfg, dsv4_dummy_ckpt(d), &w, &err), 0);
    dsv4_backend *be = dsv4_dummy_backend(d, dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err), &err);
    CHECK(be != NULL);
    for (int r = 0; r < 2 && be && w; r++) {
        dsv4_tp_shard *s = NULL;
        CHECK_MSG(dsv4_tp_shard_create_ex(&cfg, w, r, 2, d, &s, &err) == 0, "%s", err.msg);
        if (!s) break;
        for (int l = 0; l < 2; l++) {
            const dsv4_block_w *a = &w->layers[l], *b = &s->layers[l];
            int64_t Hl = cfg.num_attention_heads / 2, GR = (int64_t)cfg.o_groups / 2 * cfg.o_lora_rank;
            int64_t Fe = cfg.moe_intermediate_size / 2;
            CHECK_MSG(same_rows(be, &a->attn.wq_b.w, &b->attn.wq_b.w, r * Hl * cfg.head_dim), "L%d r%d wq_b", l, r);
            CHECK_MSG(same_rows(be, &a->attn.wq_b.scale, &b->attn.wq_b.scale, r * Hl * cfg.head_dim / 128),
                      "L%d r%d wq_b.scale", l, r);
            CHECK_MSG(same_rows(be, &a->attn.wo_a.w, &b->attn.wo_a.w, r * GR), "L%d r%d wo_a", l, r);
            CHECK_MSG(same_cols(be, &a->attn.wo_b.w, &b->attn.wo_b.w, r * GR), "L%d r%d wo_b", l, r);
            CHECK_MSG(same_cols(be, &a->attn.wo_b.scale, &b->attn.wo_b.scale, r * GR / 128), "L%d r%d wo_b.scale",
                      l, r);
            CHECK_MSG(same_rows(be, &a->attn.sink, &b->attn.sink, r * Hl), "L%d r%d sinks", l, r);
            CHECK_MSG(same_rows(be, &a->ffn.shared.w1.w, &b->ffn.shared.w1.w, r * Fe), "L%d r%d shared w1", l, r);
            CHECK_MSG(same_cols(be, &a->ffn.shared.w2.w, &b->ffn.shared.w2.w, r * Fe), "L%d r%d shared w2", l, r);
            const dsv4_expert_w *ea = &a->ffn.experts[5], *eb = &b->ffn.experts[5];
            CHECK_MSG(same_rows(be, &ea->w3.w, &eb->w3.w, r * Fe), "L%d r%d expert w3", l, r);
            CHECK_MSG(same_rows(be, &ea->w3.scale, &eb->w3.scale, r * Fe), "L%d r%d expert w3.scale", l, r);
            /* FP4: two values a byte, one scale per 32 inputs */
            CHECK_MSG(same_cols(be, &ea->w2.w, &eb->w2.w, r * Fe / 2), "L%d r%d expert w2", l, r);
            CHECK_MSG(same_cols(be, &ea->w2.scale, &eb->w2.scale, r * Fe / 32), "L%d r%d expert w2.scale", l, r);
            /* replicated tensors keep the whole tensor's tag */
            CHECK(b->attn.wkv.w.data == a->attn.wkv.w.data);
        }
        CHECK_EQ_INT(s->head_split, 1);
        CHECK_MSG(same_rows(be, &w->head.w, &s->w.head.w, r * cfg.vocab_size / 2), "r%d head", r);
        dsv4_tp_shard_free(s);
    }
    if (be) be->free(be);
    dsv4_weights_free(w);
    dsv4_dummy_free(d);
}

/* Greedy tokens of TP = 1 and TP = 2 (CPU ranks, every step's logits checked across ranks). */
static void test_tp2_dummy_gives_tp1_tokens(void) {
    const int32_t prompt[] = {5, 17, 42, 7, 99, 3};
    for (int k = 0; k <= 5; k += 5) {
        int32_t out[2][16];
        int n[2] = {0, 0};
        for (int tp = 1; tp <= 2; tp++) {
            dsv4_err err = {0};
            dsv4_model_runner_opts mo = {.n_slots = 1, .max_len = 64, .max_spec = k,
                                         .numerics = DSV4_NUMERICS_REFERENCE, .device = DSV4_DEVICE_CPU};
            dsv4_load_opts lo = {.dummy = 1, .hf_overrides = SMALL, .seed = 3};
            dsv4_tp_runner *t = NULL;
            dsv4_tp_runner_opts to = {.tp_size = tp, .check_ranks = 1};
            int rc = dsv4_tp_runner_open(DIR_0731, &mo, &lo, &to, &t, &err);
            CHECK_MSG(rc == 0, "tp %d: %s", tp, err.msg);
            if (rc) return;
            dsv4_runner run = dsv4_tp_runner_iface(t);
            dsv4_drafter dr;
            int has = k > 0 && dsv4_tp_runner_drafter(t, &dr);
            CHECK(k == 0 || has);
            dsv4_engine_opts eo = {1, 64, 64, k, dsv4_tp_runner_config(t)->eos_token_id, {{0}}, 0, 0};
            dsv4_engine *e = NULL;
            CHECK_EQ_INT(dsv4_engine_create(&eo, &run, has ? &dr : NULL, &e, &err), 0);
            if (e) n[tp - 1] = tu_generate_greedy(e, prompt, 6, 16, out[tp - 1], 16, NULL);
            CHECK_MSG(n[tp - 1] == 16, "tp %d k %d: %d tokens", tp, k, n[tp - 1]);
            dsv4_engine_free(e);
            dsv4_tp_runner_free(t);
        }
        CHECK_MSG(n[0] == n[1] && !memcmp(out[0], out[1], sizeof(int32_t) * (size_t)n[0]),
                  "k %d: TP=2 dummy tokens differ from TP=1", k);
    }
}

/* NCCL is dlopen'd: a path that does not load is a clear error naming the variable, never a fall-through. */
static void test_nccl_missing_is_a_clear_error(void) {
    setenv("DSV4_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    dsv4_comm *c[2];
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_comm_nccl_create_all(2, c, &err), DSV4_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "NCCL not found");
    CHECK_CONTAINS(err.msg, "/nonexistent/libnccl.so.2");
    CHECK_CONTAINS(err.msg, "DSV4_NCCL_LIB");
    CHECK(c[0] == NULL && c[1] == NULL);
    unsetenv("DSV4_NCCL_LIB");
}

int main(void) {
    test_nccl_missing_is_a_clear_error();
    test_slices_are_the_whole_tensors_bytes();
    test_tp2_dummy_gives_tp1_tokens();
    return TEST_REPORT();
}
