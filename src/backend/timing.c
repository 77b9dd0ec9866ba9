/* A backend that times another backend's ops (src/backend/timing.h). */
#include "backend/timing.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    OP_EMBED, OP_ADD, OP_RMSNORM, OP_ROPE, OP_QAT_FP8, OP_QAT_HAD, OP_LINEAR, OP_LINEAR_GROUPED,
    OP_HC_PRE, OP_HC_POST, OP_HC_HEAD, OP_WIN_STORE, OP_COMPRESS, OP_INDEXER, OP_ATTENTION,
    OP_MOE_ROUTE, OP_MOE_EXPERTS, OP_SWIGLU, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
    "embed", "add", "rmsnorm", "rope", "qat_fp8", "qat_hadamard_fp4", "linear", "linear_grouped",
    "hc_pre", "hc_post", "hc_head", "win_store", "compress", "indexer_select", "attention",
    "moe_route", "moe_experts", "swiglu"};

typedef struct timed_ctx {
    dsv4_backend *inner;
    int sync_each;
    long calls[OP_COUNT];
    double sec[OP_COUNT];
} timed_ctx;

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Forward op `name` to the inner backend and charge its wall time to `op`. */
#define TIMED(op, name, ...)                                                   \
    do {                                                                       \
        timed_ctx *c = be->ctx;                                                \
        c->inner->numerics = be->numerics;                                     \
        double t0 = now_sec();                                                 \
        int rc = c->inner->name(c->inner, __VA_ARGS__);                        \
        if (c->sync_each && !rc) rc = c->inner->sync(c->inner, err);           \
        c->sec[op] += now_sec() - t0;                                          \
        c->calls[op]++;                                                        \
        return rc;                                                             \
    } while (0)
#define INNER(be) (((timed_ctx *)(be)->ctx)->inner)

static void t_free(dsv4_backend *be) {
    if (be) free(be->ctx);
    free(be);
}
static int t_buf_alloc(dsv4_backend *be, dsv4_dtype dt, int64_t r, int64_t c, dsv4_buf *o, dsv4_err *err) {
    return INNER(be)->buf_alloc(INNER(be), dt, r, c, o, err);
}
static void t_buf_free(dsv4_backend *be, dsv4_buf *b) { INNER(be)->buf_free(INNER(be), b); }
static int t_buf_write(dsv4_backend *be, dsv4_buf *d, const void *h, dsv4_err *err) {
    return INNER(be)->buf_write(INNER(be), d, h, err);
}
static int t_buf_read(dsv4_backend *be, const dsv4_buf *s, void *h, dsv4_err *err) {
    return INNER(be)->buf_read(INNER(be), s, h, err);
}
static int t_gather(dsv4_backend *be, const dsv4_buf *s, const int32_t *i, int n, dsv4_buf *d, dsv4_err *err) {
    return INNER(be)->buf_gather_rows(INNER(be), s, i, n, d, err);
}
static int t_upload(dsv4_backend *be, const dsv4_tview *h, dsv4_tview *d, dsv4_err *err) {
    return INNER(be)->upload(INNER(be), h, d, err);
}
static int t_upload_linear(dsv4_backend *be, const dsv4_linear *h, dsv4_linear *d, dsv4_err *err) {
    return INNER(be)->upload_linear(INNER(be), h, d, err);
}
static int t_batch_begin(dsv4_backend *be, const dsv4_batch *b, dsv4_err *err) {
    return INNER(be)->batch_begin(INNER(be), b, err);
}
static int t_sync(dsv4_backend *be, dsv4_err *err) { return INNER(be)->sync(INNER(be), err); }

static int t_embed(dsv4_backend *be, const dsv4_tview *t, const dsv4_batch *b, int n, dsv4_buf *o, dsv4_err *err) {
    TIMED(OP_EMBED, embed, t, b, n, o, err);
}
static int t_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err) {
    TIMED(OP_ADD, add, a, b, y, err);
}
static int t_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *w, int g, float eps, dsv4_buf *y,
                     dsv4_err *err) {
    TIMED(OP_RMSNORM, rmsnorm, x, w, g, eps, y, err);
}
static int t_rope(dsv4_backend *be, dsv4_buf *x, int hd, const dsv4_rope *r, const dsv4_batch *b, int inv,
                  dsv4_err *err) {
    TIMED(OP_ROPE, rope, x, hd, r, b, inv, err);
}
static int t_qat_fp8(dsv4_backend *be, dsv4_buf *x, int hd, int nq, int blk, dsv4_err *err) {
    TIMED(OP_QAT_FP8, qat_fp8, x, hd, nq, blk, err);
}
static int t_qat_had(dsv4_backend *be, dsv4_buf *x, int hd, dsv4_err *err) {
    TIMED(OP_QAT_HAD, qat_hadamard_fp4, x, hd, err);
}
static int t_linear(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y, dsv4_err *err) {
    TIMED(OP_LINEAR, linear, x, w, y, err);
}
static int t_linear_grouped(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, int g, dsv4_buf *y,
                            dsv4_err *err) {
    TIMED(OP_LINEAR_GROUPED, linear_grouped, x, w, g, y, err);
}
static int t_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                    const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y, dsv4_buf *post,
                    dsv4_buf *comb, dsv4_err *err) {
    TIMED(OP_HC_PRE, hc_pre, X, fn, base, scale, n_hc, iters, eps, y, post, comb, err);
}
static int t_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                     const dsv4_buf *comb, int n_hc, dsv4_buf *Xo, dsv4_err *err) {
    TIMED(OP_HC_POST, hc_post, X, f, post, comb, n_hc, Xo, err);
}
static int t_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                     const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err) {
    TIMED(OP_HC_HEAD, hc_head, X, fn, base, scale, n_hc, eps, y, err);
}
static int t_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                       dsv4_err *err) {
    TIMED(OP_WIN_STORE, win_store, ws, kv, b, err);
}
static int t_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                      const dsv4_tview *ape, const dsv4_tview *nw, float eps, const dsv4_rope *r, dsv4_qat q,
                      const dsv4_batch *b, dsv4_err *err) {
    TIMED(OP_COMPRESS, compress, cs, K, Z, ape, nw, eps, r, q, b, err);
}
static int t_indexer(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float gs, const dsv4_cmp_state *idx,
                     int topk, const dsv4_batch *b, dsv4_buf *sel, dsv4_err *err) {
    TIMED(OP_INDEXER, indexer_select, qi, g, gs, idx, topk, b, sel, err);
}
static int t_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                       const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int nh,
                       const dsv4_batch *b, dsv4_buf *o, dsv4_err *err) {
    TIMED(OP_ATTENTION, attention, q, kv, ws, cs, sel, sinks, nh, b, o, err);
}
static int t_moe_route(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *gate, const dsv4_tview *bias,
                       const dsv4_tview *t2e, int k, float rs, const dsv4_batch *b, dsv4_buf *ids, dsv4_buf *w,
                       dsv4_err *err) {
    TIMED(OP_MOE_ROUTE, moe_route, x, gate, bias, t2e, k, rs, b, ids, w, err);
}
static int t_moe_experts(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1, const dsv4_linear *w3,
                         const dsv4_linear *w2, int n, const dsv4_buf *ids, const dsv4_buf *w, float lim,
                         dsv4_buf *y, dsv4_err *err) {
    TIMED(OP_MOE_EXPERTS, moe_experts, x, w1, w3, w2, n, ids, w, lim, y, err);
}
static int t_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float lim, dsv4_buf *h, dsv4_err *err) {
    TIMED(OP_SWIGLU, swiglu, g, u, lim, h, err);
}

