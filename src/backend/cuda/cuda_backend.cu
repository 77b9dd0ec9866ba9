/*
 * cuda_backend.cu — the CUDA op table (cuda_backend.h): device buffers,
 * weight upload, the batch mirror, linears and MoE on top of the kernels of
 * dsv4_cuda.h; the small ops are in cuda_be_ops.cu.
 *
 * Weights. `upload_linear` keeps, per linear, a host record (cu_lin) that
 * holds the uploaded dsv4_cuda_weight (FP8 as stored, FP4 repacked, BF16) or
 * an F32 copy. The returned dsv4_linear points at the record: w.data = the
 * record, scale.data = &record->magic, so `linear` can tell an uploaded
 * linear from raw device views without dereferencing a device pointer.
 *
 * MoE. dsv4_cuda_moe wants all experts of a layer in one expert-major
 * allocation; the op table hands over per-expert linears. `experts_ready`
 * (backend.h), called by dsv4_block_dev_init right after a block's experts
 * are uploaded or dummy-filled, assembles the set (device-to-device copies of
 * the repacked bytes, the same layout dsv4_cuda_experts_upload makes) and
 * keeps it, keyed by the w1 array, until the backend is freed; the
 * per-expert copies are then freed and their records point into the set, so
 * experts cost their size once. Why at load time and not in the first
 * forward (review 2026-12-01 S1/S2): the transient (+ one layer's experts,
 * 3.2 GiB at TP=1 on Flash) then comes before the KV pool is sized from the
 * free memory, not out of the activation reserve; and the cudaMalloc /
 * cudaStreamSynchronize / cudaFree of the assembly never run inside a
 * forward, where under TP a peer rank may be waiting in a collective for
 * this one (cuda_ctx.cu, the workspace). moe_experts still assembles a set it
 * was not given at load (a caller that skips experts_ready, e.g. an op test),
 * with a warning. Uploading a layer's experts straight into one allocation
 * (an upload_experts op) would remove the transient too.
 */
#include "backend/cuda/cuda_be_internal.cuh"
#include "backend/cuda/cuda_rows.cuh"
#include "backend/cuda/cuda_logit_top.h"
#include "backend/cuda/cuda_subtile.cuh"

#include <stdlib.h>
#include <string.h>

#define LIN_MAGIC 0x4c494e43u /* "CNIL" */

typedef struct cu_lin {
    uint32_t magic;
    dsv4_dtype dtype;     /* stored dtype of w */
    dsv4_cuda_weight cw;  /* FP8 / FP4 / BF16 */
    float *f32;           /* F32 weights: device copy [out][in] */
    int64_t out, in;      /* logical; cw.out / cw.in are larger when uploaded padded (cuda_subtile.cu) */
    int borrowed;         /* cw points into an expert-major set (cu_moe): not ours to free */
    struct cu_lin *next;
} cu_lin;

typedef struct cu_moe {
    const dsv4_linear *key; /* the w1 array */
    const void *key0;       /* w1[0].w.data, in case the array is reused */
    int n_exp;
    dsv4_cuda_experts ex;
    void *bf16_ptrs;        /* BF16 experts: device table of 3 x n_exp weight pointers (w1s, w3s, w2s); ex unused */
    struct cu_moe *next;
} cu_moe;

/* ------------------------------------------------------------------ checks */

static size_t dt_size(dsv4_dtype dt) {
    switch (dt) {
    case DSV4_DT_F32: case DSV4_DT_I32: return 4;
    case DSV4_DT_BF16: case DSV4_DT_F16: return 2;
    case DSV4_DT_I64: return 8;
    case DSV4_DT_F8_E4M3: case DSV4_DT_F8_E8M0: case DSV4_DT_I8: case DSV4_DT_U8: return 1;
    default: return 0;
    }
}

int cu_be_check(const dsv4_buf *b, dsv4_dtype dt, int64_t rows, int64_t cols, const char *what, dsv4_err *err) {
    if (!b || !b->data) return cu_err(err, DSV4_EINVAL, "cuda: %s: missing buffer", what);
    if (b->dtype != dt) return cu_err(err, DSV4_EINVAL, "cuda: %s: wrong dtype (%d, expected %d)", what, (int)b->dtype, (int)dt);
    if ((rows >= 0 && b->rows != rows) || (cols >= 0 && b->cols != cols))
        return cu_err(err, DSV4_EINVAL, "cuda: %s: shape [%lld,%lld], expected [%lld,%lld]", what, (long long)b->rows,
                      (long long)b->cols, (long long)rows, (long long)cols);
    return DSV4_OK;
}

int cu_be_check_vec(const dsv4_tview *v, int64_t n, const char *what, dsv4_err *err) {
    if (!v || !v->data) return cu_err(err, DSV4_EINVAL, "cuda: %s: missing tensor", what);
    if (v->dtype != DSV4_DT_F32 && v->dtype != DSV4_DT_BF16)
        return cu_err(err, DSV4_EINVAL, "cuda: %s (%s): dtype %d, expected F32/BF16", what, v->name ? v->name : "-",
                      (int)v->dtype);
    int64_t k = 1;
    for (int i = 0; i < v->ndim; i++) k *= v->shape[i];
    if (n >= 0 && k != n)
        return cu_err(err, DSV4_EINVAL, "cuda: %s (%s): %lld elements, expected %lld", what, v->name ? v->name : "-",
                      (long long)k, (long long)n);
    return DSV4_OK;
}

/* ------------------------------------------------------ lifetime, memory */

static void cu_be_free(dsv4_backend *be) {
    if (!be) return;
    cu_be *cb = cube(be);
    if (cb) {
        if (cb->ctx) cudaStreamSynchronize(cb->ctx->stream);
        for (int i = 0; i < cb->nviews; i++) dsv4_cuda_free(cb->ctx, cb->views[i]);
        free(cb->views);
        for (cu_lin *l = cb->lins, *n; l; l = n) {
            n = l->next;
            if (!l->borrowed) dsv4_cuda_weight_free(cb->ctx, &l->cw);
            dsv4_cuda_free(cb->ctx, l->f32);
            free(l);
        }
        for (cu_moe *m = cb->moes, *n; m; m = n) {
            n = m->next;
            dsv4_cuda_experts_free(cb->ctx, &m->ex);
            dsv4_cuda_free(cb->ctx, m->bf16_ptrs);
            free(m);
        }
        dsv4_cuda_free(cb->ctx, cb->d_batch);
        dsv4_cuda_free(cb->ctx, cb->d_flags);
        if (cb->h_stage) cudaFreeHost(cb->h_stage);
        dsv4_cuda_ctx_free(cb->ctx);
        cu_op_profile_free(cb->prof);
        free(cb);
    }
    free(be);
}

