/*
 * The HBM bytes one forward step has to read — the denominator of the
 * roofline that `dsv4 perf` prints next to each measured step time
 * (spec/PERFORMANCE.md §2-§3: "report every benchmark with the bytes the step
 * had to move ... and the ratio to the ceiling").
 *
 * Why a model and not a counter: the point is the lower bound a perfect
 * kernel set would reach, so it counts each byte once per step: every dense
 * weight once whatever the batch, the routed experts the step's rows select
 * (expected number of distinct experts when every row picks k of E
 * uniformly, which is what random `--load-format dummy` weights do:
 * E·(1 − (1 − k/E)^rows), PERFORMANCE.md §3), the gathered embedding and
 * tid2eid rows, and the per-request attention state the rows read (window
 * rows, indexer keys scanned, selected / all compressed rows).
 *
 * Dtypes come from the config the way the checkpoints store them (MODEL.md
 * §2.3-2.4): with quantization_config, the attention / shared-expert /
 * indexer-query linears are FP8 E4M3 + one E8M0 byte per 128x128 block;
 * routed experts are FP4 (two per byte) + one E8M0 byte per 32 inputs when
 * expert_dtype is fp4, else FP8 like the dense ones (BF16 without
 * quantization_config); compressors, indexer weights_proj, router, embedding
 * and head are BF16; norms BF16; hyper-connection mixers, attention sinks and
 * compressor ape F32.
 */
#ifndef DSV4_ENGINE_STEP_BYTES_H
#define DSV4_ENGINE_STEP_BYTES_H

#include <stdint.h>

#include "model/config.h"

typedef struct dsv4_step_bytes {
    double dense;        /* non-expert weights read once per step (head included) */
    double experts;      /* routed experts selected by the step's rows */
    double gathered;     /* embedding rows and tid2eid rows of the step's tokens */
    double state;        /* attention state read by all requests */
    double total;        /* sum of the above */
    double expert_bytes; /* bytes of one routed expert (w1 + w3 + w2 with scales) */
    double experts_per_layer; /* expected distinct experts per MoE layer */
} dsv4_step_bytes;

/*
 * dsv4_step_bytes_compute — bytes of one target forward over n_seqs requests
 * of rows_per_seq rows each (1 = decode, k+1 = verify, a chunk = prefill),
 * each request having `context` positions already in its state, attention
 * state stored state_elem_bytes per element (4 on today's F32 backends).
 * Logits are computed for at least one row, so the head counts once.
 * Errors: DSV4_EINVAL for non-positive sizes or a negative context.
 */
int dsv4_step_bytes_compute(const dsv4_config *cfg, int n_seqs, int rows_per_seq, int64_t context,
                            int state_elem_bytes, dsv4_step_bytes *out, dsv4_err *err);

/* Bytes of all target weights as stored (every expert, whole embedding and
 * tid2eid tables; draft blocks excluded): checks the dtype rules above
 * against a checkpoint's tensor sizes. */
double dsv4_step_bytes_weights_total(const dsv4_config *cfg);

#endif
