/*
 * The MTP block (spec/MODEL.md §3.9) as backend ops. The input adapters are
 * the only new part; the block itself is dsv4_block_forward with a ratio-0
 * layer state, exactly like a sliding-window target layer.
 *
 * Broadcasting e_proj(e) [T][d] over the hc_mult streams uses a row gather
 * (row t repeated hc_mult times) into a [T*hc][d] buffer, which has the
 * memory layout of [T][hc*d]; hnorm and h_proj act on each stream as a row
 * of the same [T*hc][d] view.
 */
#include "model/mtp.h"

#include <stdlib.h>
#include <string.h>

int dsv4_mtp_create(const dsv4_config *cfg, const dsv4_weights *w, const dsv4_model *target, int n_slots,
                    int max_len, int max_spec, dsv4_mtp **out, dsv4_err *err) {
    *out = NULL;
    if (cfg->draft_kind != DSV4_DRAFT_MTP || w->n_mtp < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "mtp: checkpoint has no MTP block");
    const dsv4_mtp_w *mw = &w->mtp[0];
    if (mw->block.hash || mw->block.ratio != 0 || mw->block.layer_id != cfg->num_hidden_layers)
        return dsv4_err_set(err, DSV4_EINVAL, "mtp: block bound as layer %d (hash %d, ratio %d)", mw->block.layer_id,
                            (int)mw->block.hash, mw->block.ratio);
    dsv4_mtp *m = calloc(1, sizeof *m);
    if (!m) return dsv4_err_set(err, DSV4_ENOMEM, "mtp: out of memory");
    m->cfg = cfg;
    m->be = target->be;
    m->target = target;
    m->e_proj = mw->e_proj;
    m->h_proj = mw->h_proj;
    m->enorm = mw->enorm;
    m->hnorm = mw->hnorm;
    m->norm = mw->norm;
    m->hc_head = mw->hc_head;
    dsv4_backend *be = m->be;
    int rc = dsv4_block_dev_init(cfg, &mw->block, be, &m->block, err);
    if (!rc) rc = dsv4_upload_linear(be, &m->e_proj, err);
    if (!rc) rc = dsv4_upload_linear(be, &m->h_proj, err);
    if (!rc) rc = dsv4_upload_view(be, &m->enorm, err);
    if (!rc) rc = dsv4_upload_view(be, &m->hnorm, err);
    if (!rc) rc = dsv4_upload_view(be, &m->norm, err);
    if (!rc) rc = dsv4_upload_view(be, &m->hc_head.fn, err);
    if (!rc) rc = dsv4_upload_view(be, &m->hc_head.base, err);
    if (!rc) rc = dsv4_upload_view(be, &m->hc_head.scale, err);
    int ratio0 = 0;
    if (!rc) rc = dsv4_state_create(be, cfg, &ratio0, 1, n_slots, max_len, max_spec, &m->st, err);
    if (rc) {
        dsv4_mtp_free(m);
        return dsv4_err_prefix(err, "mtp: ");
    }
    *out = m;
    return DSV4_OK;
}

void dsv4_mtp_free(dsv4_mtp *m) {
    if (!m) return;
    dsv4_block_dev_free(&m->block);
    dsv4_state_free(m->st);
    free(m);
}

int dsv4_mtp_reset_slot(dsv4_mtp *m, int slot, dsv4_err *err) { return dsv4_state_reset_slot(m->st, slot, err); }

int dsv4_mtp_forward(dsv4_mtp *m, const dsv4_batch *b, const float *streams, float *logits, float *out_streams,
                     dsv4_err *err) {
    const dsv4_config *cfg = m->cfg;
    dsv4_backend *be = m->be;
    int T = b->n_rows, hc = cfg->hc_mult, d = cfg->hidden_size;
    float eps = (float)cfg->rms_norm_eps;
    if (T <= 0) return dsv4_err_set(err, DSV4_EINVAL, "mtp: empty batch");
    for (int t = 0; t < T; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= m->st->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "mtp: row %d: slot %d out of [0,%d)", t, b->slot[t], m->st->n_slots);
        if (b->pos[t] < 0 || b->pos[t] >= m->st->max_len)
            return dsv4_err_set(err, DSV4_ERANGE, "mtp: row %d: position %d beyond max length %d", t, b->pos[t],
                                m->st->max_len);
    }
    int32_t *rep = malloc(sizeof(int32_t) * (size_t)T * hc);
    if (!rep) return dsv4_err_set(err, DSV4_ENOMEM, "mtp: out of memory");
    for (int t = 0; t < T; t++)
        for (int c = 0; c < hc; c++) rep[t * hc + c] = t;
    dsv4_buf H = {0}, e = {0}, ep = {0}, X = {0}, y = {0}, lg = {0};
    int rc = be->batch_begin(be, b, err);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, (int64_t)T * hc, d, &H, err);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, T, d, &e, err);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, T, d, &ep, err);
    if (!rc) rc = be->buf_alloc(be, be->act_dtype, (int64_t)T * hc, d, &X, err);
    if (!rc) rc = be->buf_write(be, &H, streams, err);
    /* e = e_proj(enorm(embed[token])) */
    if (!rc) rc = be->embed(be, &m->target->embed, b, 1, &e, err);
    if (!rc) rc = be->rmsnorm(be, &e, &m->enorm, d, eps, &e, err);
    if (!rc) rc = be->linear(be, &e, &m->e_proj, &ep, err);
    /* per stream: h_proj(hnorm(H_s)), then + e broadcast over the streams */
    if (!rc) rc = be->rmsnorm(be, &H, &m->hnorm, d, eps, &H, err);
    if (!rc) rc = be->linear(be, &H, &m->h_proj, &X, err);
    if (!rc) rc = be->buf_gather_rows(be, &ep, rep, T * hc, &H, err); /* H now holds e broadcast */
    if (!rc) rc = be->add(be, &X, &H, &X, err);
    /* the block, with its own ratio-0 window ring: streams [T][hc*d] */
    dsv4_buf Xs = X;
    Xs.rows = T;
    Xs.cols = (int64_t)hc * d;
    if (!rc) rc = dsv4_block_forward(cfg, &m->block, &m->st->layers[0], be, b, &Xs, err);
    if (!rc && out_streams) rc = be->buf_read(be, &Xs, out_streams, err);
    if (!rc && logits) {
        rc = be->buf_alloc(be, be->act_dtype, T, d, &y, err);
        if (!rc) rc = be->hc_head(be, &Xs, &m->hc_head.fn, &m->hc_head.base, &m->hc_head.scale, hc,
                                  (float)cfg->hc_eps, &y, err);
        if (!rc) rc = be->rmsnorm(be, &y, &m->norm, d, eps, &y, err);
        if (!rc) rc = be->buf_alloc(be, DSV4_DT_F32, T, m->target->head.out, &lg, err);
        if (!rc) rc = be->linear(be, &y, &m->target->head, &lg, err);
        if (!rc) rc = be->buf_read(be, &lg, logits, err);
    }
    if (!rc) rc = be->sync(be, err);
    be->buf_free(be, &H);
    be->buf_free(be, &e);
    be->buf_free(be, &ep);
    be->buf_free(be, &X);
    be->buf_free(be, &y);
    be->buf_free(be, &lg);
    free(rep);
    if (rc) dsv4_err_prefix(err, "mtp: ");
    return rc;
}
