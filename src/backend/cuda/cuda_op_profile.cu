/*
 * Per-op wall time of eager forwards (env DSV4_CUDA_OP_PROFILE=1), a debugging aid.
 *
 * Why: a step's wall time (DSV4_STEP_LOG) says that a prefill chunk of a row count seen for the
 * first time costs 15-20 ms more than the next chunk of that count (bench/results/
 * 2026-12-01-warmup-prefill-h200.md), not where. This wraps every op of the backend's table:
 * synchronise the stream, call the op, note the host time until it returns (launch overhead and
 * any host work: allocation, attribute setting, library heuristics), synchronise again, note the
 * total. At the next batch_begin (the next forward) one INFO line gives the previous forward's
 * ops, largest total first. The synchronisations serialise host and device, so totals are
 * upper bounds of the op's share in a normal (overlapped) forward; compare a forward with a
 * later one of the same shape, not with unprofiled runs. Ops inside a graph capture run
 * unwrapped (a capture cannot synchronise).
 *
 * DSV4_CUDA_OP_PROFILE=2: in-stream stamps instead, for CUDA-graph steps too. Why: ncu serialises
 * kernels and flushes the overlap PDL gives, and Nsight Systems does not run on the GPU machines
 * (library device/KINDS.md), so neither says what an op costs inside a replayed decode graph. After
 * each compute op a one-thread kernel (k_op_stamp, in the PDL chain: it waits for the op's last
 * kernel, then reads %globaltimer) adds the time since the previous stamp to that op's counter in
 * device memory; a stamp before `embed` (the first op of every forward) restarts the clock, so the
 * host's gap between steps is not counted. Stamps are ordinary kernels, so a capture records them
 * and every replay adds to the counters. At the next batch_begin one INFO line gives the previous
 * forward's ops (us, calls), largest first. Each stamp is one more node (~1-2 us, and the op after
 * it overlaps only the stamp): the step gets slower, so read the shares, not the sum.
 */
#include "backend/cuda/cuda_be_internal.cuh"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PF_N (sizeof(dsv4_backend) / sizeof(void *) + 1)

typedef struct cu_prof {
    dsv4_backend orig;  /* the table before wrapping */
    const char *name[PF_N];
    double host_ms[PF_N], total_ms[PF_N];
    int calls[PF_N];
    int rows;           /* rows of the forward being profiled (batch_begin) */
    int stamps;         /* mode 2: in-stream stamps (below) instead of synchronised host times */
    unsigned long long *d_ns; /* device [PF_N]: ns per op since the last report; [PF_N] the last stamp */
    unsigned *d_calls;        /* device [PF_N] */
} cu_prof;
#define PF_NS_BYTES (sizeof(unsigned long long) * (PF_N + 1)) /* d_ns with its last-stamp slot */
#define PF_CALLS_BYTES (sizeof(unsigned) * PF_N)

/* One stamp (mode 2): after the previous kernel, ns[id] += now - ns[PF_N]; reset only restarts. */
__global__ void k_op_stamp(unsigned long long *ns, unsigned *calls, int id, int reset) {
    pdl_trigger();
    pdl_wait();
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (!reset && ns[PF_N]) {
        ns[id] += t - ns[PF_N];
        calls[id]++;
    }
    ns[PF_N] = t;
}

static void pf_stamp(cu_be *cb, cu_prof *p, int id, int reset) {
    if (cu_launch(cb->ctx, k_op_stamp, dim3(1), dim3(1), 0, p->d_ns, p->d_calls, id, reset) != cudaSuccess)
        cudaGetLastError(); /* a lost stamp is a gap in the profile, never an error of the op */
}

/* Mode 2: the device counters into the host arrays (total_ms; host_ms stays 0), then zeroed. On the
 * backend's stream (non-blocking: a default-stream copy would not wait for its kernels). */
