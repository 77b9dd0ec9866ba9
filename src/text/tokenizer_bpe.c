/*
 * text/tokenizer_bpe.c — the BPE merge loop for one pre-token, the merge
 * rank map, and the cache of already-merged pre-tokens.
 *
 * Why this exact loop: BPE with ties is order-sensitive. We replay the
 * algorithm of `tokenizers` (models/bpe/word.rs merge_all): a priority queue
 * of candidate merges ordered by (rank, position), lowest first; a popped
 * candidate is skipped when its left symbol was merged away, has no right
 * neighbour, or the pair at that position no longer merges into the same id;
 * after a merge, the new pairs with the left and right neighbours are pushed.
 * Same queue order, same skips, same ids.
 */
#include "text/tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

int tk_merge_insert(dsv4_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->merge_cap - 1, j = mix64(key) & mask;
    while (t->merges[j].key != UINT64_MAX && t->merges[j].key != key) j = (j + 1) & mask;
    t->merges[j] = (tk_merge_slot){key, rank, new_id};
    return DSV4_OK;
}

int tk_merge_find(const dsv4_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->merge_cap - 1, j = mix64(key) & mask;
    for (;;) {
        const tk_merge_slot *s = &t->merges[j];
        if (s->key == key) {
            *rank = s->rank;
            *new_id = s->new_id;
            return 1;
        }
        if (s->key == UINT64_MAX) return 0;
        j = (j + 1) & mask;
    }
}

/* ---- binary min-heap of candidate merges, ordered by (rank, pos) ---- */

typedef struct cand {
    int32_t rank, pos, new_id;
} cand;

static inline int cand_less(const cand *x, const cand *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const cand *best = &last;
        if (l < m && cand_less(&h[l], best)) { s = l; best = &h[l]; }
        if (r < m && cand_less(&h[r], best)) { s = r; }
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

typedef struct sym {
    int32_t id, prev, next, len; /* len 0 = merged away */
} sym;

/* Merge n initial symbol ids in place; writes result ids to out_ids, returns count. */
static size_t bpe_merge(const dsv4_tokenizer *t, const int32_t *ids0, size_t n, sym *sy, cand *heap,
                        int32_t *out_ids) {
    for (size_t i = 0; i < n; i++) sy[i] = (sym){ids0[i], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    size_t hn = 0;
    int32_t rank, nid;
    for (size_t i = 0; i + 1 < n; i++)
        if (tk_merge_find(t, sy[i].id, sy[i + 1].id, &rank, &nid))
            heap_push(heap, &hn, (cand){rank, (int32_t)i, nid});
    while (hn) {
        cand top = heap_pop(heap, &hn);
        sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t np = cur->next;
        sym right = sy[np];
        if (!tk_merge_find(t, cur->id, right.id, &rank, &nid) || nid != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        sy[np].len = 0;
        if (right.next >= 0) sy[right.next].prev = top.pos;
        if (cur->prev >= 0 && tk_merge_find(t, sy[cur->prev].id, cur->id, &rank, &nid))
            heap_push(heap, &hn, (cand){rank, cur->prev, nid});
        if (cur->next >= 0 && tk_merge_find(t, cur->id, sy[cur->next].id, &rank, &nid))
            heap_push(heap, &hn, (cand){rank, top.pos, nid});
    }
    size_t k = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = sy[i].next) out_ids[k++] = sy[i].id;
    return k;
}

/* ---- cache ---- */

static int cache_get(const dsv4_tokenizer *t, const unsigned char *s, size_t n, dsv4_tokvec *out, int *hit) {
    *hit = 0;
    dsv4_tokenizer *mt = (dsv4_tokenizer *)t; /* the cache is the one mutable part, under its mutex */
    size_t slot = tk_hash((const char *)s, n) & (TK_CACHE_SLOTS - 1);
    pthread_mutex_lock(&mt->cache_mu);
    tk_cache_entry *e = &mt->cache[slot];
    int rc = DSV4_OK;
    if (e->key && e->klen == n && !memcmp(e->key, s, n)) {
        *hit = 1;
        for (uint32_t i = 0; i < e->nids && !rc; i++) rc = dsv4_tokvec_push(out, e->ids[i]);
    }
    pthread_mutex_unlock(&mt->cache_mu);
    return rc;
}

static void cache_put(const dsv4_tokenizer *t, const unsigned char *s, size_t n, const int32_t *ids, size_t k) {
    dsv4_tokenizer *mt = (dsv4_tokenizer *)t;
    char *key = malloc(n ? n : 1);
    int32_t *v = malloc(k * sizeof *v + 1);
    if (!key || !v) { free(key); free(v); return; }
    memcpy(key, s, n);
    memcpy(v, ids, k * sizeof *v);
    size_t slot = tk_hash((const char *)s, n) & (TK_CACHE_SLOTS - 1);
    pthread_mutex_lock(&mt->cache_mu);
    tk_cache_entry *e = &mt->cache[slot];
    char *ok = e->key;
    int32_t *oi = e->ids;
    *e = (tk_cache_entry){key, (uint32_t)n, (uint32_t)k, v};
    pthread_mutex_unlock(&mt->cache_mu);
    free(ok);
    free(oi);
}

int tk_bpe_piece(const dsv4_tokenizer *t, const unsigned char *s, size_t n, dsv4_tokvec *out) {
    if (!n) return DSV4_OK;
    if (n > (size_t)1 << 28) return DSV4_ERANGE; /* symbol positions are int32; heap holds 3n */
    /* Single byte: no merges possible. */
    if (n == 1) return t->byte_id[s[0]] >= 0 ? dsv4_tokvec_push(out, t->byte_id[s[0]]) : DSV4_OK;
    int cacheable = n <= TK_CACHE_MAX_PIECE;
    if (cacheable) {
        int hit, rc = cache_get(t, s, n, out, &hit);
        if (rc || hit) return rc;
    }
    enum { STK = 128 };
    int32_t ids0_s[STK], res_s[STK];
    sym sy_s[STK];
    cand heap_s[3 * STK];
    int32_t *ids0 = ids0_s, *res = res_s;
    sym *sy = sy_s;
    cand *heap = heap_s;
    if (n > STK) {
        ids0 = malloc(n * sizeof *ids0);
        res = malloc(n * sizeof *res);
        sy = malloc(n * sizeof *sy);
        heap = malloc(3 * n * sizeof *heap);
        if (!ids0 || !res || !sy || !heap) {
            free(ids0); free(res); free(sy); free(heap);
            return DSV4_ENOMEM;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[s[i]] >= 0) ids0[m++] = t->byte_id[s[i]];
    size_t k = bpe_merge(t, ids0, m, sy, heap, res);
    int rc = DSV4_OK;
    for (size_t i = 0; i < k && !rc; i++) rc = dsv4_tokvec_push(out, res[i]);
    if (!rc && cacheable) cache_put(t, s, n, res, k);
    if (n > STK) { free(ids0); free(res); free(sy); free(heap); }
    return rc;
}
