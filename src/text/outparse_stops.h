/*
 * text/outparse_stops.h — internal: stop-string matcher of the output parser
 * (spec/SERVING.md §6.1). Not a public API; used by outparse.c.
 *
 * Text arrives in pieces with per-byte token tags. The matcher releases text
 * that can no longer be part of a match and withholds the longest suffix that
 * is a proper prefix of some stop string. The first match to *complete* in the
 * text wins (ties: list order), so feeding a step's tokens one by one gives
 * the same answer as token-by-token generation.
 */
#ifndef DSV4_TEXT_OUTPARSE_STOPS_H
#define DSV4_TEXT_OUTPARSE_STOPS_H

#include "dsv4/common.h"
#include "text/outparse_buf.h"

typedef void (*op_emit_fn)(void *ctx, const char *s, size_t n);

typedef struct op_stops {
    char **str;
    size_t *len;
    int n;
    int include; /* include_stop_str_in_output */
    int32_t min_tag; /* matches completing in an earlier token are ignored (min_tokens) */
    op_buf held; /* tagged */
} op_stops;

/* Copies the strings. Empty string -> DSV4_EINVAL naming its index. */
int op_stops_init(op_stops *st, const char *const *stops, int n, int include, dsv4_err *err);
void op_stops_free(op_stops *st);

/*
 * Push text (tags: per-byte token index, or NULL: every byte has token
 * index `tag_all`). Calls emit for released text.
 * Returns 1 when a stop matched (then *which = its index, *tag = token index
 * of its last byte; text before the match was emitted, the rest is dropped),
 * 0 when none matched, -1 on allocation failure.
 */
int op_stops_push(op_stops *st, const char *s, const int32_t *tags, int32_t tag_all, size_t n, op_emit_fn emit,
                  void *ctx, int *which, int32_t *tag);

/* Release all held text (no match can complete any more). */
void op_stops_flush(op_stops *st, op_emit_fn emit, void *ctx);
#endif
