/*
 * The target forward (spec/MODEL.md §3.0, §3.6): embedding into hc_mult
 * streams, every block in order, then hc_head → norm → fp32 head on the rows
 * whose logits are wanted.
 */
#include "model/forward.h"
#include "parallel/comm.h"

#include <stdlib.h>
#include <string.h>

/* taps[t][i*d + k] = mean over the hc streams of X[t] (host copy `host`). */
static void tap_mean(const float *host, int T, int n_hc, int d, int i, int n_taps, float *taps) {
    for (int t = 0; t < T; t++) {
        float *o = taps + ((size_t)t * n_taps + i) * d;
        const float *x = host + (size_t)t * n_hc * d;
        for (int k = 0; k < d; k++) {
            float acc = 0;
            for (int h = 0; h < n_hc; h++) acc += x[h * d + k];
            o[k] = acc / n_hc;
        }
    }
}

/* Tensor parallel: each rank's head rows give logits [n][V/N]; the ranks' blocks side by side are [n][V]. */
static int gather_vocab(dsv4_comm *c, dsv4_backend *be, dsv4_buf *lg, dsv4_err *err) {
    dsv4_buf full = {0};
    int rc = be->buf_alloc(be, DSV4_DT_F32, lg->rows, lg->cols * c->size, &full, err);
    if (!rc) rc = c->all_gather(c, be, lg, &full, err);
    be->buf_free(be, lg);
    *lg = full;
    return rc;
}

int dsv4_forward(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const int32_t *logit_rows,
                 int n_logits, float *logits, float *streams, dsv4_err *err) {
    dsv4_fwd_out out = {.logit_rows = logit_rows, .n_logits = n_logits, .logits = logits, .streams = streams};
    return dsv4_forward_ex(m, st, b, &out, err);
}

int dsv4_forward_ex(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                    dsv4_err *err) {
    const int32_t *logit_rows = out->logit_rows;
    int n_logits = dsv4_fwd_n_logits(out);
    const dsv4_config *cfg = m->cfg;
    dsv4_backend *be = m->be;
    int T = b->n_rows, n_hc = cfg->hc_mult, d = cfg->hidden_size;
    if (out->ids && !be->logit_top)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "forward: greedy ids asked, backend %s has no logit_top", be->name);
    if (T <= 0) return dsv4_err_set(err, DSV4_EINVAL, "forward: empty batch");
    if (st->n_layers != m->n_layers)
        return dsv4_err_set(err, DSV4_EINVAL, "forward: state has %d layers, model %d", st->n_layers, m->n_layers);
    for (int t = 0; t < T; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= st->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: row %d: slot %d out of [0,%d)", t, b->slot[t], st->n_slots);
        if (b->pos[t] < 0 || b->pos[t] >= st->max_len)
            return dsv4_err_set(err, DSV4_ERANGE, "forward: row %d: position %d beyond max length %d", t, b->pos[t],
                                st->max_len);
    }
    for (int i = 0; i < n_logits; i++)
        if (logit_rows[i] < 0 || logit_rows[i] >= T)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: logit row %d out of [0,%d)", logit_rows[i], T);
    int n_taps = dsv4_fwd_n_taps(out);
    for (int i = 0; i < n_taps; i++)
        if (out->tap_layers[i] < 0 || out->tap_layers[i] >= m->n_layers)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: tap layer %d out of [0,%d)", out->tap_layers[i],
                                m->n_layers);
    if (n_taps && be->act_dtype != DSV4_DT_F32)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "forward: taps need F32 activations (backend %s)", be->name);
    if (n_taps && out->taps_dev) {
        const dsv4_buf *td = out->taps_dev;
        int need = out->read_rows > 0 && out->read_rows < T ? out->read_rows : T;
        if (!be->hc_mean || out->taps)
            return dsv4_err_set(err, DSV4_EUNSUPPORTED, "forward: taps_dev needs the backend's hc_mean and no host taps");
        if (td->dtype != DSV4_DT_F32 || td->cols != (int64_t)n_taps * d || td->rows < need)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: taps_dev %lldx%lld for %d rows of %d taps x %d",
                                (long long)td->rows, (long long)td->cols, need, n_taps, d);
    }
    int rc;
    /* capture sizes (issue 7): a decode / verify batch runs as the next captured size */
    if (m->n_pad_sizes && !m->in_pad && (rc = dsv4_forward_padded(m, st, b, out, err)) != 1) return rc;
    rc = be->batch_begin(be, b, err);
    if (rc) return rc;
    __atomic_store_n(&m->last_path, DSV4_FWD_PATH_EAGER, __ATOMIC_RELAXED); /* forward_graph refines it */
    /* CUDA graphs (issue 7): replay or capture when enabled and eligible; 1 = not handled */
    if (m->graphs_on && (rc = dsv4_forward_graph(m, st, b, out, err)) != 1) {
        dsv4_forward_path_count(m);
        return rc;
    }
    if (m->graphs_on) dsv4_forward_path_count(m);
    dsv4_buf X = {0}, lg = {0}, taps = {0};
    /* Taps: a backend with hc_mean keeps them in backend memory until the end
     * (no read in the middle of the forward); otherwise the streams are read
     * back after the tap layer and the mean is taken on the host. With
     * taps_dev and room for every row, they are written there in place. */
    int dev_taps = n_taps && be->hc_mean;
    const int in_place = dev_taps && out->taps_dev && out->taps_dev->rows >= T;
    if (in_place) taps = (dsv4_buf){out->taps_dev->data, DSV4_DT_F32, T, out->taps_dev->cols};
    float *host = NULL;
    if (n_taps && !dev_taps && !(host = malloc(sizeof(float) * (size_t)T * n_hc * d)))
        return dsv4_err_set(err, DSV4_ENOMEM, "forward: out of memory");
    /* Shape-static launches serve graph capture and replay (and the eager warm-up of a graph shape,
     * so it sums as the replays will). A prefill-sized step never replays a graph: size its launches
     * by its positions, not by max_model_len (same bits, forward.h dsv4_forward_graph_shaped). */
    const int static_shapes = be->static_shapes;
    if (static_shapes && !dsv4_forward_graph_shaped(b)) be->static_shapes = 0;
    rc = dsv4_forward_launch(m, st, b, out, host, &X, &lg, &taps, err);
    be->static_shapes = static_shapes;
    free(host);
    if (in_place) taps = (dsv4_buf){0}; /* already where they go: the finish neither reads nor frees it */
    return dsv4_forward_finish(m, out, &X, &lg, &taps, rc, err);
}

