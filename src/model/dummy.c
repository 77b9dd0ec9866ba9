/*
 * Dummy weights (model/dummy.h): the tensor inventory of a config, the
 * file-less checkpoint over it, the fill chosen for each tensor, and the
 * backend wrapper that fills instead of uploading.
 *
 * The inventory mirrors the binder (weights.c) name by name; the binder
 * then checks it on every dummy load, so the two cannot drift silently.
 * Dtypes follow a real checkpoint of the config (MODEL.md §2.2 "Flash
 * values", DSPARK.md §3.1): quantised q8 linears FP8 + 128x128 E8M0 scale
 * (BF16 for a dequantised config), routed experts FP4 when expert_dtype is
 * "fp4" (else like q8), norms BF16, hc_* / attn_sink / ape / gate.bias F32,
 * tid2eid I64.
 */
#include "model/dummy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/dummy_fill.h"

typedef struct entry {
    dsv4_tview v;
    dsv4_fill fill;
} entry;

struct dsv4_dummy {
    entry *e;
    size_t n, cap;
    char *tags;              /* [cap]: view i of the inventory has data = tags + i */
    void **host;             /* host buffers with real values (tid2eid) */
    size_t n_host;
    dsv4_ckpt *ck;
    uint64_t seed;
    uint64_t made_n, made_bytes;
    int oom;
    /* slices (dsv4_dummy_slice): tag sub_tags + j fills per sub_fill[j]; at most n */
    char *sub_tags;
    dsv4_fill *sub_fill;
    size_t n_sub;
};

/* ---- fills ---------------------------------------------------------------- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* E[q^2] of the E4M3 codes 0..hi (random sign): the decoded magnitudes of
 * spec/MODEL.md §2.3 (subnormal m·2^-9 for exponent field 0). */
static double e4m3_msq(int hi) {
    double s = 0;
    for (int c = 0; c <= hi; c++) {
        int e = c >> 3, m = c & 7;
        double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
        s += v * v;
    }
    return s / (hi + 1);
}

/* E[q^2] of a uniform E2M1 nibble (values 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives). */
static double fp4_msq(void) {
    static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    double s = 0;
    for (int i = 0; i < 8; i++) s += v[i] * v[i];
    return s / 8;
}

#define E4M3_HI 0x38 /* magnitude codes up to 1.0 */

/* E8M0 byte of the power-of-two scale that brings codes of mean square msq
 * to std 1/sqrt(in): the nearest 2^k in log scale, so within sqrt(2). */
static int scale_byte(double msq, int64_t in) {
    double k = floor(log2(1.0 / sqrt((double)in * msq)) + 0.5);
    int b = 127 + (int)k;
    return b < 1 ? 1 : b > 254 ? 254 : b;
}

static dsv4_fill uniform(uint64_t seed, double center, double half) {
    dsv4_fill f = {.kind = DSV4_FILL_UNIFORM, .seed = seed, .center = center, .half = half};
    return f;
}

/* ---- the inventory ------------------------------------------------------- */

static entry *add(dsv4_dummy *d, const char *name, dsv4_dtype dt, int nd, int64_t d0, int64_t d1) {
    if (d->oom) return NULL;
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 1024;
        entry *ne = realloc(d->e, cap * sizeof *ne);
        if (!ne) {
            d->oom = 1;
            return NULL;
        }
        d->e = ne;
        d->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm) {
        d->oom = 1;
        return NULL;
    }
    entry *e = &d->e[d->n++];
    memset(e, 0, sizeof *e);
    e->v.name = nm;
    e->v.dtype = dt;
    e->v.ndim = nd;
    e->v.shape[0] = d0;
    if (nd > 1) e->v.shape[1] = d1;
    e->v.nbytes = (size_t)(d0 * (nd > 1 ? d1 : 1)) * dsv4_dtype_size(dt);
    e->fill.seed = dsv4_fill_hash(d->seed, name_hash(name));
    return e;
}