static int cu_buf_alloc(dsv4_backend *be, dsv4_dtype dt, int64_t rows, int64_t cols, dsv4_buf *out, dsv4_err *err) {
    size_t es = dt_size(dt);
    if (!out || !es || rows < 0 || cols < 0)
        return cu_err(err, DSV4_EINVAL, "cuda: buf_alloc: bad dtype or shape [%lld,%lld]", (long long)rows,
                      (long long)cols);
    size_t n = (size_t)rows * (size_t)cols * es;
    void *p = NULL;
    /* Stream-ordered allocation from the device pool (kept cached, see create):
     * the forward's scratch costs no cudaMalloc/cudaFree and no synchronisation
     * between layers. */
    cudaStream_t st = cube(be)->ctx->stream;
    cudaError_t e = cudaMallocAsync(&p, n ? n : 1, st);
    if (e != cudaSuccess)
        return cu_err(err, e == cudaErrorMemoryAllocation ? DSV4_ENOMEM : DSV4_EBACKEND,
                      "cuda: buf_alloc: %zu bytes: %s", n, cudaGetErrorString(e));
    e = cudaMemsetAsync(p, 0, n ? n : 1, st);
    if (e != cudaSuccess) {
        cudaFreeAsync(p, st);
        return cu_err(err, DSV4_EBACKEND, "cuda: buf_alloc: memset: %s", cudaGetErrorString(e));
    }
    out->data = p;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    return DSV4_OK;
}

/* Device memory free / total (backend.h mem_info), on this backend's GPU. */
static int cu_mem_info(dsv4_backend *be, int64_t *free_bytes, int64_t *total_bytes, dsv4_err *err) {
    cu_be *cb = cube(be);
    size_t f = 0, t = 0;
    CU_TRY(cudaSetDevice(cb->ctx->device), err, "mem_info (device)");
    CU_TRY(cudaMemGetInfo(&f, &t), err, "mem_info");
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return DSV4_OK;
}

/* Scratch with undefined contents (backend.h buf_alloc_scratch): from the
 * context's arena (cu_arena_alloc), so a captured step has no allocation,
 * memset or free nodes for it. DSV4_CUDA_SCRATCH_MB=0: buf_alloc's zeroed
 * pool memory, the behaviour before, for comparison. */
static int cu_buf_alloc_scratch(dsv4_backend *be, dsv4_dtype dt, int64_t rows, int64_t cols, dsv4_buf *out,
                                dsv4_err *err) {
    dsv4_cuda_ctx *c = cube(be)->ctx;
    if (!c->ar_mode) return cu_buf_alloc(be, dt, rows, cols, out, err);
    size_t es = dt_size(dt);
    if (!out || !es || rows < 0 || cols < 0)
        return cu_err(err, DSV4_EINVAL, "cuda: buf_alloc_scratch: bad dtype or shape [%lld,%lld]", (long long)rows,
                      (long long)cols);
    void *p = NULL;
    int rc = cu_arena_alloc(c, (size_t)rows * (size_t)cols * es, &p, err);
    if (rc) return rc;
    out->data = p;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    return DSV4_OK;
}

static void cu_buf_free(dsv4_backend *be, dsv4_buf *b) {
    if (!b || !b->data) return;
    cu_arena_free(cube(be)->ctx, b->data); /* stream-ordered: queued ops that use it finish first */
    b->data = NULL;
}

static size_t buf_bytes(const dsv4_buf *b) { return (size_t)b->rows * (size_t)b->cols * dt_size(b->dtype); }

static int cu_buf_write(dsv4_backend *be, dsv4_buf *dst, const void *host, dsv4_err *err) {
    if (!dst || !dst->data || !host) return cu_err(err, DSV4_EINVAL, "cuda: buf_write: NULL");
    return dsv4_cuda_upload(cube(be)->ctx, dst->data, host, buf_bytes(dst), err);
}

static int cu_buf_read(dsv4_backend *be, const dsv4_buf *src, void *host, dsv4_err *err) {
    if (!src || !src->data || !host) return cu_err(err, DSV4_EINVAL, "cuda: buf_read: NULL");
    return dsv4_cuda_download(cube(be)->ctx, host, src->data, buf_bytes(src), err);
}

static int cu_buf_gather_rows(dsv4_backend *be, const dsv4_buf *src, const int32_t *idx, int n, dsv4_buf *dst,
                              dsv4_err *err) {
    if (!src || !dst || !src->data || !dst->data || src->dtype != dst->dtype || src->cols != dst->cols ||
        dst->rows < n || n < 0)
        return cu_err(err, DSV4_EINVAL, "cuda: gather_rows: mismatched buffers");
    size_t rb = (size_t)src->cols * dt_size(src->dtype);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= src->rows)
            return cu_err(err, DSV4_EINVAL, "cuda: gather_rows: index %d out of [0,%lld)", idx[i], (long long)src->rows);
    /* one copy per run of consecutive indices (a decode step's logit rows, a whole copy, a slot's
     * accepted verify rows), not one per row */
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && idx[j] == idx[j - 1] + 1; j++) {}
        CU_TRY(cudaMemcpyAsync((char *)dst->data + (size_t)i * rb, (const char *)src->data + (size_t)idx[i] * rb,
                               (size_t)(j - i) * rb, cudaMemcpyDeviceToDevice, cube(be)->ctx->stream),
               err, "gather_rows");
    }
    return DSV4_OK;
}

/* ----------------------------------------------------------------- weights */

static int cu_upload(dsv4_backend *be, const dsv4_tview *host, dsv4_tview *dev, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!host || !dev) return cu_err(err, DSV4_EINVAL, "cuda: upload: NULL");
    *dev = *host;
    if (!host->data) return DSV4_OK;
    if (cb->nviews == cb->capviews) {
        int cap = cb->capviews ? 2 * cb->capviews : 64;
        void **v = (void **)realloc(cb->views, (size_t)cap * sizeof *v);
        if (!v) return cu_err(err, DSV4_ENOMEM, "cuda: upload: out of memory");
        cb->views = v;
        cb->capviews = cap;
    }
    void *p = NULL;
    int rc = dsv4_cuda_alloc(cb->ctx, host->nbytes, &p, err);
    if (!rc) rc = dsv4_cuda_upload(cb->ctx, p, host->data, host->nbytes, err);
    if (rc) {
        dsv4_cuda_free(cb->ctx, p);
        return rc;
    }
    cb->views[cb->nviews++] = p;
    dev->data = p;
    return DSV4_OK;
}

static int cu_upload_linear(dsv4_backend *be, const dsv4_linear *host, dsv4_linear *dev, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!host || !dev || !host->w.data) return cu_err(err, DSV4_EINVAL, "cuda: upload_linear: missing weight");
    cu_lin *l = (cu_lin *)calloc(1, sizeof *l);
    if (!l) return cu_err(err, DSV4_ENOMEM, "cuda: upload_linear: out of memory");
    l->magic = LIN_MAGIC;
    l->dtype = host->w.dtype;
    l->out = host->out;
    l->in = host->in;
    int rc;
    if (host->w.dtype == DSV4_DT_F32) {
        size_t nb = (size_t)(host->out * host->in) * 4;
        if (host->w.nbytes != nb) {
            free(l);
            return cu_err(err, DSV4_EINVAL, "cuda: %s: F32 weight size does not match [%lld,%lld]",
                          host->w.name ? host->w.name : "linear", (long long)host->out, (long long)host->in);
        }
        void *p = NULL;
        rc = dsv4_cuda_alloc(cb->ctx, nb, &p, err);
        if (!rc) rc = dsv4_cuda_upload(cb->ctx, p, host->w.data, nb, err);
        l->f32 = (float *)p;
    } else if (cu_subtile_needed(host)) { /* narrower than the tiles: zero-padded (cuda_subtile.cu) */
        dsv4_linear pl;
        void *bytes = NULL;
        rc = cu_subtile_pad(host, &pl, &bytes, err);
        if (!rc) rc = dsv4_cuda_weight_upload(cb->ctx, &pl, &l->cw, err);
        free(bytes);
    } else {
        rc = dsv4_cuda_weight_upload(cb->ctx, host, &l->cw, err);
    }
    if (rc) {
        dsv4_cuda_free(cb->ctx, l->f32);
        free(l);
        return rc;
    }
    l->next = cb->lins;
    cb->lins = l;
    *dev = *host;
    dev->w.data = l;
    dev->scale.data = &l->magic;
    return DSV4_OK;
}

