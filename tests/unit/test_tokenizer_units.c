/*
 * Tokenizer pieces (SERVING.md §1.1-1.2; text/tokenizer.h):
 *  - regex classes: every code point, translated \p{L} \p{N} \p{M} \p{P}
 *    \p{S} \s vs the reference's own classification (fixture made by
 *    tools/gen_tokenizer_unicode.py through tokenizers' Split); the fast
 *    (native) variant agrees wherever encode would pick it
 *  - constructs whose meaning differs between Oniguruma and PCRE2 are refused
 *  - load errors name the file and the field
 *  - merges in [a, b] array form, Split with Removed and with a String
 *    pattern give tokenizers' ids (variants.jsonl)
 *  - ill-formed UTF-8: random byte strings never fail, decode gives valid
 *    UTF-8 equal to the repaired input, valid input is untouched
 *  - concurrent encodes from several threads equal single-threaded ones
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_models.h"
#include "text/tokenizer_internal.h"

static size_t enc8(uint32_t c, char *o) {
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

static pcre2_code *compile_variant(const char *onig, int ext) {
    char *p = NULL;
    dsv4_err err = {0};
    if (tk_regex_translate(onig, strlen(onig), ext, &p, &err)) {
        CHECK_MSG(0, "translate %s: %s", onig, err.msg);
        return NULL;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec,
                                   &eo, NULL);
    free(p);
    CHECK_MSG(re != NULL, "compile %s", onig);
    if (re) pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

static void test_unicode_classes(void) {
    char *fx = tm_read_file(DSV4_SOURCE_DIR "/tests/fixtures/tokenizer/unicode_classes.txt", NULL);
    CHECK_MSG(fx != NULL, "unicode_classes.txt missing");
    if (!fx) return;
    uint8_t *ref = malloc(0x110000);
    int classes = 0;
    for (char *line = fx, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (line[0] == '#') continue;
        char name[8];
        int off;
        if (sscanf(line, "%7s%n", name, &off) != 1) continue;
        memset(ref, 0, 0x110000);
        for (char *p = line + off; *p;) {
            unsigned a, b;
            int k;
            if (sscanf(p, " %x-%x%n", &a, &b, &k) != 2) break;
            for (unsigned c = a; c <= b && c < 0x110000; c++) ref[c] = 1;
            p += k;
        }
        char onig[16];
        snprintf(onig, sizeof onig, name[0] == 's' ? "\\s" : "\\p{%s}", name);
        pcre2_code *ext = compile_variant(onig, 1), *nat = compile_variant(onig, 0);
        pcre2_match_data *md = pcre2_match_data_create(2, NULL);
        long wrong_ext = 0, wrong_nat = 0, first_bad = -1;
        for (uint32_t c = 1; ext && nat && c < 0x110000; c++) {
            if (c >= 0xD800 && c < 0xE000) continue;
            char u[4];
            size_t n = enc8(c, u);
            int me = pcre2_match(ext, (PCRE2_SPTR)u, n, 0, 0, md, NULL) > 0;
            if (me != ref[c]) { wrong_ext++; if (first_bad < 0) first_bad = c; }
            /* encode uses the native variant only for texts without "extra" code points */
            if (!tk_regex_text_needs_ext(u, n)) {
                int mn = pcre2_match(nat, (PCRE2_SPTR)u, n, 0, 0, md, NULL) > 0;
                if (mn != ref[c]) wrong_nat++;
            }
        }
        CHECK_MSG(wrong_ext == 0, "class %s: %ld code points differ from tokenizers (first U+%04lX)", name, wrong_ext,
                  first_bad);
        CHECK_MSG(wrong_nat == 0, "class %s: native variant wrong on %ld code points", name, wrong_nat);
        pcre2_match_data_free(md);
        pcre2_code_free(ext);
        pcre2_code_free(nat);
        classes++;
    }
    CHECK_EQ_INT(classes, 6);
    free(ref);
    free(fx);
}

