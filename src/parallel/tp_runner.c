/*
 * The in-process tensor-parallel runner (tp_runner.h): a job board that makes
 * every rank run the same runner call on the same host batch.
 *
 * Why a generation-counted job board and not a queue: the engine makes one
 * call at a time and waits for it, so there is exactly one job in flight;
 * workers wait for the generation to move, run the job on their own model
 * runner, and count down. A rank that fails aborts the communicator so the
 * others, possibly blocked in an all-reduce, return instead of hanging; the
 * step then fails with the FIRST failing rank's message (the others only say
 * "aborted") and the local communicator is re-armed for the next step.
 *
 * GPU ranks (--device cuda, or auto on a host with enough GPUs): rank r
 * drives GPU r. Its model runner is opened, used and freed only on its own
 * thread (rank 0: whichever thread calls the runner, bound to GPU 0 before
 * every job), and the ranks are joined by NCCL communicators made in this
 * process with ncclCommInitAll; their collectives are queued on each rank's
 * backend stream (comm_nccl.c), so ranks run their steps without host
 * synchronisation and capture CUDA graphs that contain the collectives. The
 * communicators are destroyed on the ranks' threads at the same time (an
 * NCCL destroy may wait for its peers).
 */
#include "parallel/tp_runner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/forward.h"
#include "parallel/tp_shard.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

enum { JOB_OPEN = 1, JOB_FORWARD, JOB_TARGET, JOB_BENCH, JOB_RELEASE, JOB_RESUME, JOB_COPY, JOB_PAGES, JOB_CLOSE, JOB_QUIT };

typedef struct tp_rank {
    struct dsv4_tp_runner *t;
    int rank;
    pthread_t thread;
    int started;
    dsv4_model_runner *mr;
    dsv4_runner it;
    float *logits; /* ranks >= 1: private logits for the rank check */
    size_t logits_cap;
    int rc;
    dsv4_err err;
    double bench_us; /* JOB_BENCH: mean µs per all-reduce on this rank */
    int bench_path;  /* 1: the one-shot path ran */
} tp_rank;

struct dsv4_tp_runner {
    int n, check, local;
    int gpu; /* rank r runs on GPU r (CUDA backends, NCCL communicators) */
    dsv4_comm **comms;
    tp_rank *ranks;
    const char *dir;
    dsv4_model_runner_opts mo;
    dsv4_load_opts lo;
    int has_lo;
    dsv4_runner it0;
    /* the job board */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    unsigned gen;
    int pending, first_fail;
    struct {
        int op;
        const dsv4_batch *b;
        const int32_t *rows;
        int n_logits;
        int slot, src, dst, n_ids;
        const int32_t *ids;
        int64_t pos;
        int64_t ar_rows, ar_cols;
        int iters, oneshot;
    } job;
};

static void note_fail(dsv4_tp_runner *t, tp_rank *r) {
    pthread_mutex_lock(&t->mu);
    if (t->first_fail < 0) t->first_fail = r->rank;
    pthread_mutex_unlock(&t->mu);
    if (t->comms && t->comms[r->rank]) t->comms[r->rank]->abort(t->comms[r->rank]);
}

