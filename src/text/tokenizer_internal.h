/*
 * text/tokenizer_internal.h — the tokenizer's private layout, shared by
 * tokenizer.c (loading, lookups, decode), tokenizer_encode.c (added tokens,
 * pre-tokenizer, encode), tokenizer_bpe.c (merge loop, cache) and
 * tokenizer_regex.c (Oniguruma -> PCRE2 translation). Not a public API; the
 * unit tests include it to test the pieces one by one.
 */
#ifndef DSV4_TEXT_TOKENIZER_INTERNAL_H
#define DSV4_TEXT_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* Token flags (tok->flags[id]). */
enum { TK_USED = 1, TK_ADDED = 2, TK_SPECIAL = 4, TK_NORMALIZED = 8 };

/* string -> id, open addressing; keys owned by the map. */
typedef struct tk_strmap_slot {
    char *key;      /* NULL = empty */
    uint32_t len;
    uint32_t hash;
    int32_t id;
} tk_strmap_slot;
typedef struct tk_strmap {
    tk_strmap_slot *slots;
    size_t cap, n; /* cap is a power of two */
} tk_strmap;

/* (left id, right id) -> (rank, merged id), open addressing. */
typedef struct tk_merge_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank, new_id;
} tk_merge_slot;

/* Byte trie over added-token contents (leftmost-longest matching). */
typedef struct tk_trie_node {
    int32_t child, sibling; /* first child / next sibling, -1 = none */
    int32_t id;             /* token id ending here, -1 = none */
    uint8_t byte;
} tk_trie_node;
typedef struct tk_trie {
    tk_trie_node *nodes; /* node 0 = root */
    size_t n, cap;
    uint8_t first[256];  /* 1 if some token starts with this byte */
    int32_t count;       /* tokens inserted */
} tk_trie;

enum { TK_SPLIT_ISOLATED = 0, TK_SPLIT_REMOVED = 1 };
#define TK_MAX_SPLITS 16

typedef struct tk_split {
    pcre2_code *re;     /* translated pattern with the local PCRE2's Unicode classes */
    pcre2_code *re_ext; /* same with the reference's newer code points added; NULL if identical */
    int behavior;
} tk_split;

/* BPE cache: direct-mapped table of piece bytes -> ids, under a mutex. */
#define TK_CACHE_SLOTS 65536
#define TK_CACHE_MAX_PIECE 64
typedef struct tk_cache_entry {
    char *key;        /* NULL = empty */
    uint32_t klen, nids;
    int32_t *ids;
} tk_cache_entry;

struct dsv4_tokenizer {
    char *name;                 /* file path for messages */
    int32_t vocab_size;         /* highest id + 1 */
    char **tok_str;             /* id -> vocabulary string (NUL-terminated) */
    char **tok_bytes;           /* id -> decoded bytes (NUL-terminated) */
    uint32_t *tok_bytes_len;
    uint8_t *flags;             /* TK_* */
    tk_strmap vocab;            /* model vocab strings -> id */
    tk_strmap added;            /* added-token contents -> id */
    int32_t byte_id[256];       /* id of each byte's byte-level symbol, -1 if absent */
    tk_merge_slot *merges;
    size_t merge_cap;           /* power of two */
    tk_trie trie[2];            /* [0] non-normalized added tokens, [1] normalized */
    int n_splits;
    tk_split splits[TK_MAX_SPLITS];
    size_t max_match_ovec;
    pthread_mutex_t cache_mu;
    tk_cache_entry *cache;      /* TK_CACHE_SLOTS entries */
};

/* ---- tokenizer_bpe.c ---- */
/* Merge map lookup: returns 1 and fills rank/new_id when (a,b) merges. */
int tk_merge_find(const dsv4_tokenizer *tok, int32_t a, int32_t b, int32_t *rank, int32_t *new_id);
/* Insert (overwriting an earlier duplicate, as tokenizers' HashMap collect does). */
int tk_merge_insert(dsv4_tokenizer *tok, int32_t a, int32_t b, int32_t rank, int32_t new_id);
/* BPE one pre-token of n bytes (raw bytes, not byte-level chars); append ids. */
int tk_bpe_piece(const dsv4_tokenizer *tok, const unsigned char *s, size_t n, dsv4_tokvec *out);

/* ---- tokenizer.c ---- */
uint32_t tk_hash(const char *s, size_t n);
int32_t tk_strmap_get(const tk_strmap *m, const char *s, size_t n);
/* Byte-level alphabet (GPT-2 bytes_to_unicode): byte -> code point. */
uint32_t tk_byte_to_cp(uint8_t b);

/* ---- tokenizer_regex.c ---- */
/*
 * Translate an Oniguruma (Ruby syntax) pattern, as tokenizers' Split{Regex}
 * runs it, into an equivalent PCRE2 pattern for PCRE2_UTF|PCRE2_UCP.
 * ext = 1 adds the code points the local PCRE2's \\p{X} misses.
 * *out is malloc'd. Returns DSV4_OK, or DSV4_EUNSUPPORTED naming the
 * construct (message without prefix; the caller adds file/field).
 */
int tk_regex_translate(const char *onig, size_t len, int ext, char **out, dsv4_err *err);
/* Compile both variants (JIT when available); *ext is NULL when the pattern
 * uses no class that needs extending. */
int tk_regex_compile(const char *onig, size_t len, pcre2_code **native, pcre2_code **ext, dsv4_err *err);
/* 1 if valid UTF-8 text s contains a code point that only the extended
 * variant classifies correctly. */
int tk_regex_text_needs_ext(const char *s, size_t n);

/* ---- tokenizer_encode.c ---- */
/*
 * Replace ill-formed UTF-8 with U+FFFD (maximal-subpart policy). Returns 0
 * and sets *out=NULL when s is already valid; otherwise *out is a malloc'd
 * copy of length *out_len. Returns DSV4_ENOMEM on allocation failure.
 */
int tk_utf8_sanitize(const char *s, size_t n, char **out, size_t *out_len);

#endif