static void test_translate_refusals(void) {
    static const char *bad[] = {"\\d+", "\\w", "\\h", "\\b", "[[:alpha:]]", "[a-z&&[^c]]", "(?m).", "[\\S]",
                                "[\\P{L}]", "(?<x>a)\\k<x>", "\\R", "\\1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = NULL;
        dsv4_err err = {0};
        int rc = tk_regex_translate(bad[i], strlen(bad[i]), 0, &p, &err);
        CHECK_MSG(rc == DSV4_EUNSUPPORTED, "%s was accepted (rc %d)", bad[i], rc);
        free(p);
    }
    /* accepted: what the DeepSeek-V4 file uses, plus \u escapes */
    static const char *good[] = {"\\p{N}{1,3}", "[\u4e00-\u9fa5]+", "\\s+(?!\\S)|\\s+", "[^\\r\\n\\p{L}]?",
                                 "\\u00e9", "[!\\-./\\[\\\\\\]]"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char *p = NULL;
        dsv4_err err = {0};
        CHECK_MSG(tk_regex_translate(good[i], strlen(good[i]), 1, &p, &err) == 0, "%s: %s", good[i], err.msg);
        free(p);
    }
}

/* A small valid tokenizer.json: the 256 byte-level symbols, one merge. */
static cJSON *tiny_json(void) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char u[4] = {0};
        enc8(tk_byte_to_cp((uint8_t)b), u);
        cJSON_AddNumberToObject(vocab, u, b);
    }
    cJSON_AddNumberToObject(vocab, "ab", 256);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    cJSON_AddItemToArray(merges, cJSON_CreateString("a b"));
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "id", 257);
    cJSON_AddStringToObject(t, "content", "<s>");
    cJSON_AddBoolToObject(t, "special", 1);
    cJSON_AddBoolToObject(t, "normalized", 0);
    cJSON_AddItemToArray(added, t);
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *sp = cJSON_CreateObject();
    cJSON_AddStringToObject(sp, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "Regex", "\\s+|\\p{L}+");
    cJSON_AddStringToObject(sp, "behavior", "Isolated");
    cJSON_AddBoolToObject(sp, "invert", 0);
    cJSON_AddItemToArray(list, sp);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddBoolToObject(bl, "add_prefix_space", 0);
    cJSON_AddBoolToObject(bl, "use_regex", 0);
    cJSON_AddItemToArray(list, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    return root;
}

static int load_tiny(cJSON *j, dsv4_err *err) {
    char *s = cJSON_PrintUnformatted(j);
    dsv4_tokenizer *t = NULL;
    int rc = dsv4_tokenizer_load_json(s, strlen(s), "tiny.json", &t, err);
    dsv4_tokenizer_free(t);
    free(s);
    cJSON_Delete(j);
    return rc;
}

