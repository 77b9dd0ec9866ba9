/*
 * The DSpark drafter (spec/DSPARK.md §2) as a sequence of backend ops.
 *
 * Why the block attention is composed from the generic window attention op:
 * a draft block's γ queries all see the same keys — the last min(W, P)
 * context rows and all γ block rows, non-causally (§2.4) — while the op
 * gives a query at position p the raw rows max(0, p-window+1)..p. Storing the
 * block rows in the stage ring at P..P+γ-1 and letting every query claim
 * position P+γ-1 against a ring whose window is W+γ yields exactly positions
 * P-W..P+γ-1 for each of them. The queries keep their true RoPE positions
 * (RoPE is applied before the op, and the op only uses positions to pick
 * keys). One op call per block slot; a fused `draft_attention` op is the
 * obvious GPU optimisation and would need no other change here.
 *
 * The Markov head (§2.5) runs its γ sequential steps with the argmax on the
 * host; the confidence head (§2.6) is split into its hidden and Markov parts
 * so no concatenation op is needed: w·[h; e] = w_h·h + w_e·e.
 */
#include "model/scratch.h"
#include "model/dspark.h"
#include "engine/sampler.h" /* dsv4_sample_from: the one inverse-CDF draw */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Small helpers: uploads, scratch buffers, internal batches                 */
/* ------------------------------------------------------------------------ */

/* Rows [first, first+n) of a buffer as a buffer (backend pointer arithmetic in bytes, as state.c). */
static dsv4_buf row_view(const dsv4_buf *b, int64_t first, int64_t n) {
    dsv4_buf v = *b;
    v.data = (char *)b->data + (size_t)first * (size_t)b->cols * dsv4_dtype_size(b->dtype);
    v.rows = n;
    return v;
}

/* A batch of n segments of `len` rows: segment r in slot[r] at positions pos0[r]..pos0[r]+len-1. */
typedef struct rowbatch {
    dsv4_batch b;
    int32_t *mem;
    int32_t *token; /* writable view of b.token */
} rowbatch;

static int rb_make(rowbatch *rb, int n, int len, const int32_t *slot, const int32_t *pos0, int pos_shift,
                   dsv4_err *err) {
    int T = n * len;
    memset(rb, 0, sizeof *rb);
    rb->mem = malloc(sizeof(int32_t) * ((size_t)T * 4 + (size_t)n * 3 + 1));
    if (!rb->mem) return dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
    int32_t *tok = rb->mem, *pos = tok + T, *sl = pos + T, *sq = sl + T, *cu = sq + T, *ss = cu + n + 1,
            *sp = ss + n;
    cu[0] = 0;
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < len; i++) {
            int t = r * len + i;
            tok[t] = 0;
            pos[t] = pos0[r] + pos_shift + i;
            sl[t] = slot[r];
            sq[t] = r;
        }
        cu[r + 1] = (r + 1) * len;
        ss[r] = slot[r];
        sp[r] = pos0[r] + pos_shift;
    }
    rb->token = tok;
    rb->b = (dsv4_batch){.n_rows = T, .n_seqs = n, .token = tok, .pos = pos, .slot = sl, .seq_idx = sq,
                         .cu_seqlens = cu, .seq_slot = ss, .seq_pos0 = sp};
    return DSV4_OK;
}

static void rb_free(rowbatch *rb) { free(rb->mem); }

/* ------------------------------------------------------------------------ */
/* Lifetime                                                                  */
/* ------------------------------------------------------------------------ */

