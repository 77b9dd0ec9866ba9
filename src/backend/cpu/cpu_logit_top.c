/*
 * logit_top on the CPU (backend.h; issue 7 "sampling on the device"): the
 * reference the CUDA kernel is held to. The argmax is the host sampler's own
 * scan (src/engine/sampler.c: only a strictly larger value replaces the best),
 * so a greedy step that picks its tokens here emits exactly the tokens the
 * engine's host path would; the log-sum-exp is dsv4_token_logprob_compute's
 * (around the row maximum, summed in double in id order), so the logprobs are
 * bit-identical to the ones the engine computes from a downloaded row.
 */
#include "backend/cpu/cpu_internal.h"

#include <math.h>

/* (a, ia) comes before (b, ib) in "larger value first, ties by lower id". */
static int before(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }

static void top_row(const float *x, int64_t V, int k, int32_t *ids, float *lp) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;
    ids[0] = (int32_t)best;
    /* the rest: repeated selection of the first non-NaN value after the previous pick */
    for (int j = 1; j < k; j++) {
        float pv = x[ids[j - 1]];
        int64_t pi = ids[j - 1], pick = -1;
        int bounded = pi >= 0 && !isnan(pv);
        for (int64_t v = 0; v < V; v++) {
            if (isnan(x[v]) || (bounded && !before(pv, pi, x[v], v))) continue;
            if (pick < 0 || before(x[v], v, x[pick], pick)) pick = v;
        }
        ids[j] = (int32_t)pick; /* -1: the row has no further non-NaN value */
        if (pick < 0)
            for (int i = j + 1; i < k; i++) ids[i] = -1;
        if (pick < 0) break;
    }
    if (!lp) return;
    float mx = x[best];
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += exp((double)x[v] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < k; j++) lp[j] = ids[j] >= 0 ? (float)(x[ids[j]] - lse) : -INFINITY;
}

int dsv4_cpu_logit_top(dsv4_backend *be, const dsv4_buf *x, dsv4_buf *ids, dsv4_buf *lp, dsv4_err *err) {
    int rc = dsv4_cpu_check_f32(x, -1, -1, "logit_top x", err);
    if (!rc) rc = dsv4_cpu_check_i32(ids, x->rows, -1, "logit_top ids", err);
    if (!rc && lp) rc = dsv4_cpu_check_f32(lp, x->rows, ids->cols, "logit_top lp", err);
    if (rc) return rc;
    int64_t V = x->cols, k = ids->cols;
    if (k < 1 || k > DSV4_LOGIT_TOP_MAX || k > V)
        return dsv4_err_set(err, DSV4_EINVAL, "cpu: logit_top: %lld ids per row (1..%d, at most the %lld columns)",
                            (long long)k, DSV4_LOGIT_TOP_MAX, (long long)V);
#pragma omp parallel for schedule(static) if (x->rows > 1 && x->rows * V > DSV4_CPU_PAR_MIN)
    for (int64_t r = 0; r < x->rows; r++)
        top_row((const float *)x->data + r * V, V, (int)k, (int32_t *)ids->data + r * k,
                lp ? (float *)lp->data + r * k : NULL);
    return DSV4_OK;
}
