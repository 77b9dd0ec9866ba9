/*
 * comm_host.h — host staging and the rank-order sum shared by the
 * communicators that reduce in host memory: `local` (threads, comm_local.c)
 * and `tcp` (processes, comm_tcp.c) (comm.h; DESIGN.md "Parallelism").
 *
 * Why one implementation: the determinism contract of comm.h says a TCP group
 * gives the same bits as an in-process group of the same size. That holds
 * only while both widen BF16 the same way, add the partials in the same order
 * ((p0 + p1) + p2) + ... in fp32, and round back to BF16 the same way — so
 * those three steps live here, once.
 */
#ifndef DSV4_PARALLEL_COMM_HOST_H
#define DSV4_PARALLEL_COMM_HOST_H

#include <stddef.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rank's scratch for BF16 host bytes (zero-initialise; free `raw` with free()). */
typedef struct dsv4_comm_stage {
    const char *who; /* message prefix of the owning communicator: "local comm", "tcp comm" */
    void *raw;       /* BF16 host bytes of the buffer being staged */
    size_t raw_cap;  /* bytes */
} dsv4_comm_stage;

/*
 * dsv4_comm_host_grow — make *p (realloc'd, capacity *cap bytes) hold at
 * least `need` bytes; contents up to the old capacity are kept. Errors:
 * DSV4_ENOMEM "<who>: out of memory (N bytes)" (then *p and *cap are unchanged).
 */
int dsv4_comm_host_grow(const char *who, void **p, size_t *cap, size_t need, dsv4_err *err);

/*
 * dsv4_comm_host_read — buf (rows × cols, F32 or BF16, in be's memory) as
 * rows*cols fp32 host values into *dst (grown to at least max(rows*cols, 1)
 * floats; *dst_cap in bytes). BF16 widens exactly (its bits are the top half
 * of an fp32). Errors: DSV4_EINVAL "<who>: dtype X not supported (F32, BF16)";
 * DSV4_ENOMEM; be->buf_read's error.
 */
int dsv4_comm_host_read(dsv4_comm_stage *st, dsv4_backend *be, const dsv4_buf *buf, float **dst,
                        size_t *dst_cap, dsv4_err *err);

/*
 * dsv4_comm_host_write — v[0 .. rows*cols) (fp32 host) into buf (F32 as is;
 * BF16 rounded once to nearest even, NaN kept a quiet NaN). rows*cols == 0
 * writes nothing. Errors: DSV4_ENOMEM; be->buf_write's error.
 */
int dsv4_comm_host_write(dsv4_comm_stage *st, dsv4_backend *be, dsv4_buf *buf, const float *v, dsv4_err *err);

/*
 * dsv4_comm_host_accumulate — acc[i] += part[i] for i in [0, n), fp32. The one
 * reduction step of both host communicators: acc starts as rank 0's partial
 * and the partials of ranks 1..N-1 are added in rank order, so the sum is
 * ((p0 + p1) + p2) + ... on every rank and in every transport (comm.h
 * determinism contract). Kept out of line so that every caller gets the same
 * machine code (no caller-specific contraction or reassociation).
 */
void dsv4_comm_host_accumulate(float *acc, const float *part, size_t n);

#ifdef __cplusplus
}
#endif
#endif