static void test_load_errors(void) {
    dsv4_err err = {0};
    CHECK_EQ_INT(load_tiny(tiny_json(), &err), 0);

    /* the tiny tokenizer works: "ab" merges, "<s>" is recognised */
    {
        cJSON *j = tiny_json();
        char *s = cJSON_PrintUnformatted(j);
        dsv4_tokenizer *t = NULL;
        CHECK(dsv4_tokenizer_load_json(s, strlen(s), "tiny.json", &t, &err) == 0);
        dsv4_tokvec v = {0};
        CHECK(t && dsv4_tokenizer_encode(t, "ab<s>ba", 7, 1, &v, &err) == 0);
        CHECK_EQ_INT(v.n, 4);
        if (v.n == 4) {
            CHECK_EQ_INT(v.ids[0], 256);
            CHECK_EQ_INT(v.ids[1], 257);
            CHECK_EQ_INT(v.ids[2], 'b');
            CHECK_EQ_INT(v.ids[3], 'a');
        }
        dsv4_tokvec_free(&v);
        dsv4_tokenizer_free(t);
        free(s);
        cJSON_Delete(j);
    }

    struct { const char *what; int code; const char *needle; } cases[] = {
        {"type", DSV4_EUNSUPPORTED, "model.type"},
        {"merge_nospace", DSV4_EFORMAT, "model.merges[0]"},
        {"merge_unknown", DSV4_EFORMAT, "not in model.vocab"},
        {"merge_bad_array", DSV4_EFORMAT, "model.merges[0]"},
        {"lstrip", DSV4_EUNSUPPORTED, "added_tokens[0].lstrip"},
        {"added_id", DSV4_EUNSUPPORTED, "added_tokens[0].id"},
        {"normalizer", DSV4_EUNSUPPORTED, "normalizer"},
        {"regex", DSV4_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern.Regex"},
        {"behavior", DSV4_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior"},
        {"use_regex", DSV4_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1].use_regex"},
        {"decoder", DSV4_EUNSUPPORTED, "decoder"},
        {"byte_fallback", DSV4_EUNSUPPORTED, "model.byte_fallback"},
        {"vocab_id", DSV4_EFORMAT, "model.vocab"},
        {"no_model", DSV4_EFORMAT, "model must be an object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *j = tiny_json(), *model = cJSON_GetObjectItem(j, "model");
        cJSON *merges = cJSON_GetObjectItem(model, "merges");
        cJSON *added0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "added_tokens"), 0);
        cJSON *pre = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers");
        const char *w = cases[i].what;
        if (!strcmp(w, "type")) cJSON_ReplaceItemInObject(model, "type", cJSON_CreateString("WordPiece"));
        if (!strcmp(w, "merge_nospace")) cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateString("ab"));
        if (!strcmp(w, "merge_unknown")) cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateString("a zz"));
        if (!strcmp(w, "merge_bad_array")) cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateNumber(3));
        if (!strcmp(w, "lstrip")) cJSON_AddBoolToObject(added0, "lstrip", 1);
        if (!strcmp(w, "added_id")) cJSON_ReplaceItemInObject(added0, "id", cJSON_CreateNumber(300));
        if (!strcmp(w, "normalizer")) cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "normalizer"), "type", "NFC");
        if (!strcmp(w, "regex"))
            cJSON_ReplaceItemInObject(cJSON_GetObjectItem(cJSON_GetArrayItem(pre, 0), "pattern"), "Regex",
                                      cJSON_CreateString("\\d+"));
        if (!strcmp(w, "behavior"))
            cJSON_ReplaceItemInObject(cJSON_GetArrayItem(pre, 0), "behavior", cJSON_CreateString("MergedWithNext"));
        if (!strcmp(w, "use_regex")) cJSON_ReplaceItemInObject(cJSON_GetArrayItem(pre, 1), "use_regex", cJSON_CreateTrue());
        if (!strcmp(w, "decoder")) cJSON_DeleteItemFromObject(j, "decoder");
        if (!strcmp(w, "byte_fallback")) cJSON_AddBoolToObject(model, "byte_fallback", 1);
        if (!strcmp(w, "vocab_id")) cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model, "vocab"), "a", cJSON_CreateString("x"));
        if (!strcmp(w, "no_model")) cJSON_DeleteItemFromObject(j, "model");
        dsv4_err e = {0};
        int rc = load_tiny(j, &e);
        CHECK_MSG(rc == cases[i].code, "%s: rc %d (%s)", w, rc, e.msg);
        CHECK_CONTAINS(e.msg, cases[i].needle);
        CHECK_CONTAINS(e.msg, "tiny.json");
    }
    dsv4_tokenizer *t = NULL;
    dsv4_err e = {0};
    CHECK_EQ_INT(dsv4_tokenizer_load_json("{\"model\": [", 11, "broken.json", &t, &e), DSV4_EFORMAT);
    CHECK_CONTAINS(e.msg, "broken.json");
    CHECK_EQ_INT(dsv4_tokenizer_load("/nonexistent/dir/tokenizer.json", &t, &e), DSV4_EIO);
    CHECK_CONTAINS(e.msg, "/nonexistent/dir/tokenizer.json");
    CHECK(t == NULL);
}

static unsigned char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    unsigned char *o = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        o[i] = (unsigned char)v;
    }
    *n = l;
    return o;
}