/* A non-linear tensor with a uniform fill. */
static void plain(dsv4_dummy *d, const char *name, dsv4_dtype dt, int nd, int64_t d0, int64_t d1, double center,
                  double half) {
    entry *e = add(d, name, dt, nd, d0, d1);
    if (e) e->fill = uniform(e->fill.seed, center, half);
}

static void norm(dsv4_dummy *d, const char *name, int64_t n) { plain(d, name, DSV4_DT_BF16, 1, n, 0, 1.0, 0.05); }

typedef enum { Q8, EXPERT, DENSE } lkind;

/* "<base>.weight" (+ "<base>.scale") of logical [out, in]. */
static void lin(dsv4_dummy *d, const dsv4_config *c, const char *base, int64_t out, int64_t in, lkind k) {
    char wn[512], sn[512];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(sn, sizeof sn, "%s.scale", base);
    int fp4 = k == EXPERT && c->experts_fp4, fp8 = k != DENSE && !fp4 && c->quantized;
    if (fp4) {
        entry *w = add(d, wn, DSV4_DT_I8, 2, out, in / 2);
        if (w) w->fill.kind = DSV4_FILL_BYTES;
        entry *s = add(d, sn, DSV4_DT_F8_E8M0, 2, out, in / 32);
        if (s) s->fill.kind = DSV4_FILL_E8M0, s->fill.lo = s->fill.hi = scale_byte(fp4_msq(), in);
    } else if (fp8) {
        entry *w = add(d, wn, DSV4_DT_F8_E4M3, 2, out, in);
        if (w) w->fill.kind = DSV4_FILL_E4M3, w->fill.hi = E4M3_HI;
        entry *s = add(d, sn, DSV4_DT_F8_E8M0, 2, (out + 127) / 128, (in + 127) / 128);
        if (s) s->fill.kind = DSV4_FILL_E8M0, s->fill.lo = s->fill.hi = scale_byte(e4m3_msq(E4M3_HI), in);
    } else {
        plain(d, wn, DSV4_DT_BF16, 2, out, in, 0.0, sqrt(3.0 / (double)in));
    }
}

static void hc(dsv4_dummy *d, const dsv4_config *c, const char *p, const char *kind, int64_t rows, int64_t nscale) {
    char n[512];
    int64_t hcd = (int64_t)c->hc_mult * c->hidden_size;
    snprintf(n, sizeof n, "%shc_%s_fn", p, kind);
    plain(d, n, DSV4_DT_F32, 2, rows, hcd, 0.0, sqrt(3.0 / (double)hcd));
    snprintf(n, sizeof n, "%shc_%s_base", p, kind);
    plain(d, n, DSV4_DT_F32, 1, rows, 0, 0.0, 0.5);
    snprintf(n, sizeof n, "%shc_%s_scale", p, kind);
    plain(d, n, DSV4_DT_F32, 1, nscale, 0, 0.5, 0.25);
}

static void compressor(dsv4_dummy *d, const dsv4_config *c, const char *p, int ratio, int64_t w) {
    int64_t coff = ratio == 4 ? 2 : 1;
    char n[512];
    snprintf(n, sizeof n, "%sape", p);
    plain(d, n, DSV4_DT_F32, 2, ratio, coff * w, 0.0, 0.5);
    snprintf(n, sizeof n, "%swkv", p);
    lin(d, c, n, coff * w, c->hidden_size, DENSE);
    snprintf(n, sizeof n, "%swgate", p);
    lin(d, c, n, coff * w, c->hidden_size, DENSE);
    snprintf(n, sizeof n, "%snorm.weight", p);
    norm(d, n, w);
}

