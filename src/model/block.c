/*
 * One decoder block (spec/MODEL.md §3.0, §3.2-3.5, consolidated in §3.7-3.8)
 * as a sequence of backend ops. The same function runs target layers, the
 * MTP block and DSpark stages: what differs is the weights, the ratio and the
 * state handed in.
 *
 * Numerics switch: in reference numerics the forward calls the QAT ops (FP8
 * round-trip of the KV nope dims, Hadamard + FP4 on indexer queries); the
 * ops themselves apply W8A8 and the compressor-row QAT (backend.h).
 */
#include "model/scratch.h"
#include "model/forward.h"
#include "parallel/comm.h"

#include <math.h>
#include <string.h>

/* y[i] = x·w[i]ᵀ for linears that read the same x: one backend call where the
 * backend has linear_multi (one activation quantisation, fewer launches at
 * decode), else one linear each; the outputs are the same either way. */
static int linears(dsv4_backend *be, const dsv4_buf *x, int n, const dsv4_linear *const *w, dsv4_buf *const *y,
                   dsv4_err *err) {
    if (be->linear_multi) return be->linear_multi(be, x, n, w, y, err);
    for (int i = 0; i < n; i++) {
        int rc = be->linear(be, x, w[i], y[i], err);
        if (rc) return rc;
    }
    return 0;
}

/* rmsnorm then rope on each head of x, in one op where the backend has it (same results). */
static int norm_rope(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int hd, float eps, const dsv4_rope *rope,
                     const dsv4_batch *b, dsv4_err *err) {
    if (be->rmsnorm_rope) return be->rmsnorm_rope(be, x, weight, hd, eps, rope, b, err);
    int rc = be->rmsnorm(be, x, weight, hd, eps, x, err);
    return rc ? rc : be->rope(be, x, hd, rope, b, 0, err);
}

