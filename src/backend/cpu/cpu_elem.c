/*
 * Row-wise ops: embedding, add, RMSNorm, RoPE, the QAT round-trips and the
 * clamped SwiGLU (spec/MODEL.md §0, §3.1, §3.4.1-3.4.3, §3.4.6, §3.5).
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <string.h>

int dsv4_cpu_embed(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                   dsv4_buf *out, dsv4_err *err) {
    if (!table || table->ndim != 2 || (table->dtype != DSV4_DT_BF16 && table->dtype != DSV4_DT_F32))
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: embed: table must be BF16/F32 [V][d]");
    int64_t V = table->shape[0], d = table->shape[1];
    int rc = dsv4_cpu_check_f32(out, b->n_rows, d * n_copies, "embed out", err);
    if (rc) return rc;
    float *o = out->data;
    for (int t = 0; t < b->n_rows; t++) {
        int tok = b->token[t];
        if (tok < 0 || tok >= V)
            return dsv4_err_set(err, DSV4_EINVAL, "embed: token id %d at row %d outside vocabulary [0,%lld)",
                                tok, t, (long long)V);
        float *row = o + (size_t)t * d * n_copies;
        for (int64_t i = 0; i < d; i++) row[i] = dsv4_cpu_load_f(table->data, table->dtype, tok * d + i);
        for (int c = 1; c < n_copies; c++) memcpy(row + c * d, row, d * sizeof(float));
    }
    return DSV4_OK;
}

int dsv4_cpu_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(a, -1, -1, "add a", err);
    if (!rc) rc = dsv4_cpu_check_f32(b, a->rows, a->cols, "add b", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, a->rows, a->cols, "add y", err);
    if (rc) return rc;
    const float *pa = a->data, *pb = b->data;
    float *py = y->data;
    for (int64_t i = 0; i < a->rows * a->cols; i++) py[i] = pa[i] + pb[i];
    return DSV4_OK;
}

int dsv4_cpu_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group,
                     float eps, dsv4_buf *y, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, -1, "rmsnorm x", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, x->rows, x->cols, "rmsnorm y", err);
    if (!rc && (group <= 0 || x->cols % group))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: rmsnorm: group %d does not divide %lld", group,
                          (long long)x->cols);
    if (!rc && weight) rc = dsv4_cpu_check_vec(weight, group, "rmsnorm weight", err);
    if (rc) return rc;
    int64_t ng = x->rows * (x->cols / group);
#pragma omp parallel for schedule(static) if (x->rows * x->cols > DSV4_CPU_PAR_MIN)
    for (int64_t gi = 0; gi < ng; gi++) {
        const float *xi = (const float *)x->data + gi * group;
        float *yi = (float *)y->data + gi * group;
        double ss = 0;
        for (int i = 0; i < group; i++) ss += (double)xi[i] * xi[i];
        float r = (float)(1.0 / sqrt(ss / group + eps));
        for (int i = 0; i < group; i++) {
            float w = weight ? dsv4_cpu_load_f(weight->data, weight->dtype, i) : 1.0f;
            yi[i] = xi[i] * r * w;
        }
    }
    return DSV4_OK;
}

/* Rotate the last rope_dim dims of one head: pairs (2i, 2i+1), interleaved (§3.4.3). */
void dsv4_cpu_rope_row(float *head, int head_dim, const dsv4_rope *rope, int64_t pos, int inverse) {
    float *r = head + head_dim - rope->rope_dim;
    for (int i = 0; i < rope->rope_dim / 2; i++) {
        /* angle in fp32 as the official table does (p·ω rounded once) */
        float ang = (float)pos * rope->freq[i];
        float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
        float a = r[2 * i], bb = r[2 * i + 1];
        r[2 * i] = a * c - bb * s;
        r[2 * i + 1] = a * s + bb * c;
    }
}

int dsv4_cpu_rope(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                  const dsv4_batch *b, int inverse, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, b->n_rows, -1, "rope x", err);
    if (!rc && (head_dim <= 0 || x->cols % head_dim || rope->rope_dim > head_dim))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: rope: head_dim %d vs cols %lld / rope_dim %d",
                          head_dim, (long long)x->cols, rope->rope_dim);
    if (rc) return rc;
    int64_t nh = x->cols / head_dim;
#pragma omp parallel for schedule(static) if (x->rows * x->cols > DSV4_CPU_PAR_MIN)
    for (int t = 0; t < b->n_rows; t++)
        for (int64_t h = 0; h < nh; h++)
            dsv4_cpu_rope_row((float *)x->data + (t * nh + h) * head_dim, head_dim, rope, b->pos[t],
                              inverse);
    return DSV4_OK;
}

int dsv4_cpu_qat_fp8(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block,
                     dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, -1, "qat_fp8 x", err);
    if (!rc && (head_dim <= 0 || x->cols % head_dim || block <= 0 || n_quant % block || n_quant > head_dim))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: qat_fp8: head_dim %d, n_quant %d, block %d", head_dim,
                          n_quant, block);
    if (rc) return rc;
    int64_t nheads = x->rows * (x->cols / head_dim);
    for (int64_t h = 0; h < nheads; h++)
        for (int k = 0; k < n_quant; k += block)
            dsv4_cpu_fp8_roundtrip((float *)x->data + h * head_dim + k, block);
    return DSV4_OK;
}

int dsv4_cpu_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, -1, "qat_hadamard_fp4 x", err);
    if (!rc && (head_dim < 32 || (head_dim & (head_dim - 1)) || x->cols % head_dim))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: qat_hadamard_fp4: head_dim %d not a power of two >= 32",
                          head_dim);
    if (rc) return rc;
    int64_t nheads = x->rows * (x->cols / head_dim);
    for (int64_t h = 0; h < nheads; h++) {
        float *v = (float *)x->data + h * head_dim;
        dsv4_cpu_hadamard(v, head_dim);
        for (int k = 0; k < head_dim; k += 32) dsv4_cpu_fp4_roundtrip(v + k, 32);
    }
    return DSV4_OK;
}

float dsv4_cpu_swiglu1(float g, float u, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g / (1.0f + expf(-g)) * u;
}

int dsv4_cpu_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                    dsv4_buf *h, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(g, -1, -1, "swiglu g", err);
    if (!rc) rc = dsv4_cpu_check_f32(u, g->rows, g->cols, "swiglu u", err);
    if (!rc) rc = dsv4_cpu_check_f32(h, g->rows, g->cols, "swiglu h", err);
    if (rc) return rc;
    const float *pg = g->data, *pu = u->data;
    float *ph = h->data;
    for (int64_t i = 0; i < g->rows * g->cols; i++) ph[i] = dsv4_cpu_swiglu1(pg[i], pu[i], limit);
    return DSV4_OK;
}
