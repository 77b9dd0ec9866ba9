/*
 * text/tokenizer.c — loading a Hugging Face tokenizer.json, id/string
 * lookups and decoding (spec/SERVING.md §1.1-1.2; API in text/tokenizer.h).
 *
 * Why so strict at load time: a tokenizer that silently ignores a feature it
 * does not implement produces plausible but wrong ids, and a model fed wrong
 * ids fails quietly. So every field of tokenizer.json is either implemented
 * exactly as the `tokenizers` library does or refused with a message naming
 * the file and the field.
 */
#include "text/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* Small helpers                                                        */
/* ------------------------------------------------------------------ */

uint32_t tk_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int strmap_grow(tk_strmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    tk_strmap_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) return DSV4_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        tk_strmap_slot *s = &m->slots[i];
        if (!s->key) continue;
        size_t j = s->hash & (ncap - 1);
        while (ns[j].key) j = (j + 1) & (ncap - 1);
        ns[j] = *s;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return DSV4_OK;
}

/* Insert or overwrite key -> id. */
static int strmap_put(tk_strmap *m, const char *key, size_t len, int32_t id) {
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m)) return DSV4_ENOMEM;
    uint32_t h = tk_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        tk_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            s->id = id;
            return DSV4_OK;
        }
        j = (j + 1) & (m->cap - 1);
    }
    char *k = malloc(len + 1);
    if (!k) return DSV4_ENOMEM;
    memcpy(k, key, len);
    k[len] = 0;
    m->slots[j] = (tk_strmap_slot){k, (uint32_t)len, h, id};
    m->n++;
    return DSV4_OK;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n) {
    if (!m->cap) return -1;
    uint32_t h = tk_hash(s, n);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        const tk_strmap_slot *e = &m->slots[j];
        if (e->hash == h && e->len == n && !memcmp(e->key, s, n)) return e->id;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

static void strmap_free(tk_strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/*
 * The byte-level alphabet of GPT-2 (bytes_to_unicode): printable Latin-1
 * bytes map to themselves; the 68 others (controls, space, DEL, NBSP, soft
 * hyphen, ...) map in order to U+0100.. so every byte is a visible char.
 */
uint32_t tk_byte_to_cp(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

static size_t utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 63));
    o[2] = (char)(0x80 | (cp & 63));
    return 3;
}

/* ------------------------------------------------------------------ */
/* Added-token tries                                                    */
/* ------------------------------------------------------------------ */

static int trie_node(tk_trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 256;
        tk_trie_node *nn = realloc(t->nodes, nc * sizeof *nn);
        if (!nn) return -1;
        t->nodes = nn;
        t->cap = nc;
    }
    t->nodes[t->n] = (tk_trie_node){-1, -1, -1, byte};
    return (int)t->n++;
}

static int trie_insert(tk_trie *t, const char *s, size_t n, int32_t id) {
    if (!t->n && trie_node(t, 0) < 0) return DSV4_ENOMEM;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = t->nodes[cur].child;
        while (c >= 0 && t->nodes[c].byte != b) c = t->nodes[c].sibling;
        if (c < 0) {
            c = trie_node(t, b);
            if (c < 0) return DSV4_ENOMEM;
            t->nodes[c].sibling = t->nodes[cur].child;
            t->nodes[cur].child = c;
        }
        cur = c;
    }
    /* tokenizers keeps the last added token for duplicate contents. */
    t->nodes[cur].id = id;
    t->first[(uint8_t)s[0]] = 1;
    t->count++;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ */
/* JSON parsing                                                         */
/* ------------------------------------------------------------------ */

typedef struct loadctx {
    const char *name;
    dsv4_err *err;
} loadctx;

#define FAIL(code, ...) dsv4_err_set(L->err, code, __VA_ARGS__)

static const char *jtype(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* A boolean field that must be false (or absent/null): unsupported if true. */
static int want_false(loadctx *L, const cJSON *obj, const char *field, const char *where) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j)) return 0;
    if (cJSON_IsTrue(j))
        return FAIL(DSV4_EUNSUPPORTED, "%s: %s.%s = true is not supported", L->name, where, field);
    return FAIL(DSV4_EFORMAT, "%s: %s.%s must be a boolean, got %s", L->name, where, field, jtype(j));
}