/* The bare target forward (no drafter bookkeeping): what `dsv4 perf` times. */
static int target_forward(tp_rank *r, const dsv4_batch *b, const int32_t *rows, int n, float *logits, dsv4_err *err) {
    struct dsv4_model *m;
    struct dsv4_state *st;
    dsv4_model_runner_target(r->mr, &m, &st);
    return dsv4_forward(m, st, b, rows, n, logits, NULL, err);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One rank of dsv4_tp_runner_bench_all_reduce: check one sum, then time back-to-back calls. */
static int bench_rank(dsv4_tp_runner *t, tp_rank *r, dsv4_err *err) {
    dsv4_backend *be = dsv4_model_runner_backend(r->mr);
    dsv4_comm *c = t->comms[r->rank];
    int64_t rows = t->job.ar_rows, cols = t->job.ar_cols;
    size_t n = (size_t)(rows * cols);
    r->bench_path = dsv4_comm_nccl_set_oneshot(c, t->job.oneshot) && (int64_t)n <= dsv4_comm_nccl_oneshot_max(c);
    dsv4_buf b = {0};
    float *h = malloc(n * sizeof(float));
    int rc = h ? be->buf_alloc(be, DSV4_DT_F32, rows, cols, &b, err) : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) h[i] = (float)(r->rank + 1) * (float)(1 + i % 7);
    if (!rc) rc = be->buf_write(be, &b, h, err);
    if (!rc) rc = c->all_reduce_sum(c, be, &b, err);
    if (!rc) rc = be->buf_read(be, &b, h, err);
    float S = (float)(t->n * (t->n + 1) / 2);
    for (size_t i = 0; !rc && i < n; i++)
        if (h[i] != S * (float)(1 + i % 7))
            rc = dsv4_err_set(err, DSV4_EINTERNAL, "all-reduce check: element %zu is %g, want %g", i, (double)h[i],
                              (double)(S * (float)(1 + i % 7)));
    if (!rc) {
        memset(h, 0, n * sizeof(float));
        rc = be->buf_write(be, &b, h, err);
    }
    for (int i = 0; i < 10 && !rc; i++) rc = c->all_reduce_sum(c, be, &b, err);
    if (!rc) rc = be->sync(be, err);
    double t0 = now_s();
    for (int i = 0; i < t->job.iters && !rc; i++) rc = c->all_reduce_sum(c, be, &b, err);
    if (!rc) rc = be->sync(be, err);
    r->bench_us = (now_s() - t0) * 1e6 / (t->job.iters > 0 ? t->job.iters : 1);
    be->buf_free(be, &b);
    free(h);
    dsv4_comm_nccl_set_oneshot(c, 1); /* back to the default: one-shot when it was set up */
    return rc;
}

/* Run the current job on rank r (any thread). */
static void run_job(dsv4_tp_runner *t, tp_rank *r, float *logits0) {
    dsv4_err_clear(&r->err);
    r->rc = 0;
#ifdef DSV4_HAVE_CUDA
    if (t->gpu && t->job.op != JOB_QUIT && (r->rc = dsv4_cuda_bind(r->rank, &r->err))) {
        note_fail(t, r);
        return;
    }
#endif
    switch (t->job.op) {
    case JOB_OPEN: {
        dsv4_model_runner_opts mo = t->mo;
        if (t->gpu) {
            mo.device = DSV4_DEVICE_CUDA;
            mo.device_index = r->rank;
        }
        r->rc = dsv4_model_runner_open_tp(t->dir, &mo, t->has_lo ? &t->lo : NULL, r->rank, t->n, t->comms[r->rank],
                                          &r->mr, &r->err);
        if (!r->rc) r->it = dsv4_model_runner_iface(r->mr);
        break;
    }
    case JOB_BENCH:
        r->rc = bench_rank(t, r, &r->err);
        break;
    case JOB_CLOSE: /* on the rank's own thread: its GPU, and NCCL destroys side by side */
        dsv4_model_runner_free(r->mr);
        r->mr = NULL;
        if (!t->local && t->comms && t->comms[r->rank]) {
            t->comms[r->rank]->free(t->comms[r->rank]);
            t->comms[r->rank] = NULL;
        }
        return;
    case JOB_TARGET:
    case JOB_FORWARD: {
        int nl = t->job.n_logits;
        float *lg = logits0;
        if (r->rank > 0) { /* every rank runs the head: its vocabulary block is all-gathered */
            size_t need = (size_t)nl * (size_t)r->it.vocab;
            if (need > r->logits_cap) {
                float *p = realloc(r->logits, need * sizeof(float));
                if (!p) {
                    r->rc = dsv4_err_set(&r->err, DSV4_ENOMEM, "out of memory for logits");
                    break;
                }
                r->logits = p;
                r->logits_cap = need;
            }
            lg = r->logits;
        }
        if (t->job.op == JOB_TARGET) r->rc = target_forward(r, t->job.b, t->job.rows, nl, lg, &r->err);
        else r->rc = r->it.forward(r->it.ctx, t->job.b, t->job.rows, nl, lg, &r->err);
        break;
    }
    case JOB_RELEASE:
        r->it.release(r->it.ctx, t->job.slot);
        break;
    case JOB_RESUME:
        if (r->it.resume) r->rc = r->it.resume(r->it.ctx, t->job.slot, t->job.pos, &r->err);
        break;
    case JOB_COPY:
        if (r->it.copy_slot) r->rc = r->it.copy_slot(r->it.ctx, t->job.src, t->job.dst, &r->err);
        break;
    case JOB_PAGES:
        r->rc = r->it.set_pages(r->it.ctx, t->job.slot, t->job.n_ids, t->job.ids, &r->err);
        break;
    default:
        break;
    }
    if (r->rc) note_fail(t, r);
}

