/*
 * CPU MoE ops against direct math (spec/MODEL.md §3.5): sqrt-softplus router
 * with bias-only selection and hash routing; grouped experts with the
 * clamped SwiGLU and the routing weight applied before w2; shared SwiGLU.
 */
#include "backend/cpu/cpu_internal.h"
#include "cpu_test_util.h"
#include "test.h"

#include <math.h>

static dsv4_backend *be;
enum { T = 5, DM = 16, E = 6, K = 2, F = 8 };

static double sp(double x) { return log1p(exp(x)); }

static void test_route(void) {
    static float gw[E * DM], bias[E];
    tu_fill(gw, E * DM, 1);
    tu_fill(bias, E, 2); /* large bias: selection differs from plain top-k of a */
    dsv4_linear gate = {.w = tu_view(DSV4_DT_F32, gw, 2, E, DM), .out = E, .in = DM};
    dsv4_tview bv = tu_view(DSV4_DT_F32, bias, 1, E, 0);
    tu_batch tb;
    tu_batch_init(&tb);
    int32_t toks[T] = {3, 1, 4, 1, 5};
    tu_batch_add(&tb, 0, 0, T, toks);
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, T, DM), ids = tu_buf(be, DSV4_DT_I32, T, K), wts = tu_buf(be, DSV4_DT_F32, T, K);
    tu_fill(tu_f(&x), T * DM, 2);
    CHECK_EQ_INT(be->moe_route(be, &x, &gate, &bv, NULL, K, 1.5f, &tb.b, &ids, &wts, NULL), 0);
    int ok = 1;
    double wd = 0;
    for (int t = 0; t < T; t++) {
        double a[E], sel[E];
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int k = 0; k < DM; k++) l += (double)gw[e * DM + k] * tu_f(&x)[t * DM + k];
            a[e] = sqrt(sp(l));
            sel[e] = a[e] + bias[e];
        }
        const int32_t *id = (const int32_t *)ids.data + t * K;
        for (int e = 0; e < E; e++) /* every unpicked expert scores below every picked one */
            if (e != id[0] && e != id[1] && (sel[e] > sel[id[0]] || sel[e] > sel[id[1]])) ok = 0;
        double s = a[id[0]] + a[id[1]];
        for (int j = 0; j < K; j++) wd = fmax(wd, fabs(tu_f(&wts)[t * K + j] - 1.5 * a[id[j]] / s));
    }
    CHECK(ok);
    CHECK_NEAR(wd, 0, 1e-5);
    /* hash routing: ids from tid2eid[token], weights still from the unbiased affinities */
    static int64_t t2e[8 * K];
    for (int v = 0; v < 8; v++) {
        t2e[v * K] = v % E;
        t2e[v * K + 1] = (v + 2) % E;
    }
    dsv4_tview hv = tu_view(DSV4_DT_I64, t2e, 2, 8, K);
    CHECK_EQ_INT(be->moe_route(be, &x, &gate, NULL, &hv, K, 1.5f, &tb.b, &ids, &wts, NULL), 0);
    CHECK_EQ_INT(((int32_t *)ids.data)[0], 3);
    CHECK_EQ_INT(((int32_t *)ids.data)[1], 5);
    CHECK_NEAR(tu_f(&wts)[0] + tu_f(&wts)[1], 1.5, 1e-5);
    toks[2] = 99;
    tu_batch_init(&tb);
    tu_batch_add(&tb, 0, 0, T, toks);
    dsv4_err e = {0};
    CHECK(be->moe_route(be, &x, &gate, NULL, &hv, K, 1.5f, &tb.b, &ids, &wts, &e) == DSV4_EINVAL);
    CHECK_CONTAINS(e.msg, "99");
    be->buf_free(be, &x); be->buf_free(be, &ids); be->buf_free(be, &wts);
}

static double swiglu_ref(double g, double u, double lim) {
    g = fmin(g, lim);
    u = fmax(-lim, fmin(u, lim));
    return g / (1 + exp(-g)) * u;
}

