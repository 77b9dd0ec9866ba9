/*
 * Weight binder (src/model/weights.c) on the tiny real-layout checkpoints of
 * tools/gen_checkpoints.py (models/ if scripts/setup.sh made them, else
 * generated into a temp dir):
 *  - every view is aligned to its element size (the quantised tiny files put
 *    hc_* F32 and tid2eid I64 at odd offsets; the loader copies those);
 *  - walking every slot of dsv4_weights visits every checkpoint tensor exactly
 *    once (the "exactly one destination" rule, checked from the struct side);
 *  - slots hold what the config says (ratio-dependent compressor/indexer,
 *    hash tid2eid vs gate.bias, MTP block, DSpark stage-0/last-stage extras,
 *    absolute draft layer ids never hash-routed);
 *  - every quantised linear of the FP8/FP4 checkpoints, dequantised by
 *    src/model/formats.c, equals the same linear in the BF16 copy that the
 *    Python generator dequantised independently (ml_dtypes), bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/formats.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test.h"
#include "test_models.h"

static char models[512];

typedef struct loaded {
    dsv4_config cfg;
    dsv4_ckpt *ck;
    dsv4_weights *w;
} loaded;

static int load(const char *name, loaded *l) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", models, name);
    dsv4_err err = {0};
    memset(l, 0, sizeof *l);
    int rc = dsv4_config_load(dir, &l->cfg, &err);
    if (!rc) rc = dsv4_ckpt_open(dir, &l->ck, &err);
    if (!rc) rc = dsv4_config_set_drafts(&l->cfg, l->ck, &err);
    if (!rc) rc = dsv4_weights_bind(&l->cfg, l->ck, &l->w, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    return rc;
}

static void unload(loaded *l) {
    dsv4_weights_free(l->w);
    dsv4_ckpt_free(l->ck);
}

/* ---- a walker over every slot ---- */
typedef void (*tv_fn)(void *ctx, const dsv4_tview *v);
typedef void (*lin_fn)(void *ctx, const dsv4_linear *l);
typedef struct walker {
    tv_fn tv;
    lin_fn lin;
    void *ctx;
} walker;

static void w_tv(walker *k, const dsv4_tview *v) {
    if (v->dtype != DSV4_DT_INVALID) k->tv(k->ctx, v);
}
static void w_lin(walker *k, const dsv4_linear *l) {
    if (l->w.dtype == DSV4_DT_INVALID) return;
    w_tv(k, &l->w);
    w_tv(k, &l->scale);
    if (k->lin) k->lin(k->ctx, l);
}
static void w_hc(walker *k, const dsv4_hc_w *h) {
    w_tv(k, &h->fn);
    w_tv(k, &h->base);
    w_tv(k, &h->scale);
}
static void w_comp(walker *k, const dsv4_compressor_w *c) {
    w_tv(k, &c->ape);
    w_lin(k, &c->wkv);
    w_lin(k, &c->wgate);
    w_tv(k, &c->norm);
}
static void w_expert(walker *k, const dsv4_expert_w *e) {
    w_lin(k, &e->w1);
    w_lin(k, &e->w2);
    w_lin(k, &e->w3);
}
static void w_block(walker *k, const dsv4_block_w *b) {
    w_tv(k, &b->attn_norm);
    w_tv(k, &b->ffn_norm);
    w_hc(k, &b->hc_attn);
    w_hc(k, &b->hc_ffn);
    const dsv4_attn_w *a = &b->attn;
    w_lin(k, &a->wq_a);
    w_tv(k, &a->q_norm);
    w_lin(k, &a->wq_b);
    w_lin(k, &a->wkv);
    w_tv(k, &a->kv_norm);
    w_lin(k, &a->wo_a);
    w_lin(k, &a->wo_b);
    w_tv(k, &a->sink);
    w_comp(k, &a->compressor);
    w_lin(k, &a->indexer.wq_b);
    w_lin(k, &a->indexer.weights_proj);
    w_comp(k, &a->indexer.compressor);
    w_lin(k, &b->ffn.gate);
    w_tv(k, &b->ffn.gate_bias);
    w_tv(k, &b->ffn.tid2eid);
    for (int e = 0; e < b->ffn.n_experts; e++) w_expert(k, &b->ffn.experts[e]);
    w_expert(k, &b->ffn.shared);
}
static void walk(walker *k, const dsv4_weights *w) {
    w_tv(k, &w->embed);
    w_lin(k, &w->head);
    w_tv(k, &w->norm);
    w_hc(k, &w->hc_head);
    for (int i = 0; i < w->n_layers; i++) w_block(k, &w->layers[i]);
    for (int i = 0; i < w->n_mtp; i++) {
        const dsv4_mtp_w *m = &w->mtp[i];
        w_block(k, &m->block);
        w_lin(k, &m->e_proj);
        w_lin(k, &m->h_proj);
        w_tv(k, &m->enorm);
        w_tv(k, &m->hnorm);
        w_tv(k, &m->norm);
        w_hc(k, &m->hc_head);
    }
    for (int i = 0; i < w->n_stages; i++) {
        const dsv4_dspark_stage_w *s = &w->stages[i];
        w_block(k, &s->block);
        w_lin(k, &s->main_proj);
        w_tv(k, &s->main_norm);
        w_tv(k, &s->norm);
        w_hc(k, &s->hc_head);
        w_lin(k, &s->markov_w1);
        w_lin(k, &s->markov_w2);
        w_lin(k, &s->confidence_proj);
    }
}

