/*
 * Incremental detokenizer (src/text/detok.h) against real references:
 * tests/fixtures/detok_cases.txt from tools/gen_detok_fixture.py (Python's
 * lossy UTF-8 decode and the `tokenizers` library's decode with the
 * DeepSeek-V4 tokenizer). Each case is fed as the reference's token pieces,
 * then byte by byte; the concatenation must equal the reference decode and
 * every delta must be well-formed UTF-8 (never half a character).
 */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/detok.h"

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static size_t unhex(const char *h, size_t n, char *out) {
    size_t k = 0;
    if (n == 1 && h[0] == '-') return 0;
    for (size_t i = 0; i + 1 < n; i += 2) out[k++] = (char)(hexval(h[i]) * 16 + hexval(h[i + 1]));
    return k;
}

static int well_formed(const char *s, size_t n) {
    char *o = NULL;
    size_t on = 0;
    if (dsv4_utf8_lossy(s, n, &o, &on)) return 0;
    int ok = on == n && memcmp(o, s, n) == 0;
    free(o);
    return ok;
}

typedef struct { char *buf; size_t len, cap; } sbuf;
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->buf = realloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

/* Feed pieces; returns concatenation; counts malformed deltas. */
static void feed(char **pieces, size_t *plen, int *spec, int np, sbuf *out, int *bad) {
    dsv4_err err = {0};
    dsv4_detok *d = dsv4_detok_create(NULL, &err);
    dsv4_detok_out o;
    for (int i = 0; i < np; i++) {
        CHECK_EQ_INT(dsv4_detok_push_bytes(d, pieces[i], plen[i], spec[i], &o, &err), DSV4_OK);
        if (!well_formed(o.text, o.len)) (*bad)++;
        sb_put(out, o.text, o.len);
        if (o.special != DSV4_SPECIAL_NONE) sb_put(out, o.special_text, o.special_len);
    }
    dsv4_detok_flush(d, &o, &err);
    sb_put(out, o.text, o.len);
    dsv4_detok_free(d);
}

static void test_fixture(void) {
    FILE *f = fopen(DSV4_SOURCE_DIR "/tests/fixtures/detok_cases.txt", "r");
    CHECK_MSG(f != NULL, "missing fixture; run tools/gen_detok_fixture.py");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int ncase = 0, mismatches = 0, bad = 0, bytewise_mismatch = 0, lossy_mismatch = 0;
    while (getline(&line, &cap, f) > 0) {
        char *arrow = strstr(line, " => ");
        if (!arrow) continue;
        *arrow = 0;
        char *exphex = arrow + 4;
        exphex[strcspn(exphex, "\n")] = 0;
        char *exp = malloc(strlen(exphex) / 2 + 1);
        size_t elen = unhex(exphex, strlen(exphex), exp);
        char *pieces[64];
        size_t plen[64];
        int spec[64], np = 0, any_special = 0;
        for (char *tok = strtok(line, " "); tok && np < 64; tok = strtok(NULL, " ")) {
            spec[np] = tok[0] == '*';
            any_special |= spec[np];
            if (spec[np]) tok++;
            pieces[np] = malloc(strlen(tok) / 2 + 1);
            plen[np] = unhex(tok, strlen(tok), pieces[np]);
            np++;
        }
        sbuf out = {0};
        feed(pieces, plen, spec, np, &out, &bad);
        if (out.len != elen || memcmp(out.buf ? out.buf : "", exp, elen) != 0) mismatches++;
        if (!any_special) {
            /* byte-by-byte and the batch reference decode */
            sbuf all = {0}, out2 = {0};
            for (int i = 0; i < np; i++) sb_put(&all, pieces[i], plen[i]);
            char **bp = malloc((all.len + 1) * sizeof *bp);
            size_t *bl = malloc((all.len + 1) * sizeof *bl);
            int *bs = calloc(all.len + 1, sizeof *bs);
            for (size_t i = 0; i < all.len; i++) {
                bp[i] = all.buf + i;
                bl[i] = 1;
            }
            feed(bp, bl, bs, (int)all.len, &out2, &bad);
            if (out2.len != elen || memcmp(out2.buf ? out2.buf : "", exp, elen) != 0) bytewise_mismatch++;
            char *lz = NULL;
            size_t lzn = 0;
            dsv4_utf8_lossy(all.buf ? all.buf : "", all.len, &lz, &lzn);
            if (lzn != elen || memcmp(lz, exp, elen) != 0) lossy_mismatch++;
            free(lz);
            free(bp);
            free(bl);
            free(bs);
            free(all.buf);
            free(out2.buf);
        }
        for (int i = 0; i < np; i++) free(pieces[i]);
        free(out.buf);
        free(exp);
        ncase++;
    }
    free(line);
    fclose(f);
    CHECK(ncase > 300);
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(bytewise_mismatch, 0);
    CHECK_EQ_INT(lossy_mismatch, 0);
    CHECK_EQ_INT(bad, 0);
}

