/*
 * Weight binder (model/weights.h; DESIGN.md "Every tensor ... bound to exactly
 * one destination"; spec/MODEL.md §2.2, spec/DSPARK.md §3).
 *
 * How: walk the model the config describes, build each slot's full tensor
 * name from its segments ("layers", N, "ffn", "shared_experts", "w1",
 * "weight"), look it up in the checkpoint's hash map, check dtype and shape,
 * and mark that checkpoint tensor used. Afterwards every unmarked checkpoint
 * tensor is an error. Lookups are exact whole names, so no rule can match a
 * tensor it was not written for (`markov_w1` vs `w1`, `shared_experts` vs
 * `experts`), a tensor can never feed two slots, and the work is O(tensors).
 */
#include "model/weights.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct B {
    const dsv4_config *cfg;
    const dsv4_ckpt *ck;
    dsv4_err *err;
    int rc;
    uint8_t *used; /* per checkpoint tensor */
    const char *where; /* "target layer 3", "draft stage 1", "top level" */
} B;

typedef enum lin_kind {
    LIN_Q8,     /* FP8 + 128x128 scale, or BF16/F32 (dequantised)           */
    LIN_EXPERT, /* FP4 (I8) + per-32 scale, FP8 as LIN_Q8, or BF16/F32       */
    LIN_DENSE,  /* BF16/F32 only                                            */
} lin_kind;

static void shape_str(char *out, size_t cap, int nd, const int64_t *s) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < nd && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

static const dsv4_tview *find(B *b, const char *name) {
    const dsv4_tview *v = dsv4_ckpt_find(b->ck, name);
    return v;
}

