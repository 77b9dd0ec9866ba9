/*
 * conformance.h — run every backend op on the same random inputs in two
 * backends and report the normalised error of each output.
 *
 * Why: DESIGN.md "The CPU backend is the reference ... Each CUDA op is tested
 * against it (normalised error, at tiny and real shapes)". This is that test,
 * written once against the op table, so a new backend (CUDA) only has to be
 * passed in: dsv4_backend_conformance(cuda, cpu, &shape, ...). Inputs are
 * generated on the host, written to both backends, outputs read back.
 * Normalised error = ||test − ref||₂ / max(||ref||₂, 1e-30); integer outputs
 * (expert ids, indexer picks) are compared as sets per row (fraction of rows
 * that differ).
 */
#ifndef DSV4_BACKEND_CONFORMANCE_H
#define DSV4_BACKEND_CONFORMANCE_H

#include <stdio.h>

#include "backend/backend.h"

/* Shapes of one conformance run (spec/MODEL.md §1 names). */
typedef struct dsv4_conf_shape {
    int rows;          /* T: batch rows, split over two requests              */
    int d, n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int n_exp, top_k, moe_inter, index_heads, index_dim, index_topk;
    int window, hc;    /* sliding window, hc_mult                              */
    /*
     * Batch and attention-state layout (0 = the defaults of the tiny run):
     *  seg_rows: 0 = two requests splitting the rows in half; k > 0 = rows/k
     *            requests of k rows each (k = 6: a verify step), one slot each.
     *  pos0:     0 = segment i starts at position 5 + 32·i; > 0 = pos0 + 131·i
     *            (older positions come from random ring / compressed-row state).
     *  ratio:    main compressor ratio, 0 = 4 (with overlap, indexer and
     *            selected attention); 128 = no overlap, no indexer.
     *  paged:    the test backend's emitted rows are paged (DSV4_CMP_ROW with a
     *            shuffled, non-identity block table, spare pages NaN, pages past
     *            a slot's last row unmapped); the reference stays unpaged.
     */
    int seg_rows, pos0, ratio, paged;
    int attn_only;     /* run only the attention-state ops (compress, indexer, attention, win_store) */
    int kv_dtype;      /* dsv4_kv_dtype (src/model/kvcodec.h) of the window rows and main compressed
                        * rows in both backends (0 = F32); index keys stay F32 */
} dsv4_conf_shape;

/* The tiny shapes of spec/MODEL.md §5.2 (rows 24). */
void dsv4_conf_shape_tiny(dsv4_conf_shape *s);
/* Flash shapes (§1) with `rows` rows and 16 experts (the per-expert math is the same). */
void dsv4_conf_shape_flash(dsv4_conf_shape *s, int rows);

/*
 * dsv4_backend_conformance — run each op in `test` and `ref` (both with the
 * numerics of `ref`), print one line per op to `report` (may be NULL) and
 * return the number of ops whose error exceeds `tol` (set-compared ops: any
 * differing row beyond a fraction tol). seed makes the inputs reproducible.
 * Errors (returned as negative status, err filled): an op failing in either
 * backend, allocation failures.
 */
int dsv4_backend_conformance(dsv4_backend *test, dsv4_backend *ref, const dsv4_conf_shape *s, double tol,
                             unsigned seed, FILE *report, dsv4_err *err);

#endif
