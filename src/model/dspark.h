/*
 * dspark.h — the DSpark drafter (spec/DSPARK.md §2) written once against the
 * backend op table (src/backend/backend.h).
 *
 * What it keeps: per request slot and per draft stage, a ring of context K=V
 * rows (the drafter's only persistent state, §2.3). What one draft step does
 * (§2.8): one parallel forward of the S stages over the block
 * [anchor, noise x (γ-1)] at positions P..P+γ-1 of every request, the target's
 * LM head after the last stage's hc_head and own norm, then γ sequential Markov
 * steps (greedy) and the confidence head.
 *
 * Choices (each is checked by tests/unit/test_dspark_ref.c against the
 * independent PyTorch reference tools/ref_dspark.py, whose header lists them):
 *  - anchor at its own position P, context = committed positions <= P-1 (§4.8);
 *  - block attention non-causal: every block query sees the last
 *    min(W, P) context rows and all γ block rows (§2.4);
 *  - K/V FP8 round-trip of the nope dims on ring rows and block rows in
 *    reference numerics (§2.3, §7.7);
 *  - only rows of committed tokens may be passed to dsv4_dspark_context
 *    (§4.6): the caller writes rows P..P+a after a verify with a accepted;
 *  - stages are absolute layers num_hidden_layers + s (never hash-routed;
 *    the binder sets that, weights.h), RoPE θ = rope_theta without YaRN.
 *
 * Ring layout: stage s of slot r uses rows r*cap + (p mod cap) of a
 * dsv4_win_state with window = cap = W + γ. The block's own rows are stored at
 * P..P+γ-1 before attention (they are transient: the slots they use belong to
 * positions the next draft rewrites before reading, and positions older than
 * its window), so the generic window attention op with the query claiming
 * position P+γ-1 sees exactly positions P-W..P+γ-1 (see dspark.c).
 */
#ifndef DSV4_MODEL_DSPARK_H
#define DSV4_MODEL_DSPARK_H

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_dspark {
    const dsv4_config *cfg;
    dsv4_backend *be;
    const dsv4_model *target;  /* embed.weight and head.weight are shared (§3.1) */
    int n_stages, gamma, n_slots, window;
    dsv4_block_dev *stages;    /* [n_stages], uploaded, absolute layer ids */
    dsv4_linear main_proj;     /* stage 0: [d, n_tap*d] */
    dsv4_tview main_norm;      /* stage 0: [d] */
    dsv4_tview norm;           /* last stage: [d] */
    dsv4_hc_w hc_head;         /* last stage */
    dsv4_tview markov_w1;      /* last stage: BF16 [V, rank], used as an embedding table */
    dsv4_linear markov_w2;     /* last stage: BF16 [V, rank], y = e · W2ᵀ */
    dsv4_linear conf_h, conf_e;/* confidence_head.proj [1, d+rank] split into [1,d] and [1,rank] */
    dsv4_win_state *ring;      /* [n_stages] context rings, window = cap = W + γ */
} dsv4_dspark;

/*
 * dsv4_dspark_create — upload the draft stages of `w` (cfg->draft_kind must be
 * DSV4_DRAFT_DSPARK) to the target model's backend and allocate the context
 * rings of n_slots requests. Borrows cfg, w and target (they must outlive it).
 * Errors: DSV4_EINVAL (not a DSpark checkpoint, n_slots <= 0, a confidence
 * weight that is not one row of d + markov_rank), upload/allocation failures.
 */
int dsv4_dspark_create(const dsv4_config *cfg, const dsv4_weights *w, const dsv4_model *target,
                       int n_slots, dsv4_dspark **out, dsv4_err *err);
void dsv4_dspark_free(dsv4_dspark *d);

/* Forget a slot's context (new request in the slot): zeroes its ring rows.
 * Errors: slot out of range. */
int dsv4_dspark_reset_slot(dsv4_dspark *d, int slot, dsv4_err *err);
/* Copy slot src's context rings over slot dst's (prefix caching, spec/SERVING.md
 * §8.7). Errors: a slot out of range or src == dst; backend failures. */
int dsv4_dspark_copy_slot(dsv4_dspark *d, int src, int dst, dsv4_err *err);