/* Attention sub-layer: x [T][d] (normed) → a [T][d]. §3.4. */
static int attention_block(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_layer_state *ls,
                           dsv4_backend *be, const dsv4_batch *b, const dsv4_buf *x, dsv4_buf *a,
                           scratch *s, dsv4_err *err) {
    const dsv4_attn_w *w = &blk->w.attn;
    int T = b->n_rows, H = cfg->num_attention_heads, hd = cfg->head_dim, rd = cfg->qk_rope_head_dim;
    float eps = (float)cfg->rms_norm_eps;
    int ref = be->numerics == DSV4_NUMERICS_REFERENCE, ratio = blk->w.ratio, rc = 0;
    dsv4_dtype ad = be->act_dtype;

    /* every projection of x first, in one linears call: wq_a, wkv, the compressor's and the
     * indexer's wkv / wgate and the indexer's head weights (independent of each other) */
    dsv4_buf *qlat = sc_alloc(s, ad, T, cfg->q_lora_rank, &rc, err);
    dsv4_buf *q = sc_alloc(s, ad, T, (int64_t)H * hd, &rc, err);
    dsv4_buf *kv = sc_alloc(s, ad, T, hd, &rc, err);
    if (rc) return rc;
    const dsv4_linear *lw[DSV4_LINEAR_MULTI_MAX] = {&w->wq_a, &w->wkv};
    dsv4_buf *ly[DSV4_LINEAR_MULTI_MAX] = {qlat, kv};
    int nl = 2;
    dsv4_buf *cK = NULL, *cZ = NULL, *iK = NULL, *iZ = NULL, *g = NULL;
    if (ratio > 0) {
        const dsv4_compressor_w *c = &w->compressor;
        cK = sc_alloc(s, DSV4_DT_F32, T, c->wkv.out, &rc, err);
        cZ = sc_alloc(s, DSV4_DT_F32, T, c->wgate.out, &rc, err);
        lw[nl] = &c->wkv, ly[nl++] = cK;
        lw[nl] = &c->wgate, ly[nl++] = cZ;
    }
    if (ratio == 4) {
        const dsv4_compressor_w *c = &w->indexer.compressor;
        iK = sc_alloc(s, DSV4_DT_F32, T, c->wkv.out, &rc, err);
        iZ = sc_alloc(s, DSV4_DT_F32, T, c->wgate.out, &rc, err);
        g = sc_alloc(s, DSV4_DT_F32, T, cfg->index_n_heads, &rc, err);
        lw[nl] = &c->wkv, ly[nl++] = iK;
        lw[nl] = &c->wgate, ly[nl++] = iZ;
        lw[nl] = &w->indexer.weights_proj, ly[nl++] = g;
    }
    if (rc) return rc;
    if ((rc = linears(be, x, nl, lw, ly, err))) return rc;

    /* §3.4.1 query path */
    if ((rc = be->rmsnorm(be, qlat, &w->q_norm, cfg->q_lora_rank, eps, qlat, err))) return rc;
    /* the normed latent feeds wq_b and (ratio 4) the indexer's wq_b: one linears call */
    dsv4_buf *qi = NULL;
    if (ratio == 4) qi = sc_alloc(s, ad, T, (int64_t)cfg->index_n_heads * cfg->index_head_dim, &rc, err);
    if (rc) return rc;
    {
        const dsv4_linear *qw[2] = {&w->wq_b, &w->indexer.wq_b};
        dsv4_buf *qy[2] = {q, qi};
        if ((rc = linears(be, qlat, ratio == 4 ? 2 : 1, qw, qy, err))) return rc;
    }
    if ((rc = norm_rope(be, q, NULL, hd, eps, &blk->rope, b, err))) return rc; /* per-head, unweighted */

    /* §3.4.2 KV path: one shared head, K = V */
    if (ref && be->rmsnorm_rope_qat_fp8) { /* the three in one kernel where the backend has it */
        if ((rc = be->rmsnorm_rope_qat_fp8(be, kv, &w->kv_norm, hd, eps, &blk->rope, b, hd - rd, 64, err))) return rc;
    } else {
        if ((rc = norm_rope(be, kv, &w->kv_norm, hd, eps, &blk->rope, b, err))) return rc;
        if (ref && (rc = be->qat_fp8(be, kv, hd, hd - rd, 64, err))) return rc;
    }

    /* §3.4.5 compressor: emits the rows completed by this batch, before attention */
    if (ratio > 0) {
        const dsv4_compressor_w *c = &w->compressor;
        if ((rc = be->compress(be, &ls->cmp, cK, cZ, &c->ape, &c->norm, eps, &blk->rope, DSV4_QAT_FP8_NOPE, b,
                               err)))
            return rc;
    }

    /* §3.4.6 lightning indexer (ratio 4): index keys, queries, head weights, top-k */
    dsv4_buf *sel = NULL;
    if (ratio == 4) {
        const dsv4_compressor_w *c = &w->indexer.compressor;
        int Hi = cfg->index_n_heads, dk = cfg->index_head_dim;
        sel = sc_alloc(s, DSV4_DT_I32, T, cfg->index_topk, &rc, err);
        if (rc) return rc;
        if ((rc = be->compress(be, &ls->idx, iK, iZ, &c->ape, &c->norm, eps, &blk->rope, DSV4_QAT_HADAMARD_FP4,
                               b, err)))
            return rc;
        if (ref && be->rope_qat_hadamard_fp4) { /* one kernel where the backend has it */
            if ((rc = be->rope_qat_hadamard_fp4(be, qi, dk, &blk->rope, b, err))) return rc;
        } else {
            if ((rc = be->rope(be, qi, dk, &blk->rope, b, 0, err))) return rc;
            if (ref && (rc = be->qat_hadamard_fp4(be, qi, dk, err))) return rc;
        }
        float g_scale = (float)(1.0 / sqrt((double)dk * Hi));
        if ((rc = be->indexer_select(be, qi, g, g_scale, &ls->idx, cfg->index_topk, b, sel, err))) return rc;
    }

    /* §3.4.7 sink attention over window + compressed rows, then store the window rows */
    dsv4_buf *o = sc_alloc(s, ad, T, (int64_t)H * hd, &rc, err);
    if (rc) return rc;
    /* §3.4.8 inverse RoPE of o: inside attention's last launch where the backend has attention_rope */
    if (be->attention_rope) {
        if ((rc = be->attention_rope(be, q, kv, &ls->win, ratio > 0 ? &ls->cmp : NULL, sel, &w->sink, H, b,
                                     &blk->rope, o, err)))
            return rc;
    } else {
        if ((rc = be->attention(be, q, kv, &ls->win, ratio > 0 ? &ls->cmp : NULL, sel, &w->sink, H, b, o, err)))
            return rc;
        if ((rc = be->rope(be, o, hd, &blk->rope, b, 1, err))) return rc;
    }
    if ((rc = be->win_store(be, &ls->win, kv, b, err))) return rc;

    /* grouped low-rank output */
    dsv4_buf *z = sc_alloc(s, ad, T, (int64_t)cfg->o_groups * cfg->o_lora_rank, &rc, err);
    if (rc) return rc;
    if ((rc = be->linear_grouped(be, o, &w->wo_a, cfg->o_groups, z, err))) return rc;
    return be->linear(be, z, &w->wo_b, a, err);
}

