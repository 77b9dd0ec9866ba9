/*
 * tp_plan.h — step plans for ranks that share no memory with rank 0 (the
 * other nodes of a multi-node launch; DESIGN.md "Parallelism": "Rank 0 also
 * runs the HTTP server and the scheduler and broadcasts each step plan").
 *
 * The leader wraps rank 0's runner: every call (forward, release, resume,
 * copy_slot, set_pages, warmup) is first serialised and broadcast over the
 * communicator, then run locally. After a warmup every follower broadcasts
 * how many graphs it holds; node 0 refuses to start when a count differs. A follower loops: receive a plan, run the same call on its own
 * runner (its slice of the model), until the leader quits. Because the plan
 * broadcast and the forward's all-reduces go through one communicator in the
 * same order on every rank, ranks stay in lock step without other signalling.
 *
 * Wire format (host bytes, native endianness: every node runs the same build,
 * which the rendezvous checks): a header of 8 int64 {op, n_rows, n_seqs,
 * n_logits, a, b, c, payload bytes}, then for a forward the payload
 * token, pos, slot, seq_idx [n_rows], cu_seqlens [n_seqs+1], seq_slot,
 * seq_pos0 [n_seqs], logit rows [n_logits] (int32); for a set_pages a =
 * slot, b = n and the payload the n page ids (int32). Every node sizes its
 * KV pool from the same options, so the ids mean the same pages everywhere.
 */
#ifndef DSV4_PARALLEL_TP_PLAN_H
#define DSV4_PARALLEL_TP_PLAN_H

#include "engine/runner.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_plan_leader dsv4_plan_leader;

/*
 * dsv4_plan_leader_create — wrap rank 0's runner `inner` (c->rank must be 0;
 * max_len its positions per slot, for dsv4_tp_check_batch: a batch the ranks
 * would refuse is refused before it is broadcast). *out_runner is the runner
 * the engine drives. A forward that fails on rank 0 after its plan went out
 * aborts the communicator. Errors: DSV4_EINVAL rank != 0; DSV4_ENOMEM.
 */
int dsv4_plan_leader_create(dsv4_comm *c, const dsv4_runner *inner, int max_len, dsv4_plan_leader **out,
                            dsv4_runner *out_runner, dsv4_err *err);
/* Tell every follower to return from dsv4_plan_follow, then free. NULL-safe. */
void dsv4_plan_leader_free(dsv4_plan_leader *l);

/*
 * dsv4_plan_follow — a follower rank (c->rank > 0): run the leader's plans on
 * `inner` until it quits (returns 0). A failing call aborts the communicator
 * (so the leader's collectives fail instead of waiting) and returns its error.
 * Errors: the runner's; DSV4_EFORMAT a malformed plan; the communicator's.
 */
int dsv4_plan_follow(dsv4_comm *c, const dsv4_runner *inner, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
