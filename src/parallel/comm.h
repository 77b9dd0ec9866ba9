/*
 * comm.h — a communicator between the tensor-parallel ranks of one model
 * (DESIGN.md "Parallelism"; spec/PERFORMANCE.md §1 for what the transports cost).
 *
 * Why a struct of function pointers: the forward pass (src/model/block.c)
 * needs exactly one collective — a sum over ranks of a backend buffer — and
 * must not care whether the ranks are threads of this process sharing host
 * memory (the `local` communicator: CI, CPU backends, and a correctness
 * oracle for the GPU path) or GPUs joined by NCCL over NVLink / RoCE (the
 * `nccl` communicator, src/parallel/comm_nccl.c). The TP runner
 * (src/parallel/tp_runner.c) adds broadcast and barrier for its own
 * bookkeeping.
 *
 * Determinism contract: after all_reduce_sum every rank holds BIT-IDENTICAL
 * values (the local communicator sums the partials in rank order 0..N-1 on
 * every rank; NCCL's ring/tree reductions also deliver one result to all
 * ranks). Everything after the reduction is replicated computation on
 * identical inputs, so every rank samples the same tokens.
 *
 * Failure: a rank that fails mid-step calls `abort` so that peers blocked in a
 * collective return DSV4_EBACKEND instead of waiting forever. After an abort
 * the local communicator is usable again once every rank has returned
 * (dsv4_comm_local_recover); an aborted NCCL communicator stays dead.
 */
#ifndef DSV4_PARALLEL_COMM_H
#define DSV4_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_comm dsv4_comm;

struct dsv4_comm {
    const char *name; /* "local", "nccl", "tcp" */
    int rank, size;
    void *ctx;

    /*
     * buf (rows × cols, F32 or BF16, in be's memory) := Σ over ranks of every
     * rank's buf, same shape on every rank. BF16 is summed in fp32 and rounded
     * once. Errors: DSV4_EINVAL shape/dtype mismatch between ranks or an
     * unsupported dtype; DSV4_EBACKEND transport failure or an aborted peer.
     */
    int (*all_reduce_sum)(dsv4_comm *c, dsv4_backend *be, dsv4_buf *buf, dsv4_err *err);
    /*
     * out [rows][size*cols] := the ranks' in [rows][cols] side by side, rank r
     * at columns [r*cols, (r+1)*cols) (e.g. vocabulary-parallel logits). Same
     * dtype (F32) on every rank. Errors as all_reduce_sum.
     */
    int (*all_gather)(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *in, dsv4_buf *out, dsv4_err *err);
    /* host[0..n) of rank `root` copied to every rank's host. */
    int (*broadcast)(dsv4_comm *c, void *host, size_t n, int root, dsv4_err *err);
    /* Returns when every rank has entered. */
    int (*barrier)(dsv4_comm *c, dsv4_err *err);
    /* Wake every peer blocked in a collective with an error (see banner). */
    void (*abort)(dsv4_comm *c);
    /* Release this rank's handle. NULL-safe. */
    void (*free)(dsv4_comm *c);
    /* 1: all_reduce_sum / all_gather on a backend with a device stream are
     * queued on that stream with no host synchronisation, so a forward that
     * calls them can be captured in a CUDA graph (NCCL); 0: they block (local). */
    int capturable;
};

/*
 * dsv4_comm_local_create — n ranks that are threads of this process: fills
 * ranks[0..n) with one handle per rank (each used by exactly one thread).
 * The ranks exchange partials through host memory (be->buf_read/buf_write),
 * so any backend works; the summation order is rank order on every rank.
 * Free every handle; the shared group goes with the last.
 * Errors: DSV4_EINVAL n < 1; DSV4_ENOMEM.
 */
int dsv4_comm_local_create(int n, dsv4_comm **ranks, dsv4_err *err);
/* Clear an abort once every rank of the group has returned from its collectives. */
void dsv4_comm_local_recover(dsv4_comm *c);

/*
 * TCP (src/parallel/comm_tcp.c): ranks that are separate processes, one rank
 * per process — `dsv4 serve --nnodes N` on CPU backends runs rank r on node r
 * and joins the group right after the rendezvous, at --master-port + 1
 * (rendezvous.h). A star around rank 0: peers send their partials to rank 0,
 * which sums them in rank order 0..N-1 (the local communicator's order, so
 * the bits equal an in-process group's) and sends the one result back, so
 * every rank holds bit-identical values. Buffers go through host memory
 * (be->buf_read/buf_write), so any backend works.
 *
 * dsv4_comm_tcp_create — rank 0 listens on addr:port and waits for ranks
 *   1..size-1; the others connect to addr:port (retrying until rank 0
 *   listens). Returns when every rank is connected, or fails after timeout_s
 *   (<= 0: 300 s). Errors: DSV4_EINVAL bad rank/size/port, a peer claiming a
 *   rank twice or another group size; DSV4_EIO cannot listen (port in use),
 *   cannot reach rank 0, timeout (naming the missing ranks).
 * After setup a broken connection (a peer process that exits or crashes)
 * fails the collective with DSV4_EBACKEND naming the peer ("rank 1 (node 1
 * at A:P) closed the connection"), and the group stays dead: every later
 * call fails at once with the first reason. abort shuts every socket down,
 * waking this process's blocked threads and every peer.
 * dsv4_comm_tcp_check — without blocking, 0 while every connection is up;
 *   else DSV4_EBACKEND with the reason (a peer that hung up is noticed even
 *   with no collective in flight). 0 for other communicators.
 */