/* MoE sub-layer: x [T][d] (normed) → f [T][d]. §3.5. */
static int moe_block(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_backend *be,
                     const dsv4_batch *b, const dsv4_buf *x, dsv4_buf *f, scratch *s, dsv4_err *err) {
    const dsv4_ffn_w *w = &blk->w.ffn;
    int T = b->n_rows, k = cfg->num_experts_per_tok, rc = 0;
    float limit = (float)cfg->swiglu_limit;
    dsv4_dtype ad = be->act_dtype;
    dsv4_buf *ids = sc_alloc(s, DSV4_DT_I32, T, k, &rc, err);
    dsv4_buf *wts = sc_alloc(s, DSV4_DT_F32, T, k, &rc, err);
    if (rc) return rc;
    const dsv4_tview *hash = blk->w.hash ? &w->tid2eid : NULL;
    const dsv4_tview *bias = blk->w.hash ? NULL : &w->gate_bias;
    if ((rc = be->moe_route(be, x, &w->gate, bias, hash, k, (float)cfg->routed_scaling_factor, b, ids, wts, err)))
        return rc;
    if ((rc = be->moe_experts(be, x, blk->w1, blk->w3, blk->w2, w->n_experts, ids, wts, limit, f, err))) return rc;
    /* shared expert, same clamp (§3.5, §6.5) */
    int64_t F = w->shared.w1.out;
    dsv4_buf *g = sc_alloc(s, ad, T, F, &rc, err);
    dsv4_buf *u = sc_alloc(s, ad, T, F, &rc, err);
    dsv4_buf *sh = sc_alloc(s, ad, T, cfg->hidden_size, &rc, err);
    if (rc) return rc;
    const dsv4_linear *lw[2] = {&w->shared.w1, &w->shared.w3};
    dsv4_buf *ly[2] = {g, u};
    if ((rc = linears(be, x, 2, lw, ly, err))) return rc;
    if (be->linear_swiglu_add) return be->linear_swiglu_add(be, g, u, limit, &w->shared.w2, f, err); /* one op */
    if ((rc = be->swiglu(be, g, u, limit, g, err))) return rc;
    if ((rc = be->linear(be, g, &w->shared.w2, sh, err))) return rc;
    return be->add(be, f, sh, f, err);
}

