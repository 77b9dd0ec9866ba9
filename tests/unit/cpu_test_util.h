/* Helpers for the CPU backend / forward tests: a deterministic RNG, F32
 * buffers and ragged batches built from (slot, pos0, length) segments. */
#ifndef DSV4_CPU_TEST_UTIL_H
#define DSV4_CPU_TEST_UTIL_H

#include "backend/backend.h"
#include <stdlib.h>
#include <string.h>

static uint64_t tu_state = 0x1234567;
static inline float tu_rand(void) { /* uniform in [-1, 1) */
    tu_state ^= tu_state << 13;
    tu_state ^= tu_state >> 7;
    tu_state ^= tu_state << 17;
    return (float)((tu_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static inline void tu_fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = tu_rand() * scale;
}

static inline dsv4_buf tu_buf(dsv4_backend *be, dsv4_dtype dt, int64_t r, int64_t c) {
    dsv4_buf b = {0};
    be->buf_alloc(be, dt, r, c, &b, NULL);
    return b;
}
static inline float *tu_f(dsv4_buf *b) { return (float *)b->data; }

static inline dsv4_tview tu_view(dsv4_dtype dt, const void *data, int ndim, int64_t d0, int64_t d1) {
    dsv4_tview v = {0};
    v.dtype = dt;
    v.ndim = ndim;
    v.shape[0] = d0;
    v.shape[1] = d1;
    v.data = data;
    v.nbytes = (size_t)(d0 * (ndim > 1 ? d1 : 1)) * dsv4_dtype_size(dt);
    return v;
}

/* A ragged batch over up to 16 segments / 4096 rows, owning its arrays. */
typedef struct tu_batch {
    dsv4_batch b;
    int32_t token[4096], pos[4096], slot[4096], seq_idx[4096];
    int32_t cu[17], sslot[16], spos0[16];
} tu_batch;

static inline void tu_batch_init(tu_batch *tb) {
    memset(tb, 0, sizeof *tb);
    tb->b.token = tb->token;
    tb->b.pos = tb->pos;
    tb->b.slot = tb->slot;
    tb->b.seq_idx = tb->seq_idx;
    tb->b.cu_seqlens = tb->cu;
    tb->b.seq_slot = tb->sslot;
    tb->b.seq_pos0 = tb->spos0;
}
/* Append a segment of n rows: slot, positions pos0.., tokens from toks (indexed by position) */
static inline void tu_batch_add(tu_batch *tb, int slot, int pos0, int n, const int32_t *toks_by_pos) {
    int s = tb->b.n_seqs, r0 = tb->b.n_rows;
    tb->sslot[s] = slot;
    tb->spos0[s] = pos0;
    for (int i = 0; i < n; i++) {
        tb->pos[r0 + i] = pos0 + i;
        tb->slot[r0 + i] = slot;
        tb->seq_idx[r0 + i] = s;
        tb->token[r0 + i] = toks_by_pos ? toks_by_pos[pos0 + i] : 0;
    }
    tb->b.n_rows = r0 + n;
    tb->b.n_seqs = s + 1;
    tb->cu[s + 1] = r0 + n;
}
#endif
