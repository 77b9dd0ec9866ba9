/*
 * rendezvous.h — the multi-node handshake before NCCL (DESIGN.md
 * "Parallelism": `--nnodes --node-rank --master-addr --master-port`).
 *
 * Node 0 listens on master-addr:master-port; every other node connects and
 * sends what must agree across the cluster (tensor-parallel size, node count,
 * a hash of the model's config.json, the dsv4 build id). Node 0 checks each
 * field, and when all nnodes-1 peers have joined it sends each the 128-byte
 * NCCL unique id (ncclGetUniqueId on node 0), which every rank then hands to
 * ncclCommInitRank. Why our own TCP handshake instead of NCCL's bootstrap: NCCL
 * needs the id before it can talk, and a misconfigured launch (different -tp,
 * different checkpoint, different binary) must fail at start with a message
 * that names the field, not hang inside ncclCommInitRank.
 *
 * Wire format (all integers big-endian): hello = "DSV4RDV1", u32 node_rank,
 * u32 tp_size, u32 nnodes, u64 config_hash, char build_id[64]; reply = u32
 * status (0 ok, 1 refused), char message[256], u8 id[128].
 */
#ifndef DSV4_PARALLEL_RENDEZVOUS_H
#define DSV4_PARALLEL_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_RDV_ID_BYTES 128
#define DSV4_RDV_DEFAULT_TIMEOUT_S 300.0

typedef struct dsv4_rdv_opts {
    const char *master_addr; /* IPv4/IPv6 literal or host name */
    int master_port;         /* 1..65535 */
    int nnodes, node_rank;   /* node_rank in [0, nnodes) */
    int tp_size;             /* --tensor-parallel-size (over all nodes) */
    uint64_t config_hash;    /* dsv4_rdv_hash of config.json's bytes */
    const char *build_id;    /* e.g. the git describe of the binary; at most 63 bytes compared */
    double timeout_s;        /* <= 0: DSV4_RDV_DEFAULT_TIMEOUT_S */
} dsv4_rdv_opts;

/*
 * dsv4_rendezvous — run the handshake. On node 0, id (128 bytes) is INPUT and
 * is sent to every peer; on other nodes it is OUTPUT. nnodes == 1 returns at
 * once. Errors (DSV4_EIO unless noted), each naming master-addr:port:
 *   - node 0 cannot bind: "port P on A is already in use" (EADDRINUSE), or
 *     the system error;
 *   - timeout (DSV4_EIO): on node 0 "waited N s for node(s)
 *     1, 3 of 4"; on a peer "could not reach node 0 at A:P within N s" or
 *     "node 0 did not answer within N s";
 *   - mismatch (DSV4_EINVAL), on node 0 AND on the peer: "node R has
 *     --tensor-parallel-size 4, node 0 has 2" (also nnodes, the config hash =
 *     "a different model config.json", the build id, a duplicate or
 *     out-of-range node rank).
 */
int dsv4_rendezvous(const dsv4_rdv_opts *o, uint8_t id[DSV4_RDV_ID_BYTES], dsv4_err *err);

/* FNV-1a 64 of n bytes (the config hash). */
uint64_t dsv4_rdv_hash(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
