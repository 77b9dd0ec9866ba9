/* Sampling (src/engine/sampler.h; spec/SERVING.md §7). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

void dsv4_sampling_default(dsv4_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

int dsv4_sampling_validate(const dsv4_sampling *s, int vocab, dsv4_err *err) {
    if (!(s->temperature >= 0 && s->temperature <= 2))
        return dsv4_err_set(err, DSV4_EINVAL, "temperature must be in [0, 2], got %g", s->temperature);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return dsv4_err_set(err, DSV4_EINVAL, "top_p must be in (0, 1], got %g", s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return dsv4_err_set(err, DSV4_EINVAL, "min_p must be in [0, 1], got %g", s->min_p);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        return dsv4_err_set(err, DSV4_EINVAL, "presence_penalty must be in [-2, 2], got %g", s->presence_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        return dsv4_err_set(err, DSV4_EINVAL, "frequency_penalty must be in [-2, 2], got %g", s->frequency_penalty);
    if (!(s->repetition_penalty > 0 && s->repetition_penalty <= 2))
        return dsv4_err_set(err, DSV4_EINVAL, "repetition_penalty must be in (0, 2], got %g",
                            s->repetition_penalty);
    for (int i = 0; i < s->n_bias; i++) {
        if (s->bias_ids[i] < 0 || s->bias_ids[i] >= vocab)
            return dsv4_err_set(err, DSV4_EINVAL, "logit_bias: token id %d is outside the vocabulary (0..%d)",
                                s->bias_ids[i], vocab - 1);
        if (!(s->bias_vals[i] >= -100 && s->bias_vals[i] <= 100))
            return dsv4_err_set(err, DSV4_EINVAL, "logit_bias: value for token %d must be in [-100, 100]",
                                s->bias_ids[i]);
    }
    return DSV4_OK;
}

size_t dsv4_sampling_scratch_bytes(int vocab) {
    return (size_t)vocab * (2 * sizeof(float) + sizeof(int32_t));
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* 1 when id i comes before id j: higher value first, ties by ascending id (deterministic). A total
 * order on the ids it is used for (positive finite probabilities). */
static int before(const float *p, int32_t i, int32_t j) {
    return p[i] > p[j] || (p[i] == p[j] && i < j);
}

/* qsort_r over indices in before()'s order. */
static int by_value_desc(const void *a, const void *b, void *vals) {
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return before(vals, i, j) ? -1 : before(vals, j, i);
}

/*
 * Partial selection: rearranges idx[0..n) so that idx[0..m) hold the m ids
 * that come first in by_value_desc's order (in no particular order inside),
 * 1 <= m <= n. Why: top_k / top_p need the head of the distribution, and a
 * full sort of the 129K-token vocabulary cost ~20 ms a row (dominating a
 * sampled decode step; the speculative verifier calls this k+1 times per
 * request). Hoare's FIND with a median-of-three pivot, O(n) expected; the
 * candidates are positive finite probabilities under a total order (ties
 * broken by id), and a range that has not converged after 64 rounds is
 * simply sorted, so the worst case is the old full sort.
 */
static void select_first(int32_t *idx, int n, int m, const float *p) {
    int lo = 0, hi = n - 1, k = m - 1;
    for (int round = 0; lo < hi; round++) {
        if (round == 64) {
            qsort_r(idx + lo, (size_t)(hi - lo + 1), sizeof *idx, by_value_desc, (void *)p);
            return;
        }
        int32_t a = idx[lo], b = idx[lo + (hi - lo) / 2], c = idx[hi], x;
        if (before(p, a, b)) x = before(p, b, c) ? b : (before(p, a, c) ? c : a);
        else x = before(p, a, c) ? a : (before(p, b, c) ? c : b);
        int i = lo, j = hi;
        do { /* x lies in [lo, hi]: the scans stop at it */
            while (before(p, idx[i], x)) i++;
            while (before(p, x, idx[j])) j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        } while (i <= j);
        if (j < k) lo = i;
        if (k < i) hi = j;
    }
}

/* The nonzero ids whose probability lies in binade lo or above (float exponent field >= lo), into idx. */
static int collect_from(const float *probs, int vocab, uint32_t lo, int32_t *idx) {
    int n = 0;
    const uint32_t min_bits = lo << 23;
    for (int v = 0; v < vocab; v++) {
        uint32_t b;
        memcpy(&b, &probs[v], sizeof b);
        if (probs[v] > 0 && b >= min_bits) idx[n++] = v;
    }
    return n;
}

