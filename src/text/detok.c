/*
 * Incremental detokenizer (text/detok.h; spec/SERVING.md §3.5, §6.1).
 *
 * The only state is a handful of pending bytes that may still become a valid
 * character (at most 3: the longest proper prefix of a 4-byte sequence).
 * Decisions are made with the Unicode "maximal subpart" rule, which is what
 * makes the incremental output equal the batch lossy decode: a byte sequence
 * is replaced by U+FFFD only once it can no longer be completed, and the
 * replacement covers exactly the bytes the batch decoder would replace.
 */
#include "text/detok.h"

#include <stdlib.h>
#include <string.h>

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

struct dsv4_detok {
    dsv4_detok_vocab vocab;
    int has_vocab;
    unsigned char pend[4]; /* bytes of an incomplete character */
    size_t npend;
    char *buf; /* output text of the last call */
    size_t len, cap;
    char *spec; /* copy of the last special token's text */
    size_t spec_cap;
};

/*
 * One step of UTF-8 validation at s[0..n), n >= 1 (Unicode Table 3-7).
 * Returns 1 and *adv = char length for a well-formed character; 0 and
 * *adv = length of the maximal ill-formed subpart (>= 1) to replace with one
 * U+FFFD; -1 when all n bytes are a proper prefix of a well-formed character.
 */
static int utf8_step(const unsigned char *s, size_t n, size_t *adv) {
    unsigned char b = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b < 0x80) { *adv = 1; return 1; }
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) { need = 2; lo = 0xA0; }
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) { need = 2; hi = 0x9F; }
    else if (b == 0xF0) { need = 3; lo = 0x90; }
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) { need = 3; hi = 0x8F; }
    else { *adv = 1; return 0; } /* 80..C1, F5..FF: never a lead byte */
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) { *adv = n; return -1; }
        unsigned char c = s[i];
        unsigned char l = (i == 1) ? lo : 0x80, h = (i == 1) ? hi : 0xBF;
        if (c < l || c > h) { *adv = i; return 0; }
    }
    *adv = need + 1;
    return 1;
}

static int out_reserve(dsv4_detok *d, size_t extra) {
    if (d->len + extra + 1 <= d->cap) return 0;
    size_t nc = d->cap ? d->cap : 64;
    while (nc < d->len + extra + 1) nc *= 2;
    char *nb = realloc(d->buf, nc);
    if (!nb) return -1;
    d->buf = nb;
    d->cap = nc;
    return 0;
}

static void out_put(dsv4_detok *d, const void *p, size_t n) {
    memcpy(d->buf + d->len, p, n);
    d->len += n;
    d->buf[d->len] = '\0';
}

/* Append bytes to the pending state and release every decidable character. */
static int feed_bytes(dsv4_detok *d, const unsigned char *s, size_t n) {
    /* Worst case each input byte becomes one U+FFFD (3 bytes). */
    if (out_reserve(d, 3 * (n + d->npend))) return -1;
    size_t i = 0;
    /* First resolve the pending prefix by topping it up byte by byte. */
    while (d->npend && i < n) {
        d->pend[d->npend++] = s[i++];
        size_t adv;
        int r = utf8_step(d->pend, d->npend, &adv);
        if (r == -1) continue;
        if (r == 1) out_put(d, d->pend, adv);
        else out_put(d, FFFD, 3);
        /* Bytes after the decided part go back to the input stream. */
        size_t rest = d->npend - adv;
        d->npend = 0;
        i -= rest;
    }
    while (i < n) {
        size_t adv;
        int r = utf8_step(s + i, n - i, &adv);
        if (r == -1) {
            memcpy(d->pend, s + i, adv);
            d->npend = adv;
            break;
        }
        if (r == 1) out_put(d, s + i, adv);
        else out_put(d, FFFD, 3);
        i += adv;
    }
    return 0;
}

static void flush_pending(dsv4_detok *d) {
    /* A proper prefix of a well-formed sequence is one maximal subpart. */
    if (d->npend) {
        out_put(d, FFFD, 3);
        d->npend = 0;
    }
}

dsv4_detok *dsv4_detok_create(const dsv4_detok_vocab *vocab, dsv4_err *err) {
    dsv4_detok *d = calloc(1, sizeof *d);
    if (!d) {
        dsv4_err_set(err, DSV4_ENOMEM, "detok: out of memory");
        return NULL;
    }
    if (vocab) {
        d->vocab = *vocab;
        d->has_vocab = 1;
    }
    return d;
}

void dsv4_detok_free(dsv4_detok *d) {
    if (!d) return;
    free(d->buf);
    free(d->spec);
    free(d);
}

static void out_reset(dsv4_detok *d, dsv4_detok_out *out) {
    d->len = 0;
    if (d->buf) d->buf[0] = '\0';
    memset(out, 0, sizeof *out);
    out->text = "";
}