int cu_be_adopt_linear(dsv4_backend *be, const dsv4_linear *meta, const dsv4_cuda_weight *cw, float *f32,
                       dsv4_linear *dev, dsv4_err *err) {
    cu_be *cb = cube(be);
    cu_lin *l = (cu_lin *)calloc(1, sizeof *l);
    if (!l) return cu_err(err, DSV4_ENOMEM, "cuda: adopt_linear: out of memory");
    l->magic = LIN_MAGIC;
    l->dtype = meta->w.dtype;
    l->out = meta->out;
    l->in = meta->in;
    if (cw) l->cw = *cw;
    l->f32 = f32;
    l->next = cb->lins;
    cb->lins = l;
    dsv4_linear m = *meta;
    *dev = m;
    dev->w.data = l;
    dev->scale.data = &l->magic;
    return DSV4_OK;
}

/* The record behind a linear from upload_linear, or NULL (message in err). */
static const cu_lin *lin_of(const dsv4_linear *w, const char *op, dsv4_err *err) {
    if (!w || !w->w.data || w->scale.data != (const void *)&((const cu_lin *)w->w.data)->magic) {
        cu_err(err, DSV4_EINVAL, "cuda: %s: %s was not uploaded with upload_linear", op,
               w && w->w.name ? w->w.name : "weight");
        return NULL;
    }
    const cu_lin *l = (const cu_lin *)w->w.data;
    if (l->magic != LIN_MAGIC) {
        cu_err(err, DSV4_EINVAL, "cuda: %s: corrupt linear record", op);
        return NULL;
    }
    return l;
}

static const char *lin_name(const dsv4_linear *w) { return w->w.name ? w->w.name : "linear"; }

/* ------------------------------------------------------------------ batch */

static int batch_upload(dsv4_backend *be, cu_be *cb, const dsv4_batch *b, dsv4_err *err) {
    int T = b->n_rows;
    if (T > cb->batch_cap) {
        /* the mirror moves: graphs captured against the old one are stale. Bumped on the
         * table the ops were called with: --load-format dummy wraps the backend in a copy
         * of its table (model/dummy.c), and the model's graphs read that copy's epoch */
        be->graph_epoch++;
        if (cb->be != be) cb->be->graph_epoch++;
        CU_TRY(cudaStreamSynchronize(cb->ctx->stream), err, "batch mirror (synchronize)");
        dsv4_cuda_free(cb->ctx, cb->d_batch);
        if (cb->h_stage) cudaFreeHost(cb->h_stage);
        cb->d_batch = NULL;
        cb->h_stage = NULL;
        cb->batch_cap = 0;
        /* at least 64 rows: decode batches up to that never move the mirror */
        const int cap = T < 64 ? 64 : T;
        void *p = NULL;
        int rc = dsv4_cuda_alloc(cb->ctx, (size_t)6 * cap * sizeof(int32_t), &p, err);
        if (rc) return rc;
        cb->d_batch = (int32_t *)p;
        /* pinned: the one host-to-device copy per step is a true async copy */
        void *h = NULL;
        if (cudaMallocHost(&h, (size_t)6 * cap * sizeof(int32_t)) != cudaSuccess)
            return cu_err(err, DSV4_ENOMEM, "cuda: batch mirror: out of pinned memory");
        cb->h_stage = (int32_t *)h;
        cb->batch_cap = cap;
    }
    if (T) {
        int32_t *h = cb->h_stage, C = cb->batch_cap;
        memcpy(h, b->token, (size_t)T * 4);
        memcpy(h + C, b->pos, (size_t)T * 4);
        memcpy(h + 2 * C, b->slot, (size_t)T * 4);
        for (int t = 0; t < T; t++) {
            /* segment data; rows outside any valid segment get their own row as a segment */
            int s = b->seq_idx && b->cu_seqlens ? b->seq_idx[t] : -1;
            int ok = s >= 0 && s < b->n_seqs && b->cu_seqlens[s] <= t && t < b->cu_seqlens[s + 1];
            h[3 * C + t] = ok && b->seq_pos0 ? b->seq_pos0[s] : b->pos[t];
            h[4 * C + t] = ok ? b->cu_seqlens[s] : t;
            h[5 * C + t] = ok ? b->cu_seqlens[s + 1] : t + 1;
        }
        /* one copy from the pinned stage into the fixed device mirror, queued
         * before the step's launches (or graph); the stage is reused only
         * after the step's closing sync, which orders this copy first */
        CU_TRY(cudaStreamSynchronize(cb->ctx->stream), err, "batch mirror (stage reuse)");
        CU_TRY(cudaMemcpyAsync(cb->d_batch, h, (size_t)6 * C * 4, cudaMemcpyHostToDevice, cb->ctx->stream), err,
               "batch mirror upload");
    }
    cb->h_token = b->token;
    cb->h_pos = b->pos;
    cb->n_rows = T;
    return DSV4_OK;
}

int cu_be_batch(dsv4_backend *be, const dsv4_batch *b, const int32_t **token, const int32_t **pos,
                const int32_t **slot, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!b) return cu_err(err, DSV4_EINVAL, "cuda: no batch");
    if (b->token != cb->h_token || b->pos != cb->h_pos || b->n_rows != cb->n_rows) {
        int rc = batch_upload(be, cb, b, err);
        if (rc) return rc;
    }
    *token = cb->d_batch;
    *pos = cb->d_batch + cb->batch_cap;
    *slot = cb->d_batch + 2 * cb->batch_cap;
    return DSV4_OK;
}

int cu_be_batch_seg(dsv4_backend *be, const dsv4_batch *b, const int32_t **p0, const int32_t **r0,
                    const int32_t **r1, dsv4_err *err) {
    const int32_t *t, *p, *s;
    int rc = cu_be_batch(be, b, &t, &p, &s, err);
    if (rc) return rc;
    cu_be *cb = cube(be);
    *p0 = cb->d_batch + 3 * cb->batch_cap;
    *r0 = cb->d_batch + 4 * cb->batch_cap;
    *r1 = cb->d_batch + 5 * cb->batch_cap;
    return DSV4_OK;
}

static int cu_batch_begin(dsv4_backend *be, const dsv4_batch *b, dsv4_err *err) {
    if (!b || b->n_rows < 0 || b->n_seqs < 0) return cu_err(err, DSV4_EINVAL, "batch: bad sizes");
    for (int s = 0; s < b->n_seqs; s++)
        for (int r = b->cu_seqlens[s]; r < b->cu_seqlens[s + 1]; r++)
            if (b->seq_idx[r] != s || b->slot[r] != b->seq_slot[s] || b->pos[r] != b->seq_pos0[s] + (r - b->cu_seqlens[s]))
                return cu_err(err, DSV4_EINVAL, "batch: row %d inconsistent with segment %d (slot/pos/seq_idx)", r, s);
    if (b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_seqs] != b->n_rows)
        return cu_err(err, DSV4_EINVAL, "batch: cu_seqlens do not cover %d rows", b->n_rows);
    int rc = cu_arena_reserve(cube(be)->ctx, err); /* outside capture: batch_upload synchronises */
    return rc ? rc : batch_upload(be, cube(be), b, err);
}

