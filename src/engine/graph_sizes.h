/*
 * Which decode / verify shapes are captured as CUDA graphs at start (issue 7),
 * from vLLM's knobs: cudagraph_capture_sizes (--cuda-graph-sizes,
 * --compilation-config) and max_cudagraph_capture_size, bounded by
 * max_num_seqs, and from the speculative schedule (rows per sequence k+1).
 * Sizes here count SEQUENCES (requests in the step); vLLM counts tokens,
 * which is the same for plain decode (src/model/forward_pad.c pads a step of
 * s sequences to the next size).
 */
#ifndef DSV4_ENGINE_GRAPH_SIZES_H
#define DSV4_ENGINE_GRAPH_SIZES_H

#include "dsv4/common.h"

/*
 * dsv4_graph_sizes_resolve — the capture sizes, ascending, into out[cap];
 * returns how many (0 = none), or -1 with err set.
 *  given[n_given]: an explicit list (cudagraph_capture_sizes), any order,
 *    duplicates dropped; entries above max_num_seqs are dropped (vLLM does
 *    the same with max_num_reqs); max_size, when > 0, must equal its largest
 *    entry (vLLM's rule; DSV4_EINVAL otherwise).
 *  n_given = 0: vLLM's default pattern 1, 2, 4, then 8, 16, ... (steps of 8)
 *    up to 256, then steps of 16, up to max_size (default min(2 *
 *    max_num_seqs, 512)), bounded by max_num_seqs; max_num_seqs itself is
 *    added when the pattern stops below it and max_size was not given, so
 *    every decode batch has a graph.
 * Errors: DSV4_EINVAL a size < 1, max_size < 0, more than cap sizes.
 */
int dsv4_graph_sizes_resolve(const int *given, int n_given, int max_size, int max_num_seqs, int *out, int cap,
                             dsv4_err *err);

/*
 * dsv4_graph_rows_plan — rows per sequence to capture and, for each, the
 * largest size it needs: rows 1 (plain decode) for every size, and k+1 for
 * each speculation width k > 0 the engine can choose (spec_k, or the
 * schedule's k for the number of running requests, spec/DSPARK.md §5.3),
 * up to the size a batch of the most running requests with that k pads to.
 * A k + 1 above DSV4_GRAPH_MAX_ROWS_PER_SEQ (16: k = 16, the most
 * --speculative-config accepts) gets no entry: no graph holds such verify
 * steps, they run eagerly (refusing them stopped the server from starting).
 * schedule[n_schedule][3] = {lo, hi, k} as dsv4_engine_opts.k_schedule.
 * Returns the number of entries written to rows / max_seqs (at most cap).
 */
int dsv4_graph_rows_plan(int spec_k, const int (*schedule)[3], int n_schedule, int max_num_seqs, const int *sizes,
                         int n_sizes, int *rows, int *max_seqs, int cap);

#endif
