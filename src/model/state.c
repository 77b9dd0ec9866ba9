/*
 * Per-request attention state (spec/MODEL.md §4.1), one store per layer for
 * all slots. The emitted compressed / indexer rows are either per slot
 * (max_len/ratio rows each) or paged: one pool of pages shared by every slot,
 * one block table per slot shared by every layer (backend.h DSV4_CMP_ROW), so
 * memory follows the tokens actually held rather than n_slots x max_len. Layout and the ring
 * capacities that make rejected speculative rows safe to re-write are in
 * docs/BACKEND.md and src/backend/backend.h.
 */
#include "model/forward.h"
#include "model/kvcodec.h"

#include <stdlib.h>
#include <string.h>

/* Paged (st->n_pages > 0): the emitted rows are n_pages pages of
 * page_tokens/ratio rows, addressed through the state's one block table. */
/* A KV row store of n rows of `dim` in the state's --kv-cache-dtype (kvcodec.h):
 * F32/BF16 [n][dim], or U8 [n][record bytes] for fp8_ds_mla. */
static int alloc_kv_rows(dsv4_backend *be, dsv4_kv_dtype t, int64_t n, int dim, int rope_dim, dsv4_buf *out,
                         dsv4_err *err) {
    if (t == DSV4_KV_F32) return be->buf_alloc(be, DSV4_DT_F32, n, dim, out, err);
    if (t == DSV4_KV_BF16) return be->buf_alloc(be, DSV4_DT_BF16, n, dim, out, err);
    int64_t w = dsv4_kvcodec_row_bytes(t, dim, rope_dim);
    if (w < 0) return dsv4_err_set(err, DSV4_EINVAL, "state: no %s record for rows of %d with %d rope dims",
                                   dsv4_kv_dtype_name(t), dim, rope_dim);
    return be->buf_alloc(be, DSV4_DT_U8, n, w, out, err);
}

static int alloc_cmp(dsv4_backend *be, const dsv4_state *st, dsv4_cmp_state *cs, int ratio, int out_dim,
                     int n_slots, int max_len, int max_spec, dsv4_kv_dtype kt, int rope_dim, dsv4_err *err) {
    cs->ratio = ratio;
    cs->overlap = ratio == 4;
    cs->out_dim = out_dim;
    cs->cap = ratio * (1 + cs->overlap) + max_spec;
    cs->n_slots = n_slots;
    cs->max_rows = (max_len + ratio - 1) / ratio;
    int64_t cw = (int64_t)out_dim * (cs->overlap ? 2 : 1);
    int64_t n_rows = (int64_t)n_slots * cs->max_rows;
    if (st->n_pages > 0) {
        cs->page_rows = st->page_tokens / ratio;
        cs->max_pages = st->max_pages;
        cs->block_table = st->block_table.data;
        n_rows = (int64_t)st->n_pages * cs->page_rows;
    }
    int rc = be->buf_alloc(be, DSV4_DT_F32, (int64_t)n_slots * cs->cap, cw, &cs->kv, err);
    if (!rc) rc = be->buf_alloc(be, DSV4_DT_F32, (int64_t)n_slots * cs->cap, cw, &cs->score, err);
    if (!rc) rc = alloc_kv_rows(be, kt, n_rows, out_dim, rope_dim, &cs->rows, err);
    return rc;
}

int64_t dsv4_state_page_bytes(const dsv4_config *cfg, const int *ratios, int n_layers, int page_tokens,
                              dsv4_kv_dtype kv_dtype) {
    int64_t b = 0, row = dsv4_kvcodec_row_bytes(kv_dtype, cfg->head_dim, cfg->qk_rope_head_dim);
    for (int l = 0; l < n_layers; l++) {
        if (ratios[l] <= 0) continue;
        b += (int64_t)(page_tokens / ratios[l]) * row;
        if (ratios[l] == 4) b += (int64_t)(page_tokens / 4) * cfg->index_head_dim * (int64_t)sizeof(float);
    }
    return b;
}