int dsv4_dspark_create(const dsv4_config *cfg, const dsv4_weights *w, const dsv4_model *target,
                       int n_slots, dsv4_dspark **out, dsv4_err *err) {
    *out = NULL;
    if (cfg->draft_kind != DSV4_DRAFT_DSPARK || w->n_stages < 1 || !cfg->has_dspark)
        return dsv4_err_set(err, DSV4_EINVAL, "dspark: checkpoint has no DSpark draft stages");
    if (n_slots <= 0) return dsv4_err_set(err, DSV4_EINVAL, "dspark: n_slots %d", n_slots);
    dsv4_backend *be = target->be;
    dsv4_dspark *d = calloc(1, sizeof *d);
    if (!d) return dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
    d->cfg = cfg;
    d->be = be;
    d->target = target;
    d->n_stages = w->n_stages;
    d->gamma = cfg->dspark_block_size;
    d->n_slots = n_slots;
    d->window = cfg->sliding_window;
    d->stages = calloc((size_t)d->n_stages, sizeof *d->stages);
    d->ring = calloc((size_t)d->n_stages, sizeof *d->ring);
    int rc = d->stages && d->ring ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
    for (int s = 0; s < d->n_stages && !rc; s++) {
        const dsv4_block_w *bw = &w->stages[s].block;
        /* DSPARK.md §2.1: stages are absolute layers n+s, never hash-routed, ratio 0. */
        if (bw->hash || bw->ratio != 0 || bw->layer_id != cfg->num_hidden_layers + s)
            rc = dsv4_err_set(err, DSV4_EINVAL, "dspark: stage %d bound as layer %d (hash %d, ratio %d)", s,
                              bw->layer_id, (int)bw->hash, bw->ratio);
        if (!rc) rc = dsv4_block_dev_init(cfg, bw, be, &d->stages[s], err);
        dsv4_win_state *r = &d->ring[s];
        r->window = r->cap = d->window + d->gamma;
        r->n_slots = n_slots;
        if (!rc)
            rc = be->buf_alloc(be, DSV4_DT_F32, (int64_t)n_slots * r->cap, cfg->head_dim, &r->rows, err);
    }
    const dsv4_dspark_stage_w *first = &w->stages[0], *last = &w->stages[d->n_stages - 1];
    d->main_proj = first->main_proj;
    d->main_norm = first->main_norm;
    d->norm = last->norm;
    d->hc_head = last->hc_head;
    d->markov_w1 = last->markov_w1.w;
    d->markov_w2 = last->markov_w2;
    dsv4_linear conf = last->confidence_proj;
    int64_t dm = cfg->hidden_size, rank = last->markov_w1.in;
    if (!rc && (conf.out != 1 || conf.in != dm + rank || conf.scale.dtype != DSV4_DT_INVALID))
        rc = dsv4_err_set(err, DSV4_EINVAL, "dspark: confidence_head.proj is [%lld, %lld], expected unquantised [1, %lld]",
                          (long long)conf.out, (long long)conf.in, (long long)(dm + rank));
    if (!rc) rc = dsv4_upload_linear(be, &d->main_proj, err);
    if (!rc) rc = dsv4_upload_view(be, &d->main_norm, err);
    if (!rc) rc = dsv4_upload_view(be, &d->norm, err);
    if (!rc) rc = dsv4_upload_view(be, &d->hc_head.fn, err);
    if (!rc) rc = dsv4_upload_view(be, &d->hc_head.base, err);
    if (!rc) rc = dsv4_upload_view(be, &d->hc_head.scale, err);
    if (!rc) rc = dsv4_upload_view(be, &d->markov_w1, err);
    if (!rc) rc = dsv4_upload_linear(be, &d->markov_w2, err);
    /* One row, so the [1, d] and [1, rank] column ranges are contiguous sub-views. */
    size_t es = dsv4_dtype_size(conf.w.dtype);
    d->conf_h = conf;
    d->conf_h.in = dm;
    d->conf_h.w.shape[1] = dm;
    d->conf_h.w.nbytes = (size_t)dm * es;
    d->conf_e = conf;
    d->conf_e.in = rank;
    d->conf_e.w.shape[1] = rank;
    d->conf_e.w.nbytes = (size_t)rank * es;
    if (!rc && !be->upload_linear) { /* linears are plain memory: slice the resident copy */
        rc = dsv4_upload_linear(be, &conf, err);
        d->conf_h.w.data = conf.w.data;
        d->conf_e.w.data = (const char *)conf.w.data + (size_t)dm * es;
    } else if (!rc) {
        /* A backend with upload_linear keeps linears in its own form (an opaque
         * handle on CUDA), so the halves are made resident separately, from a
         * host copy of the row: the row itself goes up as a view and comes back,
         * which also works when its data is a dummy-weight tag, not memory. */
        dsv4_tview whole = conf.w;
        char *row = malloc(conf.w.nbytes ? conf.w.nbytes : 1);
        if (!row) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        if (!rc) rc = dsv4_upload_view(be, &whole, err);
        if (!rc) {
            dsv4_buf b = {(void *)whole.data, whole.dtype, 1, (int64_t)(conf.w.nbytes / es)};
            rc = be->buf_read(be, &b, row, err);
        }
        d->conf_h.w.data = row;
        d->conf_e.w.data = row ? row + (size_t)dm * es : NULL;
        if (!rc) rc = dsv4_upload_linear(be, &d->conf_h, err);
        if (!rc) rc = dsv4_upload_linear(be, &d->conf_e, err);
        free(row);
    }
    if (rc) {
        dsv4_dspark_free(d);
        return dsv4_err_prefix(err, "dspark: ");
    }
    *out = d;
    return DSV4_OK;
}