int dsv4_detok_push_bytes(dsv4_detok *d, const char *bytes, size_t len, int special,
                          dsv4_detok_out *out, dsv4_err *err) {
    out_reset(d, out);
    if (special) {
        if (out_reserve(d, 3) != 0) return dsv4_err_set(err, DSV4_ENOMEM, "detok: out of memory");
        flush_pending(d);
        if (len + 1 > d->spec_cap) {
            char *ns = realloc(d->spec, len + 1);
            if (!ns) return dsv4_err_set(err, DSV4_ENOMEM, "detok: out of memory");
            d->spec = ns;
            d->spec_cap = len + 1;
        }
        memcpy(d->spec, bytes, len);
        d->spec[len] = '\0';
        out->special = dsv4_special_kind_of(bytes, len);
        out->special_text = d->spec;
        out->special_len = len;
    } else if (feed_bytes(d, (const unsigned char *)bytes, len)) {
        return dsv4_err_set(err, DSV4_ENOMEM, "detok: out of memory");
    }
    if (d->buf) out->text = d->buf;
    out->len = d->len;
    return DSV4_OK;
}

int dsv4_detok_push(dsv4_detok *d, int32_t id, dsv4_detok_out *out, dsv4_err *err) {
    out_reset(d, out);
    if (!d->has_vocab)
        return dsv4_err_set(err, DSV4_EINVAL, "detok: token id %d pushed but no vocab was given", (int)id);
    const char *b = NULL;
    size_t n = 0;
    int special = 0;
    if (d->vocab.piece(d->vocab.ctx, id, &b, &n, &special) != 0)
        return dsv4_err_set(err, DSV4_EINVAL, "detok: unknown token id %d", (int)id);
    return dsv4_detok_push_bytes(d, b ? b : "", b ? n : 0, special, out, err);
}

int dsv4_detok_flush(dsv4_detok *d, dsv4_detok_out *out, dsv4_err *err) {
    out_reset(d, out);
    if (out_reserve(d, 3)) return dsv4_err_set(err, DSV4_ENOMEM, "detok: out of memory");
    flush_pending(d);
    if (d->buf) out->text = d->buf;
    out->len = d->len;
    return DSV4_OK;
}

int dsv4_utf8_lossy(const char *in, size_t n, char **out, size_t *out_len) {
    char *o = malloc(3 * n + 1);
    if (!o) return DSV4_ENOMEM;
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, k = 0;
    while (i < n) {
        size_t adv;
        int r = utf8_step(s + i, n - i, &adv);
        if (r == 1) {
            memcpy(o + k, s + i, adv);
            k += adv;
        } else {
            memcpy(o + k, FFFD, 3);
            k += 3;
        }
        i += adv;
    }
    o[k] = '\0';
    *out = o;
    *out_len = k;
    return DSV4_OK;
}

/* ---- special-token classification (SERVING.md §1.1) ---- */

static const struct {
    const char *text;
    dsv4_special_kind kind;
} SPECIALS[] = {
    {"<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", DSV4_SPECIAL_BOS},
    {"<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", DSV4_SPECIAL_EOS},
    {"<\xEF\xBD\x9C\xE2\x96\x81pad\xE2\x96\x81\xEF\xBD\x9C>", DSV4_SPECIAL_PAD},
    {"<think>", DSV4_SPECIAL_THINK_OPEN},
    {"</think>", DSV4_SPECIAL_THINK_CLOSE},
    {"\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", DSV4_SPECIAL_DSML},
    {"<\xEF\xBD\x9CUser\xEF\xBD\x9C>", DSV4_SPECIAL_ROLE},
    {"<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>", DSV4_SPECIAL_ROLE},
    {"<\xEF\xBD\x9Clatest_reminder\xEF\xBD\x9C>", DSV4_SPECIAL_ROLE},
};

dsv4_special_kind dsv4_special_kind_of(const char *text, size_t len) {
    for (size_t i = 0; i < sizeof SPECIALS / sizeof SPECIALS[0]; i++)
        if (strlen(SPECIALS[i].text) == len && memcmp(SPECIALS[i].text, text, len) == 0)
            return SPECIALS[i].kind;
    return DSV4_SPECIAL_OTHER;
}

const char *dsv4_special_kind_name(dsv4_special_kind k) {
    switch (k) {
    case DSV4_SPECIAL_NONE: return "none";
    case DSV4_SPECIAL_BOS: return "bos";
    case DSV4_SPECIAL_EOS: return "eos";
    case DSV4_SPECIAL_PAD: return "pad";
    case DSV4_SPECIAL_THINK_OPEN: return "think_open";
    case DSV4_SPECIAL_THINK_CLOSE: return "think_close";
    case DSV4_SPECIAL_DSML: return "dsml";
    case DSV4_SPECIAL_ROLE: return "role";
    case DSV4_SPECIAL_OTHER: return "other";
    }
    return "unknown";
}
