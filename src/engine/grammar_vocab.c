/*
 * Token masks for a grammar state (src/engine/grammar.h).
 *
 * Why a trie: the grammar is a byte matcher, so "may token t come next?" is
 * "do t's bytes pass the matcher?". Tokens sharing a prefix share that work:
 * the vocabulary's byte strings are stored as a trie in depth-first order
 * (each node: its byte, its depth, where its subtree ends, the tokens ending
 * there), and the mask walks it once, stepping the matcher state by one byte
 * per node and skipping a whole subtree as soon as its prefix is rejected.
 * Inside a JSON object most of the vocabulary dies at the first byte; inside a
 * string most of it survives, and the walk costs one matcher byte per trie
 * node (~1 per distinct prefix, well below vocab x token length).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_internal.h"

int dsv4_grammar_step_into(const dsv4_grammar *g, const dsv4_grammar_state *s, dsv4_grammar_state *next,
                           int c);

/* A trie in preorder; node 0 is the root (empty prefix). */
typedef struct ftrie {
    int n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    int32_t *end;       /* index after the subtree */
    int32_t *tok_first; /* [n_nodes] first token ending here, -1 */
    int32_t *tok_next;  /* [vocab] next token with the same bytes, -1 */
    int max_depth;
} ftrie;

/* Trie sets: every usable token; the tokens that are not string-plain; the
 * tokens that are not raw-plain (grammar_internal.h, the fast path). */
enum { T_ALL, T_NOT_STR, T_NOT_RAW, T_COUNT };

struct dsv4_gvocab {
    int vocab;
    int32_t eos;
    const dsv4_tokenizer *tok;
    uint8_t *allowed_id; /* [vocab] 1 = may be produced by a grammar (in the trie) */
    ftrie t[T_COUNT];
    uint32_t *plain[3];                   /* [T_NOT_STR], [T_NOT_RAW]: bitmaps of the plain tokens */
    uint16_t *nchars;                     /* [vocab] characters of a string-plain token */
    int32_t sym_id[DSV4_GRAMMAR_MAX_SYM]; /* token of symbol i (grammar.h) */
    uint8_t sym_byte[DSV4_GRAMMAR_MAX_SYM];
    int n_sym;
    int max_depth;
};

/* The bytes a grammar sees for a token: its decoded bytes, or its symbol byte. */
static const char *tok_bytes(const dsv4_gvocab *v, int32_t id, size_t *len) {
    for (int i = 0; i < v->n_sym; i++)
        if (v->sym_id[i] == id) {
            *len = 1;
            return (const char *)&v->sym_byte[i];
        }
    return dsv4_tokenizer_token_bytes(v->tok, id, len);
}

/* build-time trie: first-child / next-sibling links */
typedef struct btrie {
    int32_t *child, *sib, *tok;
    uint8_t *byte;
    int n, cap;
} btrie;

static int bt_new(btrie *t, uint8_t b) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1 << 16;
        int32_t *c = realloc(t->child, sizeof(int32_t) * (size_t)cap);
        if (c) t->child = c;
        int32_t *s = c ? realloc(t->sib, sizeof(int32_t) * (size_t)cap) : NULL;
        if (s) t->sib = s;
        int32_t *k = s ? realloc(t->tok, sizeof(int32_t) * (size_t)cap) : NULL;
        if (k) t->tok = k;
        uint8_t *y = k ? realloc(t->byte, (size_t)cap) : NULL;
        if (!y) return -1;
        t->byte = y;
        t->cap = cap;
    }
    t->child[t->n] = t->sib[t->n] = t->tok[t->n] = -1;
    t->byte[t->n] = b;
    return t->n++;
}

static void bt_free(btrie *t) {
    free(t->child);
    free(t->sib);
    free(t->tok);
    free(t->byte);
}

void dsv4_gvocab_free(dsv4_gvocab *v) {
    if (!v) return;
    free(v->allowed_id);
    for (int i = 0; i < T_COUNT; i++) {
        free(v->t[i].byte);
        free(v->t[i].depth);
        free(v->t[i].end);
        free(v->t[i].tok_first);
        free(v->t[i].tok_next);
        free(v->plain[i]);
    }
    free(v->nchars);
    free(v);
}

int dsv4_gvocab_size(const dsv4_gvocab *v) {
    return v->vocab;
}
int32_t dsv4_gvocab_eos(const dsv4_gvocab *v) {
    return v->eos;
}

/* Plain classes of a token's bytes: complete, well-formed UTF-8 without
 * '"', '\\' or bytes < 0x20 (string-plain), or without '<' or NUL
 * (raw-plain). Sets *nch to its character count. */
