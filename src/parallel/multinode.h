/*
 * multinode.h — one model served by several hosts (`dsv4 serve --nnodes N
 * --node-rank R --master-addr A --master-port P`; DESIGN.md "Parallelism":
 * "Rank 0 also runs the HTTP server and the scheduler and broadcasts each
 * step plan").
 *
 * The pieces, in order:
 *   1. the rendezvous (rendezvous.h) on A:P checks that every node agrees on
 *      --nnodes, --tensor-parallel-size, the model's config.json (+
 *      --hf-overrides) and the dsv4 build, and carries NCCL's id;
 *   2. the communicator: with --device cuda NCCL (dsv4_comm_nccl_create with
 *      the rendezvous id); otherwise the TCP communicator (comm.h), rank r on
 *      node r, rank 0 listening on A:(P+1);
 *   3. every node opens its rank's slice of the model (engine/model_runner.h
 *      dsv4_model_runner_open_tp) and the nodes compare their KV pools (slots,
 *      pages, lengths must match for node 0's page ids to mean the same pages
 *      everywhere: a mismatch names the node and both values);
 *   4. node 0 wraps its runner in the step-plan leader (tp_plan.h) and serves;
 *      every other node follows node 0's plans until node 0 quits.
 *
 * Ranks per node: --tensor-parallel-size T is the total over the nodes (vLLM's
 * meaning: `--tensor-parallel-size 4 --nnodes 2` is 2 nodes of 2 GPUs), so T
 * must be a multiple of --nnodes N and each node runs k = T / N ranks: global
 * rank node_rank·k + i, local rank i on GPU i (--device cuda) or a CPU thread.
 *   - k == 1: one communicator per node, as above (rank = node).
 *   - k > 1: the node's ranks are threads of one TP runner (tp_runner.h; its
 *     job board runs each plan on every local rank), their model group is
 *     NCCL (each rank on its GPU, initialised in one ncclGroupStart/End) or
 *     TCP (each rank its own connection, --master-port + 2), and the step
 *     plans and the pool check travel over a separate TCP group of one rank
 *     per node (--master-port + 1). multinode.c says why.
 *
 * Failure policy (what vLLM does when a worker process dies: its executor's
 * monitor fails the engine and the API server exits): a node that goes away
 * fails node 0's step in flight with an error naming the node, and node 0
 * then shuts down with a nonzero status (dsv4_multinode_check tells cmd_serve).
 * Node 0 stopping (SIGINT/SIGTERM) sends every follower "quit": they exit 0.
 */
#ifndef DSV4_PARALLEL_MULTINODE_H
#define DSV4_PARALLEL_MULTINODE_H

#include "engine/model_runner.h"
#include "engine/runner.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_multinode dsv4_multinode;

typedef struct dsv4_multinode_opts {
    const char *master_addr; /* --master-addr (node 0's address, reachable from every node) */
    int master_port;         /* --master-port (rendezvous); the TCP communicator(s) use master_port + 1 (and + 2) */
    int nnodes, node_rank;
    int tp_size;             /* --tensor-parallel-size over all nodes: a multiple of nnodes (tp_size / nnodes per node) */
    const char *model_dir;   /* config.json there is hashed into the rendezvous */
    const char *hf_overrides; /* hashed with it (NULL = none) */
    int use_nccl;            /* 1: --device cuda (NCCL over the rendezvous id); 0: TCP */
    double timeout_s;        /* rendezvous and communicator setup; <= 0: DSV4_RDV_DEFAULT_TIMEOUT_S */
} dsv4_multinode_opts;

/*
 * dsv4_multinode_join — steps 1 and 2 above. Blocks until every node has
 * joined (or timeout). Errors: DSV4_EINVAL tp_size not a multiple of nnodes
 * (after the rendezvous, so that a -tp mismatch between nodes is named
 * first), a rendezvous mismatch naming the field and the node; DSV4_EINVAL
 * (k > 1, --device cuda) fewer visible GPUs than k; DSV4_EIO timeouts and ports in use (rendezvous.h,
 * comm.h); DSV4_EUNSUPPORTED NCCL not loadable; DSV4_ENOMEM.
 */
int dsv4_multinode_join(const dsv4_multinode_opts *o, dsv4_multinode **out, dsv4_err *err);

/* This node's communicator of the step plans (rank = node rank; with one rank per node also the model's). */
dsv4_comm *dsv4_multinode_comm(dsv4_multinode *m);

/*
 * dsv4_multinode_open_leader — node 0: open rank 0's slice of dir with o / lo
 * (the same options on every node: the pool must match), check the followers'
 * pools, and wrap the runner in the step-plan leader. *mr: the rank-0 model
 * runner with one rank per node (its drafter and config are the whole model's;
 * free it after dsv4_multinode_stop), NULL with several (the node's TP runner
 * is m's: dsv4_multinode_config / _drafter); *run: what the engine drives. A call that fails marks
 * the group failed (dsv4_multinode_check). Errors: the runner's; DSV4_EINVAL a
 * follower's pool differs ("node R: KV pool ... node 0 ..."); the
 * communicator's (a follower that failed to load: "rank R ... closed the
 * connection", its own log says why).
 */
int dsv4_multinode_open_leader(dsv4_multinode *m, const char *dir, const dsv4_model_runner_opts *o,
                               const dsv4_load_opts *lo, dsv4_model_runner **mr, dsv4_runner *run, dsv4_err *err);
/* Node 0: tell the followers to quit (they exit 0) and free this node's ranks (several per node); the
 * engine must be stopped. NULL-safe, idempotent. */
void dsv4_multinode_stop(dsv4_multinode *m);
/* Node 0 after open_leader, before stop: the whole model's config (NULL before), and rank 0's drafter
 * (returns 0 when there is none; as dsv4_model_runner_drafter). */
const dsv4_config *dsv4_multinode_config(dsv4_multinode *m);
int dsv4_multinode_drafter(dsv4_multinode *m, dsv4_drafter *out);
/* Node 0 between open_leader and stop: global rank 0's backend (for logs), else NULL. */
dsv4_backend *dsv4_multinode_backend(dsv4_multinode *m);

/*
 * dsv4_multinode_check — node 0, without blocking: 0 while every node is
 * there and no step has failed; else the first failure (DSV4_EBACKEND, the
 * message names the node).
 */
int dsv4_multinode_check(dsv4_multinode *m, dsv4_err *err);

/*
 * dsv4_multinode_follow — nodes 1..N-1: open this node's slice(s) (same o / lo as
 * node 0), send the pool for node 0's check, then run node 0's step plans
 * until it quits (returns 0). Errors: the runner's (the communicator is
 * aborted first, so node 0 fails instead of waiting); node 0 gone
 * (DSV4_EBACKEND "rank 0 ... closed the connection").
 */
int dsv4_multinode_follow(dsv4_multinode *m, const char *dir, const dsv4_model_runner_opts *o,
                          const dsv4_load_opts *lo, dsv4_err *err);

/* Stop (node 0) and release the communicator. NULL-safe. */
void dsv4_multinode_free(dsv4_multinode *m);

#ifdef __cplusplus
}
#endif
#endif
