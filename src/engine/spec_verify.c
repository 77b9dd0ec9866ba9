/* Speculative verification (src/engine/spec_verify.h; spec/DSPARK.md §4). */
#include "engine/spec_verify.h"

#include "engine/sampler.h"

int dsv4_verify_greedy(const int32_t *target_argmax, const int32_t *drafts, int k, int32_t *emitted) {
    int n = 0;
    for (int j = 1; j <= k; j++) {
        int32_t want = target_argmax[j - 1];
        emitted[n++] = want; /* either d_j (equal) or the replacement */
        if (drafts[j - 1] != want) return n;
    }
    emitted[n++] = target_argmax[k]; /* bonus */
    return n;
}

int dsv4_verify_sampled(const float *p, const float *q, const int32_t *drafts, int k, int vocab, uint64_t seed,
                        int64_t pos0, float *scratch, int32_t *emitted) {
    int n = 0;
    for (int j = 1; j <= k; j++) {
        const float *pj = p + (size_t)(j - 1) * vocab;
        int32_t d = drafts[j - 1];
        double pd = pj[d];
        double qd = q ? q[(size_t)(j - 1) * vocab + d] : 1.0;
        int64_t pos = pos0 + (j - 1);
        double u = dsv4_rng_u01(seed, pos, DSV4_RNG_ACCEPT);
        if (u * qd < pd) { /* accept with probability min(1, p/q) */
            emitted[n++] = d;
            continue;
        }
        /* reject: sample from normalize(max(p - q, 0)); fall back to p when the
         * residual mass is ~0 (DeepSpec: <= 1e-8) */
        double mass = 0;
        for (int v = 0; v < vocab; v++) {
            double qv = q ? q[(size_t)(j - 1) * vocab + v] : (v == d ? 1.0 : 0.0);
            double r = pj[v] - qv;
            scratch[v] = r > 0 ? (float)r : 0.0f;
            mass += scratch[v];
        }
        const float *dist = pj;
        if (mass > 1e-8) {
            for (int v = 0; v < vocab; v++) scratch[v] = (float)(scratch[v] / mass);
            dist = scratch;
        }
        emitted[n++] = dsv4_sample_from(dist, vocab, dsv4_rng_u01(seed, pos, DSV4_RNG_RESAMPLE));
        return n;
    }
    const float *pk = p + (size_t)k * vocab;
    emitted[n++] = dsv4_sample_from(pk, vocab, dsv4_rng_u01(seed, pos0 + k, DSV4_RNG_SAMPLE));
    return n;
}

int dsv4_verify_truncate_at_stop(const int32_t *emitted, int n, const int32_t *stop_ids, int n_stop) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < n_stop; s++)
            if (emitted[i] == stop_ids[s]) return i + 1;
    return n;
}
