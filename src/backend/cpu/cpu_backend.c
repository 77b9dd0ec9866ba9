/*
 * CPU reference backend: the op table, host buffers and the argument checks
 * shared by every op. Memory is plain host memory, so `upload` is the
 * identity and batch metadata is read where it lies.
 */
#include "backend/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

int dsv4_cpu_check_f32(const dsv4_buf *b, int64_t rows, int64_t cols, const char *what, dsv4_err *err) {
    if (!b || !b->data)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: missing buffer", what);
    if (b->dtype != DSV4_DT_F32)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: dtype %s, expected F32", what,
                            dsv4_dtype_name(b->dtype));
    if ((rows >= 0 && b->rows != rows) || (cols >= 0 && b->cols != cols))
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: shape [%lld,%lld], expected [%lld,%lld]", what,
                            (long long)b->rows, (long long)b->cols, (long long)rows, (long long)cols);
    return DSV4_OK;
}

int dsv4_cpu_kv_fmt_of(const dsv4_buf *b, int64_t rows, int64_t dim, const char *what, dsv4_cpu_kv_fmt *f,
                       dsv4_err *err) {
    if (!b || !b->data) return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: missing buffer", what);
    if (rows >= 0 && b->rows != rows)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: %lld rows, expected %lld", what, (long long)b->rows,
                            (long long)rows);
    f->dim = (int)dim;
    f->rope_dim = 0;
    if (b->dtype == DSV4_DT_F32 && b->cols == dim) f->t = DSV4_KV_F32;
    else if (b->dtype == DSV4_DT_BF16 && b->cols == dim) f->t = DSV4_KV_BF16;
    else if (b->dtype == DSV4_DT_U8 && (f->rope_dim = dsv4_kvcodec_rope_dim(DSV4_KV_FP8_DS_MLA, (int)dim, b->cols)) >= 0)
        f->t = DSV4_KV_FP8_DS_MLA;
    else
        return dsv4_err_set(err, DSV4_EINVAL,
                            "cpu: %s: %s rows of %lld columns are no KV row format for dim %lld (F32/BF16 [dim], "
                            "U8 fp8_ds_mla records)",
                            what, dsv4_dtype_name(b->dtype), (long long)b->cols, (long long)dim);
    f->bytes = dsv4_kvcodec_row_bytes(f->t, f->dim, f->rope_dim);
    return DSV4_OK;
}

int dsv4_cpu_check_cmp_rows(const dsv4_cmp_state *cs, int64_t cols, const char *what, dsv4_err *err) {
    dsv4_cpu_kv_fmt f;
    if (!cs->block_table) return dsv4_cpu_kv_fmt_of(&cs->rows, (int64_t)cs->n_slots * cs->max_rows, cols, what, &f, err);
    if (cs->page_rows <= 0 || cs->max_pages <= 0 || (int64_t)cs->max_pages * cs->page_rows < cs->max_rows)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: bad paging (page_rows %d, max_pages %d, max_rows %lld)", what,
                            cs->page_rows, cs->max_pages, (long long)cs->max_rows);
    int rc = dsv4_cpu_kv_fmt_of(&cs->rows, -1, cols, what, &f, err);
    if (!rc && cs->rows.rows % cs->page_rows)
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: %lld rows is not a whole number of pages of %d", what,
                          (long long)cs->rows.rows, cs->page_rows);
    return rc;
}

int dsv4_cpu_check_i32(const dsv4_buf *b, int64_t rows, int64_t cols, const char *what, dsv4_err *err) {
    if (!b || !b->data || b->dtype != DSV4_DT_I32)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: expected an I32 buffer", what);
    if ((rows >= 0 && b->rows != rows) || (cols >= 0 && b->cols != cols))
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: shape [%lld,%lld], expected [%lld,%lld]", what,
                            (long long)b->rows, (long long)b->cols, (long long)rows, (long long)cols);
    return DSV4_OK;
}

static int64_t tview_numel(const dsv4_tview *v) {
    int64_t n = 1;
    for (int i = 0; i < v->ndim; i++) n *= v->shape[i];
    return n;
}

int dsv4_cpu_check_vec(const dsv4_tview *v, int64_t n, const char *what, dsv4_err *err) {
    if (!v || !v->data)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s: missing tensor", what);
    if (v->dtype != DSV4_DT_F32 && v->dtype != DSV4_DT_BF16 && v->dtype != DSV4_DT_F16)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s (%s): dtype %s, expected F32/BF16", what,
                            v->name ? v->name : "-", dsv4_dtype_name(v->dtype));
    if (n >= 0 && tview_numel(v) != n)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: %s (%s): %lld elements, expected %lld", what,
                            v->name ? v->name : "-", (long long)tview_numel(v), (long long)n);
    return DSV4_OK;
}

static void cpu_free(dsv4_backend *be) {
    if (!be) return;
    dsv4_cpu_fill_release(be); /* dummy weights (cpu_fill.c) */
    free(be);
}

static int cpu_buf_alloc(dsv4_backend *be, dsv4_dtype dt, int64_t rows, int64_t cols, dsv4_buf *out,
                         dsv4_err *err) {
    size_t es = dsv4_dtype_size(dt);
    if (!es || rows < 0 || cols < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: buf_alloc: bad dtype or shape [%lld,%lld]",
                            (long long)rows, (long long)cols);
    size_t n = (size_t)rows * (size_t)cols * es;
    out->data = calloc(n ? n : 1, 1);
    if (!out->data)
        return dsv4_err_set(err, DSV4_ENOMEM, "cpu: buf_alloc: %zu bytes", n);
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    return DSV4_OK;
}