/* Synchronise, then report (and clear) the deferred input errors of the ops since the last sync. */
static int cu_sync(dsv4_backend *be, dsv4_err *err) {
    cu_be *cb = cube(be);
    int rc = dsv4_cuda_sync(cb->ctx, err);
    if (rc) return rc;
    int h = 0;
    CU_TRY(cudaMemcpy(&h, cb->d_flags, sizeof h, cudaMemcpyDeviceToHost), err, "deferred flags");
    if (!h) return DSV4_OK;
    CU_TRY(cudaMemset(cb->d_flags, 0, sizeof h), err, "deferred flags");
    return cu_err(err, DSV4_EINVAL, "moe_route: tid2eid holds an expert id outside the expert range");
}

/* ------------------------------------------------------------ graph capture */

/* Thread-local capture: another thread's unrelated CUDA calls (e.g. a second
 * backend) do not invalidate it, while this thread's unsafe calls (a
 * synchronisation, cudaMalloc) do, which is what should fail the capture. */
/* A replayable step: the executable graph and the arena top at capture
 * start; scratch the graph uses lies above it (cu_graph_launch checks). */
typedef struct cu_graph {
    cudaGraphExec_t x;
    size_t ar_lo;
} cu_graph;

static int cu_graph_begin(dsv4_backend *be, dsv4_err *err) {
    dsv4_cuda_ctx *c = cube(be)->ctx;
    int rc = cu_arena_reserve(c, err);
    if (rc) return rc;
    cube(be)->ar_capture_lo = c->ar_top;
    CU_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), err, "graph capture begin");
    return DSV4_OK;
}

static int cu_graph_end(dsv4_backend *be, void **graph, dsv4_err *err) {
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cube(be)->ctx->stream, &g);
    if (e != cudaSuccess || !g) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError(); /* capture errors are not sticky: clear the record */
        return cu_err(err, DSV4_EBACKEND, "cuda: graph capture: %s", cudaGetErrorString(e));
    }
    /* node census (issue 7: a decode step's cost is mostly per node) */
    size_t nodes = 0;
    cudaGraphGetNodes(g, NULL, &nodes);
    int nk = 0, nset = 0, ncpy = 0, nal = 0, nfr = 0, nother = 0;
    cudaGraphNode_t *nv = nodes ? (cudaGraphNode_t *)malloc(nodes * sizeof *nv) : NULL;
    if (nv && cudaGraphGetNodes(g, nv, &nodes) == cudaSuccess) {
        for (size_t i = 0; i < nodes; i++) {
            cudaGraphNodeType ty;
            if (cudaGraphNodeGetType(nv[i], &ty) != cudaSuccess) ty = cudaGraphNodeTypeEmpty;
            switch (ty) {
            case cudaGraphNodeTypeKernel: nk++; break;
            case cudaGraphNodeTypeMemset: nset++; break;
            case cudaGraphNodeTypeMemcpy: ncpy++; break;
            case cudaGraphNodeTypeMemAlloc: nal++; break;
            case cudaGraphNodeTypeMemFree: nfr++; break;
            default: nother++; break;
            }
        }
    }
    free(nv);
    dsv4_cuda_ctx *c = cube(be)->ctx;
    dsv4_log(DSV4_LOG_INFO,
             "cuda: captured a graph of %zu nodes (%d kernels, %d memsets, %d memcpys, %d allocs, %d frees, %d other; "
             "scratch arena peak %zu MiB, %d fallbacks)",
             nodes, nk, nset, ncpy, nal, nfr, nother, c->ar_peak >> 20, c->ar_fallbacks);
    cudaGraphExec_t x = NULL;
    /* auto-free: a replay may start while the previous one's buffers were not freed (error paths) */
    e = cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cu_err(err, DSV4_EBACKEND, "cuda: graph instantiate: %s", cudaGetErrorString(e));
    }
    cu_graph *cg = (cu_graph *)malloc(sizeof *cg);
    if (!cg) {
        cudaGraphExecDestroy(x);
        return cu_err(err, DSV4_ENOMEM, "cuda: graph: out of host memory");
    }
    cg->x = x;
    cg->ar_lo = cube(be)->ar_capture_lo;
    *graph = (void *)cg;
    return DSV4_OK;
}

static int cu_graph_launch(dsv4_backend *be, void *graph, dsv4_err *err) {
    const cu_graph *cg = (const cu_graph *)graph;
    dsv4_cuda_ctx *c = cube(be)->ctx;
    /* the replay writes the arena scratch above ar_lo: nothing may be live there now */
    if (c->ar_top > cg->ar_lo)
        return cu_err(err, DSV4_EINTERNAL,
                      "cuda: graph launch: %zu bytes of scratch are live above the graph's arena start %zu "
                      "(free scratch before replaying a step)", c->ar_top - cg->ar_lo, cg->ar_lo);
    CU_TRY(cudaGraphLaunch(cg->x, c->stream), err, "graph launch");
    return DSV4_OK;
}

static void cu_graph_free(dsv4_backend *be, void *graph) {
    if (!graph) return;
    cudaStreamSynchronize(cube(be)->ctx->stream);
    cudaGraphExecDestroy(((cu_graph *)graph)->x);
    free(graph);
}

static int cu_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err) {
    return cu_be_hc_mean(be, X, n_hc, y, col0, err);
}

/* ----------------------------------------------------------------- linears */

/* The fp32-activation linears (F32 / BF16 / FP8 weights, no activation
 * quantisation): cuda_rows.cu, numerics in cuda_rows.cuh. */
static int dot_rows(cu_be *cb, const cu_lin *l, const float *x, int64_t xstride, int64_t T, int64_t out_g,
                    float *y, dsv4_err *err) {
    int kind;
    const void *W;
    const uint8_t *ws = NULL;
    if (l->f32) {
        kind = CU_ROWS_F32;
        W = l->f32;
    } else if (l->cw.kind == DSV4_CUDA_W_BF16) {
        kind = CU_ROWS_BF16;
        W = l->cw.w;
    } else if (l->cw.kind == DSV4_CUDA_W_FP8) {
        kind = CU_ROWS_FP8;
        W = l->cw.w;
        ws = (const uint8_t *)l->cw.scale;
    } else {
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: linear_grouped: FP4 weights not implemented");
    }
    if (!l->f32 && l->cw.in != l->in) /* padded columns change the row stride the kernels assume */
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: linear_grouped: in-dim %lld below the 128-column tile",
                      (long long)l->in);
    return cu_rows_linear(cb->ctx, kind, W, ws, l->out, l->in, x, xstride, T, out_g, y, err);
}

