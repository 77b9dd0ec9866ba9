/*
 * Hyper-connections (mHC): the pre step (mixes + Sinkhorn + collapse), the
 * post step (expand + mix) and the final head collapse
 * (spec/MODEL.md §3.2, §3.3, §3.6). All fp32.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* m[k] = (fn[k] · x) · (mean(x²) + eps)^-½ for k < n_out; x is the flat n-vector of streams. */
static void hc_mixes(const float *x, int64_t n, const dsv4_tview *fn, int n_out, float eps, float *m) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    float *row = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < n_out; k++) {
        /* fp32 accumulate, like the official fp32 GEMM; the row is copied out first because
         * checkpoint F32 tensors need not be 4-byte aligned */
        if (row && fn->dtype == DSV4_DT_F32) {
            memcpy(row, (const char *)fn->data + (size_t)(k * n) * sizeof(float), (size_t)n * sizeof(float));
            m[k] = dsv4_cpu_dot(row, x, n) * r;
        } else {
            float acc = 0;
            for (int64_t i = 0; i < n; i++) acc += dsv4_cpu_load_f(fn->data, fn->dtype, k * n + i) * x[i];
            m[k] = acc * r;
        }
    }
    free(row);
}

/*
 * Sinkhorn projection of the n×n logits L (row-major) in place (§3.2.4):
 * row softmax + eps, one column normalisation, then (iters−1) × (row, column).
 */
static void sinkhorn(float *C, int n, int iters, float eps) {
    for (int i = 0; i < n; i++) {
        float mx = -INFINITY, s = 0;
        for (int j = 0; j < n; j++) mx = fmaxf(mx, C[i * n + j]);
        for (int j = 0; j < n; j++) s += C[i * n + j] = expf(C[i * n + j] - mx);
        for (int j = 0; j < n; j++) C[i * n + j] = C[i * n + j] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int i = 0; i < n; i++) {
                float s = 0;
                for (int j = 0; j < n; j++) s += C[i * n + j];
                for (int j = 0; j < n; j++) C[i * n + j] /= s + eps;
            }
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int i = 0; i < n; i++) s += C[i * n + j];
            for (int i = 0; i < n; i++) C[i * n + j] /= s + eps;
        }
    }
}

int dsv4_cpu_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                    const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y,
                    dsv4_buf *post, dsv4_buf *comb, dsv4_err *err) {
    if (n_hc <= 0 || n_hc > 16 || iters < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_pre: n_hc %d / iters %d", n_hc, iters);
    int n_mix = n_hc * (2 + n_hc);
    int rc = dsv4_cpu_check_f32(X, -1, -1, "hc_pre X", err);
    if (!rc && X->cols % n_hc) rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_pre: cols %% n_hc");
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc;
    if (!rc) rc = dsv4_cpu_check_vec(fn, (int64_t)n_mix * n, "hc fn", err);
    if (!rc) rc = dsv4_cpu_check_vec(base, n_mix, "hc base", err);
    if (!rc) rc = dsv4_cpu_check_vec(scale, 3, "hc scale", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, T, d, "hc_pre y", err);
    if (!rc) rc = dsv4_cpu_check_f32(post, T, n_hc, "hc_pre post", err);
    if (!rc) rc = dsv4_cpu_check_f32(comb, T, n_hc * n_hc, "hc_pre comb", err);
    if (rc) return rc;
    float sc[3];
    for (int i = 0; i < 3; i++) sc[i] = dsv4_cpu_load_f(scale->data, scale->dtype, i);
#pragma omp parallel for schedule(static) if (T * X->cols * 8 > DSV4_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const float *x = (const float *)X->data + t * n;
        float m[16 * 18], pre[16];
        hc_mixes(x, n, fn, n_mix, eps, m);
        float *po = (float *)post->data + t * n_hc, *C = (float *)comb->data + t * n_hc * n_hc;
        for (int h = 0; h < n_hc; h++) {
            pre[h] = sigmoidf(m[h] * sc[0] + dsv4_cpu_load_f(base->data, base->dtype, h)) + eps;
            po[h] = 2.0f * sigmoidf(m[n_hc + h] * sc[1] + dsv4_cpu_load_f(base->data, base->dtype, n_hc + h));
        }
        for (int k = 0; k < n_hc * n_hc; k++)
            C[k] = m[2 * n_hc + k] * sc[2] + dsv4_cpu_load_f(base->data, base->dtype, 2 * n_hc + k);
        sinkhorn(C, n_hc, iters, eps);
        float *yo = (float *)y->data + t * d;
        for (int64_t i = 0; i < d; i++) {
            float acc = 0;
            for (int h = 0; h < n_hc; h++) acc += pre[h] * x[h * d + i];
            yo[i] = acc;
        }
    }
    return DSV4_OK;
}

int dsv4_cpu_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                     const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(X, -1, -1, "hc_post X", err);
    if (rc) return rc;
    int64_t T = X->rows, d = X->cols / n_hc;
    rc = dsv4_cpu_check_f32(f, T, d, "hc_post f", err);
    if (!rc) rc = dsv4_cpu_check_f32(post, T, n_hc, "hc_post post", err);
    if (!rc) rc = dsv4_cpu_check_f32(comb, T, n_hc * n_hc, "hc_post comb", err);
    if (!rc) rc = dsv4_cpu_check_f32(Xout, T, X->cols, "hc_post Xout", err);
    if (!rc && Xout->data == X->data) rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_post: Xout aliases X");
    if (rc) return rc;