/* tid2eid: real values on the host (the binder range-checks them). */
static void tid2eid(dsv4_dummy *d, const dsv4_config *c, const char *name) {
    entry *e = add(d, name, DSV4_DT_I64, 2, c->vocab_size, c->num_experts_per_tok);
    if (!e) return;
    e->fill.kind = DSV4_FILL_INDEX;
    e->fill.hi = c->n_routed_experts;
    void **nh = realloc(d->host, (d->n_host + 1) * sizeof *nh);
    int64_t *t = malloc(e->v.nbytes);
    if (!nh || !t) {
        if (nh) d->host = nh;
        free(t);
        d->oom = 1;
        return;
    }
    d->host = nh;
    d->host[d->n_host++] = t;
    int64_t n = (int64_t)c->vocab_size * c->num_experts_per_tok;
    for (int64_t i = 0; i < n; i++) t[i] = dsv4_fill_index(&e->fill, (uint64_t)i, c->num_experts_per_tok);
    e->v.data = t;
}

/* One decoder block under prefix p (weights.c block()). */
static void block(dsv4_dummy *d, const dsv4_config *c, const char *p, int layer) {
    int64_t dm = c->hidden_size, nh = c->num_attention_heads, hd = c->head_dim, ql = c->q_lora_rank;
    int64_t og = c->o_groups, ol = c->o_lora_rank, mix = (int64_t)(2 + c->hc_mult) * c->hc_mult;
    int64_t ne = c->n_routed_experts, inter = c->moe_intermediate_size, sh = (int64_t)c->n_shared_experts * inter;
    int ratio = dsv4_config_layer_ratio(c, layer);
    char n[512];
    snprintf(n, sizeof n, "%sattn_norm.weight", p);
    norm(d, n, dm);
    snprintf(n, sizeof n, "%sffn_norm.weight", p);
    norm(d, n, dm);
    hc(d, c, p, "attn", mix, 3);
    hc(d, c, p, "ffn", mix, 3);
    snprintf(n, sizeof n, "%sattn.attn_sink", p);
    plain(d, n, DSV4_DT_F32, 1, nh, 0, 0.0, 1.0);
    snprintf(n, sizeof n, "%sattn.wq_a", p);
    lin(d, c, n, ql, dm, Q8);
    snprintf(n, sizeof n, "%sattn.q_norm.weight", p);
    norm(d, n, ql);
    snprintf(n, sizeof n, "%sattn.wq_b", p);
    lin(d, c, n, nh * hd, ql, Q8);
    snprintf(n, sizeof n, "%sattn.wkv", p);
    lin(d, c, n, hd, dm, Q8);
    snprintf(n, sizeof n, "%sattn.kv_norm.weight", p);
    norm(d, n, hd);
    snprintf(n, sizeof n, "%sattn.wo_a", p);
    lin(d, c, n, og * ol, nh * hd / og, Q8);
    snprintf(n, sizeof n, "%sattn.wo_b", p);
    lin(d, c, n, dm, og * ol, Q8);
    if (ratio > 0) {
        snprintf(n, sizeof n, "%sattn.compressor.", p);
        compressor(d, c, n, ratio, hd);
    }
    if (ratio == 4) {
        int64_t ih = c->index_n_heads, ihd = c->index_head_dim;
        snprintf(n, sizeof n, "%sattn.indexer.wq_b", p);
        lin(d, c, n, ih * ihd, ql, Q8);
        snprintf(n, sizeof n, "%sattn.indexer.weights_proj", p);
        lin(d, c, n, ih, dm, DENSE);
        snprintf(n, sizeof n, "%sattn.indexer.compressor.", p);
        compressor(d, c, n, 4, ihd);
    }
    snprintf(n, sizeof n, "%sffn.gate", p);
    lin(d, c, n, ne, dm, DENSE);
    if (dsv4_config_layer_is_hash(c, layer)) {
        snprintf(n, sizeof n, "%sffn.gate.tid2eid", p);
        tid2eid(d, c, n);
    } else {
        snprintf(n, sizeof n, "%sffn.gate.bias", p);
        plain(d, n, DSV4_DT_F32, 1, ne, 0, 0.0, 0.01);
    }
    for (int64_t e = 0; e < ne; e++) {
        snprintf(n, sizeof n, "%sffn.experts.%lld.w1", p, (long long)e);
        lin(d, c, n, inter, dm, EXPERT);
        snprintf(n, sizeof n, "%sffn.experts.%lld.w3", p, (long long)e);
        lin(d, c, n, inter, dm, EXPERT);
        snprintf(n, sizeof n, "%sffn.experts.%lld.w2", p, (long long)e);
        lin(d, c, n, dm, inter, EXPERT);
    }
    if (sh > 0) {
        snprintf(n, sizeof n, "%sffn.shared_experts.w1", p);
        lin(d, c, n, sh, dm, Q8);
        snprintf(n, sizeof n, "%sffn.shared_experts.w3", p);
        lin(d, c, n, sh, dm, Q8);
        snprintf(n, sizeof n, "%sffn.shared_experts.w2", p);
        lin(d, c, n, dm, sh, Q8);
    }
}