/* A field that must be absent or null. */
static int want_null(loadctx *L, const cJSON *obj, const char *field, const char *where) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j || cJSON_IsNull(j)) return 0;
    return FAIL(DSV4_EUNSUPPORTED, "%s: %s.%s = %s is not supported (only null)", L->name, where,
                field, jtype(j));
}

static int set_token(dsv4_tokenizer *t, int32_t id, const char *s) {
    free(t->tok_str[id]);
    t->tok_str[id] = strdup(s);
    return t->tok_str[id] ? DSV4_OK : DSV4_ENOMEM;
}

static int parse_model(loadctx *L, dsv4_tokenizer *t, const cJSON *root, const cJSON *added) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return FAIL(DSV4_EFORMAT, "%s: model must be an object, got %s", L->name, jtype(model));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !cJSON_IsString(type))
        return FAIL(DSV4_EFORMAT, "%s: model.type must be a string", L->name);
    if (type && strcmp(type->valuestring, "BPE"))
        return FAIL(DSV4_EUNSUPPORTED, "%s: model.type \"%s\" is not supported (only BPE)", L->name,
                    type->valuestring);
    int rc;
    if ((rc = want_null(L, model, "dropout", "model")) || (rc = want_null(L, model, "unk_token", "model")) ||
        (rc = want_null(L, model, "continuing_subword_prefix", "model")) ||
        (rc = want_null(L, model, "end_of_word_suffix", "model")) ||
        (rc = want_false(L, model, "byte_fallback", "model")) ||
        (rc = want_false(L, model, "ignore_merges", "model")))
        return rc;

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return FAIL(DSV4_EFORMAT, "%s: model.vocab must be an object, got %s", L->name, jtype(vocab));
    /* Size: highest id over vocab and added tokens. */
    double maxid = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216.0 ||
            e->valuedouble != (double)(int32_t)e->valuedouble)
            return FAIL(DSV4_EFORMAT, "%s: model.vocab[\"%s\"]: id must be an integer in [0, 2^24]",
                        L->name, e->string ? e->string : "?");
        if (e->valuedouble > maxid) maxid = e->valuedouble;
    }
    int k = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, k++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216.0 ||
            id->valuedouble != (double)(int32_t)id->valuedouble)
            return FAIL(DSV4_EFORMAT, "%s: added_tokens[%d].id must be an integer in [0, 2^24]", L->name, k);
        if (id->valuedouble > maxid) maxid = id->valuedouble;
    }
    if (maxid < 0) return FAIL(DSV4_EFORMAT, "%s: model.vocab is empty", L->name);
    t->vocab_size = (int32_t)maxid + 1;
    t->tok_str = calloc((size_t)t->vocab_size, sizeof *t->tok_str);
    t->tok_bytes = calloc((size_t)t->vocab_size, sizeof *t->tok_bytes);
    t->tok_bytes_len = calloc((size_t)t->vocab_size, sizeof *t->tok_bytes_len);
    t->flags = calloc((size_t)t->vocab_size, 1);
    if (!t->tok_str || !t->tok_bytes || !t->tok_bytes_len || !t->flags)
        return FAIL(DSV4_ENOMEM, "%s: out of memory for %d tokens", L->name, t->vocab_size);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        if (!e->string || !*e->string)
            return FAIL(DSV4_EFORMAT, "%s: model.vocab: empty token string (id %d)", L->name, id);
        if (strmap_put(&t->vocab, e->string, strlen(e->string), id) || set_token(t, id, e->string))
            return FAIL(DSV4_ENOMEM, "%s: out of memory", L->name);
        t->flags[id] |= TK_USED;
    }

    /* Every byte's byte-level symbol. A missing one is dropped at encode
     * time, like tokenizers' BPE without unk_token. */
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t n = utf8_put(tk_byte_to_cp((uint8_t)b), u);
        t->byte_id[b] = tk_strmap_get(&t->vocab, u, n);
    }

    /* merges: "a b" strings (tokenizers < 0.20 files) or ["a", "b"] pairs. */
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        return FAIL(DSV4_EFORMAT, "%s: model.merges must be an array, got %s", L->name, jtype(merges));
    int nm = merges ? cJSON_GetArraySize(merges) : 0;
    size_t cap = 1024;
    while (cap < (size_t)nm * 2 + 2) cap *= 2;
    t->merges = malloc(cap * sizeof *t->merges);
    if (!t->merges) return FAIL(DSV4_ENOMEM, "%s: out of memory for merges", L->name);
    for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->merge_cap = cap;
    int rank = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next, rank++) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1]) {
                free(buf);
                return FAIL(DSV4_EFORMAT, "%s: model.merges[%d] = \"%s\": expected two tokens separated by one space",
                            L->name, rank, s);
            }
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring; la = strlen(a);
            b = m->child->next->valuestring; lb = strlen(b);
        } else {
            free(buf);
            return FAIL(DSV4_EFORMAT, "%s: model.merges[%d] must be a string \"a b\" or an array [\"a\", \"b\"], got %s",
                        L->name, rank, jtype(m));
        }
        int32_t ia = tk_strmap_get(&t->vocab, a, la), ib = tk_strmap_get(&t->vocab, b, lb);
        if (la + lb + 1 > bufcap) {
            bufcap = (la + lb + 1) * 2;
            char *nb = realloc(buf, bufcap);
            if (!nb) { free(buf); return FAIL(DSV4_ENOMEM, "%s: out of memory", L->name); }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t inew = tk_strmap_get(&t->vocab, buf, la + lb);
        if (ia < 0 || ib < 0 || inew < 0) {
            buf[la + lb] = 0;
            int r = FAIL(DSV4_EFORMAT, "%s: model.merges[%d]: token \"%.*s\" is not in model.vocab", L->name, rank,
                         ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb), ia < 0 ? a : ib < 0 ? b : buf);
            free(buf);
            return r;
        }
        tk_merge_insert(t, ia, ib, rank, inew);
    }
    free(buf);
    return DSV4_OK;
}