#pragma omp parallel for schedule(static) if (T * X->cols * 8 > DSV4_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const float *x = (const float *)X->data + t * n_hc * d, *fr = (const float *)f->data + t * d;
        const float *po = (const float *)post->data + t * n_hc, *C = (const float *)comb->data + t * n_hc * n_hc;
        float *xo = (float *)Xout->data + t * n_hc * d;
        for (int j = 0; j < n_hc; j++)
            for (int64_t k = 0; k < d; k++) {
                float acc = po[j] * fr[k];
                for (int i = 0; i < n_hc; i++) acc += C[i * n_hc + j] * x[i * d + k]; /* Cᵀ X */
                xo[j * d + k] = acc;
            }
    }
    return DSV4_OK;
}

/* hc_post, then hc_pre and the norm on its output: the ops composed (backend.h hc_post_pre_norm). On
 * the CPU nothing is gained by fusing; having the op makes the forward carry each block's last hc_post
 * into the next block here too, so the CPU tests run the carry path the GPU takes. */
int dsv4_cpu_hc_post_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                              const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_tview *fn,
                              const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps,
                              const dsv4_tview *norm, float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                              dsv4_err *err) {
    if (!X || !f || !post_in || !comb_in || !Xout || !y || !post || !comb || !norm)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_post_pre_norm: NULL argument");
    if (post->data == post_in->data || comb->data == comb_in->data || y->data == f->data)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_post_pre_norm: post / comb / y alias the hc_post inputs");
    int rc = dsv4_cpu_hc_post(be, X, f, post_in, comb_in, n_hc, Xout, err);
    if (!rc) rc = dsv4_cpu_hc_pre(be, Xout, fn, base, scale, n_hc, iters, eps, y, post, comb, err);
    return rc ? rc : dsv4_cpu_rmsnorm(be, y, norm, (int)y->cols, norm_eps, y, err);
}

int dsv4_cpu_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                     const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(X, -1, -1, "hc_head X", err);
    if (!rc && (n_hc <= 0 || n_hc > 16 || X->cols % n_hc))
        rc = dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_head: n_hc %d", n_hc);
    if (rc) return rc;
    int64_t T = X->rows, n = X->cols, d = n / n_hc;
    rc = dsv4_cpu_check_vec(fn, n_hc * n, "hc_head fn", err);
    if (!rc) rc = dsv4_cpu_check_vec(base, n_hc, "hc_head base", err);
    if (!rc) rc = dsv4_cpu_check_vec(scale, 1, "hc_head scale", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, T, d, "hc_head y", err);
    if (rc) return rc;
    float sc = dsv4_cpu_load_f(scale->data, scale->dtype, 0);
#pragma omp parallel for schedule(static) if (T * X->cols * 8 > DSV4_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const float *x = (const float *)X->data + t * n;
        float m[16], pre[16];
        hc_mixes(x, n, fn, n_hc, eps, m);
        for (int h = 0; h < n_hc; h++)
            pre[h] = sigmoidf(m[h] * sc + dsv4_cpu_load_f(base->data, base->dtype, h)) + eps;
        float *yo = (float *)y->data + t * d;
        for (int64_t i = 0; i < d; i++) {
            float acc = 0;
            for (int h = 0; h < n_hc; h++) acc += pre[h] * x[h * d + i];
            yo[i] = acc;
        }
    }
    return DSV4_OK;
}

/*
 * y[t][col0 + k] = (Σ_h X[t][h·d + k]) / n_hc, h in stream order — the DSpark
 * context features of one tap layer (spec/DSPARK.md §2.2; backend.h hc_mean).
 * X F32 [T][n_hc·d], y F32 [T][>= col0 + d]. The same sums as the forward's
 * host fallback (model/forward.c tap_mean) and the CUDA kernel k_hc_mean.
 * Errors: DSV4_EINVAL for dtypes, row counts or columns that do not fit.
 */
int dsv4_cpu_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err) {
    (void)be;
    if (X->dtype != DSV4_DT_F32 || y->dtype != DSV4_DT_F32 || y->rows != X->rows || n_hc <= 0 || X->cols % n_hc)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_mean: X %lldx%lld, y %lldx%lld, %d streams",
                            (long long)X->rows, (long long)X->cols, (long long)y->rows, (long long)y->cols, n_hc);
    const int64_t d = X->cols / n_hc;
    if (col0 < 0 || col0 + d > y->cols)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: hc_mean: columns [%lld,%lld) outside y (%lld)", (long long)col0,
                            (long long)(col0 + d), (long long)y->cols);
    for (int64_t t = 0; t < X->rows; t++) {
        const float *x = (const float *)X->data + t * X->cols;
        float *o = (float *)y->data + t * y->cols + col0;
        for (int64_t k = 0; k < d; k++) {
            float acc = 0;
            for (int h = 0; h < n_hc; h++) acc += x[h * d + k];
            o[k] = acc / n_hc;
        }
    }
    return DSV4_OK;
}
