/*
 * text/tokenizer_regex.c — run tokenizer.json's Oniguruma regexes with PCRE2.
 *
 * Why a translation: `tokenizers` compiles Split patterns with Oniguruma
 * (Ruby syntax). PCRE2 (UTF + UCP) reads the same text almost the same way,
 * but two differences change ids:
 *   1. \s: Oniguruma's is Unicode White_Space (includes U+0085, excludes
 *      U+180E); PCRE2's excludes nothing it calls a separator and includes
 *      U+180E. We replace \s/\S with the reference's exact class.
 *   2. Unicode version: Oniguruma in tokenizers 0.23 knows Unicode 16, Debian
 *      12's PCRE2 knows Unicode 14, so letters, marks, digits, punctuation and
 *      symbols assigned since then are "nothing" to PCRE2. tools/
 *      gen_tokenizer_unicode.py records every class as the reference matches
 *      it (tokenizer_unicode.c); at first use we find the code points the
 *      local PCRE2 misses ("extras") and compile a second, extended variant
 *      of each pattern where \p{X} becomes [\p{X}<extras>].
 * The extended variant is ~3x slower (PCRE2 JIT tests explicit ranges one by
 * one), so encode uses it only for texts that contain an extra code point
 * (tk_regex_text_needs_ext; almost never in practice). Constructs whose
 * meaning differs between the engines and that we have not verified (\d \w
 * \h \b, POSIX brackets, nested classes, Ruby's (?m)) are refused.
 * Exactness of the classes is checked code point by code point in
 * tests/unit/test_tokenizer_units.c. When the reference `tokenizers` is
 * upgraded, rerun tools/gen_tokenizer_unicode.py (its Oniguruma may know a
 * newer Unicode) and tools/gen_tokenizer_goldens.py.
 */
#include "text/tokenizer_internal.h"
#include "text/tokenizer_unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Growable string                                                      */
/* ------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* ------------------------------------------------------------------ */
/* Class tables: reference \s, and per-class extras for the local PCRE2 */
/* ------------------------------------------------------------------ */

static const char *EXT_NAMES = "LNMPS";
static struct {
    char *space;       /* reference \s as class items, e.g. "\t-\r \x{85}..." */
    char *extra[5];    /* L N M P S: class items PCRE2 lacks ("" if none) */
    uint8_t *bitmap;   /* 0x110000 bits: code points in any extra */
    int ok;
} g_cls;
static pthread_once_t g_cls_once = PTHREAD_ONCE_INIT;

static const tk_uclass *find_class(const char *name) {
    for (int i = 0; tk_uclasses[i].name; i++)
        if (!strcmp(tk_uclasses[i].name, name)) return &tk_uclasses[i];
    return NULL;
}

static size_t utf8_enc(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 63)); o[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 63));
    o[2] = (char)(0x80 | ((c >> 6) & 63)); o[3] = (char)(0x80 | (c & 63));
    return 4;
}

static uint32_t utf8_dec(const unsigned char *s, size_t *len) {
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if (s[0] < 0xE0) { *len = 2; return ((s[0] & 31u) << 6) | (s[1] & 63u); }
    if (s[0] < 0xF0) { *len = 3; return ((s[0] & 15u) << 12) | ((s[1] & 63u) << 6) | (s[2] & 63u); }
    *len = 4;
    return ((s[0] & 7u) << 18) | ((s[1] & 63u) << 12) | ((s[2] & 63u) << 6) | (s[3] & 63u);
}

static void put_range(sbuf *b, uint32_t a, uint32_t z) {
    char t[48];
    if (a == z) snprintf(t, sizeof t, "\\x{%x}", a);
    else snprintf(t, sizeof t, "\\x{%x}-\\x{%x}", a, z);
    sb_str(b, t);
}

/* Code points of the reference class that the local PCRE2's \p{X} misses:
 * run [^\p{X}] over a string of all of them. */
