/*
 * Tensor-parallel slicing of the target model (Megatron style; DESIGN.md
 * "Parallelism", spec/PERFORMANCE.md §1-2).
 *
 * What is split, rank r of N (H heads, G output groups, F widths):
 *  - attention: query heads. wq_b rows [r·H/N·hd, +H/N·hd) (a view), the
 *    sinks of those heads; wo_a is grouped by head, so the rank keeps its
 *    G/N groups' rows (a view) and wo_b the matching G/N·o_lora_rank input
 *    columns (a copy: columns are not contiguous). wo_b therefore produces a
 *    PARTIAL [T][d] sum: all-reduce #1.
 *  - LM head: vocabulary rows (a view) when N divides the vocabulary; the
 *    ranks' logit blocks are all-gathered (one collective per forward, of
 *    [rows needing logits][V]). Replicated otherwise.
 *  - replicated: wq_a/q_norm (the q latent feeds every head and the indexer),
 *    the single KV head (wkv, kv_norm), both compressors, the whole lightning
 *    indexer (its 64 heads score ONE shared top-k; splitting them would need
 *    an all-reduce of the scores before top-k — a third collective — to save
 *    0.5 GB/step of BF16 reads: not worth it at batch 1), the router, the
 *    hyper-connection mixers, norms, embedding, and the drafter (which keeps a
 *    whole-vocabulary view of the head on rank 0).
 *  - shared expert: intermediate dim. w1/w3 rows (views), w2 columns (copies).
 *  - routed experts: ALSO the intermediate dim (every rank holds a 1/N slice
 *    of all 256 experts), not expert-parallel. Why: at batch 1 a token picks
 *    6 experts, and an expert split over 2 ranks lands them 3/3 only 31% of
 *    the time (E[max] = 3.94 of 6), so the slower rank streams ~31% more
 *    expert bytes than the balanced split — a third of a plain step is expert
 *    bytes (PERFORMANCE.md §2). The intermediate split is balanced for every
 *    batch, reuses the moe_experts op unchanged (no owner masks in kernels),
 *    and sums with the shared expert into ONE partial [T][d]: all-reduce #2.
 *    Cost: the w2 column slices are copies at load (a third of the expert
 *    bytes, once).
 *
 * Two all-reduces of [T][d] per layer (Flash: d = 4096 → 16 KB per row in
 * F32). They cannot be fused into one: the FFN half starts with hc_pre, whose
 * RMS-normalised mixes and Sinkhorn iterations are non-linear in the complete
 * attention output, so the attention partials must be summed first.
 *
 * FP8 block scales (128×128, spec/MODEL.md §2.3): a slice of n rows (or
 * columns) at offset r·n keeps whole scale blocks when n % 128 == 0, or lies
 * inside one block when n divides 128 (the tiny test models); anything else
 * is refused. FP4 scales are per 32 columns of a row: column splits need
 * n % 32 == 0, row splits are free. Activation quantisation (W8A8, blocks of
 * 128 along the input) is unchanged by the split exactly when the sliced
 * input dim is a multiple of 128 — true for every Flash split up to TP = 8;
 * the tiny models split inside a block, so their reference-numerics TP
 * results differ from TP = 1 by more than summation order (the tests say by
 * how much).
 *
 * Dummy weights (--load-format dummy): their views carry a tag, not bytes, so
 * a slice is not an offset pointer or a copy but a new tag whose fill maps
 * the slice's elements to the whole tensor's (dsv4_dummy_slice): each rank
 * then fills exactly its part of the unsharded dummy model on its own device.
 */
#include "parallel/tp_shard.h"

#include <stdlib.h>
#include <string.h>

#include "model/dummy.h"

static int rule128(int64_t n) { return n > 0 && (n % 128 == 0 || (n < 128 && 128 % n == 0)); }

static int need_div(int64_t v, int tp, const char *what, dsv4_err *err) {
    if (v % tp == 0 && v / tp > 0) return 0;
    return dsv4_err_set(err, DSV4_EINVAL, "--tensor-parallel-size %d does not divide %s %lld", tp, what,
                        (long long)v);
}