static int fail(B *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(B *b, int code, const char *fmt, ...) {
    if (b->rc) return b->rc;
    char m[DSV4_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    b->rc = dsv4_err_set(b->err, code, "%s", m);
    return b->rc;
}

static int missing(B *b, const char *name) {
    return fail(b, DSV4_EBIND, "missing tensor '%s' (%s; required by config.json)", name, b->where);
}

static void mark(B *b, const dsv4_tview *v) {
    size_t i = dsv4_ckpt_index_of(b->ck, v);
    if (i == (size_t)-1) return;
    if (b->used[i])
        fail(b, DSV4_EINTERNAL, "tensor '%s' bound twice (binder bug)", v->name);
    b->used[i] = 1;
}

static int shape_is(const dsv4_tview *v, int nd, int64_t d0, int64_t d1) {
    if (v->ndim != nd) return 0;
    if (nd >= 1 && v->shape[0] != d0) return 0;
    if (nd >= 2 && v->shape[1] != d1) return 0;
    return 1;
}

static int bad_shape(B *b, const dsv4_tview *v, int nd, int64_t d0, int64_t d1, const char *note) {
    char got[96], want[96];
    int64_t w[2] = {d0, d1};
    shape_str(got, sizeof got, v->ndim, v->shape);
    shape_str(want, sizeof want, nd, w);
    return fail(b, DSV4_EBIND, "tensor '%s' in %s: shape %s, expected %s%s", v->name,
                dsv4_ckpt_file_of(b->ck, v), got, want, note ? note : "");
}

static int bad_dtype(B *b, const dsv4_tview *v, const char *want) {
    return fail(b, DSV4_EBIND, "tensor '%s' in %s: dtype %s, expected %s", v->name,
                dsv4_ckpt_file_of(b->ck, v), dsv4_dtype_name(v->dtype), want);
}

/* A non-quantised tensor: BF16 or F32 (MODEL.md §5.3 step 5), exact shape. */
static void plain(B *b, const char *name, dsv4_tview *dst, int nd, int64_t d0, int64_t d1) {
    if (b->rc) return;
    const dsv4_tview *v = find(b, name);
    if (!v) {
        missing(b, name);
        return;
    }
    if (v->dtype != DSV4_DT_BF16 && v->dtype != DSV4_DT_F32) {
        bad_dtype(b, v, "BF16 or F32");
        return;
    }
    if (!shape_is(v, nd, d0, d1)) {
        bad_shape(b, v, nd, d0, d1, NULL);
        return;
    }
    *dst = *v;
    mark(b, v);
}

/* HC parameters: fn [rows, hc*d], base [rows], scale [nscale]. */
static void hc(B *b, const char *prefix, const char *kind, dsv4_hc_w *dst, int64_t rows,
               int64_t nscale) {
    char n[512];
    int64_t hcd = (int64_t)b->cfg->hc_mult * b->cfg->hidden_size;
    snprintf(n, sizeof n, "%shc_%s_fn", prefix, kind);
    plain(b, n, &dst->fn, 2, rows, hcd);
    snprintf(n, sizeof n, "%shc_%s_base", prefix, kind);
    plain(b, n, &dst->base, 1, rows, 0);
    snprintf(n, sizeof n, "%shc_%s_scale", prefix, kind);
    plain(b, n, &dst->scale, 1, nscale, 0);
}

/* A linear "<base>.weight" (+ "<base>.scale"), logical [out, in]. */
static void lin(B *b, const char *base, dsv4_linear *dst, int64_t out, int64_t in, lin_kind kind) {
    if (b->rc) return;
    char wn[512], sn[512];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(sn, sizeof sn, "%s.scale", base);
    const dsv4_tview *w = find(b, wn), *s = find(b, sn);
    if (!w) {
        missing(b, wn);
        return;
    }
    dst->out = out;
    dst->in = in;
    const char *want = kind == LIN_DENSE ? "BF16 or F32"
                       : kind == LIN_Q8  ? "F8_E4M3 (+ .scale) or BF16/F32"
                                         : "I8 (FP4) or F8_E4M3 (+ .scale), or BF16/F32";
    switch (w->dtype) {
    case DSV4_DT_BF16:
    case DSV4_DT_F32:
        if (!shape_is(w, 2, out, in)) {
            bad_shape(b, w, 2, out, in, NULL);
            return;
        }
        if (s) {
            fail(b, DSV4_EBIND,
                 "tensor '%s' in %s: a scale for an unquantised weight ('%s' is %s); no slot takes it",
                 sn, dsv4_ckpt_file_of(b->ck, s), wn, dsv4_dtype_name(w->dtype));
            return;
        }
        dst->w = *w;
        mark(b, w);
        return;
    case DSV4_DT_F8_E4M3:
        if (kind == LIN_DENSE) break;
        if (!shape_is(w, 2, out, in)) {
            bad_shape(b, w, 2, out, in, NULL);
            return;
        }
        if (!s) {
            fail(b, DSV4_EBIND, "missing tensor '%s' (%s: '%s' in %s is F8_E4M3 and needs its E8M0 "
                 "block scale)", sn, b->where, wn, dsv4_ckpt_file_of(b->ck, w));
            return;
        }
        if (s->dtype != DSV4_DT_F8_E8M0) {
            bad_dtype(b, s, "F8_E8M0");
            return;
        }
        if (!shape_is(s, 2, (out + 127) / 128, (in + 127) / 128)) {
            bad_shape(b, s, 2, (out + 127) / 128, (in + 127) / 128, " (one scale per 128x128 block)");
            return;
        }
        dst->w = *w;
        dst->scale = *s;
        mark(b, w);
        mark(b, s);
        return;
    case DSV4_DT_I8:
        if (kind != LIN_EXPERT) break;
        if (in % 32 != 0) {
            fail(b, DSV4_EBIND, "tensor '%s' in %s: FP4 needs an input width divisible by 32 (got %lld)",
                 wn, dsv4_ckpt_file_of(b->ck, w), (long long)in);
            return;
        }
        if (!shape_is(w, 2, out, in / 2)) {
            bad_shape(b, w, 2, out, in / 2, " (FP4: two values per byte)");
            return;
        }
        if (!s) {
            fail(b, DSV4_EBIND, "missing tensor '%s' (%s: '%s' in %s is I8-packed FP4 and needs its "
                 "per-32 E8M0 scale)", sn, b->where, wn, dsv4_ckpt_file_of(b->ck, w));
            return;
        }
        if (s->dtype != DSV4_DT_F8_E8M0) {
            bad_dtype(b, s, "F8_E8M0");
            return;
        }
        if (!shape_is(s, 2, out, in / 32)) {
            bad_shape(b, s, 2, out, in / 32, " (one scale per 32 inputs)");
            return;
        }
        dst->w = *w;
        dst->scale = *s;
        mark(b, w);
        mark(b, s);
        return;
    default:
        break;
    }
    bad_dtype(b, w, want);
}

static void tid2eid(B *b, const char *name, dsv4_tview *dst) {
    if (b->rc) return;
    const dsv4_config *c = b->cfg;
    const dsv4_tview *v = find(b, name);
    if (!v) {
        missing(b, name);
        return;
    }
    if (v->dtype != DSV4_DT_I64 && v->dtype != DSV4_DT_I32) {
        bad_dtype(b, v, "I64 (or I32)");
        return;
    }
    if (!shape_is(v, 2, c->vocab_size, c->num_experts_per_tok)) {
        bad_shape(b, v, 2, c->vocab_size, c->num_experts_per_tok, NULL);
        return;
    }
    /* Values index the experts array: out-of-range ids would be an OOB read. */
    int64_t n = (int64_t)c->vocab_size * c->num_experts_per_tok;
    for (int64_t i = 0; i < n; i++) {
        int64_t e;
        if (v->dtype == DSV4_DT_I64)
            memcpy(&e, (const uint8_t *)v->data + 8 * i, 8);
        else {
            int32_t e32;
            memcpy(&e32, (const uint8_t *)v->data + 4 * i, 4);
            e = e32;
        }
        if (e < 0 || e >= c->n_routed_experts) {
            fail(b, DSV4_EBIND, "tensor '%s' in %s: expert id %lld at token %lld outside [0, %d)", name,
                 dsv4_ckpt_file_of(b->ck, v), (long long)e, (long long)(i / c->num_experts_per_tok),
                 c->n_routed_experts);
            return;
        }
    }
    *dst = *v;
    mark(b, v);
}

static void compressor(B *b, const char *prefix, dsv4_compressor_w *dst, int ratio, int64_t c) {
    const dsv4_config *cf = b->cfg;
    int64_t coff = ratio == 4 ? 2 : 1;
    char n[512];
    snprintf(n, sizeof n, "%sape", prefix);
    plain(b, n, &dst->ape, 2, ratio, coff * c);
    snprintf(n, sizeof n, "%swkv", prefix);
    lin(b, n, &dst->wkv, coff * c, cf->hidden_size, LIN_DENSE);
    snprintf(n, sizeof n, "%swgate", prefix);
    lin(b, n, &dst->wgate, coff * c, cf->hidden_size, LIN_DENSE);
    snprintf(n, sizeof n, "%snorm.weight", prefix);
    plain(b, n, &dst->norm, 1, c, 0);
}

/* One decoder block under prefix ("layers.3." or "mtp.1."), absolute id. */
static void block(B *b, const char *p, dsv4_block_w *blk, int layer_id) {
    const dsv4_config *c = b->cfg;
    int64_t d = c->hidden_size, nh = c->num_attention_heads, hd = c->head_dim;
    int64_t ql = c->q_lora_rank, og = c->o_groups, ol = c->o_lora_rank;
    int64_t mix = (int64_t)(2 + c->hc_mult) * c->hc_mult;
    int64_t ne = c->n_routed_experts, inter = c->moe_intermediate_size;
    int64_t sh = (int64_t)c->n_shared_experts * inter;
    char n[512];
    blk->layer_id = layer_id;
    blk->ratio = dsv4_config_layer_ratio(c, layer_id);
    blk->hash = dsv4_config_layer_is_hash(c, layer_id);

    snprintf(n, sizeof n, "%sattn_norm.weight", p);
    plain(b, n, &blk->attn_norm, 1, d, 0);
    snprintf(n, sizeof n, "%sffn_norm.weight", p);
    plain(b, n, &blk->ffn_norm, 1, d, 0);
    hc(b, p, "attn", &blk->hc_attn, mix, 3);
    hc(b, p, "ffn", &blk->hc_ffn, mix, 3);

    dsv4_attn_w *a = &blk->attn;
    snprintf(n, sizeof n, "%sattn.attn_sink", p);
    plain(b, n, &a->sink, 1, nh, 0);
    snprintf(n, sizeof n, "%sattn.wq_a", p);
    lin(b, n, &a->wq_a, ql, d, LIN_Q8);
    snprintf(n, sizeof n, "%sattn.q_norm.weight", p);
    plain(b, n, &a->q_norm, 1, ql, 0);
    snprintf(n, sizeof n, "%sattn.wq_b", p);
    lin(b, n, &a->wq_b, nh * hd, ql, LIN_Q8);
    snprintf(n, sizeof n, "%sattn.wkv", p);
    lin(b, n, &a->wkv, hd, d, LIN_Q8);
    snprintf(n, sizeof n, "%sattn.kv_norm.weight", p);
    plain(b, n, &a->kv_norm, 1, hd, 0);
    snprintf(n, sizeof n, "%sattn.wo_a", p);
    lin(b, n, &a->wo_a, og * ol, nh * hd / og, LIN_Q8);
    snprintf(n, sizeof n, "%sattn.wo_b", p);
    lin(b, n, &a->wo_b, d, og * ol, LIN_Q8);
    if (blk->ratio > 0) {
        snprintf(n, sizeof n, "%sattn.compressor.", p);
        compressor(b, n, &a->compressor, blk->ratio, hd);
    }
    if (blk->ratio == 4) {
        int64_t ih = c->index_n_heads, ihd = c->index_head_dim;
        snprintf(n, sizeof n, "%sattn.indexer.wq_b", p);
        lin(b, n, &a->indexer.wq_b, ih * ihd, ql, LIN_Q8);
        snprintf(n, sizeof n, "%sattn.indexer.weights_proj", p);
        lin(b, n, &a->indexer.weights_proj, ih, d, LIN_DENSE);
        snprintf(n, sizeof n, "%sattn.indexer.compressor.", p);
        compressor(b, n, &a->indexer.compressor, 4, ihd);
    }

    dsv4_ffn_w *f = &blk->ffn;
    snprintf(n, sizeof n, "%sffn.gate", p);
    lin(b, n, &f->gate, ne, d, LIN_DENSE);
    if (blk->hash) {
        snprintf(n, sizeof n, "%sffn.gate.tid2eid", p);
        tid2eid(b, n, &f->tid2eid);
    } else {
        snprintf(n, sizeof n, "%sffn.gate.bias", p);
        plain(b, n, &f->gate_bias, 1, ne, 0);
    }
    if (b->rc) return;
    f->n_experts = (int)ne;
    f->experts = calloc((size_t)ne, sizeof *f->experts);
    if (!f->experts) {
        fail(b, DSV4_ENOMEM, "out of memory binding %s", b->where);
        return;
    }
    for (int64_t e = 0; e < ne && !b->rc; e++) {
        snprintf(n, sizeof n, "%sffn.experts.%lld.w1", p, (long long)e);
        lin(b, n, &f->experts[e].w1, inter, d, LIN_EXPERT);
        snprintf(n, sizeof n, "%sffn.experts.%lld.w3", p, (long long)e);
        lin(b, n, &f->experts[e].w3, inter, d, LIN_EXPERT);
        snprintf(n, sizeof n, "%sffn.experts.%lld.w2", p, (long long)e);
        lin(b, n, &f->experts[e].w2, d, inter, LIN_EXPERT);
    }
    if (sh > 0) {
        snprintf(n, sizeof n, "%sffn.shared_experts.w1", p);
        lin(b, n, &f->shared.w1, sh, d, LIN_Q8);
        snprintf(n, sizeof n, "%sffn.shared_experts.w3", p);
        lin(b, n, &f->shared.w3, sh, d, LIN_Q8);
        snprintf(n, sizeof n, "%sffn.shared_experts.w2", p);
        lin(b, n, &f->shared.w2, d, sh, LIN_Q8);
    }
}

static void head_hc(B *b, const char *p, dsv4_hc_w *dst) {
    hc(b, p, "head", dst, b->cfg->hc_mult, 1);
}

void dsv4_weights_free(dsv4_weights *w) {
    if (!w) return;
    if (w->layers)
        for (int i = 0; i < w->n_layers; i++) free(w->layers[i].ffn.experts);
    if (w->mtp)
        for (int i = 0; i < w->n_mtp; i++) free(w->mtp[i].block.ffn.experts);
    if (w->stages)
        for (int i = 0; i < w->n_stages; i++) free(w->stages[i].block.ffn.experts);
    free(w->layers);
    free(w->mtp);
    free(w->stages);
    free(w);
}

int dsv4_weights_bind(const dsv4_config *cfg, const dsv4_ckpt *ckpt, dsv4_weights **out,
                      dsv4_err *err) {
    *out = NULL;
    size_t nt = dsv4_ckpt_count(ckpt);
    B bb = {cfg, ckpt, err, 0, calloc(nt + 1, 1), "top level"};
    B *b = &bb;
    dsv4_weights *w = calloc(1, sizeof *w);
    if (!w || !b->used) {
        free(b->used);
        free(w);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory binding weights");
    }
    int64_t d = cfg->hidden_size, V = cfg->vocab_size;
    int L = cfg->num_hidden_layers;
    char where[64], pre[64];

    plain(b, "embed.weight", &w->embed, 2, V, d);
    lin(b, "head", &w->head, V, d, LIN_DENSE);
    plain(b, "norm.weight", &w->norm, 1, d, 0);
    head_hc(b, "", &w->hc_head);

    w->n_layers = L;
    w->layers = calloc((size_t)L, sizeof *w->layers);
    if (!w->layers) fail(b, DSV4_ENOMEM, "out of memory");
    for (int i = 0; i < L && !b->rc; i++) {
        snprintf(where, sizeof where, "target layer %d", i);
        snprintf(pre, sizeof pre, "layers.%d.", i);
        b->where = where;
        block(b, pre, &w->layers[i], i);
    }

    w->draft_kind = cfg->draft_kind;
    int S = cfg->n_draft_stages;
    if (!b->rc && cfg->draft_kind == DSV4_DRAFT_MTP) {
        w->n_mtp = S;
        w->mtp = calloc((size_t)S, sizeof *w->mtp);
        if (!w->mtp) fail(b, DSV4_ENOMEM, "out of memory");
        for (int s = 0; s < S && !b->rc; s++) {
            dsv4_mtp_w *m = &w->mtp[s];
            char n[128];
            snprintf(where, sizeof where, "MTP block mtp.%d", s);
            snprintf(pre, sizeof pre, "mtp.%d.", s);
            b->where = where;
            block(b, pre, &m->block, L + s);
            snprintf(n, sizeof n, "%se_proj", pre);
            lin(b, n, &m->e_proj, d, d, LIN_Q8);
            snprintf(n, sizeof n, "%sh_proj", pre);
            lin(b, n, &m->h_proj, d, d, LIN_Q8);
            snprintf(n, sizeof n, "%senorm.weight", pre);
            plain(b, n, &m->enorm, 1, d, 0);
            snprintf(n, sizeof n, "%shnorm.weight", pre);
            plain(b, n, &m->hnorm, 1, d, 0);
            snprintf(n, sizeof n, "%snorm.weight", pre);
            plain(b, n, &m->norm, 1, d, 0);
            head_hc(b, pre, &m->hc_head);
        }
    } else if (!b->rc && cfg->draft_kind == DSV4_DRAFT_DSPARK) {
        w->n_stages = S;
        w->stages = calloc((size_t)S, sizeof *w->stages);
        if (!w->stages) fail(b, DSV4_ENOMEM, "out of memory");
        int64_t rank = cfg->dspark_markov_rank;
        for (int s = 0; s < S && !b->rc; s++) {
            dsv4_dspark_stage_w *st = &w->stages[s];
            char n[128];
            snprintf(where, sizeof where, "draft stage mtp.%d", s);
            snprintf(pre, sizeof pre, "mtp.%d.", s);
            b->where = where;
            block(b, pre, &st->block, L + s);
            if (s == 0) {
                snprintf(n, sizeof n, "%smain_proj", pre);
                lin(b, n, &st->main_proj, d, d * cfg->n_dspark_target_layer_ids, LIN_Q8);
                snprintf(n, sizeof n, "%smain_norm.weight", pre);
                plain(b, n, &st->main_norm, 1, d, 0);
            }
            if (s == S - 1) {
                snprintf(n, sizeof n, "%snorm.weight", pre);
                plain(b, n, &st->norm, 1, d, 0);
                head_hc(b, pre, &st->hc_head);
                snprintf(n, sizeof n, "%smarkov_head.markov_w1", pre);
                lin(b, n, &st->markov_w1, V, rank, LIN_DENSE);
                snprintf(n, sizeof n, "%smarkov_head.markov_w2", pre);
                lin(b, n, &st->markov_w2, V, rank, LIN_DENSE);
                snprintf(n, sizeof n, "%sconfidence_head.proj", pre);
                lin(b, n, &st->confidence_proj, 1, d + rank, LIN_DENSE);
            }
        }
    }

    /* Every checkpoint tensor must have been taken by exactly one slot. */
    for (size_t i = 0; i < nt && !b->rc; i++)
        if (!b->used[i]) {
            const dsv4_tview *v = dsv4_ckpt_at(ckpt, i);
            fail(b, DSV4_EBIND,
                 "unknown tensor '%s' in %s: no slot of this model takes it (config: %d layers, %d "
                 "routed experts, %s with %d draft stage(s))",
                 v->name, dsv4_ckpt_file_of(ckpt, v), L, cfg->n_routed_experts,
                 dsv4_config_kind_name(cfg), S);
        }

    if (!b->rc) {
        for (size_t i = 0; i < nt; i++) {
            const dsv4_tview *v = dsv4_ckpt_at(ckpt, i);
            size_t ln = strlen(v->name);
            uint64_t params = (uint64_t)dsv4_tview_numel(v) * (v->dtype == DSV4_DT_I8 ? 2 : 1);
            w->n_bytes += v->nbytes;
            if (ln >= 6 && !strcmp(v->name + ln - 6, ".scale")) continue;
            w->n_params += params;
            if (!strncmp(v->name, "mtp.", 4)) w->n_param_draft += params;
        }
        w->n_tensors = nt;
        w->expert_dtype = L > 0 && w->layers[0].ffn.n_experts > 0 ? w->layers[0].ffn.experts[0].w1.w.dtype
                                                                   : DSV4_DT_INVALID;
    }
    free(b->used);
    if (b->rc) {
        dsv4_weights_free(w);
        return b->rc;
    }
    *out = w;
    return DSV4_OK;
}

/* ---- value scan (dsv4 check --scan) ---- */

/* First illegal element of v's bytes [off, off + n) (off and n multiples of
 * the element size), as a flat element index of v, or -1. */
static int64_t first_bad_range(const dsv4_tview *v, size_t off, size_t n) {
    const uint8_t *p = (const uint8_t *)v->data + off;
    int64_t base = (int64_t)off;
    switch (v->dtype) {
    case DSV4_DT_F8_E8M0:
        for (size_t i = 0; i < n; i++)
            if (p[i] == 0xff) return base + (int64_t)i;
        return -1;
    case DSV4_DT_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            if ((p[i] & 0x7f) == 0x7f) return base + (int64_t)i;
        return -1;
    case DSV4_DT_BF16:
        for (size_t i = 0; i + 1 < n; i += 2) {
            uint16_t h;
            memcpy(&h, p + i, 2);
            if ((h & 0x7f80) == 0x7f80) return (base + (int64_t)i) / 2; /* Inf or NaN */
        }
        return -1;
    case DSV4_DT_F32:
        for (size_t i = 0; i + 3 < n; i += 4) {
            uint32_t u;
            memcpy(&u, p + i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u) return (base + (int64_t)i) / 4;
        }
        return -1;
    default:
        return -1; /* integers and packed FP4: every code is a value */
    }
}

static int64_t first_bad(const dsv4_tview *v) { return first_bad_range(v, 0, v->nbytes); }

/*
 * The sampled check: tensors up to full_max bytes (norms, biases, gates,
 * small scales) entirely; larger ones in n_win windows of win bytes spread
 * evenly from the first byte to the last. Why sample: a conversion that
 * produced NaN usually did so for a whole tensor or a large block of it,
 * which any window sees, while reading every byte of the real checkpoint
 * takes minutes (--scan does that).
 */
static int64_t first_bad_sampled(const dsv4_tview *v, size_t full_max, int n_win, size_t win) {
    size_t es = v->dtype == DSV4_DT_BF16 ? 2 : v->dtype == DSV4_DT_F32 ? 4 : 1;
    if (v->nbytes <= full_max || n_win < 1) return first_bad(v);
    win -= win % es;
    if (win < es) win = es;
    size_t last = (v->nbytes - win) / es * es; /* start of the last window */
    for (int k = 0; k < n_win; k++) {
        size_t off = k == n_win - 1 ? last : last / (size_t)(n_win - 1) * (size_t)k;
        off -= off % es;
        int64_t bad = first_bad_range(v, off, win);
        if (bad >= 0) return bad;
    }
    return -1;
}

int dsv4_weights_scan_sampled(const dsv4_ckpt *ckpt, size_t full_max, int n_windows, size_t window_bytes,
                              size_t *n_checked, dsv4_err *err) {
    size_t n = dsv4_ckpt_count(ckpt);
    for (size_t i = 0; i < n; i++) {
        const dsv4_tview *v = dsv4_ckpt_at(ckpt, i);
        int64_t bad = first_bad_sampled(v, full_max, n_windows, window_bytes);
        if (bad >= 0)
            return dsv4_err_set(err, DSV4_EFORMAT,
                                "tensor '%s' in %s: element %lld is not a legal %s value (NaN/Inf)%s",
                                v->name, dsv4_ckpt_file_of(ckpt, v), (long long)bad, dsv4_dtype_name(v->dtype),
                                v->nbytes > full_max ? " (found by sampling; `dsv4 check --scan` reads every value)"
                                                     : "");
    }
    if (n_checked) *n_checked = n;
    return DSV4_OK;
}

int dsv4_weights_scan(const dsv4_ckpt *ckpt, size_t *n_checked, dsv4_err *err) {
    size_t n = dsv4_ckpt_count(ckpt);
    for (size_t i = 0; i < n; i++) {
        const dsv4_tview *v = dsv4_ckpt_at(ckpt, i);
        int64_t bad = first_bad(v);
        if (bad >= 0)
            return dsv4_err_set(err, DSV4_EFORMAT,
                                "tensor '%s' in %s: element %lld is not a legal %s value (NaN/Inf)",
                                v->name, dsv4_ckpt_file_of(ckpt, v), (long long)bad,
                                dsv4_dtype_name(v->dtype));
    }
    if (n_checked) *n_checked = n;
    return DSV4_OK;
}
