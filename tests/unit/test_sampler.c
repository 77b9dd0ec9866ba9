/* Sampler and speculative verification (spec/SERVING.md §7, spec/DSPARK.md §4). */
#include <stdint.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "test.h"

#define V 6

static float scratch_buf[4 * 1024];

static int nonzero(const float *p, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += p[i] > 0;
    return c;
}

static double sum(const float *p, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}

static void test_transforms(void) {
    float logits[V] = {1.0f, 3.0f, -2.0f, 2.9f, 0.0f, -1.0f}, p[V];
    dsv4_sampling s;
    dsv4_sampling_default(&s);
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_sampling_validate(&s, V, &err), 0);

    /* defaults: plain softmax, argmax 1 */
    CHECK_EQ_INT(dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf), 1);
    CHECK_NEAR(sum(p, V), 1.0, 1e-6);
    CHECK_NEAR(p[1] / p[3], exp(0.1), 1e-5);

    /* greedy: one-hot */
    s.temperature = 0;
    CHECK_EQ_INT(dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf), 1);
    CHECK_EQ_INT(nonzero(p, V), 1);
    CHECK(p[1] == 1.0f);

    /* repetition penalty 2 over prompt {1}: 3.0 -> 1.5, so argmax becomes 3 */
    int32_t prompt[] = {1, 1, 2};
    s.repetition_penalty = 2.0f;
    CHECK_EQ_INT(dsv4_sampling_probs(&s, logits, V, prompt, 3, NULL, 0, p, scratch_buf), 3);
    /* negative logit of token 2 is multiplied: -4 < everything, once only (not -8) */
    s.temperature = 1;
    dsv4_sampling_probs(&s, logits, V, prompt, 3, NULL, 0, p, scratch_buf);
    CHECK_NEAR(log(p[2] / p[4]), -4.0, 1e-4);
    CHECK_NEAR(log(p[1] / p[4]), 1.5, 1e-4);

    /* frequency + presence over output only: token 3 seen twice -> 2.9 - 2*0.5 - 0.25 */
    dsv4_sampling_default(&s);
    s.frequency_penalty = 0.5f;
    s.presence_penalty = 0.25f;
    int32_t out[] = {3, 3};
    dsv4_sampling_probs(&s, logits, V, prompt, 3, out, 2, p, scratch_buf);
    CHECK_NEAR(log(p[3] / p[4]), 2.9 - 1.0 - 0.25, 1e-4);
    CHECK_NEAR(log(p[1] / p[4]), 3.0, 1e-4); /* prompt tokens untouched by these */

    /* temperature 0.5 doubles log-ratios */
    dsv4_sampling_default(&s);
    s.temperature = 0.5f;
    dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf);
    CHECK_NEAR(log(p[1] / p[0]), 4.0, 1e-4);

    /* top_k 2 keeps ids 1 and 3 */
    dsv4_sampling_default(&s);
    s.top_k = 2;
    dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf);
    CHECK_EQ_INT(nonzero(p, V), 2);
    CHECK(p[1] > 0 && p[3] > 0);
    CHECK_NEAR(sum(p, V), 1.0, 1e-6);

    /* top_p: p1 ~ 0.45, p3 ~ 0.41; 0.5 needs both, 0.4 needs only the first */
    dsv4_sampling_default(&s);
    s.top_p = 0.5f;
    dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf);
    CHECK_EQ_INT(nonzero(p, V), 2);
    s.top_p = 0.4f;
    dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf);
    CHECK_EQ_INT(nonzero(p, V), 1);

    /* min_p 0.2: keep tokens with p >= 0.2 p_max: ids 1, 3 and 0 (e^-2 = 0.135 < 0.2: 0 dropped) */
    dsv4_sampling_default(&s);
    s.min_p = 0.1f; /* e^-2 = 0.135 >= 0.1 keeps id 0; e^-3 (id 4) = 0.05 dropped */
    dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf);
    CHECK_EQ_INT(nonzero(p, V), 3);
    CHECK(p[0] > 0 && p[4] == 0);

    /* logit_bias moves the argmax */
    int32_t bid[] = {5};
    float bval[] = {10.0f};
    dsv4_sampling_default(&s);
    s.temperature = 0;
    s.bias_ids = bid;
    s.bias_vals = bval;
    s.n_bias = 1;
    CHECK_EQ_INT(dsv4_sampling_probs(&s, logits, V, NULL, 0, NULL, 0, p, scratch_buf), 5);

    /* validation names the field */
    bid[0] = V;
    CHECK_EQ_INT(dsv4_sampling_validate(&s, V, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "logit_bias");
    dsv4_sampling_default(&s);
    s.top_p = 0;
    CHECK_EQ_INT(dsv4_sampling_validate(&s, V, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "top_p");
    dsv4_sampling_default(&s);
    s.temperature = 2.5f;
    CHECK_EQ_INT(dsv4_sampling_validate(&s, V, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "temperature");

    /* inverse CDF never returns a zero-probability id */
    float q[V] = {0, 0.5f, 0, 0.5f, 0, 0};
    CHECK_EQ_INT(dsv4_sample_from(q, V, 0.0), 1);
    CHECK_EQ_INT(dsv4_sample_from(q, V, 0.49), 1);
    CHECK_EQ_INT(dsv4_sample_from(q, V, 0.51), 3);
    CHECK_EQ_INT(dsv4_sample_from(q, V, 0.9999999), 3);

    float lp[V];
    dsv4_log_softmax(logits, V, lp);
    double t = 0;
    for (int i = 0; i < V; i++) t += exp(lp[i]);
    CHECK_NEAR(t, 1.0, 1e-6);
    CHECK_NEAR(lp[1] - lp[0], 2.0, 1e-5);
}

static void test_rng(void) {
    CHECK(dsv4_rng_u01(7, 100, DSV4_RNG_ACCEPT) == dsv4_rng_u01(7, 100, DSV4_RNG_ACCEPT));
    CHECK(dsv4_rng_u01(7, 100, DSV4_RNG_ACCEPT) != dsv4_rng_u01(7, 100, DSV4_RNG_RESAMPLE));
    CHECK(dsv4_rng_u01(7, 100, DSV4_RNG_ACCEPT) != dsv4_rng_u01(7, 101, DSV4_RNG_ACCEPT));
    CHECK(dsv4_rng_u01(7, 100, DSV4_RNG_ACCEPT) != dsv4_rng_u01(8, 100, DSV4_RNG_ACCEPT));
    double m = 0;
    int in_range = 1;
    for (int i = 0; i < 100000; i++) {
        double u = dsv4_rng_u01(3, i, DSV4_RNG_SAMPLE);
        in_range &= u >= 0 && u < 1;
        m += u;
    }
    CHECK(in_range);
    CHECK_NEAR(m / 100000, 0.5, 0.005);
}

static void test_greedy_verify(void) {
    int32_t am[4] = {5, 7, 9, 11}, e[4];
    int32_t all[3] = {5, 7, 9}, first_bad[3] = {4, 7, 9}, mid_bad[3] = {5, 8, 9};
    CHECK_EQ_INT(dsv4_verify_greedy(am, all, 3, e), 4);
    CHECK(e[0] == 5 && e[1] == 7 && e[2] == 9 && e[3] == 11);
    CHECK_EQ_INT(dsv4_verify_greedy(am, first_bad, 3, e), 1);
    CHECK_EQ_INT(e[0], 5);
    CHECK_EQ_INT(dsv4_verify_greedy(am, mid_bad, 3, e), 2);
    CHECK(e[0] == 5 && e[1] == 7);
    int32_t stops[] = {1, 7};
    CHECK_EQ_INT(dsv4_verify_truncate_at_stop(am, 4, stops, 2), 2);
    CHECK_EQ_INT(dsv4_verify_truncate_at_stop(am, 4, stops, 1), 4);
}

/* Target and draft are Markov chains over V tokens: T[prev] and Q[prev]. */
static float T[V][V], Q[V][V];

static double tv(const double *a, const float *b) {
    double d = 0;
    for (int i = 0; i < V; i++) d += fabs(a[i] - b[i]);
    return d / 2;
}

/*
 * Probabilistic verification must reproduce the target: over many steps from
 * the same anchor, the first emitted token ~ T[x0], and the second (when the
 * step went on) ~ T[first]. A verifier that accepted drafts blindly would give
 * Q instead; Q is chosen far from T so that shows.
 */
static void stat_test(int deterministic_draft) {
    const int K = 3, N = 200000;
    const int32_t x0 = 2;
    double first[V] = {0}, second[V][V] = {{0}}, n_second[V] = {0};
    float p[(3 + 1) * V], q[3 * V], scratch[V];
    int32_t d[3], e[4];
    long accepted = 0;
    for (int t = 0; t < N; t++) {
        uint64_t seed = 1000 + (uint64_t)t;
        int32_t prev = x0;
        for (int j = 0; j < K; j++) {
            memcpy(q + j * V, Q[prev], sizeof Q[prev]);
            if (deterministic_draft) {
                int32_t best = 0;
                for (int v = 1; v < V; v++)
                    if (Q[prev][v] > Q[prev][best]) best = v;
                d[j] = best;
            } else {
                d[j] = dsv4_sample_from(Q[prev], V, dsv4_rng_u01(seed, 50 + j, DSV4_RNG_DRAFT));
            }
            memcpy(p + j * V, T[prev], sizeof T[prev]); /* row j: target after d_1..d_j */
            prev = d[j];
        }
        memcpy(p + K * V, T[prev], sizeof T[prev]);
        int n = dsv4_verify_sampled(p, deterministic_draft ? NULL : q, d, K, V, seed, 50, scratch, e);
        accepted += n - 1;
        first[e[0]] += 1;
        if (n >= 2) {
            second[e[0]][e[1]] += 1;
            n_second[e[0]] += 1;
        }
    }
    for (int v = 0; v < V; v++) first[v] /= N;
    double d1 = tv(first, T[x0]);
    CHECK_MSG(d1 < 0.01, "first token TV from target %.4f (draft %s)", d1, deterministic_draft ? "argmax" : "sampled");
    for (int a = 0; a < V; a++) {
        if (n_second[a] < 20000) continue;
        double row[V];
        for (int v = 0; v < V; v++) row[v] = second[a][v] / n_second[a];
        double d2 = tv(row, T[a]);
        CHECK_MSG(d2 < 0.02, "second token after %d: TV %.4f", a, d2);
    }
    CHECK(accepted > 0); /* drafts do get accepted */
}

/* ---- top_k / top_p by partial selection == by a full sort (the way it was done before 2026-12-08) ---- */

static const float *ref_vals;
static int ref_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = ref_vals[i], y = ref_vals[j];
    if (x > y) return -1;
    if (x < y) return 1;
    return (i > j) - (i < j);
}

/* The plain definition: sort every id (descending, ties to the lower id), keep top_k, then the shortest
 * prefix whose mass (summed in sorted order) reaches top_p of the kept mass (summed in id order). */
static void ref_nucleus(float *p, int n, int top_k, float top_p) {
    int32_t *idx = malloc(sizeof *idx * (size_t)n);
    char *kept = calloc((size_t)n, 1);
    for (int v = 0; v < n; v++) idx[v] = v;
    ref_vals = p;
    qsort(idx, (size_t)n, sizeof *idx, ref_desc);
    int keep = n;
    if (top_k > 0 && top_k < keep) keep = top_k;
    if (top_p < 1) {
        for (int r = 0; r < keep; r++) kept[idx[r]] = 1;
        double tot = 0, acc = 0;
        for (int v = 0; v < n; v++)
            if (kept[v]) tot += p[v];
        int r = 0;
        while (r < keep) {
            acc += p[idx[r++]];
            if (acc >= top_p * tot) break;
        }
        keep = r;
    }
    memset(kept, 0, (size_t)n);
    for (int r = 0; r < keep; r++) kept[idx[r]] = 1;
    for (int v = 0; v < n; v++)
        if (!kept[v]) p[v] = 0;
    free(kept);
    free(idx);
}

static uint64_t nrng = 88172645463325252ull;
static double nuni(void) {
    nrng ^= nrng << 13;
    nrng ^= nrng >> 7;
    nrng ^= nrng << 17;
    return (double)(nrng >> 11) * (1.0 / 9007199254740992.0);
}

static void test_nucleus_vs_full_sort(void) {
    const int sizes[] = {6, 7, 300, 5000, 129280};
    const int ks[] = {0, 1, 2, 50, 4096, -1 /* n - 1 */};
    const float ps[] = {1.0f, 0.999f, 0.95f, 0.5f, 0.1f, 1e-6f};
    int cases = 0, same = 0, keeps_checked = 0;
    for (int si = 0; si < 5; si++) {
        const int n = sizes[si];
        float *base = malloc(sizeof *base * (size_t)n), *a = malloc(sizeof *a * (size_t)n),
              *b = malloc(sizeof *b * (size_t)n);
        void *scratch = malloc(dsv4_sampling_scratch_bytes(n));
        for (int shape = 0; shape < 5; shape++) {
            /* 0: spread softmax; 1: peaked; 2: many exact ties (quantised); 3: zeros (as after min_p);
             * 4: flat (all equal) */
            double sum = 0;
            for (int v = 0; v < n; v++) {
                double g = sqrt(-2 * log(nuni() + 1e-300)) * cos(6.283185307179586 * nuni());
                double x = shape == 1 ? 8 * g : shape == 2 ? floor(2 * g) : shape == 4 ? 0 : 2 * g;
                base[v] = (float)exp(x);
                if (shape == 3 && nuni() < 0.7) base[v] = 0;
                sum += base[v];
            }
            for (int v = 0; v < n; v++) base[v] = (float)(base[v] / sum);
            for (int ki = 0; ki < 6; ki++)
                for (int pi = 0; pi < 6; pi++) {
                    int k = ks[ki] < 0 ? n - 1 : ks[ki];
                    memcpy(a, base, sizeof *a * (size_t)n);
                    memcpy(b, base, sizeof *b * (size_t)n);
                    dsv4_sampling_nucleus(a, n, k, ps[pi], scratch);
                    ref_nucleus(b, n, k, ps[pi]);
                    cases++;
                    int eq = !memcmp(a, b, sizeof *a * (size_t)n);
                    same += eq;
                    if (!eq)
                        fprintf(stderr, "nucleus differs: n %d shape %d top_k %d top_p %g: kept %d vs %d\n", n,
                                shape, k, ps[pi], nonzero(a, n), nonzero(b, n));
                    keeps_checked += nonzero(a, n) > 0;
                }
        }
        free(scratch);
        free(b);
        free(a);
        free(base);
    }
    CHECK_EQ_INT(same, cases);
    CHECK_EQ_INT(keeps_checked, cases); /* every case kept at least one id */
}

int main(void) {
    test_transforms();
    test_nucleus_vs_full_sort();
    test_rng();
    test_greedy_verify();
    /* Markov chains: T random-ish, Q deliberately different (TV(T[2], Q[2]) large). */
    for (int a = 0; a < V; a++) {
        double st = 0, sq = 0;
        for (int b = 0; b < V; b++) {
            T[a][b] = (float)(1 + ((a * 7 + b * 3) % 5));
            Q[a][b] = (float)(1 + ((a + b * 5) % 6) * ((a + b * 5) % 6));
            st += T[a][b];
            sq += Q[a][b];
        }
        for (int b = 0; b < V; b++) {
            T[a][b] = (float)(T[a][b] / st);
            Q[a][b] = (float)(Q[a][b] / sq);
        }
    }
    double qrow[V];
    for (int v = 0; v < V; v++) qrow[v] = Q[2][v];
    CHECK_MSG(tv(qrow, T[2]) > 0.2, "test setup: draft must differ from target");
    stat_test(0);
    stat_test(1);
    return TEST_REPORT();
}