static void *worker(void *arg) {
    tp_rank *r = arg;
    dsv4_tp_runner *t = r->t;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->gen == seen) pthread_cond_wait(&t->cv_job, &t->mu);
        seen = t->gen;
        int op = t->job.op;
        pthread_mutex_unlock(&t->mu);
        if (op == JOB_QUIT) break;
        run_job(t, r, NULL);
        pthread_mutex_lock(&t->mu);
        if (--t->pending == 0) pthread_cond_signal(&t->cv_done);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

/* Post the job (already in t->job) to ranks 1..n-1, run rank 0 here, wait, and fold the errors. */
static int dispatch(dsv4_tp_runner *t, float *logits0, dsv4_err *err) {
    pthread_mutex_lock(&t->mu);
    t->first_fail = -1;
    t->pending = t->n - 1;
    t->gen++;
    pthread_cond_broadcast(&t->cv_job);
    pthread_mutex_unlock(&t->mu);
    run_job(t, &t->ranks[0], logits0);
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) pthread_cond_wait(&t->cv_done, &t->mu);
    int ff = t->first_fail;
    pthread_mutex_unlock(&t->mu);
    if (ff < 0) return 0;
    if (t->local && t->comms) dsv4_comm_local_recover(t->comms[0]);
    tp_rank *r = &t->ranks[ff];
    dsv4_err_set(err, r->rc, "%s", r->err.msg);
    if (t->n > 1) dsv4_err_prefix(err, "rank %d: ", ff);
    return r->rc;
}

/* Every rank's logits must equal rank 0's bit for bit (tp_runner.h check_ranks). */
static int check_logits(dsv4_tp_runner *t, int n_logits, const float *logits, dsv4_err *err) {
    size_t V = (size_t)t->ranks[0].it.vocab, n = (size_t)n_logits * V;
    for (int k = 1; k < t->n; k++) {
        const float *o = t->ranks[k].logits;
        if (!n || !memcmp(o, logits, n * sizeof(float))) continue;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&o[i], &logits[i], sizeof(float)))
                return dsv4_err_set(err, DSV4_EINTERNAL,
                                    "tensor parallel: rank %d logits differ from rank 0 at logit row %zu token %zu "
                                    "(%.9g vs %.9g)",
                                    k, i / V, i % V, (double)o[i], (double)logits[i]);
    }
    return 0;
}

int dsv4_tp_check_batch(int n_slots, int max_len, int vocab, const dsv4_batch *b, const int32_t *rows, int n_logits,
                        dsv4_err *err) {
    if (b->n_rows <= 0) return dsv4_err_set(err, DSV4_EINVAL, "forward: empty batch");
    for (int r = 0; r < b->n_rows; r++) {
        if (b->slot[r] < 0 || b->slot[r] >= n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: row %d: slot %d out of [0,%d)", r, b->slot[r], n_slots);
        if (b->pos[r] < 0 || b->pos[r] >= max_len)
            return dsv4_err_set(err, DSV4_ERANGE, "forward: row %d: position %d beyond max length %d", r, b->pos[r],
                                max_len);
        if (b->token[r] < 0 || b->token[r] >= vocab)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: row %d: token %d outside the vocabulary [0,%d)", r,
                                b->token[r], vocab);
    }
    for (int i = 0; i < n_logits; i++)
        if (rows[i] < 0 || rows[i] >= b->n_rows)
            return dsv4_err_set(err, DSV4_EINVAL, "forward: logit row %d out of [0,%d)", rows[i], b->n_rows);
    return 0;
}