int64_t dsv4_state_fixed_bytes(const dsv4_config *cfg, const int *ratios, int n_layers, int n_slots, int max_len,
                               int max_spec, int page_tokens, dsv4_kv_dtype kv_dtype) {
    if (n_slots < 1 || page_tokens <= 0 || max_len < 1 || max_spec < 0 || n_layers < 0) return -1;
    int64_t row = dsv4_kvcodec_row_bytes(kv_dtype, cfg->head_dim, cfg->qk_rope_head_dim);
    if (row < 0) return -1;
    /* the same sizes as dsv4_state_create_paged / alloc_cmp below */
    int64_t b = (int64_t)n_slots * ((max_len + page_tokens - 1) / page_tokens) * (int64_t)sizeof(int32_t);
    for (int l = 0; l < n_layers; l++) {
        b += (int64_t)n_slots * (cfg->sliding_window + max_spec) * row;
        if (ratios[l] <= 0) continue;
        int overlap = ratios[l] == 4;
        int64_t cap = (int64_t)ratios[l] * (1 + overlap) + max_spec;
        b += 2 * (int64_t)n_slots * cap * cfg->head_dim * (1 + overlap) * (int64_t)sizeof(float); /* kv + score */
        if (ratios[l] == 4) /* the indexer's compressor: overlap, index_head_dim */
            b += 2 * (int64_t)n_slots * (8 + max_spec) * cfg->index_head_dim * 2 * (int64_t)sizeof(float);
    }
    return b;
}

int dsv4_state_create(dsv4_backend *be, const dsv4_config *cfg, const int *ratios, int n_layers,
                      int n_slots, int max_len, int max_spec, dsv4_state **out, dsv4_err *err) {
    return dsv4_state_create_paged(be, cfg, ratios, n_layers, n_slots, max_len, max_spec, 0, 0, DSV4_KV_F32, out,
                                   err);
}

int dsv4_state_create_paged(dsv4_backend *be, const dsv4_config *cfg, const int *ratios, int n_layers, int n_slots,
                            int max_len, int max_spec, int page_tokens, int n_pages, dsv4_kv_dtype kv_dtype,
                            dsv4_state **out, dsv4_err *err) {
    *out = NULL;
    if (n_slots <= 0 || max_len <= 0 || max_spec < 0 || n_layers < 0 || n_pages < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "state: n_slots %d, max_len %d, max_spec %d, n_pages %d", n_slots,
                            max_len, max_spec, n_pages);
    for (int l = 0; n_pages > 0 && l < n_layers; l++)
        if (page_tokens <= 0 || (ratios[l] > 0 && page_tokens % ratios[l]))
            return dsv4_err_set(err, DSV4_EINVAL,
                                "state: block size %d tokens is not a multiple of layer %d's compress ratio %d",
                                page_tokens, l, ratios[l]);
    dsv4_state *st = calloc(1, sizeof *st);
    if (!st) return dsv4_err_set(err, DSV4_ENOMEM, "state: out of memory");
    st->be = be;
    st->n_slots = n_slots;
    st->max_len = max_len;
    st->max_spec = max_spec;
    st->n_layers = n_layers;
    st->layers = calloc((size_t)(n_layers ? n_layers : 1), sizeof *st->layers);
    int rc = st->layers ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "state: out of memory");
    if (!rc && n_pages > 0) {
        st->page_tokens = page_tokens;
        st->n_pages = n_pages;
        st->max_pages = (max_len + page_tokens - 1) / page_tokens;
        size_t nb = (size_t)n_slots * (size_t)st->max_pages;
        st->bt_host = malloc(sizeof(int32_t) * nb);
        if (!st->bt_host) rc = dsv4_err_set(err, DSV4_ENOMEM, "state: out of memory");
        for (size_t i = 0; !rc && i < nb; i++) st->bt_host[i] = -1;
        if (!rc) rc = be->buf_alloc(be, DSV4_DT_I32, n_slots, st->max_pages, &st->block_table, err);
        if (!rc) rc = be->buf_write(be, &st->block_table, st->bt_host, err);
    }
    for (int l = 0; l < n_layers && !rc; l++) {
        dsv4_layer_state *ls = &st->layers[l];
        ls->ratio = ratios[l];
        ls->win.window = cfg->sliding_window;
        ls->win.cap = cfg->sliding_window + max_spec;
        ls->win.n_slots = n_slots;
        rc = alloc_kv_rows(be, kv_dtype, (int64_t)n_slots * ls->win.cap, cfg->head_dim, cfg->qk_rope_head_dim,
                           &ls->win.rows, err);
        if (!rc && ls->ratio > 0)
            rc = alloc_cmp(be, st, &ls->cmp, ls->ratio, cfg->head_dim, n_slots, max_len, max_spec, kv_dtype,
                           cfg->qk_rope_head_dim, err);
        if (!rc && ls->ratio == 4)
            rc = alloc_cmp(be, st, &ls->idx, 4, cfg->index_head_dim, n_slots, max_len, max_spec, DSV4_KV_F32, 0,
                           err); /* index keys: f32 (FP4-valued after Hadamard; no record defined) */
        if (rc) dsv4_err_prefix(err, "state layer %d: ", l);
    }
    if (rc) {
        dsv4_state_free(st);
        return rc;
    }
    *out = st;
    return DSV4_OK;
}

