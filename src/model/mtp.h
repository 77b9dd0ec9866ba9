/*
 * mtp.h — the MTP block of the original DeepSeek-V4-Flash checkpoint
 * (spec/MODEL.md §3.9), written against the backend op table.
 *
 * Inputs per row i: the target's final streams before hc_head H_i
 * [hc_mult][d] and a token id (the vLLM alignment of §3.9: H_i is paired with
 * the token at i+1 and the row, at RoPE position i, predicts token i+2).
 *   X = e_proj(enorm(embed[token])) broadcast to every stream
 *       + h_proj(hnorm(H_s)) per stream s,
 * then one standard ratio-0, top-k-routed decoder block (block.c) with its own
 * sliding-window ring, then hc_head → norm → the target's LM head.
 * The block's output streams are the H of a chained MTP step.
 *
 * Validated by tests/unit/test_mtp_ref.c against tools/ref_mtp.py (transformers
 * building blocks, HF numerics; own primitives, reference numerics) and the MTP
 * reference of tools/ref_transformers.py fed by our own target forward.
 */
#ifndef DSV4_MODEL_MTP_H
#define DSV4_MODEL_MTP_H

#include "backend/backend.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_mtp {
    const dsv4_config *cfg;
    dsv4_backend *be;
    const dsv4_model *target;     /* embed.weight, head.weight shared (MODEL.md §2.2) */
    dsv4_block_dev block;         /* mtp.0, absolute layer id num_hidden_layers */
    dsv4_linear e_proj, h_proj;   /* [d, d] */
    dsv4_tview enorm, hnorm, norm;/* [d] */
    dsv4_hc_w hc_head;
    dsv4_state *st;               /* the block's own window ring (ratio 0) */
} dsv4_mtp;

/*
 * dsv4_mtp_create — upload mtp.0 of `w` (cfg->draft_kind must be
 * DSV4_DRAFT_MTP) to the target's backend and allocate its window state for
 * n_slots requests of up to max_len positions, max_spec rows per step that may
 * be rejected later. Borrows cfg, w, target. Errors: not an MTP checkpoint,
 * bad sizes, upload/allocation failures.
 */
int dsv4_mtp_create(const dsv4_config *cfg, const dsv4_weights *w, const dsv4_model *target, int n_slots,
                    int max_len, int max_spec, dsv4_mtp **out, dsv4_err *err);
void dsv4_mtp_free(dsv4_mtp *m);
/* Forget a slot's MTP window rows. Errors: slot out of range. */
int dsv4_mtp_reset_slot(dsv4_mtp *m, int slot, dsv4_err *err);

/*
 * dsv4_mtp_forward — the MTP block on batch b (ragged, consecutive positions
 * per segment; earlier positions of a slot come from its window ring, so
 * chunked calls equal one call). b->token[t] is the token paired with row t
 * (the target's token at position pos+1). streams: host F32
 * [T][hc_mult*d], the target's final streams at the rows' positions.
 * Outputs (host, optional): logits F32 [T][vocab] (fp32 head) and out_streams
 * F32 [T][hc_mult*d] (the block output before hc_head).
 * Errors: slot/position out of range, token outside the vocabulary, backend failures.
 */
int dsv4_mtp_forward(dsv4_mtp *m, const dsv4_batch *b, const float *streams, float *logits,
                     float *out_streams, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
