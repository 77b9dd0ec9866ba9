/*
 * Speculative verification (spec/DSPARK.md §4.2-4.4): given the target's
 * distributions at the k+1 verify rows of one request and the k drafted
 * tokens, decide how many drafts are accepted and which tokens are emitted.
 * Lossless by construction: greedy requests emit exactly the non-speculative
 * tokens, sampled requests preserve the target distribution (rejection
 * sampling with the residual max(p - q, 0)).
 */
#ifndef DSV4_ENGINE_SPEC_VERIFY_H
#define DSV4_ENGINE_SPEC_VERIFY_H

#include <stdint.h>

/*
 * dsv4_verify_greedy — DSPARK.md §4.2.
 *   target_argmax [k+1]: argmax of the (penalised) target logits at rows 0..k;
 *   drafts [k]: d_1..d_k; emitted [k+1] out.
 * Returns the number of emitted tokens, a+1 where a = accepted drafts.
 */
int dsv4_verify_greedy(const int32_t *target_argmax, const int32_t *drafts, int k, int32_t *emitted);

/*
 * dsv4_verify_sampled — DSPARK.md §4.3.
 *   p [(k+1) * vocab]: target distributions after all sampling transforms at rows
 *     0..k (row j computed with drafts d_1..d_j in the history);
 *   q [k * vocab]: the distribution each draft d_j was sampled from, or NULL for a
 *     deterministic (argmax) draft, treated as one-hot on d_j;
 *   drafts [k]; seed and pos0 (absolute position of row 0's prediction, i.e. P+1)
 *     key the accept/resample randoms (dsv4_rng_u01, purposes ACCEPT and RESAMPLE);
 *   scratch [vocab] f32 workspace for the residual; emitted [k+1] out.
 * Returns the number of emitted tokens (1..k+1).
 */
int dsv4_verify_sampled(const float *p, const float *q, const int32_t *drafts, int k, int vocab, uint64_t seed,
                        int64_t pos0, float *scratch, int32_t *emitted);

/*
 * dsv4_verify_truncate_at_stop — DSPARK.md §4.4: cut an emitted run right after
 * the first token that is in stop_ids [n_stop] (EOS, stop_token_ids).
 * Returns the new length (<= n).
 */
int dsv4_verify_truncate_at_stop(const int32_t *emitted, int n, const int32_t *stop_ids, int n_stop);

#endif
