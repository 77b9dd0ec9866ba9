/*
 * Scratch buffers of one forward call on a backend, all freed together
 * (contents undefined on backends with buf_alloc_scratch, zeroed otherwise)
 * (used by the block, the DSpark drafter and the MTP block). Allocation
 * threads an rc through so a sequence of ops reads straight:
 *   dsv4_buf *q = sc_alloc(&s, dt, T, n, &rc, err); ... sc_free(&s);
 * After the first failure every later sc_alloc returns NULL and rc keeps the error.
 */
#ifndef DSV4_MODEL_SCRATCH_H
#define DSV4_MODEL_SCRATCH_H

#include "backend/backend.h"

#define DSV4_MAX_SCRATCH 48

typedef struct scratch {
    dsv4_backend *be;
    int n;
    dsv4_buf bufs[DSV4_MAX_SCRATCH];
} scratch;

static inline dsv4_buf *sc_alloc(scratch *s, dsv4_dtype dt, int64_t rows, int64_t cols, int *rc, dsv4_err *err) {
    if (*rc) return NULL;
    if (s->n == DSV4_MAX_SCRATCH) {
        *rc = dsv4_err_set(err, DSV4_EINTERNAL, "forward: scratch buffers exhausted (%d)", DSV4_MAX_SCRATCH);
        return NULL;
    }
    dsv4_buf *b = &s->bufs[s->n];
    /* contents undefined where the backend has scratch allocation: every op writes its outputs in full */
    *rc = s->be->buf_alloc_scratch ? s->be->buf_alloc_scratch(s->be, dt, rows, cols, b, err)
                                   : s->be->buf_alloc(s->be, dt, rows, cols, b, err);
    if (*rc) return NULL;
    s->n++;
    return b;
}

static inline void sc_free(scratch *s) {
    for (int i = s->n - 1; i >= 0; i--) s->be->buf_free(s->be, &s->bufs[i]); /* newest first: an arena pops at once */
    s->n = 0;
}
#endif
