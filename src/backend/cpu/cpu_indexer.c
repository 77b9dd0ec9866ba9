/*
 * Lightning-indexer top-k selection (spec/MODEL.md §3.4.6): for each query
 * row, score every visible index key w < (p+1)/ratio as
 * Σ_h g_h · ReLU(qi_h · k_w) and keep the best `topk`. fp32 scores (the
 * official bf16 score rounding only moves near-ties, §6.6 D8). Ties break
 * towards the lower row index; the kept rows are listed in ascending order.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct { float s; int32_t w; } scored;

/* Descending score, then ascending row. */
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->w > y->w) - (x->w < y->w);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int dsv4_cpu_indexer_select(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float g_scale,
                            const dsv4_cmp_state *idx, int topk, const dsv4_batch *b,
                            dsv4_buf *sel, dsv4_err *err) {
    int T = b->n_rows;
    int rc = dsv4_cpu_check_f32(g, T, -1, "indexer g", err);
    if (rc) return rc;
    int64_t H = g->cols, dk = idx->out_dim;
    rc = dsv4_cpu_check_f32(qi, T, H * dk, "indexer q", err);
    if (!rc) rc = dsv4_cpu_check_i32(sel, T, topk, "indexer sel", err);
    if (!rc) rc = dsv4_cpu_check_cmp_rows(idx, dk, "index keys", err);
    if (!rc && idx->rows.dtype != DSV4_DT_F32) /* index keys are always stored as f32 */
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: index keys: dtype %s, expected F32", dsv4_dtype_name(idx->rows.dtype));
    if (rc) return rc;
    int fail = 0, unmapped = 0;
#pragma omp parallel for schedule(dynamic) if ((int64_t)T * H * dk * idx->max_rows > DSV4_CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        int32_t *out = (int32_t *)sel->data + (int64_t)t * topk;
        int64_t nvis = (b->pos[t] + 1) / idx->ratio;
        if (nvis > idx->max_rows) nvis = idx->max_rows;
        for (int j = 0; j < topk; j++) out[j] = -1;
        if (nvis <= topk) { /* everything visible is kept: no scores needed */
            for (int64_t w = 0; w < nvis; w++) out[w] = (int32_t)w;
            continue;
        }
        scored *sc = malloc((size_t)nvis * sizeof *sc);
        if (!sc) {
#pragma omp atomic write
            fail = 1;
            continue;
        }
        const float *q = (const float *)qi->data + (int64_t)t * H * dk, *gw = (const float *)g->data + (int64_t)t * H;
        for (int64_t w = 0; w < nvis; w++) {
            int64_t ri = dsv4_cpu_cmp_index(idx, b->slot[t], w); /* via the block table */
            const float *key = ri < 0 ? NULL : (const float *)idx->rows.data + ri * dk;
            float total = 0;
            if (!key) {
#pragma omp atomic write
                unmapped = 1;
                total = -INFINITY;
            }
            for (int64_t h = 0; h < H && key; h++) {
                float dot = dsv4_cpu_dot(q + h * dk, key, dk);
                total += g_scale * gw[h] * (dot > 0 ? dot : 0);
            }
            sc[w].s = total;
            sc[w].w = (int32_t)w;
        }
        qsort(sc, (size_t)nvis, sizeof *sc, cmp_scored);
        for (int j = 0; j < topk; j++) out[j] = sc[j].w;
        qsort(out, (size_t)topk, sizeof *out, cmp_i32);
        free(sc);
    }
    if (fail) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: indexer_select: out of memory");
    if (unmapped) return dsv4_err_set(err, DSV4_ERANGE, "cpu: indexer_select: a visible index key is on an unmapped page");
    return DSV4_OK;
}