static int parse_added(loadctx *L, dsv4_tokenizer *t, const cJSON *added) {
    int k = 0;
    /* tokenizers does not take added-token ids from the file: it assigns
     * them (existing vocab id, else one past the highest so far, starting at
     * the model's vocab size) and only warns on a mismatch. We use the file's
     * ids and refuse a file where the two disagree. */
    int32_t next_new = (int32_t)t->vocab.n;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, k++) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d]", k);
        if (!cJSON_IsObject(a)) return FAIL(DSV4_EFORMAT, "%s: %s must be an object", L->name, where);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(content) || !*content->valuestring)
            return FAIL(DSV4_EFORMAT, "%s: %s.content must be a non-empty string", L->name, where);
        int rc;
        if ((rc = want_false(L, a, "lstrip", where)) || (rc = want_false(L, a, "rstrip", where)) ||
            (rc = want_false(L, a, "single_word", where)))
            return rc;
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(a, "special");
        const cJSON *nz = cJSON_GetObjectItemCaseSensitive(a, "normalized");
        if ((sp && !cJSON_IsBool(sp)) || (nz && !cJSON_IsBool(nz)))
            return FAIL(DSV4_EFORMAT, "%s: %s.special/normalized must be booleans", L->name, where);
        int special = cJSON_IsTrue(sp);
        /* tokenizers: `normalized` defaults to !special when absent. */
        int normalized = nz ? cJSON_IsTrue(nz) : !special;
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        const char *s = content->valuestring;
        size_t n = strlen(s);
        int32_t known = tk_strmap_get(&t->added, s, n);
        if (known < 0) known = tk_strmap_get(&t->vocab, s, n);
        int32_t expect = known >= 0 ? known : next_new;
        if (id != expect)
            return FAIL(DSV4_EUNSUPPORTED, "%s: %s.id = %d but tokenizers would assign %d to \"%s\"", L->name, where,
                        id, expect, s);
        if (known < 0) next_new = id + 1;
        if (strmap_put(&t->added, s, n, id) || set_token(t, id, s) ||
            trie_insert(&t->trie[normalized ? 1 : 0], s, n, id))
            return FAIL(DSV4_ENOMEM, "%s: out of memory", L->name);
        t->flags[id] = (uint8_t)(TK_USED | TK_ADDED | (special ? TK_SPECIAL : 0) | (normalized ? TK_NORMALIZED : 0));
    }
    return DSV4_OK;
}