/* Edits of the real file, as tools/gen_tokenizer_goldens.py apply_variant(). */
static void apply_variant(cJSON *root, const char *variant) {
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *pre = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "pre_tokenizer"), "pretokenizers");
    if (!strcmp(variant, "merges_arrays")) {
        cJSON *arr = cJSON_CreateArray();
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(model, "merges")) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            char a[256];
            snprintf(a, sizeof a, "%.*s", (int)(sp - s), s);
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(a));
            cJSON_AddItemToArray(pair, cJSON_CreateString(sp + 1));
            cJSON_AddItemToArray(arr, pair);
        }
        cJSON_ReplaceItemInObject(model, "merges", arr);
    } else if (!strcmp(variant, "split_removed")) {
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(pre, 0), "behavior", cJSON_CreateString("Removed"));
    } else if (!strcmp(variant, "split_string")) {
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "String", "th");
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", 0);
        cJSON_InsertItemInArray(pre, 0, sp);
    } else {
        CHECK_MSG(0, "unknown variant %s", variant);
    }
}

/* Features the real file does not use (merges as [a, b] arrays, Removed,
 * String patterns): edit the real file, compare with tokenizers' ids. */
static void test_variants(const char *path) {
    size_t len;
    char *orig = tm_read_file(path, &len);
    CHECK_MSG(orig != NULL, "cannot read %s", path);
    char *fx = tm_read_file(DSV4_SOURCE_DIR "/tests/fixtures/tokenizer/variants.jsonl", NULL);
    CHECK(fx != NULL);
    if (!orig || !fx) { free(orig); free(fx); return; }
    char cur[64] = "";
    dsv4_tokenizer *tok = NULL;
    int n_cases = 0, n_variants = 0;
    for (char *line = fx, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        cJSON *c = cJSON_Parse(line);
        if (!c) continue;
        const char *variant = cJSON_GetObjectItem(c, "variant")->valuestring;
        if (strcmp(variant, cur)) {
            dsv4_tokenizer_free(tok);
            tok = NULL;
            snprintf(cur, sizeof cur, "%s", variant);
            cJSON *root = cJSON_ParseWithLength(orig, len);
            apply_variant(root, variant);
            char *s = cJSON_PrintUnformatted(root);
            cJSON_Delete(root);
            dsv4_err err = {0};
            CHECK_MSG(dsv4_tokenizer_load_json(s, strlen(s), variant, &tok, &err) == 0, "%s", err.msg);
            free(s);
            n_variants++;
        }
        size_t n;
        unsigned char *in = unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &n);
        dsv4_tokvec v = {0};
        CHECK(tok && dsv4_tokenizer_encode(tok, (const char *)in, n, 1, &v, NULL) == 0);
        const cJSON *want = cJSON_GetObjectItem(c, "special"), *x;
        int ok = (size_t)cJSON_GetArraySize(want) == v.n;
        size_t i = 0;
        cJSON_ArrayForEach(x, want) if (ok && v.ids[i++] != (int32_t)x->valuedouble) ok = 0;
        CHECK_MSG(ok, "%s %s: ids differ from tokenizers", variant, cJSON_GetObjectItem(c, "name")->valuestring);
        n_cases++;
        dsv4_tokvec_free(&v);
        free(in);
        cJSON_Delete(c);
    }
    CHECK_EQ_INT(n_variants, 3);
    CHECK(n_cases >= 30);
    dsv4_tokenizer_free(tok);
    free(fx);
    free(orig);
}

/* An independent UTF-8 validity check (Unicode Table 3-7). */
static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) l = 2;
        else if (c == 0xE0) { l = 3; lo = 0xA0; }
        else if (c == 0xED) { l = 3; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) l = 3;
        else if (c == 0xF0) { l = 4; lo = 0x90; }
        else if (c == 0xF4) { l = 4; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) l = 4;
        else return 0;
        if (i + l > n || s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k < l; k++) if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += l;
    }
    return 1;
}

