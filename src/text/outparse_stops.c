/* Stop-string matcher (text/outparse_stops.h; spec/SERVING.md §6.1). */
#include "text/outparse_stops.h"

#include <stdlib.h>
#include <string.h>

int op_stops_init(op_stops *st, const char *const *stops, int n, int include, dsv4_err *err) {
    memset(st, 0, sizeof *st);
    st->held.tagged = 1;
    st->include = include;
    if (n <= 0) return DSV4_OK;
    st->str = calloc((size_t)n, sizeof *st->str);
    st->len = calloc((size_t)n, sizeof *st->len);
    if (!st->str || !st->len) return dsv4_err_set(err, DSV4_ENOMEM, "stop strings: out of memory");
    st->n = n;
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0])
            return dsv4_err_set(err, DSV4_EINVAL, "stop[%d]: empty stop string is not allowed", i);
        st->str[i] = strdup(stops[i]);
        if (!st->str[i]) return dsv4_err_set(err, DSV4_ENOMEM, "stop strings: out of memory");
        st->len[i] = strlen(stops[i]);
    }
    return DSV4_OK;
}

void op_stops_free(op_stops *st) {
    for (int i = 0; i < st->n; i++) free(st->str[i]);
    free(st->str);
    free(st->len);
    op_buf_free(&st->held);
    memset(st, 0, sizeof *st);
}

/* Length of the longest suffix of h[0..n) that is a proper prefix of a stop. */
static size_t partial_suffix(const op_stops *st, const char *h, size_t n) {
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        size_t L = st->len[i] - 1;
        if (L > n) L = n;
        for (; L > best; L--)
            if (memcmp(h + n - L, st->str[i], L) == 0) break;
        if (L > best) best = L;
    }
    return best;
}

int op_stops_push(op_stops *st, const char *s, const int32_t *tags, int32_t tag_all, size_t n, op_emit_fn emit,
                  void *ctx, int *which, int32_t *tag) {
    if (op_buf_put(&st->held, s, n, tags, tag_all)) return -1;
    op_buf *h = &st->held;
    /* Earliest-ending occurrence over all stops; the first occurrence of a
     * given stop is also its earliest-ending one. Ties keep list order. */
    int best = -1;
    size_t best_end = 0, best_start = 0;
    for (int i = 0; i < st->n; i++) {
        /* first occurrence that completes at or after token min_tag */
        const char *m = h->s;
        while ((m = memmem(m, h->len - (size_t)(m - h->s), st->str[i], st->len[i])) != NULL &&
               h->tag[(size_t)(m - h->s) + st->len[i] - 1] < st->min_tag)
            m++;
        if (!m) continue;
        size_t start = (size_t)(m - h->s), end = start + st->len[i];
        if (best < 0 || end < best_end) {
            best = i;
            best_end = end;
            best_start = start;
        }
    }
    if (best >= 0) {
        size_t keep = st->include ? best_end : best_start;
        if (keep) emit(ctx, h->s, keep);
        *which = best;
        *tag = h->tag[best_end - 1];
        op_buf_clear(h);
        return 1;
    }
    size_t hold = partial_suffix(st, h->s, h->len);
    if (h->len > hold) {
        emit(ctx, h->s, h->len - hold);
        op_buf_consume(h, h->len - hold);
    }
    return 0;
}

void op_stops_flush(op_stops *st, op_emit_fn emit, void *ctx) {
    if (st->held.len) emit(ctx, st->held.s, st->held.len);
    op_buf_clear(&st->held);
}