static int need_blocks(int64_t n, int tp, const char *what, dsv4_err *err) {
    if (rule128(n)) return 0;
    return dsv4_err_set(err, DSV4_EINVAL,
                        "--tensor-parallel-size %d: the per-rank slice of %s is %lld wide, which splits the 128x128 "
                        "FP8 scale blocks (needs a multiple of 128, or a divisor of 128)",
                        tp, what, (long long)n);
}

int dsv4_tp_check(const dsv4_config *c, int tp, dsv4_err *err) {
    if (tp < 1) return dsv4_err_set(err, DSV4_EINVAL, "--tensor-parallel-size %d must be at least 1", tp);
    if (tp == 1) return 0;
    int64_t Fs = (int64_t)c->n_shared_experts * c->moe_intermediate_size;
    int rc;
    if ((rc = need_div(c->num_attention_heads, tp, "num_attention_heads", err)) ||
        (rc = need_div(c->o_groups, tp, "o_groups", err)) ||
        (rc = need_div(c->moe_intermediate_size, tp, "moe_intermediate_size", err)) ||
        (rc = need_div(Fs, tp, "the shared expert width (n_shared_experts x moe_intermediate_size)", err)))
        return rc;
    int64_t Hl = c->num_attention_heads / tp, Gl = c->o_groups / tp;
    if ((rc = need_blocks(Hl * c->head_dim, tp, "attn.wq_b (heads x head_dim)", err)) ||
        (rc = need_blocks(Gl * c->o_lora_rank, tp, "attn.wo_a / attn.wo_b (o_groups x o_lora_rank)", err)) ||
        (rc = need_blocks(Fs / tp, tp, "the shared expert", err)))
        return rc;
    if ((c->moe_intermediate_size / tp) % 32)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "--tensor-parallel-size %d: the per-rank expert width %d is not a multiple of the FP4 "
                            "scale group (32)",
                            tp, c->moe_intermediate_size / tp);
    return 0;
}

static int own(dsv4_tp_shard *s, void *p, dsv4_err *err) {
    if (!p) return dsv4_err_set(err, DSV4_ENOMEM, "tensor parallel: out of memory");
    if (s->n_owned == s->cap_owned) {
        int nc = s->cap_owned ? 2 * s->cap_owned : 64;
        void **q = realloc(s->owned, sizeof(void *) * (size_t)nc);
        if (!q) {
            free(p);
            return dsv4_err_set(err, DSV4_ENOMEM, "tensor parallel: out of memory");
        }
        s->owned = q;
        s->cap_owned = nc;
    }
    s->owned[s->n_owned++] = p;
    return 0;
}

static int is_fp4(dsv4_dtype d) { return d == DSV4_DT_I8 || d == DSV4_DT_U8; }

static const char *nm(const dsv4_linear *l) { return l->w.name ? l->w.name : "linear"; }

/* A dummy tensor's slice: retag v (see banner). FP4 bytes keep 4-byte runs aligned (cuda_fill.cu). */
static int dummy_tag(dsv4_tp_shard *s, dsv4_tview *v, uint64_t off, int64_t cols, int64_t stride, dsv4_err *err) {
    if ((v->dtype == DSV4_DT_I8 || v->dtype == DSV4_DT_U8) && (off % 4 || cols % 4 || stride % 4))
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "tensor parallel: %s: dummy FP4 slice at byte %llu (%lld of %lld per row) is not 4-byte "
                            "aligned",
                            v->name ? v->name : "tensor", (unsigned long long)off, (long long)cols, (long long)stride);
    const void *t = dsv4_dummy_slice(s->dummy, v->data, off, cols, stride, err);
    if (!t) return err && err->code ? err->code : DSV4_EINTERNAL;
    v->data = t;
    return 0;
}

static int is_dummy(const dsv4_tp_shard *s, const dsv4_tview *v) {
    return s->dummy && dsv4_dummy_fill_for(s->dummy, v) != NULL;
}