static int cu_linear(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y, dsv4_err *err) {
    cu_be *cb = cube(be);
    const cu_lin *l = lin_of(w, "linear", err);
    if (!l) return DSV4_EINVAL;
    int rc = cu_be_check(x, DSV4_DT_F32, -1, l->in, "linear x", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, x->rows, l->out, "linear y", err);
    if (!rc && x->data == y->data) rc = cu_err(err, DSV4_EINVAL, "cuda: linear %s: y aliases x", lin_name(w));
    if (rc) return rc;
    if (l->f32) return dot_rows(cb, l, (const float *)x->data, l->in, x->rows, l->out, (float *)y->data, err);
    if (l->cw.kind != DSV4_CUDA_W_BF16 && be->numerics != DSV4_NUMERICS_REFERENCE)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: linear %s: FP8/FP4 weights in HF numerics (no activation "
                      "quantisation) not implemented", lin_name(w));
    if (l->cw.out != l->out || l->cw.in != l->in)
        return cu_subtile_linear(cb->ctx, &l->cw, l->out, l->in, (const float *)x->data, x->rows, (float *)y->data,
                                 err);
    return dsv4_cuda_linear(cb->ctx, &l->cw, (const float *)x->data, (int)x->rows, (float *)y->data, 0, err);
}

/* y += w·swiglu(g, u) (backend.h linear_swiglu_add): FP8 weights at decode sizes in two kernels
 * (dsv4_cuda_linear_swiglu_add: the quantiser makes h, the GEMV adds); anything else as swiglu, linear
 * and add on stream-ordered scratch (same bits either way). DSV4_CUDA_SHARED_FUSE=1|0 picks; default
 * CU_SHARED_FUSE_DEFAULT (cuda_internal.cuh). */
static int cu_linear_swiglu_add(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                                const dsv4_linear *w, dsv4_buf *y, dsv4_err *err) {
    cu_be *cb = cube(be);
    const cu_lin *l = lin_of(w, "linear_swiglu_add", err);
    if (!l) return DSV4_EINVAL;
    int rc = cu_be_check(g, DSV4_DT_F32, -1, l->in, "linear_swiglu_add g", err);
    if (!rc) rc = cu_be_check(u, DSV4_DT_F32, g->rows, l->in, "linear_swiglu_add u", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, g->rows, l->out, "linear_swiglu_add y", err);
    if (!rc && (y->data == g->data || y->data == u->data))
        rc = cu_err(err, DSV4_EINVAL, "cuda: linear_swiglu_add %s: y aliases g or u", lin_name(w));
    if (rc) return rc;
    if (g->rows == 0) return DSV4_OK;
    static int fuse = -1;
    if (fuse < 0) {
        const char *e = getenv("DSV4_CUDA_SHARED_FUSE");
        fuse = e && e[0] ? e[0] != '0' : CU_SHARED_FUSE_DEFAULT;
    }
    if (fuse && !l->f32 && l->cw.kind == DSV4_CUDA_W_FP8 && l->cw.out == l->out && l->cw.in == l->in &&
        be->numerics == DSV4_NUMERICS_REFERENCE) {
        rc = dsv4_cuda_linear_swiglu_add(cb->ctx, &l->cw, (const float *)g->data, (const float *)u->data, limit,
                                         (int)g->rows, (float *)y->data, 0, err);
        if (rc != DSV4_EUNSUPPORTED) return rc;
    }
    void *hp = NULL, *tp = NULL;
    if ((rc = cu_arena_alloc(cb->ctx, (size_t)g->rows * (size_t)l->in * sizeof(float), &hp, err))) return rc;
    if ((rc = cu_arena_alloc(cb->ctx, (size_t)g->rows * (size_t)l->out * sizeof(float), &tp, err))) {
        cu_arena_free(cb->ctx, hp);
        return rc;
    }
    dsv4_buf h = {hp, DSV4_DT_F32, g->rows, l->in}, t = {tp, DSV4_DT_F32, g->rows, l->out};
    rc = cu_be_swiglu(be, g, u, limit, &h, err);
    if (!rc) rc = cu_linear(be, &h, w, &t, err);
    if (!rc) rc = cu_be_add(be, y, &t, y, err);
    cu_arena_free(cb->ctx, tp); /* stream-ordered, newest first */
    cu_arena_free(cb->ctx, hp);
    return rc;
}

/* linear_multi: the FP8 weights (reference numerics) go through
 * dsv4_cuda_linear_group — one activation quantisation, up to 4 weights per
 * launch, the same per-tile sums as the single-weight kernel, so every y[i]
 * is bit-identical to `linear`'s; the BF16 weights of one in-dim through
 * another dsv4_cuda_linear_group call (one GEMV launch for the compressor's
 * and indexer's wkv / wgate and weights_proj at decode, the same per-row
 * sums as `linear`'s GEMV); the others (F32, FP4, padded) one by one. */
static int cu_linear_multi(dsv4_backend *be, const dsv4_buf *x, int n, const dsv4_linear *const *w,
                           dsv4_buf *const *y, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (n < 0 || n > DSV4_LINEAR_MULTI_MAX || (n && (!w || !y)))
        return cu_err(err, DSV4_EINVAL, "cuda: linear_multi: %d linears (max %d)", n, DSV4_LINEAR_MULTI_MAX);
    const dsv4_cuda_weight *gw[DSV4_LINEAR_MULTI_MAX], *bw[DSV4_LINEAR_MULTI_MAX];
    float *gy[DSV4_LINEAR_MULTI_MAX], *by[DSV4_LINEAR_MULTI_MAX];
    int ng = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        const cu_lin *l = lin_of(w[i], "linear_multi", err);
        if (!l) return DSV4_EINVAL;
        int rc = cu_be_check(x, DSV4_DT_F32, -1, l->in, "linear_multi x", err);
        if (!rc) rc = cu_be_check(y[i], DSV4_DT_F32, x->rows, l->out, "linear_multi y", err);
        if (!rc && x->data == y[i]->data)
            rc = cu_err(err, DSV4_EINVAL, "cuda: linear_multi %s: y aliases x", lin_name(w[i]));
        if (rc) return rc;
        /* zero-padded sub-tile weights (cuda_subtile.cu) take `linear`'s padded path */
        const int whole = !l->f32 && l->cw.out == l->out && l->cw.in == l->in;
        if (whole && l->cw.kind == DSV4_CUDA_W_FP8 && be->numerics == DSV4_NUMERICS_REFERENCE) {
            gw[ng] = &l->cw;
            gy[ng++] = (float *)y[i]->data;
        } else if (whole && l->cw.kind == DSV4_CUDA_W_BF16 && (!nb || bw[0]->in == l->cw.in)) {
            bw[nb] = &l->cw;
            by[nb++] = (float *)y[i]->data;
        } else if ((rc = cu_linear(be, x, w[i], y[i], err))) {
            return rc;
        }
    }
    int rc = DSV4_OK;
    if (ng) rc = dsv4_cuda_linear_group(cb->ctx, ng, gw, (const float *)x->data, (int)x->rows, gy, 0, err);
    if (!rc && nb) rc = dsv4_cuda_linear_group(cb->ctx, nb, bw, (const float *)x->data, (int)x->rows, by, 0, err);
    return rc;
}