static void free_cmp(dsv4_backend *be, dsv4_cmp_state *cs) {
    be->buf_free(be, &cs->kv);
    be->buf_free(be, &cs->score);
    be->buf_free(be, &cs->rows);
}

void dsv4_state_free(dsv4_state *st) {
    if (!st) return;
    for (int l = 0; l < st->n_layers && st->layers; l++) {
        st->be->buf_free(st->be, &st->layers[l].win.rows);
        free_cmp(st->be, &st->layers[l].cmp);
        free_cmp(st->be, &st->layers[l].idx);
    }
    free(st->layers);
    st->be->buf_free(st->be, &st->block_table);
    free(st->bt_host);
    free(st);
}

int dsv4_state_set_pages(dsv4_state *st, int slot, int n, const int32_t *ids, dsv4_err *err) {
    if (st->n_pages <= 0) return dsv4_err_set(err, DSV4_EINVAL, "state: set_pages on an unpaged state");
    if (slot < 0 || slot >= st->n_slots || n < 0 || n > st->max_pages)
        return dsv4_err_set(err, DSV4_EINVAL, "state: set_pages slot %d (of %d), %d pages (max %d)", slot,
                            st->n_slots, n, st->max_pages);
    for (int i = 0; i < n; i++)
        if (ids[i] < -1 || ids[i] >= st->n_pages)
            return dsv4_err_set(err, DSV4_EINVAL, "state: page id %d out of [0,%d)", ids[i], st->n_pages);
    int32_t *row = st->bt_host + (size_t)slot * (size_t)st->max_pages;
    for (int i = 0; i < st->max_pages; i++) row[i] = i < n ? ids[i] : -1;
    dsv4_buf view = st->block_table;
    view.data = (char *)st->block_table.data + (size_t)slot * (size_t)st->max_pages * sizeof(int32_t);
    view.rows = 1;
    return st->be->buf_write(st->be, &view, row, err);
}

/* Zero rows [first, first+n) of a buffer through the backend's write path. */
static int zero_rows(dsv4_backend *be, dsv4_buf *b, int64_t first, int64_t n, dsv4_err *err) {
    if (!b->data || n <= 0) return DSV4_OK;
    size_t rb = (size_t)b->cols * dsv4_dtype_size(b->dtype);
    void *zeros = calloc((size_t)n, rb);
    if (!zeros) return dsv4_err_set(err, DSV4_ENOMEM, "state: out of memory");
    dsv4_buf view = *b;
    view.data = (char *)b->data + (size_t)first * rb; /* backend pointer arithmetic: byte offsets */
    view.rows = n;
    int rc = be->buf_write(be, &view, zeros, err);
    free(zeros);
    return rc;
}

