/* Helpers for the tests of the TCP communicator's all-reduce (test_comm_tcp.c: ranks as
 * processes; test_multinode_ranks.c: 2 nodes x 2 ranks as threads): per-rank partials whose
 * sum shows the order of the additions in its bits, the rank-order sum they must equal, and
 * one rank's all_reduce_sum of its partials on a CPU buffer. */
#ifndef DSV4_COMM_TEST_UTIL_H
#define DSV4_COMM_TEST_UTIL_H

#include <stdlib.h>

#include "backend/backend.h"
#include "parallel/comm.h"

/* Rank r's partial at i: magnitudes far apart (1e6, 1, 1e-6), so that another order of the sums
 * gives other bits. */
static inline float ct_part(int r, int i) {
    unsigned x = (unsigned)(r * 7919 + i * 104729 + 17) * 2654435761u;
    float m = (float)(x >> 8) / (float)(1u << 24);
    return (i % 3 == 0 ? 1e6f : i % 3 == 1 ? 1.0f : 1e-6f) * (m - 0.5f) * (float)(r + 1);
}

/* ((p0 + p1) + p2) + ... + p(n-1) at i: the sum in rank order (the local communicator's). */
static inline float ct_rank_order_sum(int n, int i) {
    float s = ct_part(0, i);
    for (int r = 1; r < n; r++) s += ct_part(r, i);
    return s;
}

/* c->rank's partials 0..len-1 in a rows x len/rows F32 buffer of the CPU backend be, summed over
 * c with all_reduce_sum and read back into out[len]. Returns the collective's status (-1 when
 * len/rows does not divide or memory runs out). */
static inline int ct_reduce_partials(dsv4_comm *c, dsv4_backend *be, int rows, int len, float *out, dsv4_err *err) {
    float *v = malloc(sizeof(float) * (size_t)len);
    dsv4_buf b;
    if (!v || len % rows || be->buf_alloc(be, DSV4_DT_F32, rows, len / rows, &b, err)) {
        free(v);
        return -1;
    }
    for (int i = 0; i < len; i++) v[i] = ct_part(c->rank, i);
    be->buf_write(be, &b, v, err);
    int rc = c->all_reduce_sum(c, be, &b, err);
    be->buf_read(be, &b, out, err);
    be->buf_free(be, &b);
    free(v);
    return rc;
}

#endif