static int tp_forward(void *ctx, const dsv4_batch *b, const int32_t *rows, int n_logits, float *logits,
                      dsv4_err *err) {
    dsv4_tp_runner *t = ctx;
    int rc = dsv4_tp_check_batch(t->mo.n_slots, t->mo.max_len, t->it0.vocab, b, rows, n_logits, err);
    if (rc) return rc;
    t->job.op = JOB_FORWARD;
    t->job.b = b;
    t->job.rows = rows;
    t->job.n_logits = n_logits;
    rc = dispatch(t, logits, err);
    if (!rc && t->check) rc = check_logits(t, n_logits, logits, err);
    return rc;
}

int dsv4_tp_runner_forward_target(dsv4_tp_runner *t, const dsv4_batch *b, const int32_t *rows, int n_logits,
                                  float *logits, dsv4_err *err) {
    int rc = dsv4_tp_check_batch(t->mo.n_slots, t->mo.max_len, t->it0.vocab, b, rows, n_logits, err);
    if (rc) return rc;
    t->job.op = JOB_TARGET;
    t->job.b = b;
    t->job.rows = rows;
    t->job.n_logits = n_logits;
    rc = dispatch(t, logits, err);
    if (!rc && t->check) rc = check_logits(t, n_logits, logits, err);
    return rc;
}

int dsv4_tp_runner_bench_all_reduce(dsv4_tp_runner *t, int64_t rows, int64_t cols, int iters, int oneshot,
                                    double *us, int *used_oneshot, dsv4_err *err) {
    if (rows < 1 || cols < 1 || iters < 1) return dsv4_err_set(err, DSV4_EINVAL, "all-reduce bench: bad sizes");
    t->job.op = JOB_BENCH;
    t->job.ar_rows = rows;
    t->job.ar_cols = cols;
    t->job.iters = iters;
    t->job.oneshot = oneshot;
    int rc = dispatch(t, NULL, err);
    if (rc) return rc;
    double m = 0;
    for (int i = 0; i < t->n; i++) m = t->ranks[i].bench_us > m ? t->ranks[i].bench_us : m;
    *us = m;
    *used_oneshot = t->ranks[0].bench_path;
    return 0;
}

static void tp_release(void *ctx, int slot) {
    dsv4_tp_runner *t = ctx;
    dsv4_err err = {0};
    t->job.op = JOB_RELEASE;
    t->job.slot = slot;
    dispatch(t, NULL, &err);
}

/* A query: rank 0 answers (every rank holds the same positions). */
static int64_t tp_reusable(void *ctx, int slot, int64_t committed, int64_t want, int64_t n_new) {
    dsv4_tp_runner *t = ctx;
    return t->it0.reusable(t->it0.ctx, slot, committed, want, n_new);
}

static int tp_resume(void *ctx, int slot, int64_t pos, dsv4_err *err) {
    dsv4_tp_runner *t = ctx;
    t->job.op = JOB_RESUME;
    t->job.slot = slot;
    t->job.pos = pos;
    return dispatch(t, NULL, err);
}

static int tp_copy_slot(void *ctx, int src, int dst, dsv4_err *err) {
    dsv4_tp_runner *t = ctx;
    t->job.op = JOB_COPY;
    t->job.src = src;
    t->job.dst = dst;
    return dispatch(t, NULL, err);
}

/* Every rank holds the same pool (same sizes, same ids): the engine's mapping goes to all of them. */
static int tp_set_pages(void *ctx, int slot, int n, const int32_t *ids, dsv4_err *err) {
    dsv4_tp_runner *t = ctx;
    t->job.op = JOB_PAGES;
    t->job.slot = slot;
    t->job.n_ids = n;
    t->job.ids = ids;
    return dispatch(t, NULL, err);
}