/*
 * dsv4_dspark_context — context path (DSPARK.md §2.3) for the committed rows of
 * batch b (slots, consecutive positions per segment): feats host F32
 * [b->n_rows][n_tap*d], the hc-mean of the outputs of target layers
 * dspark_target_layer_ids in list order (§2.2). Computes main_x = main_norm(
 * main_proj · feats) and, per stage, kv_norm(wkv · main_x) with RoPE at the
 * row's position (+ FP8 round-trip of the nope dims in reference numerics),
 * written to the stage ring. Only committed rows may be passed (§4.6).
 * Errors: slot out of range, backend failures.
 */
int dsv4_dspark_context(dsv4_dspark *d, const dsv4_batch *b, const float *feats, dsv4_err *err);
/* The same with the features already in a backend buffer of this drafter's backend: F F32
 * [b->n_rows][n_tap*d] (a view is fine; not modified). Why: the target's taps stay on the device
 * (dsv4_fwd_out.taps_dev), so a prefill chunk's 48 KB a row never crosses host memory.
 * Errors: as dsv4_dspark_context, DSV4_EINVAL for a buffer of another shape or dtype. */
int dsv4_dspark_context_buf(dsv4_dspark *d, const dsv4_batch *b, const dsv4_buf *F, dsv4_err *err);

/*
 * dsv4_dspark_draft — one draft step for n requests (§2.4-2.6): request r in
 * slot[r] with anchor token anchor[r] at position pos[r] (= P, its context
 * being positions <= P-1 already in the ring). Outputs (host memory):
 *   tokens     I32 [n][γ]   greedy drafts for positions P+1..P+γ (required);
 *   logits     F32 [n][γ][V] z_i = U_i + W2·W1[prev_i] (optional, NULL);
 *   conf_logit F32 [n][γ]   raw confidence logits w·[h_i; e_i] (optional;
 *                           the confidence is its sigmoid).
 * Requests must use distinct slots. Errors: n <= 0, slot out of range,
 * duplicate slot, pos < 1, token out of vocabulary, backend failures.
 */
int dsv4_dspark_draft(dsv4_dspark *d, int n, const int32_t *slot, const int32_t *anchor,
                      const int32_t *pos, int32_t *tokens, float *logits, float *conf_logit,
                      dsv4_err *err);

/*
 * Sampled drafting (spec/DSPARK.md §2.5 "sample from q_i = softmax(z_i / T)",
 * §4.3 probabilistic verification). Per request r:
 *   temperature [n]: T_r; T_r <= 0 drafts greedily (q not written);
 *   u [n][γ]: uniforms in [0,1), one per Markov step, supplied by the caller
 *     (the engine keys them by seed and position so replays reproduce);
 *   q [n][γ][V] out (host F32): the distribution each draft was drawn from,
 *     i.e. softmax(z_i / T_r) with z_i built from the SAMPLED previous draft.
 *   sampled [n] out: 1 where q was written.
 * The Markov chain feeds each sampled draft to the next step, so later drafts
 * are conditioned on earlier sampled ones, exactly as the verifier assumes.
 */
typedef struct dsv4_draft_sampling {
    const float *temperature;
    const double *u;
    float *q;
    int *sampled;
} dsv4_draft_sampling;

/*
 * dsv4_dspark_draft_sampled — dsv4_dspark_draft with sampled Markov steps
 * where temperature > 0 (smp may be NULL = greedy). Same errors, plus
 * DSV4_EINVAL when smp lacks u or q.
 */
int dsv4_dspark_draft_sampled(dsv4_dspark *d, int n, const int32_t *slot, const int32_t *anchor,
                              const int32_t *pos, const dsv4_draft_sampling *smp, int32_t *tokens,
                              float *logits, float *conf_logit, dsv4_err *err);

/*
 * dsv4_draft_pick — one Markov step's choice over z [V] (F32, host): argmax
 * when temperature <= 0 (q untouched); else the token at uniform u of the CDF
 * of softmax(z / temperature), which is written to q [V]. Returns the token.
 * Shared by the DSpark and MTP drafters.
 */
int32_t dsv4_draft_pick(const float *z, int64_t V, float temperature, double u, float *q);

#ifdef __cplusplus
}
#endif
#endif
