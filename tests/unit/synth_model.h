/*
 * A small random DeepSeek-V4 model built in memory (config + dsv4_weights)
 * for forward tests that must not depend on the loader or fixtures:
 * layers with ratios 0 / 4 / 128 / 4, hash routing on the first two, FP8
 * attention/shared-expert linears, FP4 routed experts, F32 elsewhere.
 * Dims are tiny but keep the real structure (head_dim 128 = 64 nope + 64 rope,
 * index_head_dim 128, hc_mult 4, 20 Sinkhorn iterations).
 */
#ifndef DSV4_SYNTH_MODEL_H
#define DSV4_SYNTH_MODEL_H

#include "cpu_test_util.h"
#include "model/formats.h"
#include "model/forward.h"

#include <math.h>

typedef struct synth {
    dsv4_config cfg;
    dsv4_weights w;
    dsv4_block_w layers[4];
    dsv4_expert_w experts[4][4];
    void *allocs[1024];
    int n_allocs;
} synth;

static void *sy_alloc(synth *s, size_t n) {
    void *p = calloc(1, n ? n : 1);
    s->allocs[s->n_allocs++] = p;
    return p;
}

static dsv4_tview sy_f32(synth *s, int ndim, int64_t d0, int64_t d1, float scale, float offset) {
    int64_t n = d0 * (ndim > 1 ? d1 : 1);
    float *p = sy_alloc(s, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) p[i] = offset + scale * tu_rand();
    return tu_view(DSV4_DT_F32, p, ndim, d0, d1);
}

static dsv4_linear sy_lin_f32(synth *s, int64_t o, int64_t i) {
    dsv4_linear l = {.out = o, .in = i};
    l.w = sy_f32(s, 2, o, i, sqrtf(3.0f / i), 0);
    return l;
}

/* FP8 E4M3 with 128×128 E8M0 block scales (spec §2.3), quantised from U(±sqrt(3/i)). */
static dsv4_linear sy_lin_fp8(synth *s, int64_t o, int64_t i) {
    dsv4_linear l = {.out = o, .in = i};
    int64_t so = (o + 127) / 128, si = (i + 127) / 128;
    uint8_t *q = sy_alloc(s, (size_t)(o * i)), *sc = sy_alloc(s, (size_t)(so * si));
    float bound = sqrtf(3.0f / i);
    int e = (int)ceilf(log2f(bound / 448.0f));
    for (int64_t k = 0; k < so * si; k++) sc[k] = (uint8_t)(e + 127);
    for (int64_t k = 0; k < o * i; k++) q[k] = dsv4_f32_to_e4m3(bound * tu_rand() / ldexpf(1, e));
    l.w = tu_view(DSV4_DT_F8_E4M3, q, 2, o, i);
    l.scale = tu_view(DSV4_DT_F8_E8M0, sc, 2, so, si);
    return l;
}

/* FP4 E2M1 packed (low nibble = even column) with per-32 E8M0 scales. */
static dsv4_linear sy_lin_fp4(synth *s, int64_t o, int64_t i, float gain) {
    dsv4_linear l = {.out = o, .in = i};
    uint8_t *q = sy_alloc(s, (size_t)(o * i / 2)), *sc = sy_alloc(s, (size_t)(o * i / 32));
    float bound = gain * sqrtf(3.0f / i);
    int e = (int)ceilf(log2f(bound / 6.0f));
    for (int64_t k = 0; k < o * i / 32; k++) sc[k] = (uint8_t)(e + 127);
    for (int64_t k = 0; k < o * i / 2; k++) {
        uint8_t lo = dsv4_f32_to_e2m1(bound * tu_rand() / ldexpf(1, e));
        uint8_t hi = dsv4_f32_to_e2m1(bound * tu_rand() / ldexpf(1, e));
        q[k] = (uint8_t)(lo | hi << 4);
    }
    l.w = tu_view(DSV4_DT_I8, q, 2, o, i / 2);
    l.scale = tu_view(DSV4_DT_F8_E8M0, sc, 2, o, i / 32);
    return l;
}

static dsv4_hc_w sy_hc(synth *s, int n_out, int64_t width, int n_scale) {
    dsv4_hc_w h;
    h.fn = sy_f32(s, 2, n_out, width, 0.5f / sqrtf((float)width), 0);
    h.base = sy_f32(s, 1, n_out, 0, 1, 0);
    h.scale = sy_f32(s, 1, n_scale, 0, 0.25f, 1);
    return h;
}

static dsv4_compressor_w sy_cmp(synth *s, int ratio, int c, int d) {
    int coff = ratio == 4 ? 2 : 1;
    dsv4_compressor_w k;
    k.ape = sy_f32(s, 2, ratio, coff * c, 1, 0);
    k.wkv = sy_lin_f32(s, coff * c, d);
    k.wgate = sy_lin_f32(s, coff * c, d);
    k.norm = sy_f32(s, 1, c, 0, 0.1f, 1);
    return k;
}

