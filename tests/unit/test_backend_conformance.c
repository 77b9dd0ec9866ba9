/*
 * The backend conformance harness (src/backend/conformance.h) that the CUDA
 * backend will be run through: two CPU backends agree on every op (error 0),
 * and a backend with one wrong op is caught — a RoPE with the rotation sign
 * flipped, a linear that skips the W8A8 activation quantisation of reference
 * numerics, an attention without the sink, an attention that ignores the
 * block table of paged compressed rows. Also the batch / state layouts of the
 * GPU run: paged rows, verify-shaped segments, long chunks, ratio 128.
 */
#include "backend/conformance.h"
#include "model/kvcodec.h"
#include "backend/cpu/cpu_internal.h"
#include "test.h"

static int bad_rope(dsv4_backend *be, dsv4_buf *x, int hd, const dsv4_rope *r, const dsv4_batch *b, int inv,
                    dsv4_err *err) {
    return dsv4_cpu_rope(be, x, hd, r, b, !inv, err);
}

static int bad_linear(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y, dsv4_err *err) {
    dsv4_numerics n = be->numerics;
    be->numerics = DSV4_NUMERICS_HF; /* forgets W8A8 */
    int rc = dsv4_cpu_linear(be, x, w, y, err);
    be->numerics = n;
    return rc;
}

static int bad_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                         const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int nh,
                         const dsv4_batch *b, dsv4_buf *o, dsv4_err *err) {
    static float very_negative[256];
    for (int i = 0; i < nh && i < 256; i++) very_negative[i] = -1e30f; /* sink weight 0 */
    dsv4_tview none = *sinks;
    none.dtype = DSV4_DT_F32;
    none.data = very_negative;
    return dsv4_cpu_attention(be, q, kv, ws, cs, sel, &none, nh, b, o, err);
}

/* Reads paged rows as if unpaged within the paged buffer (slot*max_pages*page_rows + w): wrong rows, and
 * NaN ones from spare pages. */
static int paging_blind_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                                  const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int nh,
                                  const dsv4_batch *b, dsv4_buf *o, dsv4_err *err) {
    if (!cs || !cs->block_table) return dsv4_cpu_attention(be, q, kv, ws, cs, sel, sinks, nh, b, o, err);
    dsv4_cmp_state blind = *cs;
    blind.block_table = NULL;
    blind.max_rows = (int64_t)cs->max_pages * cs->page_rows;
    blind.rows.rows = (int64_t)cs->n_slots * blind.max_rows;
    if (blind.rows.rows > cs->rows.rows) return dsv4_err_set(err, DSV4_EINVAL, "paged buffer too small to misread");
    return dsv4_cpu_attention(be, q, kv, ws, &blind, sel, sinks, nh, b, o, err);
}

/* An op a backend has not implemented yet: the harness reports it and goes on. */
static int no_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                       const dsv4_tview *ape, const dsv4_tview *nw, float eps, const dsv4_rope *r, dsv4_qat q,
                       const dsv4_batch *b, dsv4_err *err) {
    return dsv4_err_set(err, DSV4_EUNSUPPORTED, "compress: not implemented");
}

int main(void) {
    dsv4_err e = {0};
    dsv4_conf_shape sh;
    dsv4_conf_shape_tiny(&sh);
    for (int num = 0; num < 2; num++) {
        dsv4_numerics n = num ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE;
        dsv4_backend *ref = dsv4_backend_cpu_create(n, &e), *test = dsv4_backend_cpu_create(n, &e);
        int fails = dsv4_backend_conformance(test, ref, &sh, 1e-6, 7, num ? NULL : stdout, &e);
        CHECK_MSG(fails == 0, "cpu vs cpu (%s): %d ops differ (%s)", num ? "hf" : "reference", fails, e.msg);
        test->free(test);
        ref->free(ref);
    }
    for (int k = 0; k < 3; k++) {
        dsv4_backend *ref = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
        dsv4_backend *test = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
        if (k == 0) test->rope = bad_rope;
        if (k == 1) test->linear = bad_linear;
        if (k == 2) test->attention = bad_attention;
        int fails = dsv4_backend_conformance(test, ref, &sh, 1e-3, 7, NULL, &e);
        CHECK_MSG(fails >= 1, "broken op %d was not caught (%d, %s)", k, fails, e.msg);
        test->free(test);
        ref->free(ref);
    }
    {
        /* unsupported compress: skipped (its outputs copied from the reference), every later op
         * still compared and equal; a broken rope is still caught in the same run */
        dsv4_backend *ref = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
        dsv4_backend *test = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
        test->compress = no_compress;
        int fails = dsv4_backend_conformance(test, ref, &sh, 1e-6, 7, NULL, &e);
        CHECK_MSG(fails == 0, "unsupported op: %d failures (%s)", fails, e.msg);
        test->rope = bad_rope;
        fails = dsv4_backend_conformance(test, ref, &sh, 1e-3, 7, NULL, &e);
        CHECK_MSG(fails >= 1, "broken rope next to an unsupported op not caught (%d, %s)", fails, e.msg);
        test->free(test);
        ref->free(ref);
    }
    {
        /* the attention-state layouts the CUDA backend is run with (tests/gpu/gpu_conformance.c): a
         * paged test side (shuffled block table, NaN in spare pages, unmapped tail pages) against the
         * unpaged reference, verify-shaped segments of 6 rows, a chunk longer than the rings crossing
         * many compressor windows, ratio 128. Paging only moves rows: the results must be identical. */
        static const struct { int rows, seg, pos0, ratio, paged; } L[] = {
            {24, 0, 0, 0, 1}, {24, 6, 300, 0, 1}, {300, 0, 0, 0, 0}, {300, 0, 0, 128, 1}, {24, 6, 1000, 128, 0}};
        /* each layout with the window / main compressed rows stored as f32, bf16 and fp8_ds_mla records
         * (--kv-cache-dtype; the CUDA harness runs the same three) */
        for (size_t i = 0, kv = 0; i < sizeof L / sizeof L[0]; kv = (kv + 1) % 3, i += kv == 0) {
            dsv4_conf_shape ls;
            dsv4_conf_shape_tiny(&ls);
            ls.kv_dtype = (int)kv;
            ls.rows = L[i].rows;
            ls.seg_rows = L[i].seg;
            ls.pos0 = L[i].pos0;
            ls.ratio = L[i].ratio;
            ls.paged = L[i].paged;
            dsv4_backend *ref = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
            dsv4_backend *test = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &e);
            int fails = dsv4_backend_conformance(test, ref, &ls, 0.0, 7, NULL, &e);
            CHECK_MSG(fails == 0, "layout %zu (rows %d, seg %d, pos0 %d, ratio %d, paged %d, kv %s): %d (%s)", i,
                      L[i].rows, L[i].seg, L[i].pos0, L[i].ratio, L[i].paged, dsv4_kv_dtype_name((dsv4_kv_dtype)kv),
                      fails, e.msg);
            /* and a paged attention that ignores the block table reads the NaN spare pages: caught */
            if (L[i].paged) {
                test->attention = paging_blind_attention;
                fails = dsv4_backend_conformance(test, ref, &ls, 1e-3, 7, NULL, &e);
                CHECK_MSG(fails >= 1, "layout %zu (kv %s): attention blind to the block table not caught (%d, %s)", i,
                          dsv4_kv_dtype_name((dsv4_kv_dtype)kv), fails, e.msg);
            }
            test->free(test);
            ref->free(ref);
        }
    }
    return TEST_REPORT();
}
