/*
 * dsv4_model: the target weights made resident on a backend (spec/MODEL.md
 * §2.2), plus per-layer RoPE tables (§3.4.3). Absent views (dtype INVALID,
 * e.g. tid2eid of a top-k layer) are kept absent.
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

int dsv4_upload_view(dsv4_backend *be, dsv4_tview *v, dsv4_err *err) {
    if (v->dtype == DSV4_DT_INVALID || !v->data) return DSV4_OK;
    dsv4_tview dev;
    int rc = be->upload(be, v, &dev, err);
    if (rc) return dsv4_err_prefix(err, "uploading %s: ", v->name ? v->name : "tensor");
    *v = dev;
    return DSV4_OK;
}

int dsv4_upload_linear(dsv4_backend *be, dsv4_linear *l, dsv4_err *err) {
    if (be->upload_linear && l->w.dtype != DSV4_DT_INVALID && l->w.data) {
        dsv4_linear dev;
        int rc = be->upload_linear(be, l, &dev, err);
        if (rc) return dsv4_err_prefix(err, "uploading %s: ", l->w.name ? l->w.name : "linear");
        *l = dev;
        return DSV4_OK;
    }
    int rc = dsv4_upload_view(be, &l->w, err);
    return rc ? rc : dsv4_upload_view(be, &l->scale, err);
}

static int up_hc(dsv4_backend *be, dsv4_hc_w *h, dsv4_err *err) {
    int rc = dsv4_upload_view(be, &h->fn, err);
    if (!rc) rc = dsv4_upload_view(be, &h->base, err);
    if (!rc) rc = dsv4_upload_view(be, &h->scale, err);
    return rc;
}

static int up_cmp(dsv4_backend *be, dsv4_compressor_w *c, dsv4_err *err) {
    int rc = dsv4_upload_view(be, &c->ape, err);
    if (!rc) rc = dsv4_upload_linear(be, &c->wkv, err);
    if (!rc) rc = dsv4_upload_linear(be, &c->wgate, err);
    if (!rc) rc = dsv4_upload_view(be, &c->norm, err);
    return rc;
}

int dsv4_block_dev_init(const dsv4_config *cfg, const dsv4_block_w *w, dsv4_backend *be,
                        dsv4_block_dev *out, dsv4_err *err) {
    memset(out, 0, sizeof *out);
    out->w = *w;
    dsv4_block_w *b = &out->w;
    int rc = dsv4_rope_init(&out->rope, cfg->qk_rope_head_dim,
                            b->ratio ? cfg->compress_rope_theta : cfg->rope_theta,
                            b->ratio ? cfg->yarn.factor : 1.0,
                            (double)cfg->yarn.original_max_position_embeddings, cfg->yarn.beta_fast,
                            cfg->yarn.beta_slow, err);
    if (!rc) rc = dsv4_upload_view(be, &b->attn_norm, err);
    if (!rc) rc = dsv4_upload_view(be, &b->ffn_norm, err);
    if (!rc) rc = up_hc(be, &b->hc_attn, err);
    if (!rc) rc = up_hc(be, &b->hc_ffn, err);
    dsv4_attn_w *a = &b->attn;
    if (!rc) rc = dsv4_upload_linear(be, &a->wq_a, err);
    if (!rc) rc = dsv4_upload_view(be, &a->q_norm, err);
    if (!rc) rc = dsv4_upload_linear(be, &a->wq_b, err);
    if (!rc) rc = dsv4_upload_linear(be, &a->wkv, err);
    if (!rc) rc = dsv4_upload_view(be, &a->kv_norm, err);
    if (!rc) rc = dsv4_upload_linear(be, &a->wo_a, err);
    if (!rc) rc = dsv4_upload_linear(be, &a->wo_b, err);
    if (!rc) rc = dsv4_upload_view(be, &a->sink, err);
    if (!rc && b->ratio > 0) rc = up_cmp(be, &a->compressor, err);
    if (!rc && b->ratio == 4) {
        rc = dsv4_upload_linear(be, &a->indexer.wq_b, err);
        if (!rc) rc = dsv4_upload_linear(be, &a->indexer.weights_proj, err);
        if (!rc) rc = up_cmp(be, &a->indexer.compressor, err);
    }
    dsv4_ffn_w *f = &b->ffn;
    if (!rc) rc = dsv4_upload_linear(be, &f->gate, err);
    if (!rc) rc = dsv4_upload_view(be, &f->gate_bias, err);
    if (!rc) rc = dsv4_upload_view(be, &f->tid2eid, err);
    if (!rc) rc = dsv4_upload_linear(be, &f->shared.w1, err);
    if (!rc) rc = dsv4_upload_linear(be, &f->shared.w2, err);
    if (!rc) rc = dsv4_upload_linear(be, &f->shared.w3, err);
    if (!rc && f->n_experts > 0) {
        out->w1 = calloc((size_t)f->n_experts, sizeof(dsv4_linear));
        out->w2 = calloc((size_t)f->n_experts, sizeof(dsv4_linear));
        out->w3 = calloc((size_t)f->n_experts, sizeof(dsv4_linear));
        if (!out->w1 || !out->w2 || !out->w3) rc = dsv4_err_set(err, DSV4_ENOMEM, "model: out of memory");
        for (int e = 0; e < f->n_experts && !rc; e++) {
            out->w1[e] = f->experts[e].w1;
            out->w2[e] = f->experts[e].w2;
            out->w3[e] = f->experts[e].w3;
            rc = dsv4_upload_linear(be, &out->w1[e], err);
            if (!rc) rc = dsv4_upload_linear(be, &out->w2[e], err);
            if (!rc) rc = dsv4_upload_linear(be, &out->w3[e], err);
        }
        /* Now, not in the first forward: the pool is sized after the weights, and under
         * TP a forward may overlap a peer's collective (backend.h experts_ready). */
        if (!rc && be->experts_ready) {
            rc = be->experts_ready(be, out->w1, out->w3, out->w2, f->n_experts, err);
            if (rc) dsv4_err_prefix(err, "assembling the %d routed experts: ", f->n_experts);
        }
    }
    b->ffn.experts = NULL; /* the uploaded copies live in w1/w2/w3 */
    if (rc) {
        dsv4_err_prefix(err, "layer %d: ", w->layer_id);
        dsv4_block_dev_free(out);
    }
    return rc;
}