static int parse_normalizer(loadctx *L, const cJSON *root) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (!n || cJSON_IsNull(n)) return DSV4_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence") && cJSON_IsArray(list) &&
        cJSON_GetArraySize(list) == 0)
        return DSV4_OK;
    return FAIL(DSV4_EUNSUPPORTED, "%s: normalizer of type %s is not supported (only null or an empty Sequence)",
                L->name, cJSON_IsString(type) ? type->valuestring : "?");
}

static int parse_one_pretok(loadctx *L, dsv4_tokenizer *t, const cJSON *p, const char *where, int last) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type)) return FAIL(DSV4_EFORMAT, "%s: %s.type must be a string", L->name, where);
    const char *ty = type->valuestring;
    if (!strcmp(ty, "ByteLevel")) {
        if (!last)
            return FAIL(DSV4_EUNSUPPORTED, "%s: %s: ByteLevel must be the last pre-tokenizer", L->name, where);
        int rc;
        if ((rc = want_false(L, p, "add_prefix_space", where)) || (rc = want_false(L, p, "use_regex", where)))
            return rc;
        return DSV4_OK;
    }
    if (strcmp(ty, "Split"))
        return FAIL(DSV4_EUNSUPPORTED, "%s: %s: pre-tokenizer type \"%s\" is not supported (Split, ByteLevel)",
                    L->name, where, ty);
    if (last) return FAIL(DSV4_EUNSUPPORTED, "%s: %s: the last pre-tokenizer must be ByteLevel", L->name, where);
    int rc;
    if ((rc = want_false(L, p, "invert", where))) return rc;
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(beh)) return FAIL(DSV4_EFORMAT, "%s: %s.behavior must be a string", L->name, where);
    int behavior;
    if (!strcmp(beh->valuestring, "Isolated")) behavior = TK_SPLIT_ISOLATED;
    else if (!strcmp(beh->valuestring, "Removed")) behavior = TK_SPLIT_REMOVED;
    else
        return FAIL(DSV4_EUNSUPPORTED, "%s: %s.behavior \"%s\" is not supported (Isolated, Removed)", L->name,
                    where, beh->valuestring);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
    const cJSON *str = pat ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
    if (t->n_splits == TK_MAX_SPLITS)
        return FAIL(DSV4_EUNSUPPORTED, "%s: %s: more than %d Split pre-tokenizers", L->name, where, TK_MAX_SPLITS);
    pcre2_code *code = NULL, *code_ext = NULL;
    if (cJSON_IsString(re)) {
        dsv4_err e = {0};
        if ((rc = tk_regex_compile(re->valuestring, strlen(re->valuestring), &code, &code_ext, &e)))
            return FAIL(rc, "%s: %s.pattern.Regex: %s", L->name, where, e.msg);
    } else if (cJSON_IsString(str)) {
        /* A literal string. */
        if (!*str->valuestring) return FAIL(DSV4_EFORMAT, "%s: %s.pattern.String is empty", L->name, where);
        int ec;
        PCRE2_SIZE eo;
        code = pcre2_compile((PCRE2_SPTR)str->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_LITERAL, &ec,
                             &eo, NULL);
        if (!code) return FAIL(DSV4_EFORMAT, "%s: %s.pattern.String does not compile", L->name, where);
    } else {
        return FAIL(DSV4_EFORMAT, "%s: %s.pattern must be {\"Regex\": ...} or {\"String\": ...}", L->name, where);
    }
    t->splits[t->n_splits++] = (tk_split){code, code_ext, behavior};
    uint32_t caps = 0;
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &caps);
    if (caps + 1 > t->max_match_ovec) t->max_match_ovec = caps + 1;
    return DSV4_OK;
}

static int parse_pretok(loadctx *L, dsv4_tokenizer *t, const cJSON *root) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!cJSON_IsObject(p))
        return FAIL(DSV4_EUNSUPPORTED, "%s: pre_tokenizer is %s; only a byte-level one is supported", L->name,
                    jtype(p));
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type)) return FAIL(DSV4_EFORMAT, "%s: pre_tokenizer.type must be a string", L->name);
    if (strcmp(type->valuestring, "Sequence")) return parse_one_pretok(L, t, p, "pre_tokenizer", 1);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!cJSON_IsArray(list) || !cJSON_GetArraySize(list))
        return FAIL(DSV4_EFORMAT, "%s: pre_tokenizer.pretokenizers must be a non-empty array", L->name);
    int k = 0, n = cJSON_GetArraySize(list);
    for (const cJSON *e = list->child; e; e = e->next, k++) {
        char where[64];
        snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%d]", k);
        if (!cJSON_IsObject(e)) return FAIL(DSV4_EFORMAT, "%s: %s must be an object", L->name, where);
        int rc = parse_one_pretok(L, t, e, where, k == n - 1);
        if (rc) return rc;
    }
    return DSV4_OK;
}

