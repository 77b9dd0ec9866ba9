/*
 * Mixture of experts (spec/MODEL.md §3.5): the sqrt-softplus router with
 * bias-corrected top-k or hash routing, and the routed experts with the
 * clamped SwiGLU, executed grouped by expert (gather the rows that chose an
 * expert, run its three linears once on them, scatter back).
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int dsv4_cpu_moe_route(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *gate,
                       const dsv4_tview *bias, const dsv4_tview *tid2eid, int k, float route_scale,
                       const dsv4_batch *b, dsv4_buf *ids, dsv4_buf *weights, dsv4_err *err) {
    int T = b->n_rows;
    int64_t E = gate->out;
    int rc = dsv4_cpu_check_f32(x, T, gate->in, "moe_route x", err);
    if (!rc) rc = dsv4_cpu_check_i32(ids, T, k, "moe ids", err);
    if (!rc) rc = dsv4_cpu_check_f32(weights, T, k, "moe weights", err);
    if (!rc && (k <= 0 || k > E)) rc = dsv4_err_set(err, DSV4_EINVAL, "moe_route: k %d of %lld experts", k, (long long)E);
    if (!rc && bias && bias->data) rc = dsv4_cpu_check_vec(bias, E, "gate.bias", err);
    if (!rc && tid2eid && tid2eid->data &&
        (tid2eid->dtype != DSV4_DT_I64 || tid2eid->ndim != 2 || tid2eid->shape[1] != k))
        rc = dsv4_err_set(err, DSV4_EINVAL, "moe_route: tid2eid must be I64 [V][%d]", k);
    if (rc) return rc;
    float *a = malloc((size_t)T * E * sizeof(float));
    if (!a) return dsv4_err_set(err, DSV4_ENOMEM, "cpu: moe_route: out of memory");
    rc = dsv4_cpu_matmul(x->data, T, gate, a, 0, err); /* router logits in fp32 */
    if (rc) {
        free(a);
        return rc;
    }
    for (int64_t i = 0; i < (int64_t)T * E; i++) a[i] = sqrtf(softplusf(a[i]));
    int hash = tid2eid && tid2eid->data;
    for (int t = 0; t < T && !rc; t++) {
        const float *at = a + (int64_t)t * E;
        int32_t *id = (int32_t *)ids->data + (int64_t)t * k;
        if (hash) {
            int64_t tok = b->token[t];
            if (tok < 0 || tok >= tid2eid->shape[0]) {
                rc = dsv4_err_set(err, DSV4_EINVAL, "moe_route: token %lld outside tid2eid", (long long)tok);
                break;
            }
            for (int j = 0; j < k; j++) {
                int64_t e;
                memcpy(&e, (const char *)tid2eid->data + 8 * (tok * k + j), 8); /* may be unaligned */
                if (e < 0 || e >= E) {
                    rc = dsv4_err_set(err, DSV4_EINVAL, "moe_route: tid2eid[%lld] = %lld not an expert",
                                      (long long)tok, (long long)e);
                    break;
                }
                id[j] = (int32_t)e;
            }
        } else {
            /* top-k of a + bias; the bias only picks, it never weighs. Ties -> lower id. */
            for (int j = 0; j < k; j++) {
                int best = -1;
                float bv = -INFINITY;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int jj = 0; jj < j; jj++) taken |= id[jj] == e;
                    if (taken) continue;
                    float v = at[e] + (bias && bias->data ? dsv4_cpu_load_f(bias->data, bias->dtype, e) : 0.0f);
                    if (best < 0 || v > bv) {
                        best = e;
                        bv = v;
                    }
                }
                id[j] = best;
            }
        }
        if (rc) break;
        float s = 0;
        for (int j = 0; j < k; j++) s += at[id[j]];
        float *wt = (float *)weights->data + (int64_t)t * k;
        for (int j = 0; j < k; j++) wt[j] = at[id[j]] / s * route_scale;
    }
    free(a);
    return rc;
}

int dsv4_cpu_moe_experts(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1,
                         const dsv4_linear *w3, const dsv4_linear *w2, int n_exp,
                         const dsv4_buf *ids, const dsv4_buf *weights, float limit, dsv4_buf *y,
                         dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, -1, "moe x", err);
    if (rc) return rc;
    int64_t T = x->rows, d = x->cols;
    rc = dsv4_cpu_check_i32(ids, T, -1, "moe ids", err);
    if (!rc) rc = dsv4_cpu_check_f32(weights, T, ids->cols, "moe weights", err);
    if (!rc) rc = dsv4_cpu_check_f32(y, T, d, "moe y", err);
    if (rc) return rc;
    int k = (int)ids->cols, ref = be->numerics == DSV4_NUMERICS_REFERENCE;
    int64_t F = w1[0].out;
    memset(y->data, 0, (size_t)(T * d) * sizeof(float));
    float *xg = malloc((size_t)(T * d) * sizeof(float)), *g = malloc((size_t)(T * F) * sizeof(float));
    float *u = malloc((size_t)(T * F) * sizeof(float)), *o = malloc((size_t)(T * d) * sizeof(float));
    int64_t *rows = malloc((size_t)T * sizeof *rows);
    float *rw = malloc((size_t)T * sizeof *rw);
    if (!xg || !g || !u || !o || !rows || !rw) rc = dsv4_err_set(err, DSV4_ENOMEM, "cpu: moe: out of memory");
    for (int e = 0; e < n_exp && !rc; e++) {
        int64_t n = 0; /* gather the rows routed to e */
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (((const int32_t *)ids->data)[t * k + j] == e) {
                    rows[n] = t;
                    rw[n] = ((const float *)weights->data)[t * k + j];
                    memcpy(xg + n * d, (const float *)x->data + t * d, d * sizeof(float));
                    n++;
                }
        if (!n) continue;
        if (w1[e].in != d || w3[e].in != d || w1[e].out != F || w3[e].out != F || w2[e].in != F || w2[e].out != d) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "moe: expert %d weight shapes do not match d=%lld, F=%lld", e,
                              (long long)d, (long long)F);
            break;
        }
        rc = dsv4_cpu_matmul(xg, n, &w1[e], g, ref, err);
        if (!rc) rc = dsv4_cpu_matmul(xg, n, &w3[e], u, ref, err);
        if (rc) break;
        /* official: routing weight applied to h before w2 */
        for (int64_t i = 0; i < n; i++)
            for (int64_t f = 0; f < F; f++) g[i * F + f] = rw[i] * dsv4_cpu_swiglu1(g[i * F + f], u[i * F + f], limit);
        rc = dsv4_cpu_matmul(g, n, &w2[e], o, ref, err);
        for (int64_t i = 0; i < n && !rc; i++) {
            float *yr = (float *)y->data + rows[i] * d;
            for (int64_t c = 0; c < d; c++) yr[c] += o[i * d + c];
        }
    }
    for (int64_t t = 0; t < T && !rc; t++)
        for (int j = 0; j < k; j++) {
            int32_t e = ((const int32_t *)ids->data)[t * k + j];
            if (e < 0 || e >= n_exp) {
                rc = dsv4_err_set(err, DSV4_EINVAL, "moe: row %lld routed to expert %d of %d", (long long)t, e, n_exp);
                break;
            }
        }
    free(xg); free(g); free(u); free(o); free(rows); free(rw);
    return rc;
}
