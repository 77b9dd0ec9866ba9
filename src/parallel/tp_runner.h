/*
 * tp_runner.h — tensor parallelism inside one process: N ranks, each a
 * dsv4_model_runner over its slice of the target (src/parallel/tp_shard.h)
 * with its own backend, joined by a communicator (comm.h), behind the ONE
 * dsv4_runner interface the engine already drives (src/engine/runner.h;
 * DESIGN.md "Parallelism").
 *
 * Threads: rank 0 runs on the calling (engine) thread, ranks 1..N-1 each on
 * a worker thread that lives as long as the runner, so a rank's backend is
 * only ever used from one thread (a CUDA rank binds its device there). Every
 * forward / release / resume / copy_slot / set_pages runs the same call with
 * the same host batch on all ranks; the engine sees rank 0's results. Every
 * rank sizes the same KV pool (issue 5), so the engine's page ids are valid on
 * all of them; the interface reports rank 0's pool sizes. The drafter is
 * rank 0's (replicated, not sharded: DSpark stages and the MTP block are a
 * small part of a step, and rank 0 holds the full target features they read).
 */
#ifndef DSV4_PARALLEL_TP_RUNNER_H
#define DSV4_PARALLEL_TP_RUNNER_H

#include "engine/model_runner.h"
#include "engine/runner.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_tp_runner dsv4_tp_runner;

typedef struct dsv4_tp_runner_opts {
    int tp_size;            /* ranks, >= 1 */
    dsv4_comm **comms;      /* [tp_size] one handle per rank, taken over by the runner (freed by it even
                               when open fails); NULL = local communicator made here */
    /* Debug/test knob: each step fails (DSV4_EINTERNAL, naming rank, row and
     * token) unless every rank's logits are bit-identical to rank 0's. Also
     * on when the environment has DSV4_TP_CHECK_RANKS=1 (the CLIs). */
    int check_ranks;
    /* Several ranks per node (parallel/multinode.h): this process holds the tensor-parallel ranks
     * first_rank .. first_rank + tp_size - 1 of world_size, joined to the other nodes' ranks by the
     * caller's comms (needed then; comms[i]->rank must be first_rank + i). Rank i of this process opens
     * slice first_rank + i of world_size. 0 / 0: this process holds every rank (world_size = tp_size). */
    int first_rank, world_size;
    /* With comms: 1 = local rank i runs on GPU i (CUDA backends; NCCL comms made by the caller with
     * dsv4_comm_nccl_create_ranks); 0 = every rank on o->device (as without this field). */
    int comms_on_gpus;
} dsv4_tp_runner_opts;

/*
 * dsv4_tp_runner_open — open checkpoint dir once per rank (in parallel, one
 * thread each) with the model runner options o (n_slots, max_len, max_spec,
 * numerics, device) and load options lo (NULL = a real checkpoint;
 * --hf-overrides and dummy weights apply, each rank filling its own slice)
 * through dsv4_model_runner_open_tp. Checks dsv4_tp_check first so a TP size
 * that does not divide the model is refused before any loading.
 * Devices (when tp->comms is NULL): o->device CPU gives CPU ranks and the
 * local communicator; CUDA gives rank r GPU r and NCCL communicators made in
 * this process (comm.h dsv4_comm_nccl_create_all); AUTO takes the GPUs when
 * the host has tp_size of them, else CPU ranks. Every rank sizes the same KV
 * pool from o (the pool lives on each rank's device).
 * With tp->first_rank / world_size (several nodes): the ranks are first_rank +
 * i of world_size, dsv4_tp_check runs for world_size, and messages name the
 * global rank; the first local rank still runs on the calling thread.
 * Errors: the first failing rank's error prefixed "rank R: "; DSV4_EINVAL
 * bad tp_size / first_rank / world_size (or no comms with world_size >
 * tp_size), or --device cuda with fewer visible GPUs than tp_size (the
 * message gives both); DSV4_EUNSUPPORTED --device cuda in a build without
 * CUDA, or NCCL not loadable (the message says which variable to set);
 * DSV4_ENOMEM / thread creation failures.
 */
int dsv4_tp_runner_open(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                        const dsv4_tp_runner_opts *tp, dsv4_tp_runner **out, dsv4_err *err);
/*
 * dsv4_tp_runner_forward_target — the bare target forward on every rank (no
 * drafter features: what `dsv4 perf` times), logits of rows[0..n_logits) of
 * b into logits [n_logits][vocab] (rank 0's; checked against the others with
 * check_ranks). Errors: dsv4_tp_check_batch's; the first failing rank's.
 */
int dsv4_tp_runner_forward_target(dsv4_tp_runner *t, const dsv4_batch *b, const int32_t *rows, int n_logits,
                                  float *logits, dsv4_err *err);
/*
 * dsv4_tp_runner_bench_all_reduce — the all-reduce of a [rows][cols] buffer of
 * dtype dt (F32 or BF16) on every rank's backend (parallel/ar_bench.h): one
 * eager call and two replays of a captured CUDA graph checked bit for bit
 * against the host rank-order sum, then `iters` eager calls and replays of a
 * graph of up to 50 calls timed. oneshot 1 asks for the NVLink one-shot path
 * (comm.h dsv4_comm_nccl_set_oneshot; res->used_oneshot says whether it ran:
 * messages above its capacity still go through NCCL), 0 for NCCL.
 * res: the slowest rank's mean µs per call (us_graph -1 without graphs),
 * rank 0's result hash, ranks_equal (every rank's result bytes hashed the
 * same), bad / checked summed over ranks. A wrong sum is reported in res,
 * not as an error. Errors: DSV4_EINVAL bad sizes; the communicator's.
 */
typedef struct dsv4_tp_ar_result {
    double us_eager, us_graph;
    int used_oneshot, ranks_equal;
    uint64_t hash;
    int64_t bad, checked;
} dsv4_tp_ar_result;
int dsv4_tp_runner_bench_all_reduce(dsv4_tp_runner *t, int64_t rows, int64_t cols, dsv4_dtype dt, int iters,
                                    int oneshot, dsv4_tp_ar_result *res, dsv4_err *err);
/* Stop the workers and free every rank. NULL-safe. */
void dsv4_tp_runner_free(dsv4_tp_runner *t);

/* The engine interface (valid while t lives). Calls must not overlap (the engine makes one at a time). */
dsv4_runner dsv4_tp_runner_iface(dsv4_tp_runner *t);
/* Rank 0's drafter (see banner); returns 0 when the checkpoint has none or max_spec was 0. */
int dsv4_tp_runner_drafter(dsv4_tp_runner *t, dsv4_drafter *out);
/* Rank r's backend (e.g. "cuda:1"), or NULL for r out of range. */
dsv4_backend *dsv4_tp_runner_backend(dsv4_tp_runner *t, int rank);
/* The whole model's config. */
const dsv4_config *dsv4_tp_runner_config(const dsv4_tp_runner *t);

/*
 * dsv4_tp_check_batch — the checks dsv4_forward makes before its first op
 * (slot in [0,n_slots), position in [0,max_len), token in [0,vocab), logit
 * rows in [0,T)), made once on rank 0 before a batch reaches the ranks: a
 * failing rank aborts the communicator, and an aborted NCCL one stays dead.
 * Errors: DSV4_EINVAL / DSV4_ERANGE naming the row.
 */
int dsv4_tp_check_batch(int n_slots, int max_len, int vocab, const dsv4_batch *b, const int32_t *rows, int n_logits,
                        dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
