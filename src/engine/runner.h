/*
 * What the engine needs from a model: a runner that executes one forward over
 * a ragged batch (spec/MODEL.md §3.8, DESIGN.md "Data flow" step 2), and
 * optionally a drafter that proposes speculative tokens (spec/DSPARK.md §2).
 *
 * Why an interface here and not a direct call into src/model: the scheduler,
 * the verification and the request lifecycle are tested on their own with
 * small deterministic runners, and the same engine drives the CPU reference,
 * the CUDA backend and tensor-parallel workers.
 */
#ifndef DSV4_ENGINE_RUNNER_H
#define DSV4_ENGINE_RUNNER_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct dsv4_runner {
    void *ctx;
    int vocab;    /* logits width */
    int n_slots;  /* request slots the runner holds state for */
    /*
     * forward — run rows of b (host metadata; see dsv4_batch) and write the
     * raw logits of the rows listed in logit_rows [n_logits] (indices into the
     * batch) to logits [n_logits][vocab] (f32, host). State of every slot is
     * position-addressed: rows at positions already seen are overwritten.
     * Errors: DSV4_EBACKEND/DSV4_EINVAL with a message; the engine then fails
     * the requests of this step and keeps serving.
     */
    int (*forward)(void *ctx, const dsv4_batch *b, const int32_t *logit_rows, int n_logits, float *logits,
                   dsv4_err *err);
    /* A slot's request finished or was cancelled: its state may be dropped. */
    void (*release)(void *ctx, int slot);
    /*
     * Prefix caching (spec/SERVING.md §8.7). Optional: NULL = no caching.
     * The three cover the state of the drafter this runner hands out too.
     *
     * reusable — slot holds the state of a history whose positions
     * < committed are final and whose first `want` tokens equal a new
     * prompt of n_new tokens (want <= n_new - 1). Returns the largest
     * position R <= want from which that prompt can be prefilled in this
     * slot with results identical to a cold prefill (state of positions < R
     * kept as is, positions >= R recomputed), or 0 when there is none.
     */
    int64_t (*reusable)(void *ctx, int slot, int64_t committed, int64_t want, int64_t n_new);
    /* resume — the slot's next request prefills from pos (a value reusable
     * returned): reset any "next position" bookkeeping to pos. */
    int (*resume)(void *ctx, int slot, int64_t pos, dsv4_err *err);
    /* copy_slot — optional: make slot dst's state an exact copy of src's
     * (afterwards reusable answers the same for both). */
    int (*copy_slot)(void *ctx, int src, int dst, dsv4_err *err);
    /*
     * Paged state pool (issue 5; backend.h DSV4_CMP_ROW). page_tokens = 0: the
     * runner holds every slot's state itself (no pool). Otherwise the
     * position-addressed compressed state of a slot lives in pages of
     * page_tokens positions drawn from a pool of n_pages, and the ENGINE owns
     * the pages: before a forward touches positions [0, n) of a slot, pages
     * 0 .. ceil(n/page_tokens)-1 of that slot must be mapped with set_pages
     * (ids[n] page ids in [0, n_pages), each mapped by at most one slot;
     * the slot's other pages become unmapped). page_bytes: bytes of one page.
     */
    int page_tokens;
    int n_pages;
    int64_t page_bytes;
    int (*set_pages)(void *ctx, int slot, int n, const int32_t *ids, dsv4_err *err);
    /*
     * forward_ids — optional (NULL: the engine always asks for logits): the
     * same forward as `forward`, but instead of the logits of the rows in
     * logit_rows [n_logits] it writes their greedy ids to ids [n_logits]
     * (host I32): the argmax of the raw logits with ties to the lowest id,
     * exactly what dsv4_sampling_probs returns for a greedy request without
     * logit_bias or penalties (src/engine/sampler.h). The argmax runs where
     * the logits are (backend logit_top), so 4 bytes a row come back instead
     * of vocab floats (issue 7). Errors as `forward`.
     */
    int (*forward_ids)(void *ctx, const dsv4_batch *b, const int32_t *logit_rows, int n_logits, int32_t *ids,
                       dsv4_err *err);
    /*
     * warmup — optional (NULL: nothing to prepare): capture the decode /
     * verify CUDA graphs for the configured batch sizes before serving
     * (issue 7; dsv4_model_runner_warmup). *n_graphs: graphs held (per rank).
     * Called once, before the engine thread starts.
     */
    int (*warmup)(void *ctx, int *n_graphs, dsv4_err *err);
} dsv4_runner;

typedef struct dsv4_drafter {
    void *ctx;
    int max_k;    /* largest block the drafter can propose (dspark_block_size) */
    /*
     * commit — after a forward, positions < committed_len[i] of slot[i] are
     * final for each of the n requests of the step (prefill chunks: all their
     * rows; verify rows: the anchor and the accepted drafts). The drafter
     * takes its context from those rows only (spec/DSPARK.md §4.6); rejected
     * rows are never committed and are re-run in a later step.
     */
    int (*commit)(void *ctx, int n, const int32_t *slot, const int64_t *committed_len, dsv4_err *err);
    /*
     * propose — k drafts for each of n requests (distinct slots): request i
     * drafts after `anchor[i]`, the last emitted token, at position
     * anchor_pos[i] (= its committed length). drafts [n][k] out.
     * q[i] (may be NULL) points to [k][vocab]: a drafter that samples fills it
     * with the distribution each draft was drawn from and sets q_valid[i] = 1;
     * a deterministic (argmax) drafter sets q_valid[i] = 0 and verification
     * treats q as one-hot (DSPARK.md §4.3). temperature[i], seed[i]: the
     * request's, for drafters that sample.
     */
    int (*propose)(void *ctx, int n, const int32_t *slot, const int32_t *anchor, const int64_t *anchor_pos, int k,
                   const float *temperature, const uint64_t *seed, int32_t *drafts, float *const *q, int *q_valid,
                   dsv4_err *err);
    void (*release)(void *ctx, int slot);
} dsv4_drafter;

#endif
