/*
 * Sampling: from raw target logits to the distribution a token is drawn from
 * (spec/SERVING.md §7.2), and the counter-based random numbers that make a
 * request's output reproducible from its seed (§7.3, spec/DSPARK.md §4.3).
 *
 * Order of operations (vLLM v1, SERVING.md §7.2):
 *   raw logits -> logit_bias -> repetition (prompt+output) / presence and
 *   frequency (output) penalties -> temperature -> min_p -> top_k -> top_p.
 * Greedy (temperature 0) is the argmax of the penalised logits.
 * Log-probabilities reported to clients are of the RAW logits (vLLM default).
 */
#ifndef DSV4_ENGINE_SAMPLER_H
#define DSV4_ENGINE_SAMPLER_H

#include <stdint.h>

#include "dsv4/common.h"

typedef struct dsv4_sampling {
    float temperature;        /* >= 0; 0 = greedy. Default 1.0 */
    float top_p;              /* (0, 1]; default 1 */
    int top_k;                /* <= 0 = off */
    float min_p;              /* [0, 1]; default 0 */
    float presence_penalty;   /* [-2, 2] over output tokens */
    float frequency_penalty;  /* [-2, 2] over output tokens */
    float repetition_penalty; /* (0, 2] over prompt + output; 1 = off */
    uint64_t seed;            /* RNG key; the engine picks one when the request has none */
    const int32_t *bias_ids;  /* logit_bias: n_bias (id, value) pairs */
    const float *bias_vals;
    int n_bias;
} dsv4_sampling;

/* Defaults of SERVING.md §7.1: temperature 1, top_p 1, top_k off, min_p 0, no penalties. */
void dsv4_sampling_default(dsv4_sampling *s);

/*
 * dsv4_sampling_validate — range checks of SERVING.md §3.3. On error returns
 * DSV4_EINVAL with a message naming the request field (e.g. "top_p must be in (0, 1]").
 * vocab: model vocabulary size, for logit_bias ids.
 */
int dsv4_sampling_validate(const dsv4_sampling *s, int vocab, dsv4_err *err);

/*
 * dsv4_sampling_probs — the final distribution for one position.
 *   logits [vocab] f32 raw target logits (not modified);
 *   prompt [n_prompt], output [n_output]: token ids seen so far (for penalties;
 *     under speculation `output` includes the earlier drafts of the same step);
 *   probs [vocab] f32 out: sums to 1; zero outside the kept set. For greedy,
 *     one-hot on the argmax of the penalised logits (ties: lowest id).
 *   scratch: 2*vocab floats + vocab ints of workspace (see dsv4_sampling_scratch_bytes).
 * Returns the argmax id of the penalised logits (always, for greedy and sampled).
 */
size_t dsv4_sampling_scratch_bytes(int vocab);
int32_t dsv4_sampling_probs(const dsv4_sampling *s, const float *logits, int vocab, const int32_t *prompt,
                            int n_prompt, const int32_t *output, int n_output, float *probs, void *scratch);

/*
 * dsv4_sampling_nucleus — the top_k / top_p stage of dsv4_sampling_probs on
 * its own (exposed for tests): zeroes probs [vocab] (f32, >= 0, not
 * renormalised) outside the kept set: the top_k most likely ids (top_k <= 0
 * or >= vocab: all), then the shortest prefix of those, in descending
 * probability with ties to the lower id, whose mass reaches top_p (in
 * (0, 1]) of theirs (SERVING.md §7.2). Zero-probability ids are never kept.
 * scratch: dsv4_sampling_scratch_bytes(vocab) bytes.
 */
void dsv4_sampling_nucleus(float *probs, int vocab, int top_k, float top_p, void *scratch);

/* Draw from probs [vocab] by inverse CDF with u in [0, 1). Never returns a zero-probability id. */
int32_t dsv4_sample_from(const float *probs, int vocab, double u);

/* log_softmax of raw logits [vocab] into out [vocab] (f32, natural log). */
void dsv4_log_softmax(const float *logits, int vocab, float *out);

/* Most alternatives one token can report (OpenAI top_logprobs <= 20, SERVING.md §3.3). */
#define DSV4_MAX_TOP_LOGPROBS 20

/* Log-probabilities of one generated token (natural log, of the RAW target
 * logits: before logit_bias, penalties and temperature; SERVING.md §7.2). */
typedef struct dsv4_token_logprob {
    int32_t token;                           /* the emitted token */
    float logprob;                           /* log_softmax(raw logits)[token] */
    int n_top;                               /* alternatives filled, 0..DSV4_MAX_TOP_LOGPROBS */
    int32_t top_ids[DSV4_MAX_TOP_LOGPROBS];  /* most likely first; ties: lowest id first */
    float top_logprobs[DSV4_MAX_TOP_LOGPROBS];
} dsv4_token_logprob;

/*
 * dsv4_token_logprob_compute — fill out for `token` from raw logits [vocab]
 * (f32, not modified) with the n_top (clamped to [0, DSV4_MAX_TOP_LOGPROBS]
 * and to vocab) most likely ids. One pass for log-sum-exp, one for the top-n
 * (O(vocab * n_top)); no scratch memory. SERVING.md §3.3, §7.2.
 */
void dsv4_token_logprob_compute(const float *logits, int vocab, int32_t token, int n_top, dsv4_token_logprob *out);

/*
 * Counter-based uniform random numbers in [0, 1): a pure function of
 * (seed, position, purpose), so replays and batch composition never change a
 * request's randoms (spec/DSPARK.md §4.3 "independent, counter-based RNG streams").
 */
enum { DSV4_RNG_SAMPLE = 0, DSV4_RNG_DRAFT = 1, DSV4_RNG_ACCEPT = 2, DSV4_RNG_RESAMPLE = 3 };
double dsv4_rng_u01(uint64_t seed, int64_t position, int purpose);

#endif