int dsv4_forward_launch(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                        float *host, dsv4_buf *X_, dsv4_buf *lg_, dsv4_buf *taps_, dsv4_err *err) {
    const int32_t *logit_rows = out->logit_rows;
    int n_logits = dsv4_fwd_n_logits(out);
    int n_taps = dsv4_fwd_n_taps(out);
    const dsv4_config *cfg = m->cfg;
    dsv4_backend *be = m->be;
    int T = b->n_rows, n_hc = cfg->hc_mult, d = cfg->hidden_size;
    int dev_taps = n_taps && be->hc_mean;
    /* *taps_ with data: the caller's buffer of T rows (taps_dev in place); else allocated here */
    dsv4_buf X = {0}, y = {0}, ysel = {0}, lg = {0}, taps = taps_->data ? *taps_ : (dsv4_buf){0};
    int rc = be->buf_alloc(be, be->act_dtype, T, (int64_t)n_hc * d, &X, err);
    if (!rc && dev_taps && !taps.data) rc = be->buf_alloc(be, DSV4_DT_F32, T, (int64_t)n_taps * d, &taps, err);
    if (!rc) rc = be->embed(be, &m->embed, b, n_hc, &X, err);
    /* where the backend fuses hc_post into the next hc_pre, a block's last hc_post waits for the next
     * block (not past a tap layer, whose streams are read, nor the last layer) */
    dsv4_hc_carry carry = {0};
    const int use_carry = be->hc_post_pre_norm != NULL && m->n_layers > 1;
    if (!rc && use_carry) rc = dsv4_hc_carry_init(be, cfg, T, &carry, err);
    for (int l = 0; l < m->n_layers && !rc; l++) {
        int tap = 0;
        for (int i = 0; i < n_taps; i++) tap |= out->tap_layers[i] == l;
        const int defer = use_carry && !tap && l + 1 < m->n_layers;
        rc = dsv4_block_forward_carry(cfg, &m->layers[l], &st->layers[l], be, b, &X, use_carry ? &carry : NULL,
                                      defer, err);
        int read = 0;
        for (int i = 0; i < n_taps && !rc; i++) {
            if (out->tap_layers[i] != l) continue;
            if (dev_taps) {
                rc = be->hc_mean(be, &X, n_hc, &taps, (int64_t)i * d, err);
                continue;
            }
            if (!read && !(rc = be->buf_read(be, &X, host, err))) read = 1;
            if (!rc) tap_mean(host, out->read_rows > 0 && out->read_rows < T ? out->read_rows : T, n_hc, d, i, n_taps, out->taps);
        }
    }
    if (!rc) rc = dsv4_hc_carry_flush(be, n_hc, &carry, &X, err); /* (none pending: the last layer wrote X) */
    if (use_carry) dsv4_hc_carry_free(be, &carry);
    if (!rc && n_logits > 0) {
        rc = be->buf_alloc(be, be->act_dtype, T, d, &y, err);
        if (!rc) rc = be->hc_head(be, &X, &m->hc_head.fn, &m->hc_head.base, &m->hc_head.scale, n_hc,
                                  (float)cfg->hc_eps, &y, err);
        if (!rc) rc = be->buf_alloc(be, be->act_dtype, n_logits, d, &ysel, err);
        if (!rc) rc = be->buf_gather_rows(be, &y, logit_rows, n_logits, &ysel, err);
        if (!rc) rc = be->rmsnorm(be, &ysel, &m->norm, d, (float)cfg->rms_norm_eps, &ysel, err);
        if (!rc) rc = be->buf_alloc(be, DSV4_DT_F32, n_logits, m->head.out, &lg, err);
        if (!rc) rc = be->linear(be, &ysel, &m->head, &lg, err);
        if (!rc && m->head_comm) rc = gather_vocab(m->head_comm, be, &lg, err);
        if (!rc && out->ids) { /* greedy ids on the device: lg becomes the I32 [n][1] ids */
            dsv4_buf ids = {0};
            rc = be->buf_alloc(be, DSV4_DT_I32, n_logits, 1, &ids, err);
            if (!rc) rc = be->logit_top(be, &lg, &ids, NULL, err);
            be->buf_free(be, &lg); /* stream-ordered: after logit_top read it */
            lg = ids;
        }
    }
    be->buf_free(be, &y); /* stream-ordered: after the ops that read it */
    be->buf_free(be, &ysel);
    *X_ = X;
    *lg_ = lg;
    *taps_ = taps;
    return rc;
}