static char *compute_extra(char cls, uint8_t *bitmap) {
    char nm[2] = {cls, 0};
    const tk_uclass *u = find_class(nm);
    if (!u) return NULL;
    size_t cap = 1;
    for (int j = 0; j < u->n; j++) cap += (size_t)(u->ranges[j][1] - u->ranges[j][0] + 1) * 4;
    char *all = malloc(cap);
    if (!all) return NULL;
    size_t n = 0;
    for (int j = 0; j < u->n; j++)
        for (uint32_t c = u->ranges[j][0]; c <= u->ranges[j][1]; c++) n += utf8_enc(c, all + n);
    char pat[16];
    snprintf(pat, sizeof pat, "[^\\p{%c}]", cls);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    sbuf b = {0};
    sb_str(&b, "");
    if (re && md) {
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        size_t off = 0;
        uint32_t ra = 0, rz = 0;
        int open = 0;
        while (off < n && pcre2_match(re, (PCRE2_SPTR)all, n, off, PCRE2_NO_UTF_CHECK, md, NULL) > 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t l;
            uint32_t c = utf8_dec((const unsigned char *)all + ov[0], &l);
            off = ov[0] + l;
            bitmap[c >> 3] |= (uint8_t)(1u << (c & 7));
            if (open && c == rz + 1) rz = c;
            else {
                if (open) put_range(&b, ra, rz);
                ra = rz = c;
                open = 1;
            }
        }
        if (open) put_range(&b, ra, rz);
    } else {
        b.oom = 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    free(all);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}

static void cls_init(void) {
    const tk_uclass *s = find_class("s");
    g_cls.bitmap = calloc(0x110000 / 8, 1);
    if (!s || !g_cls.bitmap) return;
    sbuf b = {0};
    sb_str(&b, "");
    for (int j = 0; j < s->n; j++) put_range(&b, s->ranges[j][0], s->ranges[j][1]);
    if (b.oom) return;
    g_cls.space = b.p;
    for (int i = 0; i < 5; i++)
        if (!(g_cls.extra[i] = compute_extra(EXT_NAMES[i], g_cls.bitmap))) return;
    g_cls.ok = 1;
}

static int cls_ready(dsv4_err *err) {
    pthread_once(&g_cls_once, cls_init);
    if (!g_cls.ok) return dsv4_err_set(err, DSV4_ENOMEM, "building Unicode class tables failed");
    return DSV4_OK;
}

int tk_regex_text_needs_ext(const char *s, size_t n) {
    if (!g_cls.ok) return 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { i++; continue; }
        size_t l;
        uint32_t c = utf8_dec(u + i, &l);
        if (c < 0x110000 && (g_cls.bitmap[c >> 3] >> (c & 7)) & 1) return 1;
        i += l;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Translation                                                          */
/* ------------------------------------------------------------------ */

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Parse \p{X} \p{^X} \P{X} at s[i] == 'p' or 'P'. Sets name (up to 31 chars),
 * negated; returns chars consumed after the backslash, or 0 if malformed. */
static size_t parse_prop(const char *s, size_t i, size_t len, char *name, int *neg) {
    size_t j = i + 1;
    *neg = s[i] == 'P';
    if (j >= len || s[j] != '{') return 0;
    j++;
    if (j < len && s[j] == '^') { *neg = !*neg; j++; }
    size_t k = 0;
    while (j < len && s[j] != '}' && k < 31) name[k++] = s[j++];
    name[k] = 0;
    if (j >= len || s[j] != '}' || !k) return 0;
    return j + 1 - i;
}

static int ext_index(const char *name) {
    if (name[1]) return -1;
    const char *p = strchr(EXT_NAMES, name[0]);
    return p && *p ? (int)(p - EXT_NAMES) : -1;
}

static int translate(const char *s, size_t len, int ext, sbuf *o, dsv4_err *err) {
    int in_class = 0;
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (c == '\\') {
            if (i + 1 >= len) return dsv4_err_set(err, DSV4_EFORMAT, "pattern ends with a backslash");
            char e = s[i + 1];
            if (e == 'p' || e == 'P') {
                char name[32];
                int neg;
                size_t k = parse_prop(s, i + 1, len, name, &neg);
                if (!k) return dsv4_err_set(err, DSV4_EFORMAT, "malformed \\%c{...} at offset %zu", e, i);
                int xi = ext_index(name);
                char t[48];
                snprintf(t, sizeof t, "\\p{%s}", name);
                if (in_class) {
                    if (neg)
                        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "negated property inside a class at offset %zu", i);
                    sb_str(o, t);
                    if (ext && xi >= 0) sb_str(o, g_cls.extra[xi]);
                } else if (ext && xi >= 0) {
                    sb_str(o, neg ? "[^" : "[");
                    sb_str(o, t);
                    sb_str(o, g_cls.extra[xi]);
                    sb_str(o, "]");
                } else {
                    if (neg) t[1] = 'P';
                    sb_str(o, t);
                }
                i += 1 + k;
                continue;
            }
            if (e == 's' || e == 'S') {
                if (in_class && e == 'S')
                    return dsv4_err_set(err, DSV4_EUNSUPPORTED, "\\S inside a class at offset %zu", i);
                if (!in_class) sb_str(o, e == 'S' ? "[^" : "[");
                sb_str(o, g_cls.space);
                if (!in_class) sb_str(o, "]");
                i += 2;
                continue;
            }
            if (e == 'v') { sb_str(o, "\\x0b"); i += 2; continue; }
            if (e == 'u') {
                if (i + 5 >= len || !is_hex(s[i + 2]) || !is_hex(s[i + 3]) || !is_hex(s[i + 4]) ||
                    !is_hex(s[i + 5]))
                    return dsv4_err_set(err, DSV4_EFORMAT, "malformed \\u escape at offset %zu", i);
                sb_str(o, "\\x{");
                sb_put(o, s + i + 2, 4);
                sb_str(o, "}");
                i += 6;
                continue;
            }
            if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
                /* Escapes with the same meaning in both engines. */
                if (!strchr("tnrfeaxAzZG", e))
                    return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                                        "escape \\%c at offset %zu (its meaning differs between Oniguruma and PCRE2 "
                                        "or is unverified)", e, i);
            }
            sb_put(o, s + i, 2);
            i += 2;
            continue;
        }
        if (in_class) {
            if (c == '[')
                return dsv4_err_set(err, DSV4_EUNSUPPORTED, "nested class or POSIX bracket at offset %zu", i);
            if (c == '&' && i + 1 < len && s[i + 1] == '&')
                return dsv4_err_set(err, DSV4_EUNSUPPORTED, "class intersection && at offset %zu", i);
            if (c == ']') in_class = 0;
            sb_put(o, s + i, 1);
            i++;
            continue;
        }
        if (c == '[') {
            in_class = 1;
            sb_put(o, "[", 1);
            i++;
            if (i < len && s[i] == '^') { sb_put(o, "^", 1); i++; }
            if (i < len && s[i] == ']') { sb_str(o, "\\]"); i++; }
            continue;
        }
        if (c == '^') { sb_str(o, "(?m:^)"); i++; continue; }
        if (c == '$') { sb_str(o, "(?m:$)"); i++; continue; }
        if (c == '(' && i + 1 < len && s[i + 1] == '?') {
            static const char *ok[] = {"(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>", "(?i:", "(?i)", NULL};
            int good = 0;
            for (int k = 0; ok[k]; k++)
                if (len - i >= strlen(ok[k]) && !memcmp(s + i, ok[k], strlen(ok[k]))) good = 1;
            if (!good) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "group syntax \"%.4s\" at offset %zu", s + i, i);
        }
        sb_put(o, s + i, 1);
        i++;
    }
    if (in_class) return dsv4_err_set(err, DSV4_EFORMAT, "unterminated character class");
    return o->oom ? dsv4_err_set(err, DSV4_ENOMEM, "out of memory") : DSV4_OK;
}