/* hc_pre, then the sub-layer's RMSNorm on y: one op where the backend has hc_pre_norm. */
static int hc_pre_normed(dsv4_backend *be, const dsv4_buf *X, const dsv4_hc_w *hc, int n_hc, int iters, float hc_eps,
                         const dsv4_tview *norm, int d, float eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                         dsv4_err *err) {
    if (be->hc_pre_norm)
        return be->hc_pre_norm(be, X, &hc->fn, &hc->base, &hc->scale, n_hc, iters, hc_eps, norm, eps, y, post, comb,
                               err);
    int rc = be->hc_pre(be, X, &hc->fn, &hc->base, &hc->scale, n_hc, iters, hc_eps, y, post, comb, err);
    return rc ? rc : be->rmsnorm(be, y, norm, d, eps, y, err);
}

/* Xout = hc_post(X, f, post_in, comb_in), then hc_pre_normed on Xout: one op where the backend has
 * hc_post_pre_norm (same outputs). post / comb must be other buffers than post_in / comb_in. */
static int hc_post_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                       const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_hc_w *hc, int iters,
                       float hc_eps, const dsv4_tview *norm, int d, float eps, dsv4_buf *y, dsv4_buf *post,
                       dsv4_buf *comb, dsv4_err *err) {
    if (be->hc_post_pre_norm)
        return be->hc_post_pre_norm(be, X, f, post_in, comb_in, n_hc, Xout, &hc->fn, &hc->base, &hc->scale, iters,
                                    hc_eps, norm, eps, y, post, comb, err);
    int rc = be->hc_post(be, X, f, post_in, comb_in, n_hc, Xout, err);
    return rc ? rc : hc_pre_normed(be, Xout, hc, n_hc, iters, hc_eps, norm, d, eps, y, post, comb, err);
}

int dsv4_hc_carry_init(dsv4_backend *be, const dsv4_config *cfg, int T, dsv4_hc_carry *c, dsv4_err *err) {
    memset(c, 0, sizeof *c);
    int64_t n_hc = cfg->hc_mult, d = cfg->hidden_size;
    int rc = be->buf_alloc(be, be->act_dtype, T, n_hc * d, &c->X2, err);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, T, d, &c->sub, err);
    for (int i = 0; i < 2 && !rc; i++) {
        rc = be->buf_alloc(be, DSV4_DT_F32, T, n_hc, &c->post[i], err);
        if (!rc) rc = be->buf_alloc(be, DSV4_DT_F32, T, n_hc * n_hc, &c->comb[i], err);
    }
    if (rc) dsv4_hc_carry_free(be, c);
    return rc;
}

int dsv4_hc_carry_flush(dsv4_backend *be, int n_hc, dsv4_hc_carry *c, dsv4_buf *X, dsv4_err *err) {
    if (!c->pending) return DSV4_OK;
    c->pending = 0;
    return be->hc_post(be, &c->X2, &c->sub, &c->post[c->cur], &c->comb[c->cur], n_hc, X, err);
}

void dsv4_hc_carry_free(dsv4_backend *be, dsv4_hc_carry *c) {
    for (int i = 1; i >= 0; i--) { /* newest first (a stream-ordered arena pops at once) */
        be->buf_free(be, &c->comb[i]);
        be->buf_free(be, &c->post[i]);
    }
    be->buf_free(be, &c->sub);
    be->buf_free(be, &c->X2);
    c->pending = 0;
}

/*
 * The block as the math reads (§3.2): X → hc_pre → attention → hc_post → X2 → hc_pre → MoE → hc_post → X.
 * Each hc_post but the block's last runs fused with the hc_pre after it (hc_post_pre); with a carry the
 * last one may be left pending for the next block's first hc_pre (defer), so a step runs one hc_post
 * launch instead of two a layer. Two post / comb pairs alternate: the fused op reads one and writes the
 * other.
 */