/* Rows [o, o+n) of a linear, as views into the same bytes. */
static int slice_rows(dsv4_tp_shard *s, dsv4_linear *l, int64_t o, int64_t n, dsv4_err *err) {
    if (l->w.dtype == DSV4_DT_INVALID) return 0;
    if (o < 0 || n <= 0 || o + n > l->out || l->w.ndim != 2)
        return dsv4_err_set(err, DSV4_EINTERNAL, "tensor parallel: %s: rows [%lld,+%lld) of %lld", nm(l),
                            (long long)o, (long long)n, (long long)l->out);
    const uint8_t *w = l->w.data;
    size_t row_bytes = (size_t)l->w.shape[1] * dsv4_dtype_size(l->w.dtype);
    int dummy = is_dummy(s, &l->w), rc;
    if (l->w.dtype == DSV4_DT_F8_E4M3) {
        if (!(o % 128 == 0 || o / 128 == (o + n - 1) / 128))
            return dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: %s: rows [%lld,+%lld) split an FP8 scale block",
                                nm(l), (long long)o, (long long)n);
        size_t srow = (size_t)l->scale.shape[1] * dsv4_dtype_size(l->scale.dtype);
        if (dummy) {
            if ((rc = dummy_tag(s, &l->scale, (uint64_t)(o / 128) * (uint64_t)l->scale.shape[1], 0, 0, err))) return rc;
        } else {
            l->scale.data = (const uint8_t *)l->scale.data + (size_t)(o / 128) * srow;
        }
        l->scale.shape[0] = (n + 127) / 128;
        l->scale.nbytes = (size_t)l->scale.shape[0] * srow;
    } else if (is_fp4(l->w.dtype)) {
        size_t srow = (size_t)l->scale.shape[1] * dsv4_dtype_size(l->scale.dtype);
        if (dummy) {
            if ((rc = dummy_tag(s, &l->scale, (uint64_t)o * (uint64_t)l->scale.shape[1], 0, 0, err))) return rc;
        } else {
            l->scale.data = (const uint8_t *)l->scale.data + (size_t)o * srow;
        }
        l->scale.shape[0] = n;
        l->scale.nbytes = (size_t)n * srow;
    } else if (l->scale.dtype != DSV4_DT_INVALID) {
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "tensor parallel: %s: scaled %s weight", nm(l),
                            dsv4_dtype_name(l->w.dtype));
    }
    if (dummy) {
        if ((rc = dummy_tag(s, &l->w, (uint64_t)o * (uint64_t)l->w.shape[1], 0, 0, err))) return rc;
    } else {
        l->w.data = w + (size_t)o * row_bytes;
    }
    l->w.shape[0] = n;
    l->w.nbytes = (size_t)n * row_bytes;
    l->out = n;
    return 0;
}

/* Copy byte columns [c0, c0+nc) of a [rows][row_bytes] matrix. */
static void *copy_cols(const void *src, int64_t rows, size_t row_bytes, size_t c0, size_t nc) {
    size_t n = (size_t)rows * nc;
    uint8_t *d = malloc(n ? n : 1);
    if (!d) return NULL;
    for (int64_t r = 0; r < rows; r++) memcpy(d + (size_t)r * nc, (const uint8_t *)src + (size_t)r * row_bytes + c0, nc);
    return d;
}