/*
 * top_k, then top_p over the tokens in descending probability (ties: lower id
 * first), as vLLM. Only tokens of nonzero probability are candidates (a zero
 * adds nothing to any prefix and stays zero). Not by sorting the vocabulary
 * (~20 ms a row at 129K ids): one pass counts the ids and sums the mass per
 * binade (float exponent), which bounds from below the probability of any id
 * the result can keep (the top_k-th id's binade; for top_p the highest binade
 * whose mass from the top reaches top_p of the total, with a 1e-6 margin for
 * the order of the sums); only the ids at or above it are candidates. Among
 * them top_k is Hoare's FIND and top_p walks a prefix sorted in growing
 * pieces (64 ids, then x4, the rest at once past a quarter); should the
 * walk run out of candidates (it cannot but for rounding) it starts again
 * over every nonzero id. The kept set is
 * the full sort's; tot, the mass top_p is a share of, is summed in id order
 * (before 2026-12-08 in sorted order: the two differ in the last bits of a
 * double, so a kept set could only differ where a prefix's mass lies within
 * ~1e-15 of the threshold).
 */
void dsv4_sampling_nucleus(float *probs, int vocab, int top_k, float top_p, void *scratch) {
    float *mark = scratch;                                /* [vocab] */
    int32_t *idx = (int32_t *)(mark + 2 * (size_t)vocab); /* [vocab], where dsv4_sampling_probs keeps it */
    int cnt[256] = {0}, n = 0;
    double bmass[256] = {0}, all = 0;
    for (int v = 0; v < vocab; v++) {
        const float p = probs[v];
        if (!(p > 0)) continue;
        uint32_t b;
        memcpy(&b, &p, sizeof b);
        cnt[b >> 23]++;
        bmass[b >> 23] += p;
        all += p;
        n++;
    }
    const int hk = top_k > 0 && top_k < n;
    int lo = 0;
    if (hk) {
        for (int b = 255, c = 0; b >= 0; b--)
            if ((c += cnt[b]) >= top_k) {
                lo = b;
                break;
            }
    } else if (top_p < 1) {
        const double target = (double)top_p * all * (1 + 1e-6);
        double acc = 0;
        for (int b = 255; b >= 0; b--)
            if ((acc += bmass[b]) >= target) {
                lo = b;
                break;
            }
    }
    int nc = collect_from(probs, vocab, (uint32_t)lo, idx);
    int keep = nc;
    if (hk) {
        select_first(idx, nc, top_k, probs);
        keep = top_k;
    }
    if (top_p < 1 && keep > 0) {
        double tot = all;
        if (hk) {
            tot = 0;
            memset(mark, 0, (size_t)vocab * sizeof *mark);
            for (int r = 0; r < keep; r++) mark[idx[r]] = 1;
            for (int v = 0; v < vocab; v++)
                if (mark[v] != 0) tot += probs[v];
        }
        /* smallest prefix whose mass reaches top_p of the (renormalised) kept mass */
        for (int pass = 0; pass < 2; pass++) {
            int r = 0, sorted = 0, reached = 0;
            double acc = 0;
            while (!reached && r < keep) {
                int next = sorted == 0 ? 64 : sorted * 4;
                if (next > keep / 4) next = keep; /* most of them: one sort beats more selection passes */
                if (next < keep) select_first(idx + sorted, keep - sorted, next - sorted, probs);
                qsort_r(idx + sorted, (size_t)(next - sorted), sizeof *idx, by_value_desc, probs);
                sorted = next;
                while (r < sorted) {
                    acc += probs[idx[r]];
                    r++;
                    if (acc >= top_p * tot) {
                        reached = 1;
                        break;
                    }
                }
            }
            if (reached || hk || nc == n) {
                keep = r;
                break;
            }
            keep = nc = collect_from(probs, vocab, 0, idx); /* ran out of candidates: all nonzero ids */
        }
    }
    memset(mark, 0, (size_t)vocab * sizeof *mark);
    for (int r = 0; r < keep; r++) mark[idx[r]] = 1;
    for (int v = 0; v < vocab; v++)
        if (mark[v] == 0) probs[v] = 0;
}