typedef struct cover {
    const dsv4_ckpt *ck;
    int *hits;
    int foreign, misaligned;
} cover;
static void cover_tv(void *ctx, const dsv4_tview *v) {
    cover *c = ctx;
    size_t i = dsv4_ckpt_index_of(c->ck, dsv4_ckpt_find(c->ck, v->name));
    if (i == (size_t)-1 || dsv4_ckpt_at(c->ck, i)->data != v->data) c->foreign++;
    else c->hits[i]++;
    if ((uintptr_t)v->data % dsv4_dtype_size(v->dtype) != 0) c->misaligned++;
}

static void test_cover(const char *name) {
    loaded l;
    if (load(name, &l)) return;
    size_t n = dsv4_ckpt_count(l.ck);
    cover c = {l.ck, calloc(n, sizeof(int)), 0, 0};
    walker k = {cover_tv, NULL, &c};
    walk(&k, l.w);
    int once = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        if (c.hits[i] == 1) once++;
        else {
            other++;
            fprintf(stderr, "%s: tensor %s bound %d times\n", name, dsv4_ckpt_at(l.ck, i)->name, c.hits[i]);
        }
    }
    CHECK_EQ_INT(other, 0);
    CHECK_EQ_INT(once, (long long)n);
    CHECK_EQ_INT(c.foreign, 0);
    CHECK_EQ_INT(c.misaligned, 0); /* every view readable as its C element type */
    CHECK_EQ_INT(l.w->n_tensors, (long long)n);
    free(c.hits);
    unload(&l);
}