void dsv4_dspark_free(dsv4_dspark *d) {
    if (!d) return;
    for (int s = 0; s < d->n_stages; s++) {
        if (d->stages) dsv4_block_dev_free(&d->stages[s]);
        if (d->ring) d->be->buf_free(d->be, &d->ring[s].rows);
    }
    free(d->stages);
    free(d->ring);
    free(d);
}

int dsv4_dspark_reset_slot(dsv4_dspark *d, int slot, dsv4_err *err) {
    if (slot < 0 || slot >= d->n_slots)
        return dsv4_err_set(err, DSV4_EINVAL, "dspark: slot %d out of [0,%d)", slot, d->n_slots);
    int rc = DSV4_OK;
    for (int s = 0; s < d->n_stages && !rc; s++) {
        dsv4_buf v = row_view(&d->ring[s].rows, (int64_t)slot * d->ring[s].cap, d->ring[s].cap);
        void *zeros = calloc((size_t)v.rows * (size_t)v.cols, dsv4_dtype_size(v.dtype));
        if (!zeros) return dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
        rc = d->be->buf_write(d->be, &v, zeros, err);
        free(zeros);
    }
    return rc;
}

int dsv4_dspark_copy_slot(dsv4_dspark *d, int src, int dst, dsv4_err *err) {
    if (src < 0 || src >= d->n_slots || dst < 0 || dst >= d->n_slots || src == dst)
        return dsv4_err_set(err, DSV4_EINVAL, "dspark: copy slot %d -> %d (slots [0,%d))", src, dst, d->n_slots);
    int rc = DSV4_OK;
    for (int s = 0; s < d->n_stages && !rc; s++) {
        int64_t cap = d->ring[s].cap;
        dsv4_buf from = row_view(&d->ring[s].rows, (int64_t)src * cap, cap);
        dsv4_buf to = row_view(&d->ring[s].rows, (int64_t)dst * cap, cap);
        void *tmp = malloc((size_t)from.rows * (size_t)from.cols * dsv4_dtype_size(from.dtype));
        if (!tmp) return dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
        rc = d->be->buf_read(d->be, &from, tmp, err);
        if (!rc) rc = d->be->buf_write(d->be, &to, tmp, err);
        free(tmp);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Context path (§2.3)                                                       */
/* ------------------------------------------------------------------------ */

/* K=V rows of stage s for x [T][d] at the batch's positions: kv_norm(wkv x), RoPE, FP8 nope round-trip. */
static int stage_kv(dsv4_dspark *d, int s, const dsv4_buf *x, const dsv4_batch *b, dsv4_buf *kv, dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    const dsv4_block_dev *blk = &d->stages[s];
    int hd = cfg->head_dim, rd = cfg->qk_rope_head_dim;
    int rc = be->linear(be, x, &blk->w.attn.wkv, kv, err);
    if (!rc) rc = be->rmsnorm(be, kv, &blk->w.attn.kv_norm, hd, (float)cfg->rms_norm_eps, kv, err);
    if (!rc) rc = be->rope(be, kv, hd, &blk->rope, b, 0, err);
    if (!rc && be->numerics == DSV4_NUMERICS_REFERENCE) rc = be->qat_fp8(be, kv, hd, hd - rd, 64, err);
    return rc;
}

static int check_slots(const dsv4_dspark *d, const dsv4_batch *b, dsv4_err *err) {
    for (int t = 0; t < b->n_rows; t++)
        if (b->slot[t] < 0 || b->slot[t] >= d->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "dspark: row %d: slot %d out of [0,%d)", t, b->slot[t], d->n_slots);
    return DSV4_OK;
}

/* The context path from features in F (a backend buffer), or from host `feats` uploaded first. */
static int context_run(dsv4_dspark *d, const dsv4_batch *b, const dsv4_buf *Fin, const float *feats, dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    int T = b->n_rows, dm = cfg->hidden_size, rc = check_slots(d, b, err);
    if (rc || T == 0) return rc;
    if (Fin && (Fin->dtype != DSV4_DT_F32 || Fin->rows != T || Fin->cols != d->main_proj.in))
        return dsv4_err_set(err, DSV4_EINVAL, "dspark context: features %lldx%lld, want F32 %dx%lld",
                            (long long)Fin->rows, (long long)Fin->cols, T, (long long)d->main_proj.in);
    if ((rc = be->batch_begin(be, b, err))) return rc;
    scratch s = {.be = be};
    const dsv4_buf *F = Fin;
    if (!F) {
        dsv4_buf *up = sc_alloc(&s, DSV4_DT_F32, T, d->main_proj.in, &rc, err);
        if (!rc) rc = be->buf_write(be, up, feats, err);
        F = up;
    }
    dsv4_buf *mx = sc_alloc(&s, be->act_dtype, T, dm, &rc, err);
    dsv4_buf *ck = sc_alloc(&s, be->act_dtype, T, cfg->head_dim, &rc, err);
    if (!rc) rc = be->linear(be, F, &d->main_proj, mx, err);
    if (!rc) rc = be->rmsnorm(be, mx, &d->main_norm, dm, (float)cfg->rms_norm_eps, mx, err);
    for (int st = 0; st < d->n_stages && !rc; st++) {
        rc = stage_kv(d, st, mx, b, ck, err);
        if (!rc) rc = be->win_store(be, &d->ring[st], ck, b, err);
    }
    sc_free(&s);
    if (rc) dsv4_err_prefix(err, "dspark context: ");
    return rc;
}

int dsv4_dspark_context(dsv4_dspark *d, const dsv4_batch *b, const float *feats, dsv4_err *err) {
    return context_run(d, b, NULL, feats, err);
}

int dsv4_dspark_context_buf(dsv4_dspark *d, const dsv4_batch *b, const dsv4_buf *F, dsv4_err *err) {
    return context_run(d, b, F, NULL, err);
}

/* ------------------------------------------------------------------------ */
/* Draft forward (§2.4-2.6)                                                  */
/* ------------------------------------------------------------------------ */

/* Index tables of one draft step with n requests, T = n*γ block rows (request-major). */
typedef struct draft_idx {
    int32_t *kv_last;  /* [n]   row r*γ+γ-1: the block row at position P+γ-1          */
    int32_t *q_slot;   /* [γ][n] row r*γ+i: the queries of block slot i                */
    int32_t *unpermute;/* [T]   request-major row r*γ+i ← slot-major row i*n+r          */
} draft_idx;

/* DSparkAttention of stage s (§2.4) on y [T][d] (attn_norm output) → a [T][d]. */
static int draft_attention(dsv4_dspark *d, int s, const rowbatch *blk, const rowbatch *q1, const draft_idx *ix,
                           const dsv4_buf *y, dsv4_buf *a, scratch *sc, dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    const dsv4_block_dev *bd = &d->stages[s];
    const dsv4_attn_w *w = &bd->w.attn;
    int T = blk->b.n_rows, n = q1->b.n_rows, g = d->gamma, H = cfg->num_attention_heads, hd = cfg->head_dim;
    float eps = (float)cfg->rms_norm_eps;
    dsv4_dtype ad = be->act_dtype;
    int rc = 0;
    dsv4_buf *qlat = sc_alloc(sc, ad, T, cfg->q_lora_rank, &rc, err);
    dsv4_buf *q = sc_alloc(sc, ad, T, (int64_t)H * hd, &rc, err);
    dsv4_buf *kv = sc_alloc(sc, ad, T, hd, &rc, err);
    dsv4_buf *kl = sc_alloc(sc, ad, n, hd, &rc, err);
    dsv4_buf *qi = sc_alloc(sc, ad, n, (int64_t)H * hd, &rc, err);
    dsv4_buf *oi = sc_alloc(sc, ad, T, (int64_t)H * hd, &rc, err);
    dsv4_buf *o = sc_alloc(sc, ad, T, (int64_t)H * hd, &rc, err);
    dsv4_buf *z = sc_alloc(sc, ad, T, (int64_t)cfg->o_groups * cfg->o_lora_rank, &rc, err);
    if (rc) return rc;
    /* queries at the true block positions P..P+γ-1: per-head unweighted RMS before RoPE */
    if ((rc = be->linear(be, y, &w->wq_a, qlat, err))) return rc;
    if ((rc = be->rmsnorm(be, qlat, &w->q_norm, cfg->q_lora_rank, eps, qlat, err))) return rc;
    if ((rc = be->linear(be, qlat, &w->wq_b, q, err))) return rc;
    if ((rc = be->rmsnorm(be, q, NULL, hd, eps, q, err))) return rc;
    if ((rc = be->rope(be, q, hd, &bd->rope, &blk->b, 0, err))) return rc;
    /* the block's own K=V rows (same round-trip as ring rows), stored at P..P+γ-1 */
    if ((rc = stage_kv(d, s, y, &blk->b, kv, err))) return rc;
    if ((rc = be->win_store(be, &d->ring[s], kv, &blk->b, err))) return rc;
    if ((rc = be->buf_gather_rows(be, kv, ix->kv_last, n, kl, err))) return rc;
    /* one window-attention call per block slot, each query claiming position P+γ-1 */
    if ((rc = be->batch_begin(be, &q1->b, err))) return rc;
    for (int i = 0; i < g && !rc; i++) {
        dsv4_buf oview = row_view(oi, (int64_t)i * n, n);
        rc = be->buf_gather_rows(be, q, ix->q_slot + (size_t)i * n, n, qi, err);
        if (!rc) rc = be->attention(be, qi, kl, &d->ring[s], NULL, NULL, &w->sink, H, &q1->b, &oview, err);
    }
    if (!rc) rc = be->batch_begin(be, &blk->b, err);
    if (!rc) rc = be->buf_gather_rows(be, oi, ix->unpermute, T, o, err);
    /* inverse RoPE at the true query positions, grouped low-rank output (MODEL.md §3.4.8) */
    if (!rc) rc = be->rope(be, o, hd, &bd->rope, &blk->b, 1, err);
    if (!rc) rc = be->linear_grouped(be, o, &w->wo_a, cfg->o_groups, z, err);
    if (!rc) rc = be->linear(be, z, &w->wo_b, a, err);
    return rc;
}

/* MoE of a draft stage (MODEL.md §3.5; same ops as block.c): top-k with gate.bias, shared expert clamped. */
static int draft_moe(dsv4_dspark *d, int s, const dsv4_batch *b, const dsv4_buf *x, dsv4_buf *f, scratch *sc,
                     dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    const dsv4_block_dev *bd = &d->stages[s];
    const dsv4_ffn_w *w = &bd->w.ffn;
    int T = b->n_rows, k = cfg->num_experts_per_tok, rc = 0;
    float limit = (float)cfg->swiglu_limit;
    int64_t F = w->shared.w1.out;
    dsv4_buf *ids = sc_alloc(sc, DSV4_DT_I32, T, k, &rc, err);
    dsv4_buf *wts = sc_alloc(sc, DSV4_DT_F32, T, k, &rc, err);
    dsv4_buf *g = sc_alloc(sc, be->act_dtype, T, F, &rc, err);
    dsv4_buf *u = sc_alloc(sc, be->act_dtype, T, F, &rc, err);
    dsv4_buf *sh = sc_alloc(sc, be->act_dtype, T, cfg->hidden_size, &rc, err);
    if (rc) return rc;
    if ((rc = be->moe_route(be, x, &w->gate, &w->gate_bias, NULL, k, (float)cfg->routed_scaling_factor, b, ids, wts,
                            err)))
        return rc;
    if ((rc = be->moe_experts(be, x, bd->w1, bd->w3, bd->w2, w->n_experts, ids, wts, limit, f, err))) return rc;
    if ((rc = be->linear(be, x, &w->shared.w1, g, err))) return rc;
    if ((rc = be->linear(be, x, &w->shared.w3, u, err))) return rc;
    if ((rc = be->swiglu(be, g, u, limit, g, err))) return rc;
    if ((rc = be->linear(be, g, &w->shared.w2, sh, err))) return rc;
    return be->add(be, f, sh, f, err);
}

/* One stage: the V4 block of MODEL.md §3.0 with DSparkAttention, in place on X [T][hc*d]. */
static int draft_stage(dsv4_dspark *d, int s, const rowbatch *blk, const rowbatch *q1, const draft_idx *ix,
                       dsv4_buf *X, dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    const dsv4_block_w *w = &d->stages[s].w;
    int T = blk->b.n_rows, n_hc = cfg->hc_mult, dm = cfg->hidden_size, rc = 0;
    float eps = (float)cfg->rms_norm_eps, hc_eps = (float)cfg->hc_eps;
    scratch sc = {.be = be};
    dsv4_buf *y = sc_alloc(&sc, be->act_dtype, T, dm, &rc, err);
    dsv4_buf *post = sc_alloc(&sc, DSV4_DT_F32, T, n_hc, &rc, err);
    dsv4_buf *comb = sc_alloc(&sc, DSV4_DT_F32, T, (int64_t)n_hc * n_hc, &rc, err);
    dsv4_buf *sub = sc_alloc(&sc, be->act_dtype, T, dm, &rc, err);
    dsv4_buf *X2 = sc_alloc(&sc, be->act_dtype, T, (int64_t)n_hc * dm, &rc, err);
    if (!rc) rc = be->hc_pre(be, X, &w->hc_attn.fn, &w->hc_attn.base, &w->hc_attn.scale, n_hc,
                             cfg->hc_sinkhorn_iters, hc_eps, y, post, comb, err);
    if (!rc) rc = be->rmsnorm(be, y, &w->attn_norm, dm, eps, y, err);
    if (!rc) rc = draft_attention(d, s, blk, q1, ix, y, sub, &sc, err);
    if (!rc) rc = be->hc_post(be, X, sub, post, comb, n_hc, X2, err);
    if (!rc) rc = be->hc_pre(be, X2, &w->hc_ffn.fn, &w->hc_ffn.base, &w->hc_ffn.scale, n_hc,
                             cfg->hc_sinkhorn_iters, hc_eps, y, post, comb, err);
    if (!rc) rc = be->rmsnorm(be, y, &w->ffn_norm, dm, eps, y, err);
    if (!rc) rc = draft_moe(d, s, &blk->b, y, sub, &sc, err);
    if (!rc) rc = be->hc_post(be, X2, sub, post, comb, n_hc, X, err);
    sc_free(&sc);
    if (rc) dsv4_err_prefix(err, "stage %d (layer %d): ", s, w->layer_id);
    return rc;
}

static int validate_requests(const dsv4_dspark *d, int n, const int32_t *slot, const int32_t *anchor,
                             const int32_t *pos, dsv4_err *err) {
    if (n <= 0) return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: %d requests", n);
    for (int r = 0; r < n; r++) {
        if (slot[r] < 0 || slot[r] >= d->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: request %d: slot %d out of [0,%d)", r, slot[r],
                                d->n_slots);
        if (pos[r] < 1)
            return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: request %d: anchor position %d has no context", r,
                                pos[r]);
        if (anchor[r] < 0 || anchor[r] >= d->cfg->vocab_size)
            return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: request %d: anchor token %d outside vocabulary", r,
                                anchor[r]);
        for (int q = 0; q < r; q++)
            if (slot[q] == slot[r])
                return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: requests %d and %d share slot %d", q, r, slot[r]);
    }
    return DSV4_OK;
}