static int cu_linear_grouped(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, int groups, dsv4_buf *y,
                             dsv4_err *err) {
    const cu_lin *l = lin_of(w, "linear_grouped", err);
    if (!l) return DSV4_EINVAL;
    if (groups <= 0 || l->out % groups)
        return cu_err(err, DSV4_EINVAL, "cuda: linear_grouped: %d groups do not divide %lld rows", groups,
                      (long long)l->out);
    int rc = cu_be_check(x, DSV4_DT_F32, -1, l->in * groups, "linear_grouped x", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, x->rows, l->out, "linear_grouped y", err);
    if (rc) return rc;
    return dot_rows(cube(be), l, (const float *)x->data, l->in * groups, x->rows, l->out / groups,
                    (float *)y->data, err);
}

/* -------------------------------------------------------------------- MoE */

static int cu_moe_route(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *gate, const dsv4_tview *bias,
                        const dsv4_tview *tid2eid, int k, float route_scale, const dsv4_batch *b, dsv4_buf *ids,
                        dsv4_buf *weights, dsv4_err *err) {
    cu_be *cb = cube(be);
    const cu_lin *l = lin_of(gate, "moe_route", err);
    if (!l) return DSV4_EINVAL;
    int T = b->n_rows, E = (int)l->out;
    int rc = cu_be_check(x, DSV4_DT_F32, T, l->in, "moe_route x", err);
    if (!rc) rc = cu_be_check(ids, DSV4_DT_I32, T, k, "moe ids", err);
    if (!rc) rc = cu_be_check(weights, DSV4_DT_F32, T, k, "moe weights", err);
    if (!rc && (k <= 0 || k > E)) rc = cu_err(err, DSV4_EINVAL, "moe_route: k %d of %d experts", k, E);
    if (!rc && bias && bias->data) rc = cu_be_check_vec(bias, E, "gate.bias", err);
    int hash = tid2eid && tid2eid->data;
    if (!rc && hash && (tid2eid->dtype != DSV4_DT_I64 || tid2eid->ndim != 2 || tid2eid->shape[1] != k))
        rc = cu_err(err, DSV4_EINVAL, "moe_route: tid2eid must be I64 [V][%d]", k);
    if (!rc && !l->f32 && l->cw.kind != DSV4_CUDA_W_BF16)
        rc = cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_route: gate %s must be BF16 or F32", lin_name(gate));
    if (rc) return rc;
    if (hash)
        for (int t = 0; t < T; t++)
            if (b->token[t] < 0 || b->token[t] >= tid2eid->shape[0])
                return cu_err(err, DSV4_EINVAL, "moe_route: token %d outside tid2eid", b->token[t]);
    if (!T) return DSV4_OK;
    const int32_t *tok, *pos, *slot;
    if ((rc = cu_be_batch(be, b, &tok, &pos, &slot, err))) return rc;
    /* logits in fp32 (exact fp32 dot, as the CPU reference), in a buffer of our own:
     * the workspace is used by the route tail's error flag */
    void *lg = NULL;
    if ((rc = cu_arena_alloc(cb->ctx, (size_t)T * E * 4, &lg, err))) return rc;
    rc = dot_rows(cb, l, (const float *)x->data, l->in, T, E, (float *)lg, err);
    if (!rc)
        rc = cu_be_route_tail(be, (const float *)lg, T, E, bias && bias->data ? bias : NULL, hash ? tid2eid : NULL,
                              tok, k, route_scale, (int32_t *)ids->data, (float *)weights->data, err);
    cu_arena_free(cb->ctx, lg); /* stream-ordered: no synchronisation inside the layer */
    return rc;
}

/* The expert-major copy of an expert set (see the banner): found, or made
 * now. in_forward: called from moe_experts, i.e. experts_ready did not make
 * it at load; logged, since the assembly then allocates and synchronises in
 * the middle of a forward. */
static int moe_set(cu_be *cb, const dsv4_linear *w1, const dsv4_linear *w3, const dsv4_linear *w2, int n_exp,
                   int in_forward, const dsv4_cuda_experts **out, dsv4_err *err) {
    for (cu_moe *m = cb->moes; m; m = m->next)
        if (m->key == w1 && m->key0 == w1[0].w.data && m->n_exp == n_exp && !m->bf16_ptrs) {
            *out = &m->ex;
            return DSV4_OK;
        }
    const cu_lin *l0 = lin_of(&w1[0], "moe_experts", err);
    if (!l0) return DSV4_EINVAL;
    /* the stored (possibly padded, cuda_subtile.cu) dims: a padded d_ff is exact (zero rows give h = 0) */
    int64_t dm = l0->cw.in, dff = l0->cw.out;
    if (l0->cw.in != l0->in)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_experts: d_model %lld below the 128-column tile",
                      (long long)l0->in);
    for (int e = 0; e < n_exp; e++) {
        const dsv4_linear *ws[3] = {&w1[e], &w3[e], &w2[e]};
        for (int j = 0; j < 3; j++) {
            const cu_lin *l = lin_of(ws[j], "moe_experts", err);
            if (!l) return DSV4_EINVAL;
            if (l->cw.kind != DSV4_CUDA_W_FP4)
                return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_experts: expert %d %s is not FP4 (only FP4 experts "
                              "are implemented)", e, lin_name(ws[j]));
            int64_t eo = j == 2 ? dm : dff, ei = j == 2 ? dff : dm;
            int64_t lo = j == 2 ? l0->in : l0->out, li = j == 2 ? l0->out : l0->in;
            if (l->cw.out != eo || l->cw.in != ei || l->out != lo || l->in != li)
                return cu_err(err, DSV4_EINVAL, "moe: expert %d weight shapes do not match d=%lld, F=%lld", e,
                              (long long)dm, (long long)dff);
        }
    }
    cu_moe *m = (cu_moe *)calloc(1, sizeof *m);
    if (!m) return cu_err(err, DSV4_ENOMEM, "cuda: moe_experts: out of memory");
    m->key = w1;
    m->key0 = w1[0].w.data;
    m->n_exp = n_exp;
    dsv4_cuda_experts *x = &m->ex;
    x->n_experts = n_exp;
    x->d_model = dm;
    x->d_ff = dff;
    size_t wb = (size_t)(dm * dff / 2), sb = (size_t)(dm * dff / 32);
    int rc = 0;
    void **bufs[6] = {&x->w1, &x->w3, &x->w2, &x->s1, &x->s3, &x->s2};
    for (int j = 0; j < 6 && !rc; j++) rc = dsv4_cuda_alloc(cb->ctx, (j < 3 ? wb : sb) * n_exp, bufs[j], err);
    for (int e = 0; e < n_exp && !rc; e++) {
        const dsv4_linear *ws[3] = {&w1[e], &w3[e], &w2[e]};
        for (int j = 0; j < 3 && !rc; j++) {
            const cu_lin *l = (const cu_lin *)ws[j]->w.data;
            cudaError_t ce = cudaMemcpyAsync((uint8_t *)*bufs[j] + e * wb, l->cw.w, wb, cudaMemcpyDeviceToDevice,
                                             cb->ctx->stream);
            if (ce == cudaSuccess)
                ce = cudaMemcpyAsync((uint8_t *)*bufs[3 + j] + e * sb, l->cw.scale, sb, cudaMemcpyDeviceToDevice,
                                     cb->ctx->stream);
            if (ce != cudaSuccess) rc = cu_err(err, DSV4_EBACKEND, "cuda: moe_experts: copy: %s", cudaGetErrorString(ce));
        }
    }
    if (rc) {
        dsv4_cuda_experts_free(cb->ctx, x);
        free(m);
        return rc;
    }
    x->bytes = 3 * (wb + sb) * n_exp;
    /* The per-expert copies are now redundant: free them and point each
     * expert's record into the set, so the experts cost their size once (a
     * plain `linear` on one expert still works). Peak = the weights uploaded
     * so far + one layer's experts, at load (experts_ready). */
    cudaError_t se = cudaStreamSynchronize(cb->ctx->stream);
    if (se != cudaSuccess) {
        dsv4_cuda_experts_free(cb->ctx, x);
        free(m);
        return cu_err(err, DSV4_EBACKEND, "cuda: moe_experts: copy: %s", cudaGetErrorString(se));
    }
    for (int e = 0; e < n_exp; e++) {
        const dsv4_linear *ws[3] = {&w1[e], &w3[e], &w2[e]};
        for (int j = 0; j < 3; j++) {
            cu_lin *l = (cu_lin *)ws[j]->w.data; /* our own record (lin_of checked it above) */
            if (l->borrowed) continue;
            dsv4_cuda_weight cw = l->cw;
            dsv4_cuda_free(cb->ctx, cw.w);
            dsv4_cuda_free(cb->ctx, cw.scale);
            l->cw.w = (uint8_t *)*bufs[j] + e * wb;
            l->cw.scale = (uint8_t *)*bufs[3 + j] + e * sb;
            l->borrowed = 1;
        }
    }
    m->next = cb->moes;
    cb->moes = m;
    *out = x;
    if (in_forward)
        dsv4_log(DSV4_LOG_WARN,
                 "cuda: the expert set of %s (%d experts, %.2f GiB) was assembled in a forward, not at load "
                 "(experts_ready was not called): a transient copy and a stream synchronisation mid-forward",
                 lin_name(&w1[0]), n_exp, (double)x->bytes / 1073741824.0);
    return DSV4_OK;
}