static void inventory(dsv4_dummy *d, const dsv4_config *c, int stages, int dspark) {
    int64_t dm = c->hidden_size, V = c->vocab_size;
    int L = c->num_hidden_layers;
    char p[64], n[128];
    plain(d, "embed.weight", DSV4_DT_BF16, 2, V, dm, 0.0, 1.0);
    lin(d, c, "head", V, dm, DENSE);
    norm(d, "norm.weight", dm);
    hc(d, c, "", "head", c->hc_mult, 1);
    for (int l = 0; l < L; l++) {
        snprintf(p, sizeof p, "layers.%d.", l);
        block(d, c, p, l);
    }
    for (int s = 0; s < stages; s++) {
        snprintf(p, sizeof p, "mtp.%d.", s);
        block(d, c, p, L + s);
        if (!dspark) { /* original Flash MTP block (MODEL.md §2.2) */
            snprintf(n, sizeof n, "%se_proj", p);
            lin(d, c, n, dm, dm, Q8);
            snprintf(n, sizeof n, "%sh_proj", p);
            lin(d, c, n, dm, dm, Q8);
            const char *nn[3] = {"enorm", "hnorm", "norm"};
            for (int k = 0; k < 3; k++) {
                snprintf(n, sizeof n, "%s%s.weight", p, nn[k]);
                norm(d, n, dm);
            }
            hc(d, c, p, "head", c->hc_mult, 1);
            continue;
        }
        if (s == 0) { /* DSPARK.md §3.1 stage-0 extras */
            snprintf(n, sizeof n, "%smain_proj", p);
            lin(d, c, n, dm, dm * c->n_dspark_target_layer_ids, Q8);
            snprintf(n, sizeof n, "%smain_norm.weight", p);
            norm(d, n, dm);
        }
        if (s == stages - 1) { /* last-stage head */
            int64_t rank = c->dspark_markov_rank;
            snprintf(n, sizeof n, "%snorm.weight", p);
            norm(d, n, dm);
            hc(d, c, p, "head", c->hc_mult, 1);
            snprintf(n, sizeof n, "%smarkov_head.markov_w1", p);
            lin(d, c, n, V, rank, DENSE);
            snprintf(n, sizeof n, "%smarkov_head.markov_w2", p);
            lin(d, c, n, V, rank, DENSE);
            snprintf(n, sizeof n, "%sconfidence_head.proj", p);
            lin(d, c, n, 1, dm + rank, DENSE);
        }
    }
}

void dsv4_dummy_free(dsv4_dummy *d) {
    if (!d) return;
    dsv4_ckpt_free(d->ck);
    for (size_t i = 0; i < d->n; i++) free((char *)d->e[i].v.name);
    free(d->e);
    free(d->tags);
    free(d->sub_tags);
    free(d->sub_fill);
    for (size_t i = 0; i < d->n_host; i++) free(d->host[i]);
    free(d->host);
    free(d);
}

