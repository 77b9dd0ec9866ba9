/*
 * ar_bench.h — one rank's part of the all-reduce benchmark and correctness
 * check (`dsv4 perf -tp N --all-reduce-bench`, tp_runner.h
 * dsv4_tp_runner_bench_all_reduce; issue 7, spec/PERFORMANCE.md §1).
 *
 * Why a file of its own: the check needs a host reference (the rank-order
 * sum every communicator promises, comm.h "Determinism contract") and a CUDA
 * graph capture of the collective, which are neither the TP runner's job nor
 * a communicator's.
 */
#ifndef DSV4_PARALLEL_AR_BENCH_H
#define DSV4_PARALLEL_AR_BENCH_H

#include <stdint.h>

#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_ar_bench {
    /* in */
    int64_t rows, cols; /* message shape */
    dsv4_dtype dtype;   /* F32 or BF16 */
    int iters;          /* timed back-to-back calls (eager; the graph holds min(iters, 50)) */
    /* out (this rank) */
    double us_eager; /* mean µs per call, calls launched one by one from the host */
    double us_graph; /* mean µs per call replaying a CUDA graph of them; -1: backend without graphs */
    uint64_t hash;   /* FNV-1a of the bytes of the first call's result (compare across ranks / paths) */
    int64_t bad;     /* elements != the host rank-order sum: first call + 2 replays of a captured graph of 3 */
    int64_t checked; /* elements compared */
} dsv4_ar_bench;

/*
 * dsv4_ar_bench_rank — rank c->rank's part; every rank of the group calls it
 * at the same time with the same b->rows/cols/dtype/iters (collectives inside).
 * Input of rank r, element i: a deterministic value of varied sign and
 * magnitude (exact in the dtype), so sums round. Expected result: rank order
 * v_0 + v_1 + ... + v_{N-1} in F32, rounded once to the dtype (comm.h).
 * Errors: DSV4_EINVAL bad shape or dtype; DSV4_ENOMEM; the communicator's /
 * backend's errors. A wrong sum is not an error: b->bad counts it.
 */
int dsv4_ar_bench_rank(dsv4_comm *c, dsv4_backend *be, dsv4_ar_bench *b, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
