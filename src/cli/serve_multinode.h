/*
 * serve_multinode.h — the `dsv4 serve --nnodes N` parts of the command
 * (src/parallel/multinode.h for the design; DESIGN.md "Parallelism").
 */
#ifndef DSV4_CLI_SERVE_MULTINODE_H
#define DSV4_CLI_SERVE_MULTINODE_H

#include "cli/serve_args.h"
#include "parallel/multinode.h"
#include "server/service.h"

/*
 * dsv4_serve_join — rendezvous + communicator for this node from the flags
 * (--nnodes, --node-rank, --master-addr, --master-port, -tp, --device cuda =
 * NCCL, else TCP; DSV4_RDV_TIMEOUT_S overrides the 300 s default wait).
 * Errors as dsv4_multinode_join, message ready to print.
 */
int dsv4_serve_join(const dsv4_serve_args *a, const char *dir, dsv4_multinode **out, dsv4_err *err);

/*
 * dsv4_serve_follower — the whole life of node R > 0: join, open this rank,
 * follow node 0 until it quits. Returns the process exit status: 0 when node 0
 * quit, 1 on an error (printed, naming the node).
 */
int dsv4_serve_follower(const dsv4_serve_args *a, dsv4_service_opts *so);

#endif