void dsv4_block_dev_free(dsv4_block_dev *b) {
    if (!b) return;
    free(b->w1);
    free(b->w2);
    free(b->w3);
    b->w1 = b->w2 = b->w3 = NULL;
}

int dsv4_model_create(const dsv4_config *cfg, const dsv4_weights *w, dsv4_backend *be,
                      dsv4_model **out, dsv4_err *err) {
    *out = NULL;
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return dsv4_err_set(err, DSV4_ENOMEM, "model: out of memory");
    m->cfg = cfg;
    m->be = be;
    m->embed = w->embed;
    m->norm = w->norm;
    m->head = w->head;
    m->hc_head = w->hc_head;
    m->n_layers = w->n_layers;
    m->layers = calloc((size_t)(w->n_layers > 0 ? w->n_layers : 1), sizeof *m->layers);
    int rc = m->layers ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "model: out of memory");
    if (!rc) rc = dsv4_upload_view(be, &m->embed, err);
    if (!rc) rc = dsv4_upload_view(be, &m->norm, err);
    if (!rc) rc = dsv4_upload_linear(be, &m->head, err);
    if (!rc) rc = up_hc(be, &m->hc_head, err);
    for (int l = 0; l < w->n_layers && !rc; l++) rc = dsv4_block_dev_init(cfg, &w->layers[l], be, &m->layers[l], err);
    if (rc) {
        dsv4_model_free(m);
        return rc;
    }
    *out = m;
    return DSV4_OK;
}

void dsv4_model_free(dsv4_model *m) {
    if (!m) return;
    dsv4_forward_graphs_free(m);
    for (int l = 0; l < m->n_layers && m->layers; l++) dsv4_block_dev_free(&m->layers[l]);
    free(m->layers);
    free(m);
}