/* BF16 experts (the dequantised tiny checkpoints): the device table of their
 * weight pointers for cu_moe_generic_bf16, made on first use and kept like
 * an expert set. *F: the expert width. 0 with *out = NULL when the experts
 * are not BF16. */
static int moe_bf16_set(cu_be *cb, const dsv4_linear *w1, const dsv4_linear *w3, const dsv4_linear *w2, int n_exp,
                        const void *const **out, int64_t *F, dsv4_err *err) {
    *out = NULL;
    const cu_lin *l0 = lin_of(&w1[0], "moe_experts", err);
    if (!l0) return DSV4_EINVAL;
    if (l0->f32 || l0->cw.kind != DSV4_CUDA_W_BF16) return DSV4_OK;
    *F = l0->out;
    for (cu_moe *m = cb->moes; m; m = m->next)
        if (m->key == w1 && m->key0 == w1[0].w.data && m->n_exp == n_exp && m->bf16_ptrs) {
            *out = (const void *const *)m->bf16_ptrs;
            return DSV4_OK;
        }
    const void **h = (const void **)calloc((size_t)3 * n_exp, sizeof *h);
    if (!h) return cu_err(err, DSV4_ENOMEM, "cuda: moe_experts: out of memory");
    int rc = DSV4_OK;
    for (int e = 0; e < n_exp && !rc; e++) {
        const dsv4_linear *ws[3] = {&w1[e], &w3[e], &w2[e]};
        for (int j = 0; j < 3 && !rc; j++) {
            const cu_lin *l = lin_of(ws[j], "moe_experts", err);
            int64_t eo = j == 2 ? l0->in : l0->out, ei = j == 2 ? l0->out : l0->in;
            if (!l) rc = DSV4_EINVAL;
            else if (l->f32 || l->cw.kind != DSV4_CUDA_W_BF16 || l->out != eo || l->in != ei)
                rc = cu_err(err, DSV4_EINVAL, "cuda: moe_experts: expert %d %s is not BF16 [%lld, %lld] like expert 0",
                            e, lin_name(ws[j]), (long long)eo, (long long)ei);
            else h[(size_t)j * n_exp + e] = l->cw.w;
        }
    }
    cu_moe *m = rc ? NULL : (cu_moe *)calloc(1, sizeof *m);
    if (!rc && !m) rc = cu_err(err, DSV4_ENOMEM, "cuda: moe_experts: out of memory");
    if (!rc) rc = dsv4_cuda_alloc(cb->ctx, (size_t)3 * n_exp * sizeof *h, &m->bf16_ptrs, err);
    if (!rc) rc = dsv4_cuda_upload(cb->ctx, m->bf16_ptrs, h, (size_t)3 * n_exp * sizeof *h, err);
    free(h);
    if (rc) {
        if (m) dsv4_cuda_free(cb->ctx, m->bf16_ptrs);
        free(m);
        return rc;
    }
    m->key = w1;
    m->key0 = w1[0].w.data;
    m->n_exp = n_exp;
    m->next = cb->moes;
    cb->moes = m;
    *out = (const void *const *)m->bf16_ptrs;
    return DSV4_OK;
}

static int cu_moe_experts(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1, const dsv4_linear *w3,
                          const dsv4_linear *w2, int n_exp, const dsv4_buf *ids, const dsv4_buf *weights, float limit,
                          dsv4_buf *y, dsv4_err *err) {
    cu_be *cb = cube(be);
    int rc = cu_be_check(x, DSV4_DT_F32, -1, -1, "moe x", err);
    if (rc) return rc;
    int64_t T = x->rows, d = x->cols;
    rc = cu_be_check(ids, DSV4_DT_I32, T, -1, "moe ids", err);
    if (!rc) rc = cu_be_check(weights, DSV4_DT_F32, T, ids->cols, "moe weights", err);
    if (!rc) rc = cu_be_check(y, DSV4_DT_F32, T, d, "moe y", err);
    if (!rc && n_exp <= 0) rc = cu_err(err, DSV4_EINVAL, "cuda: moe_experts: %d experts", n_exp);
    if (rc) return rc;
    const void *const *tab = NULL;
    int64_t F = 0;
    if ((rc = moe_bf16_set(cb, w1, w3, w2, n_exp, &tab, &F, err))) return rc;
    if (tab) { /* BF16 experts: no activation quantisation in either numerics (cpu_linear.c) */
        if (w1[0].in != d)
            return cu_err(err, DSV4_EINVAL, "cuda: moe_experts: x has %lld columns, experts %lld", (long long)d,
                          (long long)w1[0].in);
        return cu_moe_generic_bf16(cb->ctx, tab, tab + n_exp, tab + 2 * n_exp, n_exp, (const float *)x->data, T, d,
                                   F, (const int32_t *)ids->data, (const float *)weights->data, (int)ids->cols, limit,
                                   (float *)y->data, err);
    }
    if (be->numerics != DSV4_NUMERICS_REFERENCE)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_experts: HF numerics (no W8A8) not implemented");
    if (limit != 10.0f)
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: moe_experts: swiglu limit %g (the kernel has 10)", (double)limit);
    const dsv4_cuda_experts *ex = NULL;
    if ((rc = moe_set(cb, w1, w3, w2, n_exp, 1, &ex, err))) return rc;
    if (ex->d_model != d) return cu_err(err, DSV4_EINVAL, "cuda: moe_experts: x has %lld columns, experts %lld",
                                        (long long)d, (long long)ex->d_model);
    /* ids outside [0, n_exp) are skipped by the kernel (the CPU reference rejects them).
     * The kernel groups at most 65536 (token, expert) entries per call, so a
     * longer chunk runs as consecutive row ranges: rows are independent, and
     * the calls are stream-ordered on one workspace. One call per prefill
     * chunk gives the grouped GEMM the most rows per expert (cuda_moe.cu). */
    /* fp32 intermediates like the CPU reference; DSV4_CUDA_MOE_BF16=1 in the
     * environment selects the official bf16 storage (for measuring the gap). */
    static int moe_flags = -1;
    if (moe_flags < 0) {
        const char *ev = getenv("DSV4_CUDA_MOE_BF16");
        moe_flags = ev && *ev && strcmp(ev, "0") ? DSV4_CUDA_MOE_BF16 : 0;
    }
    const int64_t k = ids->cols, per = k > 0 ? (int64_t)65536 / k : T;
    for (int64_t r0 = 0; r0 < T && !rc; r0 += per) {
        int64_t n = T - r0 < per ? T - r0 : per;
        rc = dsv4_cuda_moe(cb->ctx, ex, (const float *)x->data + r0 * d, (int)n, (const int32_t *)ids->data + r0 * k,
                           (const float *)weights->data + r0 * k, (int)k, NULL, (float *)y->data + r0 * d, moe_flags, err);
    }
    return rc;
}