int dsv4_comm_tcp_create(const char *addr, int port, int rank, int size, double timeout_s, dsv4_comm **out,
                         dsv4_err *err);
int dsv4_comm_tcp_check(dsv4_comm *c, dsv4_err *err);
/*
 * dsv4_comm_tcp_create_ranks — ranks first .. first+n-1 of a TCP group of
 * `size` in this process (one node of several, each holding n ranks:
 * parallel/multinode.h): out[i] is rank first+i's handle, each with its own
 * connection to rank 0 (and rank 0, when first == 0, listening), made
 * concurrently (one thread each) since setup returns only when the whole
 * group is in. Each handle is then used by one thread. Sums keep the rank
 * order of the star (bit-identical to the local communicator of `size`
 * threads). Messages name rank R's node as R / n (every node holds n ranks).
 * Errors: DSV4_EINVAL bad range; the first failing rank's
 * dsv4_comm_tcp_create error (every handle made is freed); DSV4_ENOMEM.
 */
int dsv4_comm_tcp_create_ranks(const char *addr, int port, int first, int n, int size, double timeout_s,
                               dsv4_comm **out, dsv4_err *err);

/*
 * NCCL (src/parallel/comm_nccl.c). libnccl.so.2 is loaded with dlopen at run
 * time, never linked, from the first of these that is set: $DSV4_NCCL_LIB (a
 * path), $NCCL_LIBRARY, else the loader's default search ("libnccl.so.2"); an
 * explicit path that does not load is an error, not a fall-through. The pip wheel nvidia-nccl-cu13
 * puts it in site-packages/nvidia/nccl/lib: point DSV4_NCCL_LIB there.
 *
 * dsv4_nccl_unique_id — ncclGetUniqueId into id (128 bytes), on rank 0 only;
 *   the rendezvous (rendezvous.h) carries it to the other nodes.
 * dsv4_comm_nccl_create — ncclCommInitRank(size, id, rank) on the calling
 *   thread's current CUDA device (the CUDA backend selects it). The buffers
 *   handed to all_reduce_sum are device pointers of that backend; the
 *   reduction runs on the legacy default stream after be->sync and is waited
 *   for (correct, not fast: see PERFORMANCE.md §1 for the one-shot path).
 * Errors: DSV4_EUNSUPPORTED library not found (the message says where it
 *   looked and which variable to set); DSV4_EBACKEND an NCCL error string.
 */
#define DSV4_NCCL_ID_BYTES 128
/*
 * dsv4_comm_nccl_create_all — n ranks on GPUs 0..n-1 of this host, one
 * process (ncclCommInitAll): ranks[r] is rank r's handle, to be used from the
 * thread that drives GPU r (its collectives run on that thread's backend
 * stream). Free every handle, each from its rank's thread (ncclCommDestroy
 * may wait for the peers). Errors: DSV4_EINVAL fewer visible GPUs than n
 * (the message gives both numbers); DSV4_EUNSUPPORTED NCCL or the CUDA
 * runtime cannot be loaded (as dsv4_comm_nccl_create); DSV4_EBACKEND NCCL's
 * error string.
 */
int dsv4_comm_nccl_create_all(int n, dsv4_comm **ranks, dsv4_err *err);
/*
 * dsv4_comm_nccl_set_oneshot — in a CUDA build, dsv4_comm_nccl_create_all sets
 * up a one-shot all-reduce over NVLink peer memory (cuda_backend.h
 * dsv4_cuda_oneshot_*: one kernel, for a decode step's small messages)
 * unless DSV4_TP_ONESHOT=0, or peer access is missing (then NCCL only, with a
 * warning); F32 and BF16 messages up to DSV4_TP_ONESHOT_MAX bytes (default
 * 1 MB) take it, larger ones NCCL. This turns that path on (1) or off (0)
 * for rank c (every rank must be set the same way between the same pair of
 * steps). Returns whether the one-shot path is now in use (0 for other
 * communicators).
 */
int dsv4_comm_nccl_set_oneshot(dsv4_comm *c, int on);
/* The largest message in BYTES the one-shot path takes; larger ones go through NCCL. 0 = no one-shot path. */
int64_t dsv4_comm_nccl_oneshot_max(const dsv4_comm *c);
/* The number of CUDA devices this process sees (cudaGetDeviceCount through the
 * runtime NCCL's loader finds), or -1 with err set (no runtime: DSV4_EUNSUPPORTED;
 * no driver / GPU: DSV4_EBACKEND). */
int dsv4_cuda_visible_devices(dsv4_err *err);
int dsv4_nccl_unique_id(uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_err *err);
int dsv4_comm_nccl_create(int rank, int size, const uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_comm **out,
                          dsv4_err *err);
/*
 * dsv4_comm_nccl_create_ranks — ranks first .. first+n-1 of an NCCL group of
 * `size` (the rendezvous id) in this process, rank first+i on GPU i of this
 * host: one thread calls ncclCommInitRank for each inside ncclGroupStart /
 * ncclGroupEnd (NCCL's rule when one thread initialises several ranks), then
 * out[i] is used from the thread that drives GPU i (tp_runner.h
 * comms_on_gpus). No one-shot path (peer memory does not span hosts). Free
 * every handle from its rank's thread. Errors: DSV4_EINVAL bad range or fewer
 * visible GPUs than n (both numbers given); DSV4_EUNSUPPORTED as
 * dsv4_comm_nccl_create; DSV4_EBACKEND NCCL's error string (every handle made
 * is aborted). Compiled, not yet run on several GPUs of several hosts.
 */
int dsv4_comm_nccl_create_ranks(int first, int n, int size, const uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_comm **out,
                                dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
