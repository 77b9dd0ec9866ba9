/*
 * timing.h — a backend that times another backend's ops.
 *
 * Why a wrapper instead of timers inside each backend: the same per-op
 * breakdown then works for the CPU reference and the CUDA backend (with
 * sync_each, so asynchronous kernels are charged to the op that launched
 * them), and the forward code stays free of instrumentation.
 * For benchmarks only (bench/); never asserted in tests.
 */
#ifndef DSV4_BACKEND_TIMING_H
#define DSV4_BACKEND_TIMING_H

#include <stdio.h>

#include "backend/backend.h"

/*
 * dsv4_backend_timing_wrap — a backend whose ops call `inner`'s ops and add
 * their wall time per op name. sync_each: call inner->sync after every op.
 * The wrapper's numerics are forwarded to inner on every call. free() of the
 * wrapper does not free inner. Returns NULL on allocation failure (err set).
 */
dsv4_backend *dsv4_backend_timing_wrap(dsv4_backend *inner, int sync_each, dsv4_err *err);
/* Print one line per op that ran: calls, total ms, µs/call, share of the total. */
void dsv4_backend_timing_report(const dsv4_backend *timed, FILE *out);
/* Zero the counters. */
void dsv4_backend_timing_reset(dsv4_backend *timed);

#endif