void dsv4_tp_runner_free(dsv4_tp_runner *t) {
    if (!t) return;
    int started = 0, all = 1;
    for (int i = 1; i < t->n; i++) {
        started |= t->ranks[i].started;
        all &= t->ranks[i].started;
    }
    if (started) {
        if (all) { /* every rank frees its runner (and NCCL handle) on its own thread */
            dsv4_err e = {0};
            t->job.op = JOB_CLOSE;
            dispatch(t, NULL, &e);
        }
        pthread_mutex_lock(&t->mu);
        t->job.op = JOB_QUIT;
        t->gen++;
        pthread_cond_broadcast(&t->cv_job);
        pthread_mutex_unlock(&t->mu);
        for (int i = 1; i < t->n; i++)
            if (t->ranks[i].started) pthread_join(t->ranks[i].thread, NULL);
    }
    for (int i = 0; i < t->n; i++) {
        dsv4_model_runner_free(t->ranks[i].mr);
        free(t->ranks[i].logits);
    }
    if (t->comms)
        for (int i = 0; i < t->n; i++)
            if (t->comms[i]) t->comms[i]->free(t->comms[i]);
    free(t->comms);
    free(t->ranks);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    free(t);
}

/*
 * Which ranks: GPUs (1) or CPU threads (0), for o->device and n ranks.
 * CUDA needs n visible GPUs (a clear error otherwise); AUTO takes the GPUs
 * when there are enough, else CPU ranks with a log line saying why.
 */
static int pick_gpu(const dsv4_model_runner_opts *o, int n, int *gpu, dsv4_err *err) {
    *gpu = 0;
    if (o->device == DSV4_DEVICE_CPU) return 0;
#ifdef DSV4_HAVE_CUDA
    dsv4_err ce = {0};
    int have = dsv4_cuda_device_count(&ce);
    if (have >= n) {
        *gpu = 1;
        dsv4_log(DSV4_LOG_INFO, "tensor parallel: %d ranks on GPUs 0..%d (NCCL)", n, n - 1);
        return 0;
    }
    if (o->device == DSV4_DEVICE_CUDA) {
        if (have < 0) return dsv4_err_set(err, DSV4_EBACKEND, "--device cuda: %s", ce.msg);
        return dsv4_err_set(err, DSV4_EINVAL,
                            "--tensor-parallel-size %d with --device cuda needs %d GPUs, but this host has %d visible "
                            "(check CUDA_VISIBLE_DEVICES, or lower --tensor-parallel-size)",
                            n, n, have);
    }
    dsv4_log(DSV4_LOG_INFO, "tensor parallel: %d CPU ranks (--device auto: %d GPU%s visible)", n, have < 0 ? 0 : have,
             have == 1 ? "" : "s");
    return 0;
#else
    if (o->device == DSV4_DEVICE_CUDA)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "--device cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
    (void)n;
    return 0;
#endif
}