int dsv4_state_reset_slot(dsv4_state *st, int slot, dsv4_err *err) {
    if (slot < 0 || slot >= st->n_slots)
        return dsv4_err_set(err, DSV4_EINVAL, "state: slot %d out of [0,%d)", slot, st->n_slots);
    int rc = DSV4_OK;
    for (int l = 0; l < st->n_layers && !rc; l++) {
        dsv4_layer_state *ls = &st->layers[l];
        rc = zero_rows(st->be, &ls->win.rows, (int64_t)slot * ls->win.cap, ls->win.cap, err);
        dsv4_cmp_state *cs[2] = {&ls->cmp, &ls->idx};
        for (int i = 0; i < 2 && !rc; i++) {
            if (!cs[i]->rows.data) continue;
            rc = zero_rows(st->be, &cs[i]->kv, (int64_t)slot * cs[i]->cap, cs[i]->cap, err);
            if (!rc) rc = zero_rows(st->be, &cs[i]->score, (int64_t)slot * cs[i]->cap, cs[i]->cap, err);
            if (!rc && !cs[i]->block_table)
                rc = zero_rows(st->be, &cs[i]->rows, (int64_t)slot * cs[i]->max_rows, cs[i]->max_rows, err);
        }
    }
    return rc;
}

/* Copy rows [src_first, +n) of a buffer over rows [dst_first, +n) (host bounce). */
static int copy_rows(dsv4_backend *be, dsv4_buf *b, int64_t src_first, int64_t dst_first, int64_t n, dsv4_err *err) {
    if (!b->data || n <= 0) return DSV4_OK;
    size_t rb = (size_t)b->cols * dsv4_dtype_size(b->dtype);
    void *tmp = malloc((size_t)n * rb);
    if (!tmp) return dsv4_err_set(err, DSV4_ENOMEM, "state: out of memory copying a slot");
    dsv4_buf s = *b, d = *b;
    s.data = (char *)b->data + (size_t)src_first * rb;
    d.data = (char *)b->data + (size_t)dst_first * rb;
    s.rows = d.rows = n;
    int rc = be->buf_read(be, &s, tmp, err);
    if (!rc) rc = be->buf_write(be, &d, tmp, err);
    free(tmp);
    return rc;
}

int dsv4_state_copy_slot(dsv4_state *st, int src, int dst, int64_t n_pos, dsv4_err *err) {
    if (src < 0 || src >= st->n_slots || dst < 0 || dst >= st->n_slots || src == dst)
        return dsv4_err_set(err, DSV4_EINVAL, "state: copy slot %d -> %d (slots [0,%d))", src, dst, st->n_slots);
    if (n_pos < 0 || n_pos > st->max_len)
        return dsv4_err_set(err, DSV4_EINVAL, "state: copy of %lld positions (max %d)", (long long)n_pos,
                            st->max_len);
    int rc = DSV4_OK;
    for (int l = 0; l < st->n_layers && !rc; l++) {
        dsv4_layer_state *ls = &st->layers[l];
        int64_t c = ls->win.cap;
        rc = copy_rows(st->be, &ls->win.rows, (int64_t)src * c, (int64_t)dst * c, c, err);
        dsv4_cmp_state *cs[2] = {&ls->cmp, &ls->idx};
        for (int i = 0; i < 2 && !rc; i++) {
            if (!cs[i]->rows.data) continue;
            int64_t k = cs[i]->cap, m = cs[i]->max_rows, w = (n_pos + cs[i]->ratio - 1) / cs[i]->ratio;
            if (w > m) w = m;
            rc = copy_rows(st->be, &cs[i]->kv, (int64_t)src * k, (int64_t)dst * k, k, err);
            if (!rc) rc = copy_rows(st->be, &cs[i]->score, (int64_t)src * k, (int64_t)dst * k, k, err);
            if (!rc && !cs[i]->block_table)
                rc = copy_rows(st->be, &cs[i]->rows, (int64_t)src * m, (int64_t)dst * m, w, err);
            /* paged: page by page, where both slots map the page (host mirror of the table) */
            int64_t pr = cs[i]->page_rows;
            for (int64_t pg = 0; !rc && cs[i]->block_table && pg * pr < w; pg++) {
                int32_t ps = st->bt_host[(size_t)src * st->max_pages + pg], pd = st->bt_host[(size_t)dst * st->max_pages + pg];
                int64_t cnt = w - pg * pr < pr ? w - pg * pr : pr;
                if (ps >= 0 && pd >= 0) rc = copy_rows(st->be, &cs[i]->rows, ps * pr, pd * pr, cnt, err);
            }
        }
    }
    return rc;
}