int dsv4_block_forward_carry(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_layer_state *ls,
                             dsv4_backend *be, const dsv4_batch *b, dsv4_buf *X, dsv4_hc_carry *carry, int defer,
                             dsv4_err *err) {
    int T = b->n_rows, n_hc = cfg->hc_mult, d = cfg->hidden_size, rc = 0;
    float eps = (float)cfg->rms_norm_eps, hc_eps = (float)cfg->hc_eps;
    int iters = cfg->hc_sinkhorn_iters;
    dsv4_dtype ad = be->act_dtype;
    if (ls->ratio != blk->w.ratio)
        return dsv4_err_set(err, DSV4_EINTERNAL, "block %d: state ratio %d != layer ratio %d", blk->w.layer_id,
                            ls->ratio, blk->w.ratio);
    if (carry && carry->X2.rows != T)
        return dsv4_err_set(err, DSV4_EINTERNAL, "block %d: hc carry of %lld rows for a batch of %d",
                            blk->w.layer_id, (long long)carry->X2.rows, T);
    scratch s = {.be = be};
    dsv4_buf *y = sc_alloc(&s, ad, T, d, &rc, err);
    dsv4_buf *sub, *X2, *pp[2], *cc[2];
    int cur = 0; /* pp[cur], cc[cur]: the post / comb of the pending hc_post (carry) */
    if (carry) {
        sub = &carry->sub, X2 = &carry->X2, cur = carry->cur;
        for (int i = 0; i < 2; i++) pp[i] = &carry->post[i], cc[i] = &carry->comb[i];
    } else {
        sub = sc_alloc(&s, ad, T, d, &rc, err);
        X2 = sc_alloc(&s, ad, T, (int64_t)n_hc * d, &rc, err);
        for (int i = 0; i < 2; i++) {
            pp[i] = sc_alloc(&s, DSV4_DT_F32, T, n_hc, &rc, err);
            cc[i] = sc_alloc(&s, DSV4_DT_F32, T, (int64_t)n_hc * n_hc, &rc, err);
        }
    }
    /* attention half: X → X2 (the previous block's pending hc_post first, fused) */
    const int nxt = cur ^ 1;
    if (!rc && carry && carry->pending) {
        carry->pending = 0;
        rc = hc_post_pre(be, X2, sub, pp[cur], cc[cur], n_hc, X, &blk->w.hc_attn, iters, hc_eps, &blk->w.attn_norm,
                         d, eps, y, pp[nxt], cc[nxt], err);
    } else if (!rc) {
        rc = hc_pre_normed(be, X, &blk->w.hc_attn, n_hc, iters, hc_eps, &blk->w.attn_norm, d, eps, y, pp[nxt],
                           cc[nxt], err);
    }
    if (!rc) rc = attention_block(cfg, blk, ls, be, b, y, sub, &s, err);
    if (!rc && blk->comm) rc = blk->comm->all_reduce_sum(blk->comm, be, sub, err); /* TP: sum the heads' wo_b partials */
    /* MoE half: X2 → X */
    if (!rc)
        rc = hc_post_pre(be, X, sub, pp[nxt], cc[nxt], n_hc, X2, &blk->w.hc_ffn, iters, hc_eps, &blk->w.ffn_norm, d,
                         eps, y, pp[cur], cc[cur], err);
    if (!rc) rc = moe_block(cfg, blk, be, b, y, sub, &s, err);
    if (!rc && blk->comm) rc = blk->comm->all_reduce_sum(blk->comm, be, sub, err); /* TP: sum the experts' w2 partials */
    if (!rc && carry && defer) {
        carry->pending = 1, carry->cur = cur; /* X = hc_post(X2, sub, pp[cur], cc[cur]) runs in the next block */
    } else if (!rc) {
        rc = be->hc_post(be, X2, sub, pp[cur], cc[cur], n_hc, X, err);
    }
    sc_free(&s);
    if (rc) dsv4_err_prefix(err, "layer %d: ", blk->w.layer_id);
    return rc;
}

int dsv4_block_forward(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_layer_state *ls,
                       dsv4_backend *be, const dsv4_batch *b, dsv4_buf *X, dsv4_err *err) {
    return dsv4_block_forward_carry(cfg, blk, ls, be, b, X, NULL, 0, err);
}