/* Load-time work (dummy-weight fills, expert sets): forwarded, not timed. */
static int t_experts_ready(dsv4_backend *be, const dsv4_linear *w1, const dsv4_linear *w3, const dsv4_linear *w2,
                           int n, dsv4_err *err) {
    return INNER(be)->experts_ready(INNER(be), w1, w3, w2, n, err);
}
static int t_fill(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err) {
    return INNER(be)->fill_dummy(INNER(be), how, dev, err);
}
static int t_fill_linear(dsv4_backend *be, const dsv4_fill *wf, const dsv4_fill *sf, dsv4_linear *dev,
                         dsv4_err *err) {
    return INNER(be)->fill_dummy_linear(INNER(be), wf, sf, dev, err);
}

dsv4_backend *dsv4_backend_timing_wrap(dsv4_backend *inner, int sync_each, dsv4_err *err) {
    dsv4_backend *be = calloc(1, sizeof *be);
    timed_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        dsv4_err_set(err, DSV4_ENOMEM, "timing backend: out of memory");
        return NULL;
    }
    c->inner = inner;
    c->sync_each = sync_each;
    be->name = inner->name;
    be->numerics = inner->numerics;
    be->act_dtype = inner->act_dtype;
    be->ctx = c;
    be->free = t_free;
    be->buf_alloc = t_buf_alloc;
    be->buf_free = t_buf_free;
    be->buf_write = t_buf_write;
    be->buf_read = t_buf_read;
    be->buf_gather_rows = t_gather;
    be->upload = t_upload;
    be->upload_linear = inner->upload_linear ? t_upload_linear : NULL;
    be->batch_begin = t_batch_begin;
    be->sync = t_sync;
    be->embed = t_embed;
    be->add = t_add;
    be->rmsnorm = t_rmsnorm;
    be->rope = t_rope;
    be->qat_fp8 = t_qat_fp8;
    be->qat_hadamard_fp4 = t_qat_had;
    be->linear = t_linear;
    be->linear_grouped = t_linear_grouped;
    be->hc_pre = t_hc_pre;
    be->hc_post = t_hc_post;
    be->hc_head = t_hc_head;
    be->win_store = t_win_store;
    be->compress = t_compress;
    be->indexer_select = t_indexer;
    be->attention = t_attention;
    be->moe_route = t_moe_route;
    be->moe_experts = t_moe_experts;
    be->experts_ready = inner->experts_ready ? t_experts_ready : NULL;
    be->swiglu = t_swiglu;
    be->fill_dummy = inner->fill_dummy ? t_fill : NULL;
    be->fill_dummy_linear = inner->fill_dummy_linear ? t_fill_linear : NULL;
    return be;
}

void dsv4_backend_timing_report(const dsv4_backend *timed, FILE *out) {
    const timed_ctx *c = timed->ctx;
    double total = 0;
    for (int i = 0; i < OP_COUNT; i++) total += c->sec[i];
    fprintf(out, "%-18s %8s %10s %10s %6s\n", "op", "calls", "total ms", "us/call", "share");
    for (int i = 0; i < OP_COUNT; i++) {
        if (!c->calls[i]) continue;
        fprintf(out, "%-18s %8ld %10.2f %10.1f %5.1f%%\n", op_names[i], c->calls[i], c->sec[i] * 1e3,
                c->sec[i] * 1e6 / c->calls[i], total > 0 ? 100 * c->sec[i] / total : 0);
    }
    fprintf(out, "%-18s %8s %10.2f\n", "all ops", "", total * 1e3);
}

void dsv4_backend_timing_reset(dsv4_backend *timed) {
    timed_ctx *c = timed->ctx;
    memset(c->calls, 0, sizeof c->calls);
    memset(c->sec, 0, sizeof c->sec);
}