int tk_regex_translate(const char *onig, size_t len, int ext, char **out, dsv4_err *err) {
    *out = NULL;
    int rc = cls_ready(err);
    if (rc) return rc;
    sbuf o = {0};
    sb_str(&o, "");
    rc = translate(onig, len, ext, &o, err);
    if (rc) { free(o.p); return rc; }
    *out = o.p;
    return DSV4_OK;
}

static int compile_one(const char *onig, size_t len, int ext, pcre2_code **out, dsv4_err *err) {
    char *p;
    int rc = tk_regex_translate(onig, len, ext, &p, err);
    if (rc) return rc;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        rc = dsv4_err_set(err, DSV4_EFORMAT, "PCRE2 cannot compile the translated pattern: %s (offset %zu of \"%.200s\")",
                          (const char *)msg, (size_t)eo, p);
        free(p);
        return rc;
    }
    free(p);
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    *out = re;
    return DSV4_OK;
}

int tk_regex_compile(const char *onig, size_t len, pcre2_code **native, pcre2_code **ext, dsv4_err *err) {
    *native = *ext = NULL;
    char *a = NULL, *b = NULL;
    int rc = tk_regex_translate(onig, len, 0, &a, err);
    if (!rc) rc = tk_regex_translate(onig, len, 1, &b, err);
    int same = !rc && !strcmp(a, b);
    free(a);
    free(b);
    if (rc) return rc;
    if ((rc = compile_one(onig, len, 0, native, err))) return rc;
    if (!same && (rc = compile_one(onig, len, 1, ext, err))) {
        pcre2_code_free(*native);
        *native = NULL;
        return rc;
    }
    return DSV4_OK;
}