static int utf8_complete(const uint8_t *b, size_t n, int *nch) {
    size_t i = 0;
    int chars = 0;
    while (i < n) {
        uint8_t c = b[i];
        size_t len = c < 0x80                 ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : c >= 0xE0 && c <= 0xEF ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if ((b[i + k] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && b[i + 1] < 0xA0) return 0;
        if (c == 0xED && b[i + 1] > 0x9F) return 0;
        if (c == 0xF0 && b[i + 1] < 0x90) return 0;
        if (c == 0xF4 && b[i + 1] > 0x8F) return 0;
        i += len;
        chars++;
    }
    *nch = chars;
    return 1;
}

static int build_trie(const dsv4_gvocab *v, const uint8_t *member, ftrie *ft) {
    btrie t = {0};
    int32_t *stack = NULL, *pos = NULL;
    ft->tok_next = malloc(sizeof(int32_t) * (size_t)v->vocab);
    if (!ft->tok_next || bt_new(&t, 0) < 0) goto oom;
    for (int32_t id = 0; id < v->vocab; id++) {
        ft->tok_next[id] = -1;
        if (!member[id]) continue;
        size_t len = 0;
        const char *b = tok_bytes(v, id, &len);
        int node = 0;
        for (size_t i = 0; i < len; i++) {
            uint8_t c = (uint8_t)b[i];
            int ch = t.child[node], prev = -1;
            while (ch >= 0 && t.byte[ch] < c) {
                prev = ch;
                ch = t.sib[ch];
            }
            if (ch < 0 || t.byte[ch] != c) { /* insert keeping siblings sorted */
                int nn = bt_new(&t, c);
                if (nn < 0) goto oom;
                t.sib[nn] = ch;
                if (prev < 0)
                    t.child[node] = nn;
                else
                    t.sib[prev] = nn;
                ch = nn;
            }
            node = ch;
        }
        ft->tok_next[id] = t.tok[node];
        t.tok[node] = id;
    }
    /* flatten in preorder */
    ft->n_nodes = t.n;
    ft->byte = malloc((size_t)t.n);
    ft->depth = malloc(sizeof(uint16_t) * (size_t)t.n);
    ft->end = malloc(sizeof(int32_t) * (size_t)t.n);
    ft->tok_first = malloc(sizeof(int32_t) * (size_t)t.n);
    pos = malloc(sizeof(int32_t) * (size_t)t.n); /* preorder index of each build node */
    stack = malloc(sizeof(int32_t) * (size_t)t.n * 2);
    if (!ft->byte || !ft->depth || !ft->end || !ft->tok_first || !pos || !stack) goto oom;
    /* iterative DFS; stack entries: build node, or -(node+1) = "close" marker */
    int sp = 0, k = 0, d = -1;
    stack[sp++] = 0;
    while (sp) {
        int32_t e = stack[--sp];
        if (e < 0) {
            ft->end[pos[-e - 1]] = k;
            d--;
            continue;
        }
        d++;
        pos[e] = k;
        ft->byte[k] = t.byte[e];
        ft->depth[k] = (uint16_t)d;
        ft->tok_first[k] = t.tok[e];
        if (d > ft->max_depth) ft->max_depth = d;
        k++;
        stack[sp++] = -(e + 1);
        /* children pushed in reverse so the smallest byte is visited first */
        int nc = 0;
        for (int c = t.child[e]; c >= 0; c = t.sib[c])
            nc++;
        int i = 0;
        for (int c = t.child[e]; c >= 0; c = t.sib[c])
            stack[sp + nc - 1 - i++] = c;
        sp += nc;
    }
    free(pos);
    free(stack);
    bt_free(&t);
    return 0;
oom:
    free(pos);
    free(stack);
    bt_free(&t);
    return -1;
}

int dsv4_gvocab_create(const dsv4_tokenizer *tok, int vocab, int32_t eos_id, const int32_t *extra,
                       int n_extra, dsv4_gvocab **out, dsv4_err *err) {
    *out = NULL;
    dsv4_gvocab *v = calloc(1, sizeof *v);
    uint8_t *member = NULL;
    if (!v) goto oom;
    v->vocab = vocab;
    v->eos = eos_id;
    v->tok = tok;
    if (n_extra > DSV4_GRAMMAR_MAX_SYM) n_extra = DSV4_GRAMMAR_MAX_SYM;
    for (int i = 0; i < n_extra; i++) {
        v->sym_id[i] = extra[i];
        v->sym_byte[i] = (uint8_t)DSV4_GRAMMAR_SYM(i);
    }
    v->n_sym = n_extra;
    size_t words = (size_t)(vocab + 31) / 32;
    v->allowed_id = calloc((size_t)vocab, 1);
    v->nchars = calloc((size_t)vocab, sizeof(uint16_t));
    member = malloc((size_t)vocab * T_COUNT);
    v->plain[T_NOT_STR] = calloc(words, sizeof(uint32_t));
    v->plain[T_NOT_RAW] = calloc(words, sizeof(uint32_t));
    if (!v->allowed_id || !v->nchars || !member || !v->plain[T_NOT_STR] || !v->plain[T_NOT_RAW]) goto oom;
    int ntok = dsv4_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < vocab; id++) {
        size_t len = 0;
        const char *b = id < ntok ? dsv4_tokenizer_token_bytes(tok, id, &len) : NULL;
        int use = b && len > 0, sym = 0;
        for (int i = 0; i < n_extra; i++)
            sym |= extra[i] == id;
        if (use && dsv4_tokenizer_is_added(tok, id)) use = sym;
        for (size_t i = 0; use && !sym && i < len; i++)
            if ((uint8_t)b[i] >= 0xF8) use = 0; /* would alias a symbol */
        if (sym) b = tok_bytes(v, id, &len);
        int nch = 0, str_plain = 0, raw_plain = 0;
        if (use && utf8_complete((const uint8_t *)b, len, &nch)) {
            str_plain = raw_plain = 1;
            for (size_t i = 0; i < len; i++) {
                uint8_t c = (uint8_t)b[i];
                if (c == '"' || c == '\\' || c < 0x20) str_plain = 0;
                if (c == '<' || c == 0) raw_plain = 0;
            }
        }
        v->allowed_id[id] = (uint8_t)use;
        v->nchars[id] = (uint16_t)(nch > 65535 ? 65535 : nch);
        member[T_ALL * (size_t)vocab + (size_t)id] = (uint8_t)use;
        member[T_NOT_STR * (size_t)vocab + (size_t)id] = (uint8_t)(use && !str_plain);
        member[T_NOT_RAW * (size_t)vocab + (size_t)id] = (uint8_t)(use && !raw_plain);
        if (str_plain) v->plain[T_NOT_STR][id >> 5] |= 1u << (id & 31);
        if (raw_plain) v->plain[T_NOT_RAW][id >> 5] |= 1u << (id & 31);
    }
    for (int i = 0; i < T_COUNT; i++) {
        if (build_trie(v, member + (size_t)i * (size_t)vocab, &v->t[i])) goto oom;
        if (v->t[i].max_depth > v->max_depth) v->max_depth = v->t[i].max_depth;
    }
    free(member);
    *out = v;
    return DSV4_OK;
oom:
    free(member);
    dsv4_gvocab_free(v);
    return dsv4_err_set(err, DSV4_ENOMEM, "out of memory building the token trie");
}