static void test_slots_flash(void) {
    loaded l;
    if (load("tiny-flash", &l)) return;
    const dsv4_weights *w = l.w;
    const dsv4_config *c = &l.cfg;
    CHECK(w->draft_kind == DSV4_DRAFT_MTP && w->n_mtp == 1 && w->n_stages == 0);
    CHECK(c->n_draft_stages == 1);
    /* layer 0: ratio 0, hash: no compressor, tid2eid, no gate.bias */
    CHECK(w->layers[0].ratio == 0 && w->layers[0].hash);
    CHECK(w->layers[0].attn.compressor.ape.dtype == DSV4_DT_INVALID);
    CHECK(w->layers[0].ffn.tid2eid.dtype == DSV4_DT_I64 && w->layers[0].ffn.gate_bias.dtype == DSV4_DT_INVALID);
    CHECK(w->layers[0].ffn.tid2eid.shape[0] == c->vocab_size && w->layers[0].ffn.tid2eid.shape[1] == c->num_experts_per_tok);
    /* layer 1: ratio 4, hash: overlapping compressor (2*head_dim) + indexer */
    const dsv4_attn_w *a1 = &w->layers[1].attn;
    CHECK(w->layers[1].ratio == 4 && w->layers[1].hash);
    CHECK(a1->compressor.ape.shape[0] == 4 && a1->compressor.ape.shape[1] == 2 * c->head_dim);
    CHECK(a1->compressor.wkv.out == 2 * c->head_dim && a1->compressor.wkv.w.dtype == DSV4_DT_BF16);
    CHECK(a1->indexer.wq_b.w.dtype == DSV4_DT_F8_E4M3 && a1->indexer.wq_b.out == (int64_t)c->index_n_heads * c->index_head_dim);
    CHECK_STR(a1->indexer.compressor.norm.name, "layers.1.attn.indexer.compressor.norm.weight");
    /* layer 2: ratio 128, top-k: compressor width head_dim, no indexer, gate.bias */
    const dsv4_block_w *b2 = &w->layers[2];
    CHECK(b2->ratio == 128 && !b2->hash);
    CHECK(b2->attn.compressor.ape.shape[0] == 128 && b2->attn.compressor.ape.shape[1] == c->head_dim);
    CHECK(b2->attn.indexer.wq_b.w.dtype == DSV4_DT_INVALID);
    CHECK(b2->ffn.gate_bias.dtype == DSV4_DT_F32 && b2->ffn.tid2eid.dtype == DSV4_DT_INVALID);
    /* experts: FP4 I8 [inter, d/2], scale [inter, d/32]; shared FP8 */
    const dsv4_linear *e = &w->layers[3].ffn.experts[7].w2;
    CHECK_STR(e->w.name, "layers.3.ffn.experts.7.w2.weight");
    CHECK(e->w.dtype == DSV4_DT_I8 && e->out == c->hidden_size && e->in == c->moe_intermediate_size);
    CHECK(e->scale.shape[1] == c->moe_intermediate_size / 32);
    CHECK_STR(w->layers[3].ffn.shared.w3.scale.name, "layers.3.ffn.shared_experts.w3.scale");
    CHECK(w->expert_dtype == DSV4_DT_I8);
    /* MTP block: absolute id num_hidden_layers, ratio 0, not hash, has gate.bias */
    const dsv4_mtp_w *m = &w->mtp[0];
    CHECK(m->block.layer_id == 4 && m->block.ratio == 0 && !m->block.hash);
    CHECK(m->block.ffn.gate_bias.dtype == DSV4_DT_F32);
    CHECK_STR(m->e_proj.w.name, "mtp.0.e_proj.weight");
    CHECK_STR(m->hc_head.scale.name, "mtp.0.hc_head_scale");
    CHECK_STR(w->hc_head.fn.name, "hc_head_fn");
    CHECK(w->head.w.dtype == DSV4_DT_BF16 && w->head.out == c->vocab_size);
    unload(&l);
}

static void test_slots_dspark(void) {
    loaded l;
    if (load("tiny-dspark", &l)) return;
    const dsv4_weights *w = l.w;
    const dsv4_config *c = &l.cfg;
    CHECK(w->draft_kind == DSV4_DRAFT_DSPARK && w->n_stages == 3 && w->n_mtp == 0);
    for (int s = 0; s < 3; s++) {
        const dsv4_dspark_stage_w *st = &w->stages[s];
        char nm[128];
        CHECK(st->block.layer_id == c->num_hidden_layers + s && !st->block.hash && st->block.ratio == 0);
        CHECK(st->block.ffn.tid2eid.dtype == DSV4_DT_INVALID);
        /* the four shared-expert tensors the seed loader dropped, per stage */
        snprintf(nm, sizeof nm, "mtp.%d.ffn.shared_experts.w1.weight", s);
        CHECK_STR(st->block.ffn.shared.w1.w.name, nm);
        snprintf(nm, sizeof nm, "mtp.%d.ffn.shared_experts.w1.scale", s);
        CHECK_STR(st->block.ffn.shared.w1.scale.name, nm);
        snprintf(nm, sizeof nm, "mtp.%d.ffn.shared_experts.w3.weight", s);
        CHECK_STR(st->block.ffn.shared.w3.w.name, nm);
        snprintf(nm, sizeof nm, "mtp.%d.ffn.shared_experts.w3.scale", s);
        CHECK_STR(st->block.ffn.shared.w3.scale.name, nm);
        CHECK((st->main_proj.w.dtype != DSV4_DT_INVALID) == (s == 0));
        CHECK((st->markov_w1.w.dtype != DSV4_DT_INVALID) == (s == 2));
        CHECK((st->norm.dtype != DSV4_DT_INVALID) == (s == 2));
    }
    const dsv4_dspark_stage_w *s0 = &w->stages[0], *s2 = &w->stages[2];
    CHECK(s0->main_proj.out == c->hidden_size && s0->main_proj.in == 3 * c->hidden_size);
    CHECK(s0->main_proj.scale.shape[0] == c->hidden_size / 128 && s0->main_proj.scale.shape[1] == 3 * c->hidden_size / 128);
    CHECK_STR(s2->markov_w1.w.name, "mtp.2.markov_head.markov_w1.weight");
    CHECK_STR(s2->markov_w2.w.name, "mtp.2.markov_head.markov_w2.weight");
    CHECK(s2->markov_w1.out == c->vocab_size && s2->markov_w1.in == c->dspark_markov_rank);
    CHECK(s2->confidence_proj.out == 1 && s2->confidence_proj.in == c->hidden_size + c->dspark_markov_rank);
    CHECK(w->n_param_draft > 0 && w->n_param_draft < w->n_params);
    unload(&l);
}

