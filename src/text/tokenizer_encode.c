/*
 * text/tokenizer_encode.c — text -> ids (spec/SERVING.md §1.2).
 *
 * The pipeline is the one `tokenizers` runs for this kind of file:
 *   0. ill-formed UTF-8 -> U+FFFD (ours: Python cannot even hand such bytes
 *      to tokenizers; we match what it does with bytes.decode(errors="replace"))
 *   1. added tokens (allow_special only): split out non-normalized added
 *      tokens, leftmost-longest; then, in the gaps, the normalized ones
 *      (the normalizer is the identity, see tokenizer.c)
 *   2. pre-tokenizer: each Split regex in turn cuts every piece left by the
 *      previous step (a regex never sees across a piece boundary), then the
 *      byte-level mapping (implicit: BPE works on bytes)
 *   3. BPE per piece (tokenizer_bpe.c)
 */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* UTF-8 repair                                                         */
/* ------------------------------------------------------------------ */

/* Length of the well-formed sequence at s[i], or 0 if ill-formed; on 0,
 * *sub is the length of the maximal subpart to replace (>= 1). Unicode
 * Table 3-7 (well-formed UTF-8 byte sequences). */
static size_t utf8_valid_at(const unsigned char *s, size_t n, size_t i, size_t *sub) {
    unsigned c = s[i];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) { need = 3; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 3;
    else if (c == 0xED) { need = 3; hi = 0x9F; }
    else if (c == 0xF0) { need = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) { need = 4; hi = 0x8F; }
    else { *sub = 1; return 0; }
    size_t k = 1;
    for (; k < need; k++) {
        if (i + k >= n) break;
        unsigned b = s[i + k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) break;
    }
    if (k == need) return need;
    *sub = k;
    return 0;
}

int tk_utf8_sanitize(const char *str, size_t n, char **out, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)str;
    *out = NULL;
    *out_len = n;
    size_t i = 0, sub = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t l = utf8_valid_at(s, n, i, &sub);
        if (!l) break;
        i += l;
    }
    if (i >= n) return DSV4_OK; /* valid: use as is */
    /* Each replacement is 3 bytes for at least 1 input byte. */
    char *o = malloc(n * 3 + 1);
    if (!o) return DSV4_ENOMEM;
    memcpy(o, s, i);
    size_t k = i;
    while (i < n) {
        if (s[i] < 0x80) { o[k++] = (char)s[i++]; continue; }
        size_t l = utf8_valid_at(s, n, i, &sub);
        if (l) {
            memcpy(o + k, s + i, l);
            k += l;
            i += l;
        } else {
            o[k++] = (char)0xEF; o[k++] = (char)0xBF; o[k++] = (char)0xBD;
            i += sub;
        }
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ */
/* Pre-tokenizer                                                        */
/* ------------------------------------------------------------------ */

typedef struct encctx {
    const dsv4_tokenizer *t;
    dsv4_tokvec *out;
    dsv4_err *err;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    int ext; /* use the extended regex variants */
} encctx;

static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static int run_match(encctx *E, pcre2_code *re, const char *s, size_t n, size_t off) {
    int r = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, E->md, E->mctx);
    if (r == PCRE2_ERROR_JIT_STACKLIMIT && !E->jstack) {
        /* Only pathological inputs need more than the default 32 KiB. */
        E->mctx = pcre2_match_context_create(NULL);
        E->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!E->mctx || !E->jstack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(E->mctx, NULL, E->jstack);
        r = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, E->md, E->mctx);
    }
    return r;
}