/* Input columns [o, o+n) of a linear, as owned copies of weight and scale. */
static int slice_cols(dsv4_tp_shard *s, dsv4_linear *l, int64_t o, int64_t n, dsv4_err *err) {
    if (l->w.dtype == DSV4_DT_INVALID) return 0;
    if (o < 0 || n <= 0 || o + n > l->in || l->w.ndim != 2)
        return dsv4_err_set(err, DSV4_EINTERNAL, "tensor parallel: %s: columns [%lld,+%lld) of %lld", nm(l),
                            (long long)o, (long long)n, (long long)l->in);
    size_t we = dsv4_dtype_size(l->w.dtype), wrow = (size_t)l->w.shape[1] * we;
    size_t wc0, wnc, sc0 = 0, snc = 0;
    if (l->w.dtype == DSV4_DT_F8_E4M3) {
        if (!(o % 128 == 0 || o / 128 == (o + n - 1) / 128))
            return dsv4_err_set(err, DSV4_EINVAL,
                                "tensor parallel: %s: columns [%lld,+%lld) split an FP8 scale block", nm(l),
                                (long long)o, (long long)n);
        wc0 = (size_t)o;
        wnc = (size_t)n;
        sc0 = (size_t)(o / 128);
        snc = (size_t)((n + 127) / 128);
    } else if (is_fp4(l->w.dtype)) {
        if (o % 32 || n % 32)
            return dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: %s: columns [%lld,+%lld) split an FP4 scale group",
                                nm(l), (long long)o, (long long)n);
        wc0 = (size_t)o / 2;
        wnc = (size_t)n / 2;
        sc0 = (size_t)o / 32;
        snc = (size_t)n / 32;
    } else if (l->scale.dtype != DSV4_DT_INVALID) {
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "tensor parallel: %s: scaled %s weight", nm(l),
                            dsv4_dtype_name(l->w.dtype));
    } else {
        wc0 = (size_t)o * we;
        wnc = (size_t)n * we;
    }
    if (is_dummy(s, &l->w)) { /* a tag with a column map, no copy (banner) */
        int rc = dummy_tag(s, &l->w, wc0 / we, (int64_t)(wnc / we), l->w.shape[1], err);
        if (!rc && snc) rc = dummy_tag(s, &l->scale, sc0, (int64_t)snc, l->scale.shape[1], err);
        if (rc) return rc;
        if (snc) {
            l->scale.shape[1] = (int64_t)snc;
            l->scale.nbytes = (size_t)l->scale.shape[0] * snc * dsv4_dtype_size(l->scale.dtype);
        }
        l->w.shape[1] = (int64_t)(wnc / we);
        l->w.nbytes = (size_t)l->w.shape[0] * wnc;
        l->in = n;
        return 0;
    }
    void *wd = copy_cols(l->w.data, l->w.shape[0], wrow, wc0, wnc);
    int rc = own(s, wd, err);
    if (rc) return rc;
    if (snc) {
        size_t se = dsv4_dtype_size(l->scale.dtype), srow = (size_t)l->scale.shape[1] * se;
        void *sd = copy_cols(l->scale.data, l->scale.shape[0], srow, sc0 * se, snc * se);
        if ((rc = own(s, sd, err))) return rc;
        l->scale.data = sd;
        l->scale.shape[1] = (int64_t)snc;
        l->scale.nbytes = (size_t)l->scale.shape[0] * snc * se;
    }
    l->w.data = wd;
    l->w.shape[1] = (int64_t)(wnc / we);
    l->w.nbytes = (size_t)l->w.shape[0] * wnc;
    l->in = n;
    return 0;
}

static int shard_block(dsv4_tp_shard *s, const dsv4_config *c, dsv4_block_w *b, dsv4_expert_w *ex,
                       dsv4_err *err) {
    int r = s->rank, N = s->size, rc;
    int64_t Hl = c->num_attention_heads / N, hd = c->head_dim, GR = (int64_t)(c->o_groups / N) * c->o_lora_rank;
    dsv4_attn_w *a = &b->attn;
    if ((rc = slice_rows(s, &a->wq_b, r * Hl * hd, Hl * hd, err)) || (rc = slice_rows(s, &a->wo_a, r * GR, GR, err)) ||
        (rc = slice_cols(s, &a->wo_b, r * GR, GR, err)))
        return rc;
    if (a->sink.dtype != DSV4_DT_INVALID) {
        size_t e = dsv4_dtype_size(a->sink.dtype);
        if (is_dummy(s, &a->sink)) {
            if ((rc = dummy_tag(s, &a->sink, (uint64_t)(r * Hl), 0, 0, err))) return rc;
        } else {
            a->sink.data = (const uint8_t *)a->sink.data + (size_t)(r * Hl) * e;
        }
        a->sink.shape[0] = Hl;
        a->sink.nbytes = (size_t)Hl * e;
    }
    dsv4_ffn_w *f = &b->ffn;
    int64_t Fs = f->shared.w1.out / N;
    if (f->shared.w1.out % N)
        return dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: %s: %lld rows over %d ranks", nm(&f->shared.w1),
                            (long long)f->shared.w1.out, N);
    if ((rc = slice_rows(s, &f->shared.w1, r * Fs, Fs, err)) || (rc = slice_rows(s, &f->shared.w3, r * Fs, Fs, err)) ||
        (rc = slice_cols(s, &f->shared.w2, r * Fs, Fs, err)))
        return rc;
    for (int e = 0; e < f->n_experts; e++) {
        ex[e] = f->experts[e];
        int64_t Fe = ex[e].w1.out / N;
        if (ex[e].w1.out % N)
            return dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: %s: %lld rows over %d ranks", nm(&ex[e].w1),
                                (long long)ex[e].w1.out, N);
        if ((rc = slice_rows(s, &ex[e].w1, r * Fe, Fe, err)) || (rc = slice_rows(s, &ex[e].w3, r * Fe, Fe, err)) ||
            (rc = slice_cols(s, &ex[e].w2, r * Fe, Fe, err)))
            return rc;
    }
    f->experts = ex;
    return 0;
}

