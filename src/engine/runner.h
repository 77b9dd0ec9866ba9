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
} dsv4_runner;

typedef struct dsv4_drafter {
    void *ctx;
    int max_k;    /* largest block the drafter can propose (dspark_block_size) */
    /*
     * propose — after a forward in which slot's positions < committed_len became
     * final, propose k tokens following `anchor` (the last emitted token, at
     * position anchor_pos = committed_len). drafts [k] out; q [k][vocab] out
     * (the distribution each draft was sampled from) or NULL when the drafter
     * drafts deterministically (argmax; verification then treats q as one-hot).
     * temperature: the request's, for drafters that sample (0 = argmax).
     */
    int (*propose)(void *ctx, int slot, int32_t anchor, int64_t anchor_pos, int k, float temperature,
                   uint64_t seed, int32_t *drafts, float *q, dsv4_err *err);
    void (*release)(void *ctx, int slot);
} dsv4_drafter;

#endif