int32_t dsv4_sampling_probs(const dsv4_sampling *s, const float *logits, int vocab, const int32_t *prompt,
                            int n_prompt, const int32_t *output, int n_output, float *probs, void *scratch) {
    float *z = scratch;                    /* penalised logits */
    float *cnt = z + vocab;                /* output counts; later reused */
    int32_t *idx = (int32_t *)(cnt + vocab);
    memcpy(z, logits, (size_t)vocab * sizeof *z);

    for (int i = 0; i < s->n_bias; i++) z[s->bias_ids[i]] += s->bias_vals[i];

    /* Penalties. Repetition: over prompt + output, divide positive logits and
     * multiply negative ones (CTRL / vLLM), once per distinct id.
     * Presence/frequency: output only. idx doubles as the "seen" mark here;
     * dsv4_sampling_nucleus reuses it (and z) below. */
    memset(cnt, 0, (size_t)vocab * sizeof *cnt);
    for (int i = 0; i < n_output; i++)
        if (output[i] >= 0 && output[i] < vocab) cnt[output[i]] += 1;
    if (s->repetition_penalty != 1.0f) {
        float rp = s->repetition_penalty;
        int32_t *seen = idx;
        memset(seen, 0, (size_t)vocab * sizeof *seen);
        for (int i = 0; i < n_prompt; i++)
            if (prompt[i] >= 0 && prompt[i] < vocab) seen[prompt[i]] = 1;
        for (int v = 0; v < vocab; v++)
            if (seen[v] || cnt[v] > 0) z[v] = z[v] > 0 ? z[v] / rp : z[v] * rp;
    }
    if (s->presence_penalty != 0 || s->frequency_penalty != 0)
        for (int v = 0; v < vocab; v++)
            if (cnt[v] > 0) z[v] -= s->frequency_penalty * cnt[v] + s->presence_penalty;

    int32_t am = argmax(z, vocab);
    if (s->temperature == 0) {
        memset(probs, 0, (size_t)vocab * sizeof *probs);
        probs[am] = 1;
        return am;
    }

    /* temperature, then softmax */
    double mx = z[am], sum = 0;
    for (int v = 0; v < vocab; v++) {
        double e = exp(((double)z[v] - mx) / s->temperature);
        probs[v] = (float)e;
        sum += e;
    }
    for (int v = 0; v < vocab; v++) probs[v] = (float)(probs[v] / sum);

    /* min_p: drop tokens below min_p * p_max */
    if (s->min_p > 0) {
        float thr = s->min_p * probs[am];
        for (int v = 0; v < vocab; v++)
            if (probs[v] < thr) probs[v] = 0;
    }
    if ((s->top_k > 0 && s->top_k < vocab) || s->top_p < 1)
        dsv4_sampling_nucleus(probs, vocab, s->top_k, s->top_p, scratch);
    sum = 0;
    for (int v = 0; v < vocab; v++) sum += probs[v];
    for (int v = 0; v < vocab; v++) probs[v] = (float)(probs[v] / sum);
    return am;
}

int32_t dsv4_sample_from(const float *probs, int vocab, double u) {
    double acc = 0;
    int32_t last = -1;
    for (int v = 0; v < vocab; v++) {
        if (probs[v] <= 0) continue;
        last = v;
        acc += probs[v];
        if (u < acc) return v;
    }
    return last >= 0 ? last : 0; /* rounding left u above the total: the last kept id */
}

void dsv4_log_softmax(const float *logits, int vocab, float *out) {
    float mx = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += exp((double)logits[v] - mx);
    double lse = mx + log(sum);
    for (int v = 0; v < vocab; v++) out[v] = (float)(logits[v] - lse);
}

void dsv4_token_logprob_compute(const float *logits, int vocab, int32_t token, int n_top, dsv4_token_logprob *out) {
    if (n_top < 0) n_top = 0;
    if (n_top > DSV4_MAX_TOP_LOGPROBS) n_top = DSV4_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    float mx = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int v = 0; v < vocab; v++) sum += exp((double)logits[v] - mx);
    double lse = mx + log(sum);
    out->token = token;
    out->logprob = (float)(logits[token] - lse);
    /* top-n by insertion into a short sorted list (descending value, ascending id) */
    int m = 0;
    for (int v = 0; v < vocab && n_top > 0; v++) {
        float x = logits[v];
        if (m == n_top && !(x > logits[out->top_ids[m - 1]])) continue;
        int i = m < n_top ? m++ : m - 1;
        while (i > 0 && x > logits[out->top_ids[i - 1]]) {
            out->top_ids[i] = out->top_ids[i - 1];
            i--;
        }
        out->top_ids[i] = v;
    }
    out->n_top = m;
    for (int i = 0; i < m; i++) out->top_logprobs[i] = (float)(logits[out->top_ids[i]] - lse);
}

/* splitmix64 finaliser: a good 64-bit mixer, enough for sampling streams. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double dsv4_rng_u01(uint64_t seed, int64_t position, int purpose) {
    uint64_t h = mix64(seed ^ mix64((uint64_t)position * 4 + (uint64_t)(purpose & 3)));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0); /* 53 bits -> [0, 1) */
}