int dsv4_dummy_create(dsv4_config *cfg, uint64_t seed, dsv4_dummy **out, dsv4_err *err) {
    *out = NULL;
    int L = cfg->num_hidden_layers, dspark = cfg->has_dspark;
    int stages = dspark ? cfg->n_compress_ratios - L : cfg->num_nextn_predict_layers;
    if (dspark && stages < 1)
        return dsv4_err_set(err, DSV4_EFORMAT,
                            "config.json: dspark_* keys but compress_ratios has %d entries for %d layers: no draft "
                            "stage entries (DSPARK.md §2.1: stages = len(compress_ratios) - num_hidden_layers)",
                            cfg->n_compress_ratios, L);
    if (stages > DSV4_MAX_LAYERS - L)
        return dsv4_err_set(err, DSV4_EFORMAT, "config.json: %d draft stages after %d layers is too many", stages, L);
    dsv4_dummy *d = calloc(1, sizeof *d);
    if (!d) return dsv4_err_set(err, DSV4_ENOMEM, "dummy weights: out of memory");
    d->seed = seed;
    inventory(d, cfg, stages, dspark);
    if (!d->oom && !(d->tags = malloc(d->n ? d->n : 1))) d->oom = 1;
    dsv4_tview *views = d->oom ? NULL : malloc((d->n ? d->n : 1) * sizeof *views);
    int rc = d->oom || !views ? dsv4_err_set(err, DSV4_ENOMEM, "dummy weights: out of memory") : DSV4_OK;
    for (size_t i = 0; i < d->n && !rc; i++) {
        if (!d->e[i].v.data) d->e[i].v.data = d->tags + i;
        views[i] = d->e[i].v;
    }
    if (!rc) rc = dsv4_ckpt_from_views("dummy weights", views, d->n, &d->ck, err);
    free(views);
    if (!rc) rc = dsv4_config_set_drafts(cfg, d->ck, err);
    if (rc) {
        dsv4_dummy_free(d);
        return rc;
    }
    *out = d;
    return DSV4_OK;
}

const dsv4_ckpt *dsv4_dummy_ckpt(const dsv4_dummy *d) { return d ? d->ck : NULL; }

const dsv4_fill *dsv4_dummy_fill_for(const dsv4_dummy *d, const dsv4_tview *v) {
    if (!d || !v || !v->data) return NULL;
    const char *p = v->data;
    if (d->sub_tags && p >= d->sub_tags && p < d->sub_tags + d->n_sub) return &d->sub_fill[p - d->sub_tags];
    if (p < d->tags || p >= d->tags + d->n) return NULL;
    return &d->e[p - d->tags].fill;
}

const void *dsv4_dummy_slice(dsv4_dummy *d, const void *tag, uint64_t off, int64_t cols, int64_t stride,
                             dsv4_err *err) {
    dsv4_tview v = {.data = tag};
    const dsv4_fill *f = dsv4_dummy_fill_for(d, &v);
    if (!f) {
        dsv4_err_set(err, DSV4_EINTERNAL, "dummy weights: slicing a view that is not a dummy tensor");
        return NULL;
    }
    if (f->map_off || f->map_cols) {
        dsv4_err_set(err, DSV4_EINTERNAL, "dummy weights: a slice of a slice");
        return NULL;
    }
    if (!d->sub_tags) {
        d->sub_tags = malloc(d->n ? d->n : 1);
        d->sub_fill = calloc(d->n ? d->n : 1, sizeof *d->sub_fill);
        if (!d->sub_tags || !d->sub_fill) {
            free(d->sub_tags);
            free(d->sub_fill);
            d->sub_tags = NULL;
            d->sub_fill = NULL;
            dsv4_err_set(err, DSV4_ENOMEM, "dummy weights: out of memory");
            return NULL;
        }
    }
    if (d->n_sub == d->n) {
        dsv4_err_set(err, DSV4_EINTERNAL, "dummy weights: more slices than tensors");
        return NULL;
    }
    dsv4_fill *g = &d->sub_fill[d->n_sub];
    *g = *f;
    g->map_off = off;
    g->map_cols = cols;
    g->map_stride = stride;
    return d->sub_tags + d->n_sub++;
}