int dsv4_forward_finish(dsv4_model *m, const dsv4_fwd_out *out, dsv4_buf *X, dsv4_buf *lg, dsv4_buf *taps, int rc,
                        dsv4_err *err) {
    dsv4_backend *be = m->be;
    int n_logits = dsv4_fwd_n_logits(out);
    /* a padded batch reads its real rows only (views of the first read_rows rows; freed whole below) */
    dsv4_buf vlg = *lg, vtaps = *taps, vX = *X;
    if (out->read_rows > 0) {
        if (vlg.rows > out->read_rows) vlg.rows = out->read_rows;
        if (vtaps.rows > out->read_rows) vtaps.rows = out->read_rows;
        if (vX.rows > out->read_rows) vX.rows = out->read_rows;
    }
    /* every read after the last launch: the step is launch-only up to here */
    if (!rc && n_logits > 0) rc = be->buf_read(be, &vlg, out->ids ? (void *)out->ids : (void *)out->logits, err);
    if (!rc && taps->data && out->taps_dev) { /* a graph's or padded batch's own buffer: its real rows, on the device */
        int32_t *idx = malloc(sizeof(int32_t) * (size_t)(vtaps.rows > 0 ? vtaps.rows : 1));
        if (!idx) rc = dsv4_err_set(err, DSV4_ENOMEM, "forward: out of memory");
        for (int64_t i = 0; idx && i < vtaps.rows; i++) idx[i] = (int32_t)i;
        dsv4_buf dst = {out->taps_dev->data, DSV4_DT_F32, vtaps.rows, out->taps_dev->cols};
        if (!rc && vtaps.rows > 0) rc = be->buf_gather_rows(be, &vtaps, idx, (int)vtaps.rows, &dst, err);
        free(idx);
    } else if (!rc && taps->data) {
        rc = be->buf_read(be, &vtaps, out->taps, err);
    }
    if (!rc && out->streams) rc = be->buf_read(be, &vX, out->streams, err);
    if (!rc) rc = be->sync(be, err);
    be->buf_free(be, X);
    be->buf_free(be, lg);
    be->buf_free(be, taps);
    return rc;
}