static int pretok(encctx *E, const char *s, size_t n, int level) {
    if (!n) return DSV4_OK;
    const dsv4_tokenizer *t = E->t;
    if (level == t->n_splits) {
        int rc = tk_bpe_piece(t, (const unsigned char *)s, n, E->out);
        if (rc == DSV4_ERANGE)
            return dsv4_err_set(E->err, rc, "encode: one pre-token of %zu bytes (a word without breaks) is over the "
                                "256 MiB limit", n);
        return rc ? dsv4_err_set(E->err, rc, "encode: out of memory") : DSV4_OK;
    }
    const tk_split *sp = &t->splits[level];
    pcre2_code *re = (E->ext && sp->re_ext) ? sp->re_ext : sp->re;
    size_t pos = 0, off = 0;
    while (off < n) {
        int r = run_match(E, re, s, n, off);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            return dsv4_err_set(E->err, DSV4_EINTERNAL, "encode: regex of pre-tokenizer %d failed: %s", level,
                                (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md);
        size_t a = ov[0], b = ov[1];
        if (b <= a) { /* empty match: yields no piece; step one character */
            off = a + utf8_len((unsigned char)s[a]);
            continue;
        }
        int rc;
        if (a > pos && (rc = pretok(E, s + pos, a - pos, level + 1))) return rc;
        if (sp->behavior == TK_SPLIT_ISOLATED && (rc = pretok(E, s + a, b - a, level + 1))) return rc;
        pos = off = b;
    }
    return pos < n ? pretok(E, s + pos, n - pos, level + 1) : DSV4_OK;
}

/* ------------------------------------------------------------------ */
/* Added tokens                                                         */
/* ------------------------------------------------------------------ */

/* Longest added token of trie tr starting at s[i]; returns its length (0 if none). */
static size_t trie_longest(const tk_trie *tr, const char *s, size_t n, size_t i, int32_t *id) {
    int32_t cur = 0;
    size_t best = 0;
    for (size_t k = i; k < n; k++) {
        int32_t c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[k]) c = tr->nodes[c].sibling;
        if (c < 0) break;
        cur = c;
        if (tr->nodes[cur].id >= 0) {
            best = k + 1 - i;
            *id = tr->nodes[cur].id;
        }
    }
    return best;
}

static int split_added(encctx *E, const char *s, size_t n, int which) {
    const tk_trie *tr = &E->t->trie[which];
    if (!tr->count) return which == 0 ? split_added(E, s, n, 1) : pretok(E, s, n, 0);
    size_t gap = 0;
    for (size_t i = 0; i < n;) {
        if (!tr->first[(uint8_t)s[i]]) { i++; continue; }
        int32_t id = -1;
        size_t l = trie_longest(tr, s, n, i, &id);
        if (!l) { i++; continue; }
        int rc;
        if (i > gap && (rc = which == 0 ? split_added(E, s + gap, i - gap, 1) : pretok(E, s + gap, i - gap, 0)))
            return rc;
        if (dsv4_tokvec_push(E->out, id)) return dsv4_err_set(E->err, DSV4_ENOMEM, "encode: out of memory");
        i += l;
        gap = i;
    }
    if (gap < n) return which == 0 ? split_added(E, s + gap, n - gap, 1) : pretok(E, s + gap, n - gap, 0);
    return DSV4_OK;
}

int dsv4_tokenizer_encode(const dsv4_tokenizer *t, const char *text, size_t len, int allow_special,
                          dsv4_tokvec *out, dsv4_err *err) {
    if (!len) return DSV4_OK;
    char *fixed;
    size_t n;
    if (tk_utf8_sanitize(text, len, &fixed, &n)) return dsv4_err_set(err, DSV4_ENOMEM, "encode: out of memory");
    const char *s = fixed ? fixed : text;
    encctx E = {t, out, err, NULL, NULL, NULL, 0};
    E.md = pcre2_match_data_create(t->max_match_ovec ? (uint32_t)t->max_match_ovec : 1, NULL);
    if (!E.md) { free(fixed); return dsv4_err_set(err, DSV4_ENOMEM, "encode: out of memory"); }
    E.ext = tk_regex_text_needs_ext(s, n);
    int rc = allow_special ? split_added(&E, s, n, 0) : pretok(&E, s, n, 0);
    pcre2_match_data_free(E.md);
    if (E.jstack) pcre2_jit_stack_free(E.jstack);
    if (E.mctx) pcre2_match_context_free(E.mctx);
    free(fixed);
    return rc;
}
