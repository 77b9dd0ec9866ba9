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

static int check_win(const dsv4_win_state *ws, int64_t hd, dsv4_cpu_kv_fmt *f, dsv4_err *err) {
    if (!ws || ws->cap < ws->window || ws->window <= 0)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: window state: cap must be >= window > 0");
    return dsv4_cpu_kv_fmt_of(&ws->rows, (int64_t)ws->n_slots * ws->cap, hd, "window rows", f, err);
}

int dsv4_cpu_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                       dsv4_err *err) {
    dsv4_cpu_kv_fmt wf;
    int rc = dsv4_cpu_check_f32(kv, b->n_rows, -1, "win_store kv", err);
    if (!rc) rc = check_win(ws, kv->cols, &wf, err);
    if (rc) return rc;
    int64_t hd = kv->cols;
    for (int t = 0; t < b->n_rows; t++) {
        if (b->slot[t] < 0 || b->slot[t] >= ws->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "win_store: slot %d out of range", b->slot[t]);
        int64_t r = (int64_t)b->slot[t] * ws->cap + b->pos[t] % ws->cap;
        dsv4_cpu_kv_store(&ws->rows, &wf, r, (const float *)kv->data + (int64_t)t * hd); /* coded per --kv-cache-dtype */
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
    dsv4_cpu_kv_fmt wf, cf = {DSV4_KV_F32, 0, 0, 0};
    if (!rc) rc = check_win(ws, hd, &wf, err);
    if (!rc) rc = dsv4_cpu_check_vec(sinks, n_heads, "attn_sink", err);
    if (!rc && cs) rc = dsv4_cpu_check_cmp_rows(cs, hd, "compressed rows", err);
    if (!rc && cs) rc = dsv4_cpu_kv_fmt_of(&cs->rows, -1, hd, "compressed rows", &cf, err);
    if (!rc && sel) rc = dsv4_cpu_check_i32(sel, T, -1, "attention sel", err);
    if (rc) return rc;
    int ref = be->numerics == DSV4_NUMERICS_REFERENCE;
    float scale = 1.0f / sqrtf((float)hd);
    /* Upper bound on candidates: raw window + compressed rows. */
    int64_t max_cand = ws->window + (cs ? (sel ? sel->cols : cs->max_rows) : 0);
    int fail = 0, unmapped = 0;
#pragma omp parallel if ((int64_t)T * n_heads * max_cand * hd > DSV4_CPU_PAR_MIN)
    {
        const float **keys = malloc((size_t)max_cand * sizeof *keys);
        float *s = malloc((size_t)max_cand * sizeof *s);
        /* decoded rows of coded stores (fp8_ds_mla / bf16), one per candidate */
        int coded = wf.t != DSV4_KV_F32 || cf.t != DSV4_KV_F32;
        float *dec = coded ? malloc((size_t)max_cand * (size_t)hd * sizeof *dec) : NULL;
        uint8_t *rt = coded ? malloc((size_t)wf.bytes) : NULL; /* one record */
        if (!keys || !s || (coded && (!dec || !rt))) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic)
        for (int t = 0; t < T; t++) {
            if (!keys || !s || (coded && (!dec || !rt))) continue;
            int slot = b->slot[t];
            int64_t p = b->pos[t], p0 = b->seq_pos0[b->seq_idx[t]];
            /* Gather candidate key rows: raw window first, then compressed rows. */
            int64_t n = 0;
            int64_t lo = p - ws->window + 1 < 0 ? 0 : p - ws->window + 1;
            for (int64_t pp = lo; pp <= p; pp++, n++) {
                if (pp < p0) {
                    keys[n] = dsv4_cpu_kv_load(&ws->rows, &wf, (int64_t)slot * ws->cap + pp % ws->cap,
                                               dec ? dec + n * hd : NULL);
                    continue;
                }
                keys[n] = (const float *)kv->data + (t - (p - pp)) * hd;
                if (wf.t != DSV4_KV_F32) { /* the batch's own rows as the store will hold them, so a
                                            * result never depends on where chunks (or a preemption) fall */
                    dsv4_kvcodec_encode(wf.t, wf.dim, wf.rope_dim, keys[n], rt);
                    dsv4_kvcodec_decode(wf.t, wf.dim, wf.rope_dim, rt, dec + n * hd);
                    keys[n] = dec + n * hd;
                }
            }
            if (cs) { /* rows addressed through the block table (DSV4_CMP_ROW) */
                int64_t nvis = (p + 1) / cs->ratio;
                int64_t nsel = sel ? sel->cols : nvis < cs->max_rows ? nvis : cs->max_rows;
                const int32_t *sl = sel ? (const int32_t *)sel->data + (int64_t)t * sel->cols : NULL;
                for (int64_t j = 0; j < nsel; j++) {
                    int64_t w = sl ? sl[j] : j;
                    if (w < 0 || w >= nvis) continue;
                    int64_t ri = dsv4_cpu_cmp_index(cs, slot, w);
                    if (ri < 0) { /* a visible row on an unmapped page: the engine did not map it */
#pragma omp atomic write
                        unmapped = 1;
                        continue;
                    }
                    keys[n] = dsv4_cpu_kv_load(&cs->rows, &cf, ri, dec ? dec + n * hd : NULL);
                    n++;
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
        free(dec);
        free(rt);
    }
    if (fail) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: attention: out of memory");
    if (unmapped) return dsv4_err_set(err, DSV4_ERANGE, "cpu: attention: a visible compressed row is on an unmapped page");
    return DSV4_OK;
}
