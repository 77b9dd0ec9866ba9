/*
 * text/outparse_buf.h — internal growable byte buffer with an optional
 * parallel array of token tags, shared by the output-parser stages
 * (outparse.c, outparse_dsml.c, outparse_stops.c). Not a public API.
 *
 * Why tags: a stop string can complete in text that an earlier stage held
 * back (a "\n\n" that might open a tool call, §6.2), so the stop matcher must
 * know in which token each byte arrived to tell the engine where to truncate
 * (§6.1). Every byte carries the index of the token that completed it.
 */
#ifndef DSV4_TEXT_OUTPARSE_BUF_H
#define DSV4_TEXT_OUTPARSE_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct op_buf {
    char *s;      /* always NUL-terminated when non-NULL */
    int32_t *tag; /* parallel tags, or NULL for an untagged buffer */
    size_t len, cap;
    int tagged;
} op_buf;

static inline int op_buf_reserve(op_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 64;
    while (nc < b->len + extra + 1) nc *= 2;
    char *ns = realloc(b->s, nc);
    if (!ns) return -1;
    b->s = ns;
    if (b->tagged) {
        int32_t *nt = realloc(b->tag, nc * sizeof *nt);
        if (!nt) return -1;
        b->tag = nt;
    }
    b->cap = nc;
    return 0;
}

/* Append n bytes; tags = per-byte tags, or NULL to tag every byte with `tag`. */
static inline int op_buf_put(op_buf *b, const char *s, size_t n, const int32_t *tags, int32_t tag) {
    if (op_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->s + b->len, s, n);
    if (b->tagged) {
        for (size_t i = 0; i < n; i++) b->tag[b->len + i] = tags ? tags[i] : tag;
    }
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

static inline int op_buf_puts(op_buf *b, const char *s) { return op_buf_put(b, s, strlen(s), NULL, 0); }

/* Drop the first n bytes. */
static inline void op_buf_consume(op_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->s, b->s + n, b->len - n);
        if (b->tagged) memmove(b->tag, b->tag + n, (b->len - n) * sizeof *b->tag);
        b->len -= n;
    }
    if (b->s) b->s[b->len] = '\0';
}

/* Remove n bytes at offset off. */
static inline void op_buf_cut(op_buf *b, size_t off, size_t n) {
    if (off >= b->len) return;
    if (n > b->len - off) n = b->len - off;
    memmove(b->s + off, b->s + off + n, b->len - off - n);
    if (b->tagged) memmove(b->tag + off, b->tag + off + n, (b->len - off - n) * sizeof *b->tag);
    b->len -= n;
    b->s[b->len] = '\0';
}

static inline void op_buf_clear(op_buf *b) {
    b->len = 0;
    if (b->s) b->s[0] = '\0';
}

static inline void op_buf_free(op_buf *b) {
    free(b->s);
    free(b->tag);
    memset(b, 0, sizeof *b);
}
#endif