void dsv4_dummy_stats(const dsv4_dummy *d, uint64_t *n_tensors, uint64_t *n_bytes) {
    if (n_tensors) *n_tensors = d ? d->made_n : 0;
    if (n_bytes) *n_bytes = d ? d->made_bytes : 0;
}

/* ---- the backend wrapper -------------------------------------------------- */

typedef struct wrap {
    dsv4_backend be; /* first: the wrapper is used as a dsv4_backend */
    dsv4_backend *real;
    dsv4_dummy *d;
} wrap;

static wrap *wr(dsv4_backend *be) { return (wrap *)be; }

static void count(dsv4_dummy *d, const dsv4_tview *v) {
    if (v->dtype == DSV4_DT_INVALID) return;
    d->made_n++;
    d->made_bytes += v->nbytes;
}

static int w_upload(dsv4_backend *be, const dsv4_tview *host, dsv4_tview *dev, dsv4_err *err) {
    wrap *w = wr(be);
    const dsv4_fill *f = dsv4_dummy_fill_for(w->d, host);
    int rc;
    if (f) {
        *dev = *host;
        dev->data = NULL;
        rc = w->real->fill_dummy(w->real, f, dev, err);
    } else {
        rc = w->real->upload(w->real, host, dev, err);
    }
    if (!rc && (f || (host->name && dsv4_ckpt_find(w->d->ck, host->name)))) count(w->d, host); /* tid2eid */
    return rc;
}

static int w_upload_linear(dsv4_backend *be, const dsv4_linear *host, dsv4_linear *dev, dsv4_err *err) {
    wrap *w = wr(be);
    const dsv4_fill *fw = dsv4_dummy_fill_for(w->d, &host->w), *fs = dsv4_dummy_fill_for(w->d, &host->scale);
    if (!fw) return w->real->upload_linear(w->real, host, dev, err);
    *dev = *host;
    dev->w.data = NULL;
    dev->scale.data = NULL;
    int rc = w->real->fill_dummy_linear(w->real, fw, fs, dev, err);
    if (!rc) {
        count(w->d, &host->w);
        if (fs) count(w->d, &host->scale);
    }
    return rc;
}

static int w_fill(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err) {
    return wr(be)->real->fill_dummy(wr(be)->real, how, dev, err);
}

static int w_fill_linear(dsv4_backend *be, const dsv4_fill *wf, const dsv4_fill *sf, dsv4_linear *dev,
                         dsv4_err *err) {
    return wr(be)->real->fill_dummy_linear(wr(be)->real, wf, sf, dev, err);
}

static void w_free(dsv4_backend *be) {
    if (!be) return;
    wrap *w = wr(be);
    if (w->real) w->real->free(w->real);
    free(w);
}

dsv4_backend *dsv4_dummy_backend(dsv4_dummy *d, dsv4_backend *real, dsv4_err *err) {
    if (!real) return NULL;
    if (!real->fill_dummy || (real->upload_linear && !real->fill_dummy_linear)) {
        dsv4_err_set(err, DSV4_EUNSUPPORTED, "--load-format dummy: the %s backend cannot make dummy weights",
                     real->name ? real->name : "?");
        real->free(real);
        return NULL;
    }
    wrap *w = calloc(1, sizeof *w);
    if (!w) {
        dsv4_err_set(err, DSV4_ENOMEM, "dummy weights: out of memory");
        real->free(real);
        return NULL;
    }
    /* Every op and the private ctx are the real backend's: the wrapper is
     * the same backend to every op, only uploads of d's views differ. */
    w->be = *real;
    w->real = real;
    w->d = d;
    w->be.free = w_free;
    w->be.upload = w_upload;
    w->be.upload_linear = real->upload_linear ? w_upload_linear : NULL;
    w->be.fill_dummy = w_fill;
    w->be.fill_dummy_linear = real->fill_dummy_linear ? w_fill_linear : NULL;
    return &w->be;
}
