/*
 * Sliding-window ring and sink attention over raw window + compressed rows
 * (spec/MODEL.md §3.4.4, §3.4.7, §3.8).
 *
 * Where a key row comes from: for a query of slot s at position p whose batch
 * segment starts at p0, raw positions >= p0 are this batch's own kv rows and
 * positions < p0 are read from the slot's ring — so a chunk of any length and
 * a decode row see exactly the same keys as one long prefill would.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int check_win(const dsv4_win_state *ws, int64_t hd, dsv4_err *err) {
    if (!ws || ws->cap < ws->window || ws->window <= 0)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: window state: cap must be >= window > 0");
    return dsv4_cpu_check_f32(&ws->rows, (int64_t)ws->n_slots * ws->cap, hd, "window rows", err);
}

int dsv4_cpu_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                       dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(kv, b->n_rows, -1, "win_store kv", err);
    if (!rc) rc = check_win(ws, kv->cols, err);
    if (rc) return rc;
    int64_t hd = kv->cols;
    for (int t = 0; t < b->n_rows; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= ws->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "win_store: slot %d out of range", b->slot[t]);
        int64_t r = (int64_t)b->slot[t] * ws->cap + b->pos[t] % ws->cap;
        memcpy((float *)ws->rows.data + r * hd, (const float *)kv->data + (int64_t)t * hd, hd * sizeof(float));
    }
    return DSV4_OK;
}

int dsv4_cpu_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv,
                       const dsv4_win_state *ws, const dsv4_cmp_state *cs, const dsv4_buf *sel,
                       const dsv4_tview *sinks, int n_heads, const dsv4_batch *b, dsv4_buf *o,
                       dsv4_err *err) {
    int T = b->n_rows;
    int rc = dsv4_cpu_check_f32(kv, T, -1, "attention kv", err);
    if (rc) return rc;
    int64_t hd = kv->cols;
    rc = dsv4_cpu_check_f32(q, T, hd * n_heads, "attention q", err);
    if (!rc) rc = dsv4_cpu_check_f32(o, T, hd * n_heads, "attention o", err);
    if (!rc) rc = check_win(ws, hd, err);
    if (!rc) rc = dsv4_cpu_check_vec(sinks, n_heads, "attn_sink", err);
    if (!rc && cs) rc = dsv4_cpu_check_cmp_rows(cs, hd, "compressed rows", err);
    if (!rc && sel) rc = dsv4_cpu_check_i32(sel, T, -1, "attention sel", err);
    if (rc) return rc;
    int ref = be->numerics == DSV4_NUMERICS_REFERENCE;
    float scale = 1.0f / sqrtf((float)hd);
    /* Upper bound on candidates: raw window + compressed rows. */
    int64_t max_cand = ws->window + (cs ? (sel ? sel->cols : cs->block_table ? (int64_t)cs->max_pages * cs->page_rows : cs->max_rows) : 0);
    int fail = 0;
#pragma omp parallel if ((int64_t)T * n_heads * max_cand * hd > DSV4_CPU_PAR_MIN)
    {
        const float **keys = malloc((size_t)max_cand * sizeof *keys);
        float *s = malloc((size_t)max_cand * sizeof *s);
        if (!keys || !s) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic)
        for (int t = 0; t < T; t++) {
            if (!keys || !s) continue;
            int slot = b->slot[t];
            int64_t p = b->pos[t], p0 = b->seq_pos0[b->seq_idx[t]];
            /* Gather candidate key rows: raw window first, then compressed rows. */
            int64_t n = 0;
            int64_t lo = p - ws->window + 1 < 0 ? 0 : p - ws->window + 1;
            for (int64_t pp = lo; pp <= p; pp++)
                keys[n++] = pp >= p0 ? (const float *)kv->data + (t - (p - pp)) * hd
                                     : (const float *)ws->rows.data + ((int64_t)slot * ws->cap + pp % ws->cap) * hd;
            if (cs) { /* rows through DSV4_CMP_ROW; an unmapped page is skipped, never read */
                int64_t nvis = (p + 1) / cs->ratio;
                if (sel) {
                    const int32_t *sl = (const int32_t *)sel->data + (int64_t)t * sel->cols;
                    for (int64_t j = 0; j < sel->cols; j++)
                        if (sl[j] >= 0 && sl[j] < nvis && (keys[n] = dsv4_cpu_cmp_row(cs, slot, sl[j]))) n++;
                } else {
                    int64_t wmax = cs->block_table ? (int64_t)cs->max_pages * cs->page_rows : cs->max_rows;
                    for (int64_t w = 0; w < nvis && w < wmax; w++)
                        if ((keys[n] = dsv4_cpu_cmp_row(cs, slot, w))) n++;
                }
            }
            for (int h = 0; h < n_heads; h++) {
                const float *qh = (const float *)q->data + ((int64_t)t * n_heads + h) * hd;
                float sink = dsv4_cpu_load_f(sinks->data, sinks->dtype, h);
                float mx = sink;
                for (int64_t j = 0; j < n; j++) {
                    s[j] = dsv4_cpu_dot(qh, keys[j], hd) * scale;
                    mx = fmaxf(mx, s[j]);
                }
                /* One softmax over candidates plus the sink logit, which has no value row. */
                float den = expf(sink - mx);
                for (int64_t j = 0; j < n; j++) den += s[j] = expf(s[j] - mx);
                float *oh = (float *)o->data + ((int64_t)t * n_heads + h) * hd;
                for (int64_t k = 0; k < hd; k++) oh[k] = 0;
                for (int64_t j = 0; j < n; j++) {
                    float pj = s[j] / den;
                    if (ref) pj = dsv4_cpu_round_bf16(pj); /* official: bf16 probabilities into PV */
                    for (int64_t k = 0; k < hd; k++) oh[k] += pj * keys[j][k];
                }
            }
        }
        free(keys);
        free(s);
    }
    if (fail) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: attention: out of memory");
    return DSV4_OK;
}