static void test_experts(void) {
    static float w1[E][F * DM], w3[E][F * DM], w2[E][DM * F];
    dsv4_linear L1[E], L3[E], L2[E];
    for (int e = 0; e < E; e++) {
        tu_fill(w1[e], F * DM, e == 0 ? 4.0f : 1.0f); /* expert 0 big enough to hit the clamp */
        tu_fill(w3[e], F * DM, e == 0 ? 4.0f : 1.0f);
        tu_fill(w2[e], DM * F, 1);
        L1[e] = (dsv4_linear){.w = tu_view(DSV4_DT_F32, w1[e], 2, F, DM), .out = F, .in = DM};
        L3[e] = (dsv4_linear){.w = tu_view(DSV4_DT_F32, w3[e], 2, F, DM), .out = F, .in = DM};
        L2[e] = (dsv4_linear){.w = tu_view(DSV4_DT_F32, w2[e], 2, DM, F), .out = DM, .in = F};
    }
    dsv4_buf x = tu_buf(be, DSV4_DT_F32, T, DM), ids = tu_buf(be, DSV4_DT_I32, T, K),
             wts = tu_buf(be, DSV4_DT_F32, T, K), y = tu_buf(be, DSV4_DT_F32, T, DM);
    tu_fill(tu_f(&x), T * DM, 3);
    for (int t = 0; t < T; t++) {
        ((int32_t *)ids.data)[t * K] = 0;
        ((int32_t *)ids.data)[t * K + 1] = 1 + t % (E - 1);
        tu_f(&wts)[t * K] = 0.4f + 0.1f * t;
        tu_f(&wts)[t * K + 1] = 0.9f;
    }
    float lim = 10.0f;
    CHECK_EQ_INT(be->moe_experts(be, &x, L1, L3, L2, E, &ids, &wts, lim, &y, NULL), 0);
    double md = 0;
    int clamped = 0;
    for (int t = 0; t < T; t++) {
        double out[DM] = {0};
        for (int j = 0; j < K; j++) {
            int e = ((int32_t *)ids.data)[t * K + j];
            double h[F];
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int k = 0; k < DM; k++) {
                    g += (double)w1[e][f * DM + k] * tu_f(&x)[t * DM + k];
                    u += (double)w3[e][f * DM + k] * tu_f(&x)[t * DM + k];
                }
                clamped += g > lim || fabs(u) > lim;
                h[f] = tu_f(&wts)[t * K + j] * swiglu_ref(g, u, lim);
            }
            for (int c = 0; c < DM; c++)
                for (int f = 0; f < F; f++) out[c] += w2[e][c * F + f] * h[f];
        }
        for (int c = 0; c < DM; c++) md = fmax(md, fabs(out[c] - tu_f(&y)[t * DM + c]));
    }
    CHECK_NEAR(md, 0, 1e-3);
    CHECK(clamped > 0); /* the clamp was exercised */
    ((int32_t *)ids.data)[3] = E;
    CHECK(be->moe_experts(be, &x, L1, L3, L2, E, &ids, &wts, lim, &y, NULL) == DSV4_EINVAL);

    dsv4_buf g = tu_buf(be, DSV4_DT_F32, 1, 3), u = tu_buf(be, DSV4_DT_F32, 1, 3);
    float gv[3] = {12, -3, 0.5f}, uv[3] = {-20, 2, 15};
    memcpy(g.data, gv, sizeof gv);
    memcpy(u.data, uv, sizeof uv);
    CHECK_EQ_INT(be->swiglu(be, &g, &u, lim, &g, NULL), 0);
    for (int i = 0; i < 3; i++) CHECK_NEAR(tu_f(&g)[i], swiglu_ref(gv[i], uv[i], lim), 1e-5);
    be->buf_free(be, &x); be->buf_free(be, &ids); be->buf_free(be, &wts); be->buf_free(be, &y);
    be->buf_free(be, &g); be->buf_free(be, &u);
}

int main(void) {
    be = dsv4_backend_cpu_create(DSV4_NUMERICS_HF, NULL);
    test_route();
    test_experts();
    be->free(be);
    return TEST_REPORT();
}