static void pf_fetch(cu_be *cb, cu_prof *p) {
    unsigned long long ns[PF_N];
    unsigned calls[PF_N];
    cudaStream_t s = cb->ctx->stream;
    if (cudaMemcpyAsync(ns, p->d_ns, sizeof ns, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaMemcpyAsync(calls, p->d_calls, sizeof calls, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    for (size_t i = 0; i < PF_N; i++) {
        p->total_ms[i] = (double)ns[i] / 1e6;
        p->calls[i] = (int)calls[i];
    }
    /* the last-stamp slot [PF_N] too: the next stamp only starts the clock */
    if (cudaMemsetAsync(p->d_ns, 0, PF_NS_BYTES, s) != cudaSuccess ||
        cudaMemsetAsync(p->d_calls, 0, PF_CALLS_BYTES, s) != cudaSuccess)
        cudaGetLastError();
}

static double pf_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void pf_report(cu_prof *p) {
    int order[PF_N], n = 0;
    double tot = 0, host = 0;
    for (size_t i = 0; i < PF_N; i++)
        if (p->calls[i]) {
            order[n++] = (int)i;
            tot += p->total_ms[i];
            host += p->host_ms[i];
        }
    if (!n) return;
    for (int i = 1; i < n; i++) /* insertion sort, largest total first */
        for (int j = i; j > 0 && p->total_ms[order[j]] > p->total_ms[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    char line[2048];
    int o = p->stamps
                ? snprintf(line, sizeof line, "op stamps: %d rows, ops %.1f us in stream:", p->rows, tot * 1e3)
                : snprintf(line, sizeof line, "op profile: %d rows, ops %.2f ms (host %.2f):", p->rows, tot, host);
    for (int i = 0; i < n && o < (int)sizeof line - 80; i++) {
        const int k = order[i];
        o += p->stamps ? snprintf(line + o, sizeof line - (size_t)o, " %s %.1f x%d;", p->name[k], p->total_ms[k] * 1e3,
                                  p->calls[k])
                       : snprintf(line + o, sizeof line - (size_t)o, " %s %.2f/%.2f x%d;", p->name[k], p->total_ms[k],
                                  p->host_ms[k], p->calls[k]);
    }
    dsv4_log(DSV4_LOG_INFO, "%s", line);
    memset(p->host_ms, 0, sizeof p->host_ms);
    memset(p->total_ms, 0, sizeof p->total_ms);
    memset(p->calls, 0, sizeof p->calls);
}

template <typename T> struct pf_sig;
template <typename... A> struct pf_sig<int (*)(dsv4_backend *, A...)> {
    template <size_t ID, int (*dsv4_backend::*M)(dsv4_backend *, A...)>
    static int call(dsv4_backend *be, A... a) {
        cu_be *cb = cube(be);
        cu_prof *p = (cu_prof *)cb->prof;
        if (p->stamps) {
            /* embed is a forward's first op: restart the clock before it */
            if (ID == offsetof(dsv4_backend, embed) / sizeof(void *)) pf_stamp(cb, p, (int)ID, 1);
            const int rc = (p->orig.*M)(be, a...);
            pf_stamp(cb, p, (int)ID, 0);
            return rc;
        }
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cb->ctx->stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone)
            return (p->orig.*M)(be, a...);
        cudaStreamSynchronize(cb->ctx->stream);
        const double t0 = pf_now_ms();
        const int rc = (p->orig.*M)(be, a...);
        const double t1 = pf_now_ms();
        cudaStreamSynchronize(cb->ctx->stream);
        p->host_ms[ID] += t1 - t0;
        p->total_ms[ID] += pf_now_ms() - t0;
        p->calls[ID]++;
        return rc;
    }
};

static int pf_batch_begin(dsv4_backend *be, const dsv4_batch *b, dsv4_err *err) {
    cu_prof *p = (cu_prof *)cube(be)->prof;
    if (p->stamps) pf_fetch(cube(be), p);
    pf_report(p);
    p->rows = b ? b->n_rows : 0;
    return p->orig.batch_begin(be, b, err);
}

#define PF_WRAP(f)                                                                                          \
    do {                                                                                                    \
        if (be->f) {                                                                                        \
            const size_t id_ = offsetof(dsv4_backend, f) / sizeof(void *);                                  \
            p->name[id_] = #f;                                                                              \
            be->f = pf_sig<decltype(be->f)>::template call<offsetof(dsv4_backend, f) / sizeof(void *),      \
                                                           &dsv4_backend::f>;                               \
        }                                                                                                   \
    } while (0)

/* Wraps be's ops when DSV4_CUDA_OP_PROFILE=1 or 2 (after the table is filled). Allocation failure:
 * profiling stays off (logged), never an error. */
void cu_op_profile_install(dsv4_backend *be) {
    const char *env = getenv("DSV4_CUDA_OP_PROFILE");
    if (!env || (strcmp(env, "1") && strcmp(env, "2"))) return;
    cu_prof *p = (cu_prof *)calloc(1, sizeof *p);
    if (!p) {
        dsv4_log(DSV4_LOG_WARN, "DSV4_CUDA_OP_PROFILE: out of memory, profiling off");
        return;
    }
    p->stamps = env[0] == '2';
    if (p->stamps && (cudaMalloc((void **)&p->d_ns, PF_NS_BYTES) != cudaSuccess ||
                      cudaMalloc((void **)&p->d_calls, PF_CALLS_BYTES) != cudaSuccess ||
                      cudaMemset(p->d_ns, 0, PF_NS_BYTES) != cudaSuccess ||
                      cudaMemset(p->d_calls, 0, PF_CALLS_BYTES) != cudaSuccess)) {
        cudaGetLastError();
        cudaFree(p->d_ns);
        cudaFree(p->d_calls);
        free(p);
        dsv4_log(DSV4_LOG_WARN, "DSV4_CUDA_OP_PROFILE=2: no device memory for the counters, profiling off");
        return;
    }
    p->orig = *be;
    cube(be)->prof = p;
    if (!p->stamps) { /* allocation, read-back and synchronisation: host-timed mode only (no stream work to stamp) */
        PF_WRAP(buf_alloc);
        PF_WRAP(buf_alloc_scratch);
        PF_WRAP(buf_read);
        PF_WRAP(sync);
    }
    PF_WRAP(buf_gather_rows); /* a gather kernel on the stream: stamped in mode 2 */
    PF_WRAP(embed);
    PF_WRAP(add);
    PF_WRAP(rmsnorm);
    PF_WRAP(rope);
    PF_WRAP(rmsnorm_rope);
    PF_WRAP(qat_fp8);
    PF_WRAP(qat_hadamard_fp4);
    PF_WRAP(rmsnorm_rope_qat_fp8);
    PF_WRAP(rope_qat_hadamard_fp4);
    PF_WRAP(linear);
    PF_WRAP(linear_grouped);
    PF_WRAP(linear_multi);
    PF_WRAP(hc_pre);
    PF_WRAP(hc_pre_norm);
    PF_WRAP(hc_post);
    PF_WRAP(hc_post_pre_norm);
    PF_WRAP(hc_head);
    PF_WRAP(win_store);
    PF_WRAP(compress);
    PF_WRAP(indexer_select);
    PF_WRAP(attention);
    PF_WRAP(attention_rope);
    PF_WRAP(moe_route);
    PF_WRAP(moe_experts);
    PF_WRAP(swiglu);
    PF_WRAP(linear_swiglu_add);
    PF_WRAP(hc_mean);
    PF_WRAP(logit_top);
    be->batch_begin = pf_batch_begin;
    dsv4_log(DSV4_LOG_WARN, p->stamps ? "DSV4_CUDA_OP_PROFILE=2: a stamp kernel after every op (debugging only; slower)"
                                      : "DSV4_CUDA_OP_PROFILE=1: every op synchronises (debugging only; slower)");
}

/* Frees what cu_op_profile_install made (NULL-safe). */
void cu_op_profile_free(void *prof) {
    cu_prof *p = (cu_prof *)prof;
    if (p) {
        cudaFree(p->d_ns);
        cudaFree(p->d_calls);
    }
    free(p);
}