size_t dsv4_gvocab_scratch_bytes(const dsv4_gvocab *v) {
    return sizeof(dsv4_grammar_state) * (size_t)(v->max_depth + 1);
}

/* Walk trie ft from state s, OR-ing accepted tokens into allowed. */
static int walk(const ftrie *ft, const dsv4_grammar *g, const dsv4_grammar_state *s, uint32_t *allowed,
                dsv4_grammar_state *st) {
    int count = 0;
    memcpy(&st[0], s, sizeof *s);
    for (int i = 1; i < ft->n_nodes;) {
        int d = ft->depth[i];
        if (!dsv4_grammar_step_into(g, &st[d - 1], &st[d], ft->byte[i])) {
            i = ft->end[i];
            continue;
        }
        for (int32_t id = ft->tok_first[i]; id >= 0; id = ft->tok_next[id]) {
            allowed[id >> 5] |= 1u << (id & 31);
            count++;
        }
        i++;
    }
    return count;
}

int dsv4_gvocab_mask(const dsv4_gvocab *v, const dsv4_grammar *g, const dsv4_grammar_state *s,
                     uint32_t *allowed, void *scratch) {
    size_t words = (size_t)(v->vocab + 31) / 32;
    memset(allowed, 0, sizeof(uint32_t) * words);
    int count = 0;
    if (dsv4_grammar_is_complete(g, s) && v->eos >= 0 && v->eos < v->vocab) {
        allowed[v->eos >> 5] |= 1u << (v->eos & 31);
        count++;
    }
    if (dsv4_grammar_is_closed(g, s)) return count;
    int room, cls = dsv4_grammar_plain_class(g, s, &room), t = T_ALL;
    if (cls == GR_PLAIN_STR && room < 0) t = T_NOT_STR;
    if (cls == GR_PLAIN_RAW) t = T_NOT_RAW;
    if (t != T_ALL) { /* the plain tokens are all accepted: copy them, walk the rest */
        for (size_t w = 0; w < words; w++) {
            allowed[w] |= v->plain[t][w];
            count += __builtin_popcount(v->plain[t][w]);
        }
    } else if (cls == GR_PLAIN_STR) { /* bounded string: plain tokens that fit */
        t = T_NOT_STR;
        for (int32_t id = 0; id < v->vocab; id++)
            if (((v->plain[t][id >> 5] >> (id & 31)) & 1) && v->nchars[id] <= room) {
                allowed[id >> 5] |= 1u << (id & 31);
                count++;
            }
    }
    return count + walk(&v->t[t], g, s, allowed, scratch);
}

int dsv4_gvocab_accept(const dsv4_gvocab *v, const dsv4_grammar *g, dsv4_grammar_state *s, int32_t id) {
    if (id == v->eos) return dsv4_grammar_is_complete(g, s);
    if (id < 0 || id >= v->vocab || !v->allowed_id[id]) return 0;
    size_t len = 0;
    const char *b = tok_bytes(v, id, &len);
    return b && dsv4_grammar_bytes(g, s, b, len);
}