/* backend.h experts_ready: a block's expert set (FP4) or BF16 pointer table,
 * made at load time (see the banner) so that moe_experts only finds it. */
static int cu_experts_ready(dsv4_backend *be, const dsv4_linear *w1, const dsv4_linear *w3, const dsv4_linear *w2,
                            int n_exp, dsv4_err *err) {
    cu_be *cb = cube(be);
    if (!w1 || !w3 || !w2 || n_exp <= 0)
        return cu_err(err, DSV4_EINVAL, "cuda: experts_ready: %d experts (or missing arrays)", n_exp);
    const void *const *tab = NULL;
    int64_t F = 0;
    int rc = moe_bf16_set(cb, w1, w3, w2, n_exp, &tab, &F, err);
    if (rc || tab) return rc;
    const cu_lin *l0 = lin_of(&w1[0], "experts_ready", err);
    if (!l0) return DSV4_EINVAL;
    if (l0->f32 || l0->cw.kind != DSV4_CUDA_W_FP4) return DSV4_OK; /* moe_experts refuses these, as before */
    const dsv4_cuda_experts *ex = NULL;
    rc = moe_set(cb, w1, w3, w2, n_exp, 0, &ex, err);
    if (rc == DSV4_EUNSUPPORTED) { /* a set the kernel cannot run: left to moe_experts to report, as before */
        dsv4_err_clear(err);
        return DSV4_OK;
    }
    return rc;
}

/* ------------------------------------------------------------------ create */

extern "C" dsv4_backend *dsv4_backend_cuda_create(dsv4_numerics numerics, int device, dsv4_err *err) {
    dsv4_backend *be = (dsv4_backend *)calloc(1, sizeof *be);
    cu_be *cb = (cu_be *)calloc(1, sizeof *cb);
    if (!be || !cb) {
        free(be);
        free(cb);
        cu_err(err, DSV4_ENOMEM, "cuda backend: out of memory");
        return NULL;
    }
    if (dsv4_cuda_ctx_create(device, &cb->ctx, err)) {
        free(be);
        free(cb);
        return NULL;
    }
    /* Keep memory freed by buf_free in the device pool (never trimmed at sync
     * points), so steady-state forwards allocate scratch without the driver. */
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    /* the deferred-error flags, then k_hc_fused's row counters (cuda_be_ops.cu), one allocation */
    void *flags = NULL;
    const size_t fbytes = sizeof(int) + CU_HC_CNT * sizeof(unsigned);
    int frc = dsv4_cuda_alloc(cb->ctx, fbytes, &flags, err);
    if (!frc && cudaMemset(flags, 0, fbytes) != cudaSuccess)
        frc = cu_err(err, DSV4_EBACKEND, "cuda backend: clearing the flags failed");
    if (frc) {
        dsv4_cuda_free(cb->ctx, flags);
        dsv4_cuda_ctx_free(cb->ctx);
        free(be);
        free(cb);
        return NULL;
    }
    cb->d_flags = (int *)flags;
    cb->d_hc_cnt = (unsigned *)((int *)flags + 1);
    snprintf(cb->name, sizeof cb->name, "cuda:%d", device);
    be->name = cb->name;
    be->numerics = numerics;
    be->act_dtype = DSV4_DT_F32;
    be->ctx = cb;
    be->stream = cb->ctx->stream; /* NCCL collectives of tensor parallelism queue here (comm_nccl.c) */
    be->free = cu_be_free;
    be->buf_alloc = cu_buf_alloc;
    be->buf_free = cu_buf_free;
    be->buf_alloc_scratch = cu_buf_alloc_scratch;
    be->mem_info = cu_mem_info;
    be->buf_write = cu_buf_write;
    be->buf_read = cu_buf_read;
    be->buf_gather_rows = cu_buf_gather_rows;
    be->upload = cu_upload;
    be->upload_linear = cu_upload_linear;
    be->batch_begin = cu_batch_begin;
    be->sync = cu_sync;
    be->embed = cu_be_embed;
    be->add = cu_be_add;
    be->rmsnorm = cu_be_rmsnorm;
    be->rope = cu_be_rope;
    be->rmsnorm_rope = cu_be_rmsnorm_rope;
    be->qat_fp8 = cu_be_qat_fp8;
    be->qat_hadamard_fp4 = cu_be_qat_hadamard_fp4;
    be->rmsnorm_rope_qat_fp8 = cu_be_rmsnorm_rope_qat_fp8;
    be->rope_qat_hadamard_fp4 = cu_be_rope_qat_hadamard_fp4;
    be->linear = cu_linear;
    be->linear_grouped = cu_linear_grouped;
    be->linear_multi = cu_linear_multi;
    be->hc_pre = cu_be_hc_pre;
    be->hc_pre_norm = cu_be_hc_pre_norm;
    be->hc_post = cu_be_hc_post;
    be->hc_post_pre_norm = cu_be_hc_post_pre_norm;
    be->hc_head = cu_be_hc_head;
    be->win_store = cu_be_win_store;
    be->compress = cu_be_compress;
    be->indexer_select = cu_be_indexer_select;
    be->attention = cu_be_attention;
    be->attention_rope = cu_be_attention_rope;
    be->moe_route = cu_moe_route;
    be->moe_experts = cu_moe_experts;
    be->experts_ready = cu_experts_ready;
    be->swiglu = cu_be_swiglu;
    be->linear_swiglu_add = cu_linear_swiglu_add;
    be->hc_mean = cu_hc_mean;
    be->logit_top = cu_be_logit_top;
    be->graph_begin = cu_graph_begin;
    be->graph_end = cu_graph_end;
    be->graph_launch = cu_graph_launch;
    be->graph_free = cu_graph_free;
    cb->be = be;
    be->fill_dummy = cu_be_fill_dummy;
    be->fill_dummy_linear = cu_be_fill_dummy_linear;
    cu_op_profile_install(be); /* DSV4_CUDA_OP_PROFILE=1 or 2 only */
    return be;
}