static int parse_post_decoder(loadctx *L, const cJSON *root) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (pp && !cJSON_IsNull(pp)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pp, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "ByteLevel"))
            return FAIL(DSV4_EUNSUPPORTED, "%s: post_processor type %s is not supported (null or ByteLevel)",
                        L->name, cJSON_IsString(ty) ? ty->valuestring : "?");
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *ty = d ? cJSON_GetObjectItemCaseSensitive(d, "type") : NULL;
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "ByteLevel"))
        return FAIL(DSV4_EUNSUPPORTED, "%s: decoder %s is not supported (only ByteLevel)", L->name,
                    cJSON_IsString(ty) ? ty->valuestring : jtype(d));
    return DSV4_OK;
}

/*
 * Per-token decoded bytes, as tokenizers' ByteLevel decoder does it: a token
 * whose every char is in the byte-level alphabet becomes those bytes; a token
 * with any other char (e.g. "<｜User｜>") is taken as its raw UTF-8.
 */
static int build_token_bytes(dsv4_tokenizer *t) {
    int32_t cp2byte[512];
    for (int i = 0; i < 512; i++) cp2byte[i] = -1;
    for (int b = 0; b < 256; b++) cp2byte[tk_byte_to_cp((uint8_t)b)] = b;
    for (int32_t id = 0; id < t->vocab_size; id++) {
        const char *s = t->tok_str[id];
        if (!s) continue;
        size_t n = strlen(s);
        char *o = malloc(n + 1);
        if (!o) return DSV4_ENOMEM;
        size_t k = 0;
        int ok = 1;
        for (size_t i = 0; i < n && ok;) {
            uint8_t c = (uint8_t)s[i];
            uint32_t cp;
            if (c < 0x80) { cp = c; i += 1; }
            else if ((c & 0xE0) == 0xC0 && i + 1 < n) { cp = ((c & 31u) << 6) | ((uint8_t)s[i + 1] & 63u); i += 2; }
            else { ok = 0; break; }
            if (cp >= 512 || cp2byte[cp] < 0) ok = 0;
            else o[k++] = (char)cp2byte[cp];
        }
        if (!ok) { memcpy(o, s, n); k = n; }
        o[k] = 0;
        t->tok_bytes[id] = o;
        t->tok_bytes_len[id] = (uint32_t)k;
    }
    return DSV4_OK;
}

int dsv4_tokenizer_load_json(const char *json, size_t len, const char *name, dsv4_tokenizer **out,
                             dsv4_err *err) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    loadctx Lc = {name, err}, *L = &Lc;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= json && at <= json + len) ? (long)(at - json) : -1;
        return FAIL(DSV4_EFORMAT, "%s: invalid JSON (near byte %ld)", name, off);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return FAIL(DSV4_EFORMAT, "%s: top level must be a JSON object", name);
    }
    dsv4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { cJSON_Delete(root); return FAIL(DSV4_ENOMEM, "%s: out of memory", name); }
    pthread_mutex_init(&t->cache_mu, NULL);
    t->name = strdup(name);
    t->cache = calloc(TK_CACHE_SLOTS, sizeof *t->cache);
    int rc = (!t->name || !t->cache) ? FAIL(DSV4_ENOMEM, "%s: out of memory", name) : DSV4_OK;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!rc && added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        rc = FAIL(DSV4_EFORMAT, "%s: added_tokens must be an array, got %s", name, jtype(added));
    if (!rc) rc = parse_model(L, t, root, cJSON_IsArray(added) ? added : NULL);
    if (!rc) rc = parse_added(L, t, cJSON_IsArray(added) ? added : NULL);
    if (!rc) rc = parse_normalizer(L, root);
    if (!rc) rc = parse_pretok(L, t, root);
    if (!rc) rc = parse_post_decoder(L, root);
    if (!rc && build_token_bytes(t)) rc = FAIL(DSV4_ENOMEM, "%s: out of memory", name);
    cJSON_Delete(root);
    if (rc) {
        dsv4_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DSV4_OK;
}