static void synth_build(synth *s, uint64_t seed) {
    memset(s, 0, sizeof *s);
    tu_state = seed;
    dsv4_config *c = &s->cfg;
    c->vocab_size = 64; c->hidden_size = 64; c->num_hidden_layers = 4;
    c->num_attention_heads = 2; c->num_key_value_heads = 1; c->head_dim = 128; c->qk_rope_head_dim = 64;
    c->q_lora_rank = 64; c->o_groups = 2; c->o_lora_rank = 32; c->sliding_window = 8;
    int ratios[5] = {0, 4, 128, 4, 0};
    c->n_compress_ratios = 5;
    memcpy(c->compress_ratios, ratios, sizeof ratios);
    c->rope_theta = 10000; c->compress_rope_theta = 160000;
    c->yarn.factor = 16; c->yarn.original_max_position_embeddings = 65536; c->yarn.beta_fast = 32; c->yarn.beta_slow = 1;
    c->max_position_embeddings = 1048576;
    c->index_n_heads = 4; c->index_head_dim = 128; c->index_topk = 3;
    c->n_routed_experts = 4; c->num_experts_per_tok = 2; c->n_shared_experts = 1; c->moe_intermediate_size = 32;
    c->num_hash_layers = 2; c->routed_scaling_factor = 1.5; c->swiglu_limit = 10.0;
    c->hc_mult = 4; c->hc_sinkhorn_iters = 20; c->hc_eps = 1e-6; c->rms_norm_eps = 1e-6;
    int d = c->hidden_size, hd = c->head_dim, H = c->num_attention_heads, nh = c->hc_mult;
    dsv4_weights *w = &s->w;
    w->embed = sy_f32(s, 2, c->vocab_size, d, 1, 0);
    w->head = sy_lin_f32(s, c->vocab_size, d);
    w->norm = sy_f32(s, 1, d, 0, 0.1f, 1);
    w->hc_head = sy_hc(s, nh, (int64_t)nh * d, 1);
    w->n_layers = 4;
    w->layers = s->layers;
    for (int L = 0; L < 4; L++) {
        dsv4_block_w *b = &s->layers[L];
        b->layer_id = L;
        b->ratio = ratios[L];
        b->hash = L < c->num_hash_layers;
        b->attn_norm = sy_f32(s, 1, d, 0, 0.1f, 1);
        b->ffn_norm = sy_f32(s, 1, d, 0, 0.1f, 1);
        b->hc_attn = sy_hc(s, nh * (2 + nh), (int64_t)nh * d, 3);
        b->hc_ffn = sy_hc(s, nh * (2 + nh), (int64_t)nh * d, 3);
        dsv4_attn_w *a = &b->attn;
        a->wq_a = sy_lin_fp8(s, c->q_lora_rank, d);
        a->q_norm = sy_f32(s, 1, c->q_lora_rank, 0, 0.1f, 1);
        a->wq_b = sy_lin_fp8(s, (int64_t)H * hd, c->q_lora_rank);
        a->wkv = sy_lin_fp8(s, hd, d);
        a->kv_norm = sy_f32(s, 1, hd, 0, 0.1f, 1);
        a->wo_a = sy_lin_fp8(s, (int64_t)c->o_groups * c->o_lora_rank, (int64_t)H * hd / c->o_groups);
        a->wo_b = sy_lin_fp8(s, d, (int64_t)c->o_groups * c->o_lora_rank);
        a->sink = sy_f32(s, 1, H, 0, 1, 0);
        if (b->ratio) a->compressor = sy_cmp(s, b->ratio, hd, d);
        if (b->ratio == 4) {
            a->indexer.wq_b = sy_lin_fp8(s, (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank);
            a->indexer.weights_proj = sy_lin_f32(s, c->index_n_heads, d);
            a->indexer.compressor = sy_cmp(s, 4, c->index_head_dim, d);
        }
        dsv4_ffn_w *f = &b->ffn;
        f->gate = sy_lin_f32(s, c->n_routed_experts, d);
        if (b->hash) {
            int64_t *t2e = sy_alloc(s, (size_t)c->vocab_size * 2 * 8);
            for (int v = 0; v < c->vocab_size; v++) {
                t2e[v * 2] = (v * 7 + L) % 4;
                t2e[v * 2 + 1] = (t2e[v * 2] + 1 + v % 3) % 4;
            }
            f->tid2eid = tu_view(DSV4_DT_I64, t2e, 2, c->vocab_size, 2);
        } else {
            f->gate_bias = sy_f32(s, 1, c->n_routed_experts, 0, 0.5f, 0);
        }
        f->n_experts = 4;
        f->experts = s->experts[L];
        for (int e = 0; e < 4; e++) {
            f->experts[e].w1 = sy_lin_fp4(s, c->moe_intermediate_size, d, e == 0 ? 8.0f : 1.0f);
            f->experts[e].w3 = sy_lin_fp4(s, c->moe_intermediate_size, d, e == 0 ? 8.0f : 1.0f);
            f->experts[e].w2 = sy_lin_fp4(s, d, c->moe_intermediate_size, 1.0f);
        }
        f->shared.w1 = sy_lin_fp8(s, c->moe_intermediate_size, d);
        f->shared.w3 = sy_lin_fp8(s, c->moe_intermediate_size, d);
        f->shared.w2 = sy_lin_fp8(s, d, c->moe_intermediate_size);
    }
}

static void synth_free(synth *s) {
    for (int i = 0; i < s->n_allocs; i++) free(s->allocs[i]);
    s->n_allocs = 0;
}
#endif