int dsv4_tp_runner_open(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                        const dsv4_tp_runner_opts *tp, dsv4_tp_runner **out, dsv4_err *err) {
    *out = NULL;
    int n = tp->tp_size, rc = 0;
    dsv4_config cfg;
    dsv4_tp_runner *t = NULL;
    if (n < 1 || n > 64) rc = dsv4_err_set(err, DSV4_EINVAL, "--tensor-parallel-size %d outside [1,64]", n);
    if (!rc && !(rc = dsv4_config_load_ex(dir, lo ? lo->hf_overrides : NULL, &cfg, err))) rc = dsv4_tp_check(&cfg, n, err);
    if (rc && n >= 1 && n <= 64) dsv4_err_prefix(err, "%s: ", dir);
    int gpu = 0;
    if (!rc && !tp->comms) rc = pick_gpu(o, n, &gpu, err);
    if (!rc && !(t = calloc(1, sizeof *t))) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (rc) { /* the caller's communicators are ours whatever happens */
        for (int i = 0; tp->comms && i < n && i < 64; i++)
            if (tp->comms[i]) tp->comms[i]->free(tp->comms[i]);
        return rc;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_job, NULL);
    pthread_cond_init(&t->cv_done, NULL);
    t->n = n;
    t->gpu = gpu;
    t->check = tp->check_ranks;
    if (!t->check && getenv("DSV4_TP_CHECK_RANKS") && strcmp(getenv("DSV4_TP_CHECK_RANKS"), "0")) t->check = 1;
    t->dir = dir;
    t->mo = *o;
    if (lo) {
        t->lo = *lo;
        t->has_lo = 1;
    }
    t->ranks = calloc((size_t)n, sizeof *t->ranks);
    t->comms = calloc((size_t)n, sizeof *t->comms);
    if (!t->ranks || !t->comms) {
        for (int i = 0; tp->comms && i < n; i++)
            if (tp->comms[i]) tp->comms[i]->free(tp->comms[i]);
        dsv4_tp_runner_free(t);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    if (tp->comms) {
        memcpy(t->comms, tp->comms, sizeof(dsv4_comm *) * (size_t)n);
    } else if (gpu) {
        if ((rc = dsv4_comm_nccl_create_all(n, t->comms, err))) {
            dsv4_err_prefix(err, "tensor parallel over %d GPUs: ", n);
            dsv4_tp_runner_free(t);
            return rc;
        }
    } else {
        t->local = 1;
        if ((rc = dsv4_comm_local_create(n, t->comms, err))) {
            dsv4_tp_runner_free(t);
            return rc;
        }
    }
    for (int i = 0; i < n; i++) {
        t->ranks[i].t = t;
        t->ranks[i].rank = i;
    }
    for (int i = 1; i < n; i++) {
        if (pthread_create(&t->ranks[i].thread, NULL, worker, &t->ranks[i])) {
            dsv4_tp_runner_free(t);
            return dsv4_err_set(err, DSV4_ENOMEM, "tensor parallel: cannot start the worker of rank %d", i);
        }
        t->ranks[i].started = 1;
    }
    t->job.op = JOB_OPEN;
    if ((rc = dispatch(t, NULL, err))) {
        dsv4_tp_runner_free(t);
        return rc;
    }
    t->it0 = t->ranks[0].it;
    for (int i = 1; i < n; i++) /* the engine maps pages once for all ranks: their pools must agree */
        if (t->ranks[i].it.page_tokens != t->it0.page_tokens || t->ranks[i].it.n_pages != t->it0.n_pages) {
            rc = dsv4_err_set(err, DSV4_EINTERNAL,
                              "tensor parallel: rank %d's KV pool (%d pages of %d) differs from rank 0's (%d of %d)", i,
                              t->ranks[i].it.n_pages, t->ranks[i].it.page_tokens, t->it0.n_pages, t->it0.page_tokens);
            dsv4_tp_runner_free(t);
            return rc;
        }
    *out = t;
    return 0;
}

dsv4_runner dsv4_tp_runner_iface(dsv4_tp_runner *t) {
    /* the pool: rank 0's sizes (every rank's are the same), set_pages forwarded to every rank */
    dsv4_runner r = {.ctx = t,
                     .vocab = t->it0.vocab,
                     .n_slots = t->it0.n_slots,
                     .forward = tp_forward,
                     .release = tp_release,
                     .reusable = t->it0.reusable ? tp_reusable : NULL,
                     .resume = tp_resume,
                     .copy_slot = tp_copy_slot};
    if (t->it0.set_pages) {
        r.page_tokens = t->it0.page_tokens;
        r.n_pages = t->it0.n_pages;
        r.page_bytes = t->it0.page_bytes;
        r.set_pages = tp_set_pages;
    }
    return r;
}

int dsv4_tp_runner_drafter(dsv4_tp_runner *t, dsv4_drafter *out) { return dsv4_model_runner_drafter(t->ranks[0].mr, out); }

const dsv4_config *dsv4_tp_runner_config(const dsv4_tp_runner *t) { return dsv4_model_runner_config(t->ranks[0].mr); }

dsv4_backend *dsv4_tp_runner_backend(dsv4_tp_runner *t, int rank) {
    if (!t || rank < 0 || rank >= t->n || !t->ranks[rank].mr) return NULL;
    return dsv4_model_runner_backend(t->ranks[rank].mr);
}