void dsv4_tp_shard_free(dsv4_tp_shard *s) {
    if (!s) return;
    for (int i = 0; i < s->n_owned; i++) free(s->owned[i]);
    free(s->owned);
    free(s->layers);
    free(s->experts);
    free(s);
}

int dsv4_tp_shard_create(const dsv4_config *cfg, const dsv4_weights *w, int rank, int size,
                         dsv4_tp_shard **out, dsv4_err *err) {
    return dsv4_tp_shard_create_ex(cfg, w, rank, size, NULL, out, err);
}

int dsv4_tp_shard_create_ex(const dsv4_config *cfg, const dsv4_weights *w, int rank, int size,
                            struct dsv4_dummy *dummy, dsv4_tp_shard **out, dsv4_err *err) {
    *out = NULL;
    int rc = dsv4_tp_check(cfg, size, err);
    if (rc) return rc;
    if (rank < 0 || rank >= size)
        return dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: rank %d outside [0,%d)", rank, size);
    dsv4_tp_shard *s = calloc(1, sizeof *s);
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "tensor parallel: out of memory");
    s->rank = rank;
    s->size = size;
    s->dummy = dummy;
    s->cfg = *cfg;
    s->cfg.num_attention_heads /= size;
    s->cfg.o_groups /= size;
    s->cfg.moe_intermediate_size /= size;
    s->w = *w;
    size_t n_ex = 0;
    for (int l = 0; l < w->n_layers; l++) n_ex += (size_t)w->layers[l].ffn.n_experts;
    s->layers = calloc((size_t)(w->n_layers > 0 ? w->n_layers : 1), sizeof *s->layers);
    s->experts = calloc(n_ex ? n_ex : 1, sizeof *s->experts);
    if (!s->layers || !s->experts) {
        dsv4_tp_shard_free(s);
        return dsv4_err_set(err, DSV4_ENOMEM, "tensor parallel: out of memory");
    }
    size_t at = 0;
    for (int l = 0; l < w->n_layers && !rc; l++) {
        s->layers[l] = w->layers[l];
        rc = shard_block(s, cfg, &s->layers[l], s->experts + at, err);
        at += (size_t)w->layers[l].ffn.n_experts;
        if (rc) dsv4_err_prefix(err, "layer %d: ", l);
    }
    if (rc) {
        dsv4_tp_shard_free(s);
        return rc;
    }
    s->w.layers = s->layers;
    /* vocabulary-parallel LM head when the vocabulary divides (129280 = 2^7 * 1010) */
    if (w->head.out % size == 0 && w->head.w.dtype != DSV4_DT_INVALID) {
        int64_t Vl = w->head.out / size;
        if ((rc = slice_rows(s, &s->w.head, rank * Vl, Vl, err))) {
            dsv4_tp_shard_free(s);
            return dsv4_err_prefix(err, "LM head: ");
        }
        s->head_split = 1;
    }
    *out = s;
    return 0;
}