int dsv4_tokenizer_load(const char *path, dsv4_tokenizer **out, dsv4_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_err_set(err, DSV4_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : (1u << 20);
            char *nb = realloc(buf, nc);
            if (!nb) { free(buf); fclose(f); return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", path); }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return dsv4_err_set(err, DSV4_EIO, "%s: read error", path); }
    int rc = dsv4_tokenizer_load_json(buf, n, path, out, err);
    free(buf);
    return rc;
}

void dsv4_tokenizer_free(dsv4_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; t->tok_str && i < t->vocab_size; i++) free(t->tok_str[i]);
    for (int32_t i = 0; t->tok_bytes && i < t->vocab_size; i++) free(t->tok_bytes[i]);
    free(t->tok_str);
    free(t->tok_bytes);
    free(t->tok_bytes_len);
    free(t->flags);
    strmap_free(&t->vocab);
    strmap_free(&t->added);
    free(t->merges);
    free(t->trie[0].nodes);
    free(t->trie[1].nodes);
    for (int i = 0; i < t->n_splits; i++) {
        pcre2_code_free(t->splits[i].re);
        pcre2_code_free(t->splits[i].re_ext);
    }
    if (t->cache)
        for (size_t i = 0; i < TK_CACHE_SLOTS; i++) {
            free(t->cache[i].key);
            free(t->cache[i].ids);
        }
    free(t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    free(t->name);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Lookups and decode                                                   */
/* ------------------------------------------------------------------ */

static int valid_id(const dsv4_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TK_USED);
}

const char *dsv4_tokenizer_token_bytes(const dsv4_tokenizer *t, int32_t id, size_t *len) {
    if (!valid_id(t, id)) { if (len) *len = 0; return NULL; }
    if (len) *len = t->tok_bytes_len[id];
    return t->tok_bytes[id];
}

const char *dsv4_tokenizer_id_to_token(const dsv4_tokenizer *t, int32_t id) {
    return valid_id(t, id) ? t->tok_str[id] : NULL;
}

int32_t dsv4_tokenizer_token_to_id(const dsv4_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    int32_t id = tk_strmap_get(&t->added, token, n);
    return id >= 0 ? id : tk_strmap_get(&t->vocab, token, n);
}

int32_t dsv4_tokenizer_special_id(const dsv4_tokenizer *t, const char *text) {
    return tk_strmap_get(&t->added, text, strlen(text));
}

int dsv4_tokenizer_is_added(const dsv4_tokenizer *t, int32_t id) {
    return valid_id(t, id) && (t->flags[id] & TK_ADDED);
}

int dsv4_tokenizer_is_special(const dsv4_tokenizer *t, int32_t id) {
    return valid_id(t, id) && (t->flags[id] & TK_SPECIAL);
}

int32_t dsv4_tokenizer_vocab_size(const dsv4_tokenizer *t) { return t->vocab_size; }

int dsv4_tokenizer_decode(const dsv4_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
                          size_t *out_len, dsv4_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!valid_id(t, ids[i]))
            return dsv4_err_set(err, DSV4_EINVAL, "decode: ids[%zu] = %d is not a token of %s", i, (int)ids[i],
                                t->name);
        if (!(skip_special && (t->flags[ids[i]] & TK_SPECIAL))) total += t->tok_bytes_len[ids[i]];
    }
    char *o = malloc(total + 1);
    if (!o) return dsv4_err_set(err, DSV4_ENOMEM, "decode: out of memory (%zu bytes)", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && (t->flags[ids[i]] & TK_SPECIAL)) continue;
        memcpy(o + k, t->tok_bytes[ids[i]], t->tok_bytes_len[ids[i]]);
        k += t->tok_bytes_len[ids[i]];
    }
    o[k] = 0;
    *out = o;
    if (out_len) *out_len = k;
    return DSV4_OK;
}

void dsv4_tokvec_free(dsv4_tokvec *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int dsv4_tokvec_push(dsv4_tokvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *ni = realloc(v->ids, nc * sizeof *ni);
        if (!ni) return DSV4_ENOMEM;
        v->ids = ni;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
    return DSV4_OK;
}