int32_t dsv4_draft_pick(const float *z, int64_t V, float temperature, double u, float *q) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (z[v] > z[best]) best = v;
    if (!(temperature > 0)) return (int32_t)best;
    double sum = 0; /* softmax(z/T), max subtracted */
    for (int64_t v = 0; v < V; v++) sum += (q[v] = expf((z[v] - z[best]) / temperature));
    for (int64_t v = 0; v < V; v++) q[v] = (float)(q[v] / sum);
    return dsv4_sample_from(q, (int)V, u);
}

int dsv4_dspark_draft(dsv4_dspark *d, int n, const int32_t *slot, const int32_t *anchor, const int32_t *pos,
                      int32_t *tokens, float *logits, float *conf_logit, dsv4_err *err) {
    return dsv4_dspark_draft_sampled(d, n, slot, anchor, pos, NULL, tokens, logits, conf_logit, err);
}

int dsv4_dspark_draft_sampled(dsv4_dspark *d, int n, const int32_t *slot, const int32_t *anchor,
                              const int32_t *pos, const dsv4_draft_sampling *smp, int32_t *tokens,
                              float *logits, float *conf_logit, dsv4_err *err) {
    const dsv4_config *cfg = d->cfg;
    dsv4_backend *be = d->be;
    int rc = validate_requests(d, n, slot, anchor, pos, err);
    if (rc) return rc;
    if (smp && (!smp->temperature || !smp->u || !smp->q || !smp->sampled))
        return dsv4_err_set(err, DSV4_EINVAL, "dspark draft: sampling needs temperature, u, q and sampled");
    for (int r = 0; smp && r < n; r++) smp->sampled[r] = smp->temperature[r] > 0;
    int g = d->gamma, T = n * g, n_hc = cfg->hc_mult, dm = cfg->hidden_size;
    int64_t V = d->target->head.out;
    float eps = (float)cfg->rms_norm_eps;
    rowbatch blk = {0}, q1 = {0}, mk = {0};
    draft_idx ix = {0};
    float *U = NULL, *bias = NULL, *ch = NULL, *ce = NULL;
    scratch sc = {.be = be};
    rc = rb_make(&blk, n, g, slot, pos, 0, err);
    if (!rc) rc = rb_make(&q1, n, 1, slot, pos, g - 1, err);
    if (!rc) rc = rb_make(&mk, n, 1, slot, pos, 0, err);
    int32_t *ixmem = rc ? NULL : malloc(sizeof(int32_t) * ((size_t)n + (size_t)T * 2));
    U = rc ? NULL : malloc(sizeof(float) * (size_t)T * (size_t)V);
    bias = rc ? NULL : malloc(sizeof(float) * (size_t)n * (size_t)V);
    ch = rc ? NULL : malloc(sizeof(float) * (size_t)T);
    ce = rc ? NULL : malloc(sizeof(float) * (size_t)n);
    if (!rc && (!ixmem || !U || !bias || !ch || !ce)) rc = dsv4_err_set(err, DSV4_ENOMEM, "dspark: out of memory");
    if (!rc) {
        ix.kv_last = ixmem;
        ix.q_slot = ixmem + n;
        ix.unpermute = ixmem + n + T;
        for (int r = 0; r < n; r++) {
            ix.kv_last[r] = r * g + g - 1;
            for (int i = 0; i < g; i++) {
                ix.q_slot[i * n + r] = r * g + i;
                ix.unpermute[r * g + i] = i * n + r;
                blk.token[r * g + i] = i == 0 ? anchor[r] : cfg->dspark_noise_token_id; /* §2.2 block ids */
            }
        }
    }
    /* backbone: embed the block into hc_mult streams (the target's embedding), S stages */
    dsv4_buf *X = sc_alloc(&sc, be->act_dtype, T, (int64_t)n_hc * dm, &rc, err);
    dsv4_buf *h = sc_alloc(&sc, be->act_dtype, T, dm, &rc, err);
    dsv4_buf *hn = sc_alloc(&sc, be->act_dtype, T, dm, &rc, err);
    dsv4_buf *Ub = sc_alloc(&sc, DSV4_DT_F32, T, V, &rc, err);
    dsv4_buf *chb = sc_alloc(&sc, DSV4_DT_F32, T, 1, &rc, err);
    dsv4_buf *e = sc_alloc(&sc, be->act_dtype, n, d->markov_w2.in, &rc, err);
    dsv4_buf *bb = sc_alloc(&sc, DSV4_DT_F32, n, V, &rc, err);
    dsv4_buf *ceb = sc_alloc(&sc, DSV4_DT_F32, n, 1, &rc, err);
    if (!rc) rc = be->batch_begin(be, &blk.b, err);
    if (!rc) rc = be->embed(be, &d->target->embed, &blk.b, n_hc, X, err);
    for (int s = 0; s < d->n_stages && !rc; s++) rc = draft_stage(d, s, &blk, &q1, &ix, X, err);
    /* head: last stage's hc_head → pre-norm hidden h; own norm; the target's LM head (fp32) */
    if (!rc) rc = be->hc_head(be, X, &d->hc_head.fn, &d->hc_head.base, &d->hc_head.scale, n_hc, (float)cfg->hc_eps,
                              h, err);
    if (!rc) rc = be->rmsnorm(be, h, &d->norm, dm, eps, hn, err);
    if (!rc) rc = be->linear(be, hn, &d->target->head, Ub, err);
    if (!rc) rc = be->linear(be, h, &d->conf_h, chb, err);
    if (!rc) rc = be->buf_read(be, Ub, U, err);
    if (!rc) rc = be->buf_read(be, chb, ch, err);
    /* Markov head (§2.5): z_i = U_i + W2·W1[prev_i], prev_1 = anchor, greedy or sampled; confidence (§2.6) */
    for (int r = 0; r < n && !rc; r++) mk.token[r] = anchor[r];
    for (int i = 0; i < g && !rc; i++) {
        rc = be->batch_begin(be, &mk.b, err);
        if (!rc) rc = be->embed(be, &d->markov_w1, &mk.b, 1, e, err);
        if (!rc) rc = be->linear(be, e, &d->markov_w2, bb, err);
        if (!rc) rc = be->linear(be, e, &d->conf_e, ceb, err);
        if (!rc) rc = be->buf_read(be, bb, bias, err);
        if (!rc) rc = be->buf_read(be, ceb, ce, err);
        for (int r = 0; r < n && !rc; r++) {
            float *z = U + ((size_t)r * g + i) * (size_t)V;
            const float *bz = bias + (size_t)r * V;
            for (int64_t v = 0; v < V; v++) z[v] += bz[v];
            int32_t pick = smp && smp->temperature[r] > 0
                               ? dsv4_draft_pick(z, V, smp->temperature[r], smp->u[r * g + i],
                                                 smp->q + ((size_t)r * g + i) * (size_t)V)
                               : dsv4_draft_pick(z, V, 0.0f, 0.0, NULL);
            tokens[r * g + i] = pick;
            mk.token[r] = pick;
            if (conf_logit) conf_logit[r * g + i] = ch[r * g + i] + ce[r];
        }
    }
    if (!rc && logits) memcpy(logits, U, sizeof(float) * (size_t)T * (size_t)V);
    if (!rc) rc = be->sync(be, err);
    sc_free(&sc);
    rb_free(&blk);
    rb_free(&q1);
    rb_free(&mk);
    free(ixmem);
    free(U);
    free(bias);
    free(ch);
    free(ce);
    if (rc) dsv4_err_prefix(err, "dspark draft: ");
    return rc;
}