/* Dequantised FP8/FP4 linears == the generator's BF16 copy, bit for bit. */
typedef struct dq {
    const dsv4_ckpt *bf;
    int linears, fp8, fp4, mismatched, missing;
} dq;
static void dq_lin(void *ctx, const dsv4_linear *l) {
    dq *d = ctx;
    if (l->scale.dtype == DSV4_DT_INVALID) return;
    const dsv4_tview *ref = dsv4_ckpt_find(d->bf, l->w.name);
    if (!ref || ref->dtype != DSV4_DT_BF16 || dsv4_tview_numel(ref) != l->out * l->in) {
        d->missing++;
        return;
    }
    float *out = malloc(sizeof(float) * (size_t)(l->out * l->in));
    dsv4_err err = {0};
    if (dsv4_linear_dequant_rows(l, 0, l->out, out, &err) != 0) {
        d->mismatched++;
        free(out);
        return;
    }
    const uint16_t *h = ref->data;
    int bad = 0;
    for (int64_t i = 0; i < l->out * l->in; i++)
        if (dsv4_f32_to_bf16(out[i]) != h[i] || dsv4_bf16_to_f32(h[i]) != out[i]) bad++;
    if (bad) {
        d->mismatched++;
        fprintf(stderr, "%s: %d values differ from the BF16 copy\n", l->w.name, bad);
    }
    d->linears++;
    d->fp8 += l->w.dtype == DSV4_DT_F8_E4M3;
    d->fp4 += l->w.dtype == DSV4_DT_I8;
    free(out);
}
static void noop_tv(void *ctx, const dsv4_tview *v) { (void)ctx, (void)v; }

static void test_dequant_matches_bf16(const char *q, const char *bf) {
    loaded a, b;
    if (load(q, &a)) return;
    if (load(bf, &b)) {
        unload(&a);
        return;
    }
    dq d = {b.ck, 0, 0, 0, 0, 0};
    walker k = {noop_tv, dq_lin, &d};
    walk(&k, a.w);
    CHECK_EQ_INT(d.mismatched, 0);
    CHECK_EQ_INT(d.missing, 0);
    CHECK(d.fp8 > 10 && d.fp4 > 10);
    printf("%s: %d quantised linears (%d FP8, %d FP4) equal %s\n", q, d.linears, d.fp8, d.fp4, bf);
    CHECK(b.w->expert_dtype == DSV4_DT_BF16);
    CHECK_EQ_INT(a.w->n_params, b.w->n_params);
    unload(&a);
    unload(&b);
}

int main(void) {
    {
        static const char *const need[] = {"tiny-flash", "tiny-dspark", "tiny-flash-bf16", "tiny-dspark-bf16"};
        tm_find_models(models, sizeof models, need, (int)(sizeof need / sizeof need[0]));
    }
    test_cover("tiny-flash");
    test_cover("tiny-dspark");
    test_cover("tiny-flash-bf16");
    test_cover("tiny-dspark-bf16");
    test_slots_flash();
    test_slots_dspark();
    test_dequant_matches_bf16("tiny-flash", "tiny-flash-bf16");
    test_dequant_matches_bf16("tiny-dspark", "tiny-dspark-bf16");
    if (strncmp(models, "/tmp/dsv4_test_weights_", 23) == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf %s", models);
        if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    }
    return TEST_REPORT();
}
