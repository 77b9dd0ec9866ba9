/*
 * The target forward (spec/MODEL.md §3.0, §3.6): embedding into hc_mult
 * streams, every block in order, then hc_head → norm → fp32 head on the rows
 * whose logits are wanted.
 */
#include <stdlib.h>
#include "model/forward.h"

/* feats[t][k*d + j] = mean over the hc streams of X[t] (spec/DSPARK.md §2.2:
 * plain mean, no weights, no norm). Host-side: X is read back once per tap. */
static int tap_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, int d, int k, int n_taps, float *host_x,
                    float *feats, dsv4_err *err) {
    int rc = be->buf_read(be, X, host_x, err);
    if (rc) return rc;
    for (int64_t t = 0; t < X->rows; t++)
        for (int j = 0; j < d; j++) {
            double acc = 0;
            for (int h = 0; h < n_hc; h++) acc += host_x[(size_t)t * n_hc * d + (size_t)h * d + j];
            feats[((size_t)t * n_taps + k) * d + j] = (float)(acc / n_hc);
        }
    return 0;
}

int dsv4_forward(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const int32_t *logit_rows,
                 int n_logits, float *logits, float *streams, dsv4_err *err) {
    return dsv4_forward_taps(m, st, b, logit_rows, n_logits, logits, streams, NULL, 0, NULL, err);
}

int dsv4_forward_taps(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const int32_t *logit_rows,
                      int n_logits, float *logits, float *streams, const int *tap_layers, int n_taps,
                      float *feats, dsv4_err *err) {
    const dsv4_config *cfg = m->cfg;
    dsv4_backend *be = m->be;
    int T = b->n_rows, n_hc = cfg->hc_mult, d = cfg->hidden_size;
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
    int rc = be->batch_begin(be, b, err);
    if (rc) return rc;
    dsv4_buf X = {0}, y = {0}, ysel = {0}, lg = {0};
    float *host_x = NULL;
    if (n_taps > 0 && !(host_x = malloc(sizeof(float) * (size_t)T * (size_t)n_hc * (size_t)d)))
        return dsv4_err_set(err, DSV4_ENOMEM, "forward: out of memory for feature taps");
    rc = be->buf_alloc(be, be->act_dtype, T, (int64_t)n_hc * d, &X, err);
    if (!rc) rc = be->embed(be, &m->embed, b, n_hc, &X, err);
    for (int l = 0; l < m->n_layers && !rc; l++) {
        rc = dsv4_block_forward(cfg, &m->layers[l], &st->layers[l], be, b, &X, err);
        for (int k = 0; k < n_taps && !rc; k++)
            if (tap_layers[k] == l) rc = tap_mean(be, &X, n_hc, d, k, n_taps, host_x, feats, err);
    }
    free(host_x);
    if (!rc && streams) rc = be->buf_read(be, &X, streams, err);
    if (!rc && n_logits > 0) {
        rc = be->buf_alloc(be, be->act_dtype, T, d, &y, err);
        if (!rc) rc = be->hc_head(be, &X, &m->hc_head.fn, &m->hc_head.base, &m->hc_head.scale, n_hc,
                                  (float)cfg->hc_eps, &y, err);
        if (!rc) rc = be->buf_alloc(be, be->act_dtype, n_logits, d, &ysel, err);
        if (!rc) rc = be->buf_gather_rows(be, &y, logit_rows, n_logits, &ysel, err);
        if (!rc) rc = be->rmsnorm(be, &ysel, &m->norm, d, (float)cfg->rms_norm_eps, &ysel, err);
        if (!rc) rc = be->buf_alloc(be, DSV4_DT_F32, n_logits, m->head.out, &lg, err);
        if (!rc) rc = be->linear(be, &ysel, &m->head, &lg, err);
        if (!rc) rc = be->buf_read(be, &lg, logits, err);
    }
    if (!rc) rc = be->sync(be, err);
    be->buf_free(be, &X);
    be->buf_free(be, &y);
    be->buf_free(be, &ysel);
    be->buf_free(be, &lg);
    return rc;
}