/* A character split over three tokens is released whole, by the last one. */
static void test_split_char_held(void) {
    dsv4_err err = {0};
    dsv4_detok *d = dsv4_detok_create(NULL, &err);
    dsv4_detok_out o;
    const char *emoji = "\xF0\x9F\x91\xA9"; /* U+1F469 */
    dsv4_detok_push_bytes(d, "a\xF0", 2, 0, &o, &err);
    CHECK_EQ_INT(o.len, 1);
    dsv4_detok_push_bytes(d, emoji + 1, 1, 0, &o, &err);
    CHECK_EQ_INT(o.len, 0);
    dsv4_detok_push_bytes(d, emoji + 2, 2, 0, &o, &err);
    CHECK_EQ_INT(o.len, 4);
    CHECK(memcmp(o.text, emoji, 4) == 0);
    /* trailing partial -> U+FFFD at flush */
    dsv4_detok_push_bytes(d, "\xE4\xBD", 2, 0, &o, &err);
    CHECK_EQ_INT(o.len, 0);
    dsv4_detok_flush(d, &o, &err);
    CHECK_STR(o.text, "\xEF\xBF\xBD");
    /* a special token after a partial: U+FFFD first, then the event */
    dsv4_detok_push_bytes(d, "\xC3", 1, 0, &o, &err);
    dsv4_detok_push_bytes(d, "</think>", 8, 1, &o, &err);
    CHECK_STR(o.text, "\xEF\xBF\xBD");
    CHECK_EQ_INT(o.special, DSV4_SPECIAL_THINK_CLOSE);
    dsv4_detok_free(d);
}

/* Classification of the §1.1 table and the vocab callback path. */
static int piece_fn(void *ctx, int32_t id, const char **b, size_t *n, int *special) {
    (void)ctx;
    static const char *eos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
    if (id == 1) { *b = eos; *n = strlen(eos); *special = 1; return 0; }
    if (id == 7) { *b = "hi"; *n = 2; *special = 0; return 0; }
    return 1;
}

static void test_vocab_and_kinds(void) {
    dsv4_detok_vocab v = {NULL, piece_fn};
    dsv4_err err = {0};
    dsv4_detok *d = dsv4_detok_create(&v, &err);
    dsv4_detok_out o;
    CHECK_EQ_INT(dsv4_detok_push(d, 7, &o, &err), DSV4_OK);
    CHECK_STR(o.text, "hi");
    CHECK_EQ_INT(dsv4_detok_push(d, 1, &o, &err), DSV4_OK);
    CHECK_EQ_INT(o.special, DSV4_SPECIAL_EOS);
    CHECK_EQ_INT(o.len, 0);
    CHECK_EQ_INT(dsv4_detok_push(d, 99, &o, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "99");
    dsv4_detok_free(d);
    CHECK_EQ_INT(dsv4_special_kind_of("<think>", 7), DSV4_SPECIAL_THINK_OPEN);
    CHECK_EQ_INT(dsv4_special_kind_of("\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", 10), DSV4_SPECIAL_DSML);
    const char *bos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
    CHECK_EQ_INT(dsv4_special_kind_of(bos, strlen(bos)), DSV4_SPECIAL_BOS);
    CHECK_EQ_INT(dsv4_special_kind_of("<\xEF\xBD\x9CUser\xEF\xBD\x9C>", 12), DSV4_SPECIAL_ROLE);
    CHECK_EQ_INT(dsv4_special_kind_of("<x>", 3), DSV4_SPECIAL_OTHER);
}

int main(void) {
    test_fixture();
    test_split_char_held();
    test_vocab_and_kinds();
    return TEST_REPORT();
}