static void cpu_buf_free(dsv4_backend *be, dsv4_buf *b) {
    if (!b) return;
    free(b->data);
    b->data = NULL;
}

static size_t buf_bytes(const dsv4_buf *b) {
    return (size_t)b->rows * (size_t)b->cols * dsv4_dtype_size(b->dtype);
}

static int cpu_buf_write(dsv4_backend *be, dsv4_buf *dst, const void *host, dsv4_err *err) {
    if (!dst || !dst->data || !host) return dsv4_err_set(err, DSV4_EINVAL, "cpu: buf_write: NULL");
    memcpy(dst->data, host, buf_bytes(dst));
    return DSV4_OK;
}

static int cpu_buf_read(dsv4_backend *be, const dsv4_buf *src, void *host, dsv4_err *err) {
    if (!src || !src->data || !host) return dsv4_err_set(err, DSV4_EINVAL, "cpu: buf_read: NULL");
    memcpy(host, src->data, buf_bytes(src));
    return DSV4_OK;
}

static int cpu_buf_gather_rows(dsv4_backend *be, const dsv4_buf *src, const int32_t *idx, int n,
                               dsv4_buf *dst, dsv4_err *err) {
    if (!src || !dst || src->dtype != dst->dtype || src->cols != dst->cols || dst->rows < n)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: gather_rows: mismatched buffers");
    size_t rb = (size_t)src->cols * dsv4_dtype_size(src->dtype);
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= src->rows)
            return dsv4_err_set(err, DSV4_EINVAL, "cpu: gather_rows: index %d out of [0,%lld)", idx[i],
                                (long long)src->rows);
        memcpy((char *)dst->data + i * rb, (const char *)src->data + (size_t)idx[i] * rb, rb);
    }
    return DSV4_OK;
}

static int cpu_upload(dsv4_backend *be, const dsv4_tview *host, dsv4_tview *dev, dsv4_err *err) {
    *dev = *host; /* host memory is backend memory */
    return DSV4_OK;
}

static int cpu_batch_begin(dsv4_backend *be, const dsv4_batch *b, dsv4_err *err) {
    for (int s = 0; s < b->n_seqs; s++)
        for (int r = b->cu_seqlens[s]; r < b->cu_seqlens[s + 1]; r++)
            if (b->seq_idx[r] != s || b->slot[r] != b->seq_slot[s] ||
                b->pos[r] != b->seq_pos0[s] + (r - b->cu_seqlens[s]))
                return dsv4_err_set(err, DSV4_EINVAL,
                                    "batch: row %d inconsistent with segment %d (slot/pos/seq_idx)", r, s);
    if (b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_seqs] != b->n_rows)
        return dsv4_err_set(err, DSV4_EINVAL, "batch: cu_seqlens do not cover %d rows", b->n_rows);
    return DSV4_OK;
}

static int cpu_sync(dsv4_backend *be, dsv4_err *err) { return DSV4_OK; }

dsv4_backend *dsv4_backend_cpu_create(dsv4_numerics numerics, dsv4_err *err) {
    dsv4_backend *be = calloc(1, sizeof *be);
    if (!be) {
        dsv4_err_set(err, DSV4_ENOMEM, "cpu backend: out of memory");
        return NULL;
    }
    be->name = "cpu";
    be->numerics = numerics;
    be->act_dtype = DSV4_DT_F32;
    be->free = cpu_free;
    be->buf_alloc = cpu_buf_alloc;
    be->buf_free = cpu_buf_free;
    be->buf_write = cpu_buf_write;
    be->buf_read = cpu_buf_read;
    be->buf_gather_rows = cpu_buf_gather_rows;
    be->upload = cpu_upload;
    be->batch_begin = cpu_batch_begin;
    be->sync = cpu_sync;
    be->embed = dsv4_cpu_embed;
    be->add = dsv4_cpu_add;
    be->rmsnorm = dsv4_cpu_rmsnorm;
    be->rope = dsv4_cpu_rope;
    be->qat_fp8 = dsv4_cpu_qat_fp8;
    be->qat_hadamard_fp4 = dsv4_cpu_qat_hadamard_fp4;
    be->linear = dsv4_cpu_linear;
    be->linear_grouped = dsv4_cpu_linear_grouped;
    be->hc_pre = dsv4_cpu_hc_pre;
    be->hc_post = dsv4_cpu_hc_post;
    be->hc_post_pre_norm = dsv4_cpu_hc_post_pre_norm;
    be->hc_head = dsv4_cpu_hc_head;
    be->hc_mean = dsv4_cpu_hc_mean;
    be->win_store = dsv4_cpu_win_store;
    be->compress = dsv4_cpu_compress;
    be->indexer_select = dsv4_cpu_indexer_select;
    be->attention = dsv4_cpu_attention;
    be->moe_route = dsv4_cpu_moe_route;
    be->moe_experts = dsv4_cpu_moe_experts;
    be->swiglu = dsv4_cpu_swiglu;
    be->fill_dummy = dsv4_cpu_fill_dummy;
    be->logit_top = dsv4_cpu_logit_top;
    return be;
}