static void test_invalid_utf8(dsv4_tokenizer *tok) {
    uint64_t st = 0x9E3779B97F4A7C15ULL;
    int fails = 0, bad_out = 0, changed_valid = 0;
    static const unsigned char pool[] = {0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE4, 0xED, 0xEF, 0xF0,
                                         0xF4, 0xF5, 0xFF, 0xA0, 0x9F, 0x8F, 0x90, 'a', ' ', '<', 0};
    for (int it = 0; it < 3000; it++) {
        unsigned char buf[64];
        size_t n = 1 + (size_t)(it % 63);
        for (size_t i = 0; i < n; i++) {
            st ^= st << 13; st ^= st >> 7; st ^= st << 17;
            buf[i] = (it & 1) ? (unsigned char)st : pool[(st >> 8) % sizeof pool];
        }
        dsv4_tokvec v = {0};
        if (dsv4_tokenizer_encode(tok, (const char *)buf, n, it & 2 ? 1 : 0, &v, NULL)) { fails++; continue; }
        char *out = NULL, *fixed = NULL;
        size_t ol = 0, fl = 0;
        if (dsv4_tokenizer_decode(tok, v.ids, v.n, 0, &out, &ol, NULL)) fails++;
        else {
            if (!valid_utf8((unsigned char *)out, ol)) bad_out++;
            tk_utf8_sanitize((const char *)buf, n, &fixed, &fl);
            if (fixed ? (fl != ol || memcmp(fixed, out, ol)) : (ol != n || memcmp(buf, out, n))) bad_out++;
            if (valid_utf8(buf, n) && fixed) changed_valid++;
        }
        free(out);
        free(fixed);
        dsv4_tokvec_free(&v);
    }
    CHECK_EQ_INT(fails, 0);
    CHECK_EQ_INT(bad_out, 0);
    CHECK_EQ_INT(changed_valid, 0);
    /* the repair is one U+FFFD per maximal subpart: a lone byte, a truncated
     * sequence, a surrogate's first byte each... (Python's goldens check the
     * exact output; here: never more replacement bytes than 3 per input byte) */
    const char bad[] = "\xe4\xbd\xf0\x9f\x98\xed\xa0\x80";
    char *fixed;
    size_t fl;
    CHECK(tk_utf8_sanitize(bad, sizeof bad - 1, &fixed, &fl) == 0 && fixed);
    CHECK(fixed && valid_utf8((unsigned char *)fixed, fl) && fl <= 3 * (sizeof bad - 1));
    free(fixed);
}

typedef struct thr_arg {
    dsv4_tokenizer *tok;
    int seed, mismatches;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    const char *texts[] = {"Hello world, this is a test of the cache.", "你好，世界！这是一个测试。",
                           "def f(x):\n    return x*2\n", "<｜User｜>hi<｜Assistant｜></think>ok",
                           "emoji 👨‍👩‍👧 and numbers 1234567"};
    for (int it = 0; it < 300; it++) {
        const char *t = texts[(it + a->seed) % 5];
        dsv4_tokvec v = {0}, w = {0};
        dsv4_tokenizer_encode(a->tok, t, strlen(t), 1, &v, NULL);
        dsv4_tokenizer_encode(a->tok, t, strlen(t), 1, &w, NULL);
        if (v.n != w.n || memcmp(v.ids, w.ids, v.n * sizeof *v.ids)) a->mismatches++;
        char *out;
        size_t ol;
        if (dsv4_tokenizer_decode(a->tok, v.ids, v.n, 0, &out, &ol, NULL) || ol != strlen(t) || memcmp(out, t, ol))
            a->mismatches++;
        else free(out);
        dsv4_tokvec_free(&v);
        dsv4_tokvec_free(&w);
    }
    return NULL;
}

static void test_threads(dsv4_tokenizer *tok) {
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){tok, i, 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    int m = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        m += args[i].mismatches;
    }
    CHECK_EQ_INT(m, 0);
}

int main(void) {
    test_translate_refusals();
    test_load_errors();
    char path[4096];
    tm_tokenizer_path(path, sizeof path);
    dsv4_tokenizer *tok = NULL;
    dsv4_err err = {0};
    CHECK_MSG(dsv4_tokenizer_load(path, &tok, &err) == 0, "%s", err.msg);
    test_unicode_classes(); /* after a load: the class tables are built */
    if (tok) {
        test_invalid_utf8(tok);
        test_threads(tok);
        dsv4_tokenizer_free(tok);
    }
    test_variants(path);
    return TEST_REPORT();
}
