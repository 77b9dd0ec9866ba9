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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/forward.h"
#include "parallel/ar_bench.h"
#include "parallel/tp_shard.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

enum { JOB_OPEN = 1, JOB_FORWARD, JOB_TARGET, JOB_BENCH, JOB_RELEASE, JOB_RESUME, JOB_COPY, JOB_PAGES, JOB_CLOSE, JOB_QUIT,
       JOB_WARMUP };
static const char *const job_names[] = {"?",    "open",   "forward", "target", "bench", "release",
                                        "resume", "copy", "pages",   "close",  "quit",  "warmup"};

/*
 * The communicator a rank's model sees: the rank's own, with the collectives
 * its thread enters and returns from counted (host side: for NCCL, the
 * enqueue). Why: when a step hangs, the counts say which rank stopped
 * launching — a rank that entered fewer collectives than its peers is stuck
 * outside one (compute, or a CUDA call), while the peers wait for it inside
 * one (the watchdog and DSV4_TP_TRACE print them). Replayed CUDA graphs call
 * no host code, so their collectives are not counted.
 */
typedef struct counted {
    dsv4_comm c;
    dsv4_comm *in;
    int entered, left;
} counted;

static int ct_enter(counted *k) { return __atomic_add_fetch(&k->entered, 1, __ATOMIC_RELAXED); }
static int ct_leave(counted *k, int rc) {
    __atomic_add_fetch(&k->left, 1, __ATOMIC_RELAXED);
    return rc;
}
static int ct_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *b, dsv4_err *err) {
    counted *k = (counted *)c;
    ct_enter(k);
    return ct_leave(k, k->in->all_reduce_sum(k->in, be, b, err));
}
static int ct_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *i, dsv4_buf *o, dsv4_err *err) {
    counted *k = (counted *)c;
    ct_enter(k);
    return ct_leave(k, k->in->all_gather(k->in, be, i, o, err));
}
static int ct_bcast(dsv4_comm *c, void *h, size_t n, int root, dsv4_err *err) {
    counted *k = (counted *)c;
    ct_enter(k);
    return ct_leave(k, k->in->broadcast(k->in, h, n, root, err));
}
static int ct_barrier(dsv4_comm *c, dsv4_err *err) {
    counted *k = (counted *)c;
    ct_enter(k);
    return ct_leave(k, k->in->barrier(k->in, err));
}
static void ct_abort(dsv4_comm *c) { ((counted *)c)->in->abort(((counted *)c)->in); }
static void ct_free(dsv4_comm *c) { free(c); } /* the inner handle is the runner's (t->comms) */

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
    dsv4_ar_bench bench; /* JOB_BENCH: this rank's times and check */
    int warm_graphs; /* JOB_WARMUP: graphs this rank captured */
    int bench_path;  /* 1: the one-shot path ran */
    /* diagnostics (watchdog, DSV4_TP_TRACE) */
    counted *cc;              /* the communicator this rank's model uses */
    struct dsv4_model *model; /* its target model (last_path), while open */
    int busy;                 /* running the current job (atomic) */
    int ent0, left0;          /* cc counts when the job started */
    double ms;                /* the last job's time on this rank */
} tp_rank;

struct dsv4_tp_runner {
    int n, check, local;
    int rank0, world; /* this process holds global ranks rank0 .. rank0+n-1 of world (one node of several) */
    int gpu; /* rank r runs on GPU r (CUDA backends, NCCL communicators) */
    dsv4_comm **comms;
    tp_rank *ranks;
    const char *dir;
    dsv4_model_runner_opts mo;
    dsv4_load_opts lo;
    int has_lo;
    dsv4_runner it0;
    /* diagnostics: DSV4_TP_TRACE=1 logs every job per rank; the watchdog thread
     * logs which ranks have not finished a job after wd_s seconds (then 2x, 4x...) */
    int trace;
    double wd_s;
    int wd_started, wd_stop, wd_reports, job_running;
    pthread_t wd;
    pthread_cond_t cv_wd;
    unsigned job_no;
    double job_t0;
    char job_desc[160];
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
        dsv4_dtype ar_dtype;
    } job;
};

/*
 * A rank failed: abort EVERY rank's communicator, not only the failing one's.
 * Why: with NCCL each rank holds its own communicator, and a peer already
 * waiting inside a collective (possibly inside a replayed CUDA graph) only
 * returns when its own communicator is aborted; aborting just the failing
 * rank's handle left the peers spinning forever (a step that never ends is a
 * hung request, with no message). All ranks live in this process, so the
 * failing thread can reach them. The error is logged here, at once, because
 * the caller only sees it after every rank has returned.
 */
static void note_fail(dsv4_tp_runner *t, tp_rank *r) {
    pthread_mutex_lock(&t->mu);
    int first = t->first_fail < 0;
    if (first) t->first_fail = r->rank;
    pthread_mutex_unlock(&t->mu);
    if (first) dsv4_log(DSV4_LOG_ERROR, "tensor parallel: rank %d failed: %s", t->rank0 + r->rank, r->err.msg);
    for (int i = 0; t->comms && i < t->n; i++)
        if (t->comms[i]) t->comms[i]->abort(t->comms[i]);
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

/* One rank of dsv4_tp_runner_bench_all_reduce (parallel/ar_bench.c), on the path the job asks for. */
static int bench_rank(dsv4_tp_runner *t, tp_rank *r, dsv4_err *err) {
    dsv4_backend *be = dsv4_model_runner_backend(r->mr);
    dsv4_comm *c = t->comms[r->rank];
    dsv4_ar_bench *b = &r->bench;
    memset(b, 0, sizeof *b);
    b->rows = t->job.ar_rows;
    b->cols = t->job.ar_cols;
    b->dtype = t->job.ar_dtype;
    b->iters = t->job.iters;
    int64_t bytes = b->rows * b->cols * (b->dtype == DSV4_DT_BF16 ? 2 : 4);
    r->bench_path = dsv4_comm_nccl_set_oneshot(c, t->job.oneshot) && bytes <= dsv4_comm_nccl_oneshot_max(c);
    int rc = dsv4_ar_bench_rank(c, be, b, err);
    dsv4_comm_nccl_set_oneshot(c, 1); /* back to the default: one-shot when it was set up */
    return rc;
}

/* Run the current job on rank r (any thread). */
static void run_job_body(dsv4_tp_runner *t, tp_rank *r, float *logits0) {
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
        mo.host_ranks = t->n; /* this process's ranks share its host memory (-tp, or -tp / --nnodes) */
        if (t->gpu) {
            mo.device = DSV4_DEVICE_CUDA;
            mo.device_index = r->rank;
        }
        r->rc = dsv4_model_runner_open_tp(t->dir, &mo, t->has_lo ? &t->lo : NULL, t->rank0 + r->rank, t->world,
                                          &r->cc->c, &r->mr, &r->err);
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
    case JOB_WARMUP: /* every rank captures the same shapes in the same order: their collectives pair up */
        r->rc = dsv4_model_runner_warmup(r->mr, &r->warm_graphs, &r->err);
        break;
    default:
        break;
    }
    if (r->rc) note_fail(t, r);
}

static int job_is_forward(int op) { return op == JOB_FORWARD || op == JOB_TARGET; }

/* The latest forward's graph path of rank r (DSV4_FWD_PATH_*), -1 when closed. */
static int rank_path(const tp_rank *r) {
    return r->model ? __atomic_load_n(&r->model->last_path, __ATOMIC_RELAXED) : -1;
}

static void run_job(dsv4_tp_runner *t, tp_rank *r, float *logits0) {
    if (r->cc) {
        r->ent0 = __atomic_load_n(&r->cc->entered, __ATOMIC_RELAXED);
        r->left0 = __atomic_load_n(&r->cc->left, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&r->busy, 1, __ATOMIC_RELEASE);
    double t0 = now_s();
    run_job_body(t, r, logits0);
    r->ms = (now_s() - t0) * 1e3;
    if (t->job.op == JOB_OPEN && !r->rc && r->mr) {
        struct dsv4_state *st;
        dsv4_model_runner_target(r->mr, &r->model, &st);
    }
    if (t->job.op == JOB_CLOSE) r->model = NULL;
    __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
    if (t->trace && t->job.op != JOB_QUIT) {
        char path[48] = "";
        if (job_is_forward(t->job.op))
            snprintf(path, sizeof path, ", graph path %s", dsv4_fwd_path_name(rank_path(r)));
        dsv4_log(DSV4_LOG_INFO, "tp trace: job #%u %s (%s) rank %d: rc %d in %.2f ms%s, collectives +%d", t->job_no,
                 job_names[t->job.op], t->job_desc, r->rank, r->rc, r->ms, path,
                 r->cc ? __atomic_load_n(&r->cc->left, __ATOMIC_RELAXED) - r->left0 : 0);
    }
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

/* What the current job is, for the trace and the watchdog (engine thread, before posting). */
static void describe_job(dsv4_tp_runner *t, char *d, size_t n) {
    const dsv4_batch *b = t->job.b;
    switch (t->job.op) {
    case JOB_FORWARD:
    case JOB_TARGET:
        snprintf(d, n, "%d rows, %d seqs, %d logit rows; row 0 slot %d pos %d", b->n_rows, b->n_seqs, t->job.n_logits,
                 b->n_rows ? b->slot[0] : -1, b->n_rows ? b->pos[0] : -1);
        break;
    case JOB_RELEASE:
        snprintf(d, n, "slot %d", t->job.slot);
        break;
    case JOB_RESUME:
        snprintf(d, n, "slot %d at %lld", t->job.slot, (long long)t->job.pos);
        break;
    case JOB_COPY:
        snprintf(d, n, "slot %d -> %d", t->job.src, t->job.dst);
        break;
    case JOB_PAGES:
        snprintf(d, n, "slot %d, %d pages", t->job.slot, t->job.n_ids);
        break;
    case JOB_BENCH:
        snprintf(d, n, "%lld x %lld", (long long)t->job.ar_rows, (long long)t->job.ar_cols);
        break;
    default:
        snprintf(d, n, "-");
    }
}

/*
 * After a forward: every rank must have run its collectives the same way —
 * eagerly, inside a graph captured in this very step, or inside the graph
 * captured together earlier (NCCL's rule for graphs with collectives: the
 * choice is collective, and a replay must use the graph of a joint capture).
 * The choice is made per rank from the batch shape, so the ranks agree unless
 * something rank-local intervened (a capture failing on one rank only, a
 * graph invalidated on one rank): say so, naming the ranks.
 */
static int path_class(int p) { return p == DSV4_FWD_PATH_CAPTURE ? 1 : p == DSV4_FWD_PATH_REPLAY ? 2 : 0; }
static const char *const class_names[] = {"eagerly", "as a CUDA graph captured in this step",
                                          "as an earlier-captured CUDA graph"};

static void check_paths(dsv4_tp_runner *t) {
    int p0 = rank_path(&t->ranks[0]), c0 = path_class(p0);
    for (int i = 1; i < t->n; i++) {
        int p = rank_path(&t->ranks[i]), c = path_class(p);
        if (c != c0)
            dsv4_log(DSV4_LOG_ERROR,
                     "tensor parallel: job #%u forward (%s): rank 0 ran it %s (%s), rank %d %s (%s); NCCL needs every "
                     "rank to run a collective the same way, so this or a later step may hang",
                     t->job_no, t->job_desc, class_names[c0], dsv4_fwd_path_name(p0), i, class_names[c],
                     dsv4_fwd_path_name(p));
    }
}

/* Post the job (already in t->job) to ranks 1..n-1, run rank 0 here, wait, and fold the errors. */
static int dispatch(dsv4_tp_runner *t, float *logits0, dsv4_err *err) {
    char desc[sizeof t->job_desc];
    describe_job(t, desc, sizeof desc);
    pthread_mutex_lock(&t->mu);
    t->first_fail = -1;
    t->pending = t->n - 1;
    t->job_no++;
    t->job_t0 = now_s();
    t->job_running = 1;
    t->wd_reports = 0;
    memcpy(t->job_desc, desc, sizeof desc);
    t->gen++;
    pthread_cond_broadcast(&t->cv_job);
    pthread_mutex_unlock(&t->mu);
    run_job(t, &t->ranks[0], logits0);
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) pthread_cond_wait(&t->cv_done, &t->mu);
    int ff = t->first_fail;
    t->job_running = 0;
    pthread_mutex_unlock(&t->mu);
    if (ff < 0 && job_is_forward(t->job.op) && t->n > 1) check_paths(t);
    if (ff < 0) return 0;
    if (t->local && t->comms) dsv4_comm_local_recover(t->comms[0]);
    /* Several nodes: a rank whose failure is only that this process's first rank closed its connection
     * (it aborted the group on seeing another node die) may reach note_fail before that rank does:
     * report the first rank's own failure then, which names the node that died. */
    if (ff != 0 && t->ranks[0].rc && t->world > t->n) {
        char who[48];
        snprintf(who, sizeof who, "rank %d (node ", t->rank0);
        if (strstr(t->ranks[ff].err.msg, who) && strstr(t->ranks[ff].err.msg, "closed the connection")) ff = 0;
    }
    tp_rank *r = &t->ranks[ff];
    dsv4_err_set(err, r->rc, "%s", r->err.msg);
    if (t->world > 1) dsv4_err_prefix(err, "rank %d: ", t->rank0 + ff);
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
                                    t->rank0 + k, i / V, i % V, (double)o[i], (double)logits[i]);
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

/* One forward on every rank (op JOB_FORWARD: the runner call the engine makes; JOB_TARGET: the bare target
 * forward `dsv4 perf` times), checked once on rank 0 before any rank starts. */
static int forward_job(dsv4_tp_runner *t, int op, const dsv4_batch *b, const int32_t *rows, int n_logits,
                       float *logits, dsv4_err *err) {
    int rc = dsv4_tp_check_batch(t->mo.n_slots, t->mo.max_len, t->it0.vocab, b, rows, n_logits, err);
    if (rc) return rc;
    t->job.op = op;
    t->job.b = b;
    t->job.rows = rows;
    t->job.n_logits = n_logits;
    rc = dispatch(t, logits, err);
    if (!rc && t->check) rc = check_logits(t, n_logits, logits, err);
    return rc;
}

static int tp_forward(void *ctx, const dsv4_batch *b, const int32_t *rows, int n_logits, float *logits,
                      dsv4_err *err) {
    return forward_job(ctx, JOB_FORWARD, b, rows, n_logits, logits, err);
}

int dsv4_tp_runner_forward_target(dsv4_tp_runner *t, const dsv4_batch *b, const int32_t *rows, int n_logits,
                                  float *logits, dsv4_err *err) {
    return forward_job(t, JOB_TARGET, b, rows, n_logits, logits, err);
}

int dsv4_tp_runner_bench_all_reduce(dsv4_tp_runner *t, int64_t rows, int64_t cols, dsv4_dtype dt, int iters,
                                    int oneshot, dsv4_tp_ar_result *res, dsv4_err *err) {
    if (rows < 1 || cols < 1 || iters < 1) return dsv4_err_set(err, DSV4_EINVAL, "all-reduce bench: bad sizes");
    t->job.op = JOB_BENCH;
    t->job.ar_rows = rows;
    t->job.ar_cols = cols;
    t->job.ar_dtype = dt;
    t->job.iters = iters;
    t->job.oneshot = oneshot;
    int rc = dispatch(t, NULL, err);
    if (rc) return rc;
    memset(res, 0, sizeof *res);
    res->ranks_equal = 1;
    res->hash = t->ranks[0].bench.hash;
    res->used_oneshot = t->ranks[0].bench_path;
    for (int i = 0; i < t->n; i++) {
        const dsv4_ar_bench *b = &t->ranks[i].bench;
        res->us_eager = b->us_eager > res->us_eager ? b->us_eager : res->us_eager;
        res->us_graph = i == 0 || b->us_graph > res->us_graph ? b->us_graph : res->us_graph;
        res->ranks_equal &= b->hash == res->hash;
        res->bad += b->bad;
        res->checked += b->checked;
    }
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

/* Capture at start (issue 7) on every rank at once; *n_graphs = rank 0's count (the ranks' are equal). */
static int tp_warmup(void *ctx, int *n_graphs, dsv4_err *err) {
    dsv4_tp_runner *t = ctx;
    t->job.op = JOB_WARMUP;
    int rc = dispatch(t, NULL, err);
    *n_graphs = t->ranks[0].warm_graphs;
    for (int i = 1; i < t->n && !rc; i++)
        if (t->ranks[i].warm_graphs != *n_graphs)
            dsv4_log(DSV4_LOG_WARN, "tensor parallel: rank %d holds %d CUDA graphs, rank 0 %d", i,
                     t->ranks[i].warm_graphs, *n_graphs);
    return rc;
}

/*
 * The watchdog: a job (a step) that runs past wd_s seconds is logged once,
 * then again at 2x, 4x, ... that time, with each rank's state: done (its time
 * and rc) or busy, the collectives it entered and returned from in this job,
 * and its latest forward's graph path. A hung step thus names the rank that
 * stopped (fewer collectives entered than its peers) instead of going silent.
 */
static void *watchdog(void *arg) {
    dsv4_tp_runner *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->wd_stop) {
        double tick = t->wd_s / 4 < 0.25 ? t->wd_s / 4 : 0.25;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(tick * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&t->cv_wd, &t->mu, &ts);
        if (t->wd_stop || !t->job_running || t->wd_reports >= 16) continue;
        double el = now_s() - t->job_t0;
        if (el < t->wd_s * (double)(1u << t->wd_reports)) continue;
        t->wd_reports++;
        char msg[2048];
        size_t off = (size_t)snprintf(msg, sizeof msg, "tensor parallel: job #%u %s (%s) not finished after %.1f s:",
                                      t->job_no, job_names[t->job.op], t->job_desc, el);
        for (int i = 0; i < t->n && off < sizeof msg; i++) {
            tp_rank *r = &t->ranks[i];
            int busy = __atomic_load_n(&r->busy, __ATOMIC_ACQUIRE);
            int en = r->cc ? __atomic_load_n(&r->cc->entered, __ATOMIC_RELAXED) - r->ent0 : 0;
            int lf = r->cc ? __atomic_load_n(&r->cc->left, __ATOMIC_RELAXED) - r->left0 : 0;
            if (busy)
                off += (size_t)snprintf(msg + off, sizeof msg - off, " rank %d busy", i);
            else
                off += (size_t)snprintf(msg + off, sizeof msg - off, " rank %d done in %.1f ms rc %d", i, r->ms, r->rc);
            if (off < sizeof msg)
                off += (size_t)snprintf(msg + off, sizeof msg - off, " (collectives %d entered / %d returned%s%s);", en,
                                        lf, job_is_forward(t->job.op) ? ", graph path " : "",
                                        job_is_forward(t->job.op) ? dsv4_fwd_path_name(rank_path(r)) : "");
        }
        pthread_mutex_unlock(&t->mu);
        dsv4_log(DSV4_LOG_WARN, "%s a rank with fewer collectives entered than its peers is stuck outside one (compute "
                                "or a CUDA call) while they wait inside one for it",
                 msg);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

void dsv4_tp_runner_free(dsv4_tp_runner *t) {
    if (!t) return;
    if (t->wd_started) {
        pthread_mutex_lock(&t->mu);
        t->wd_stop = 1;
        pthread_cond_signal(&t->cv_wd);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->wd, NULL);
        t->wd_started = 0;
    }
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
        if (t->ranks[i].cc) ct_free(&t->ranks[i].cc->c);
    }
    if (t->comms)
        for (int i = 0; i < t->n; i++)
            if (t->comms[i]) t->comms[i]->free(t->comms[i]);
    free(t->comms);
    free(t->ranks);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv_job);
    pthread_cond_destroy(&t->cv_done);
    pthread_cond_destroy(&t->cv_wd);
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
    int world = tp->world_size > 0 ? tp->world_size : n, rank0 = tp->world_size > 0 ? tp->first_rank : 0;
    dsv4_config cfg;
    dsv4_tp_runner *t = NULL;
    if (n < 1 || n > 64) rc = dsv4_err_set(err, DSV4_EINVAL, "--tensor-parallel-size %d outside [1,64]", n);
    else if (rank0 < 0 || rank0 + n > world || (world > n && !tp->comms))
        rc = dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: ranks %d..%d of %d%s", rank0, rank0 + n - 1, world,
                          world > n && !tp->comms ? " need the caller's communicators" : "");
    for (int i = 0; !rc && tp->comms && i < n; i++)
        if (!tp->comms[i] || tp->comms[i]->rank != rank0 + i || tp->comms[i]->size != world)
            rc = dsv4_err_set(err, DSV4_EINVAL, "tensor parallel: communicator %d is rank %d of %d, not %d of %d", i,
                              tp->comms[i] ? tp->comms[i]->rank : -1, tp->comms[i] ? tp->comms[i]->size : -1,
                              rank0 + i, world);
    int bad_args = rc != 0;
    if (!rc && !(rc = dsv4_config_load_ex(dir, lo ? lo->hf_overrides : NULL, &cfg, err)))
        rc = dsv4_tp_check(&cfg, world, err);
    if (rc && !bad_args) dsv4_err_prefix(err, "%s: ", dir);
    int gpu = tp->comms && tp->comms_on_gpus;
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
    pthread_cond_init(&t->cv_wd, NULL);
    t->n = n;
    t->rank0 = rank0;
    t->world = world;
    t->gpu = gpu;
    t->check = tp->check_ranks;
    if (!t->check && getenv("DSV4_TP_CHECK_RANKS") && strcmp(getenv("DSV4_TP_CHECK_RANKS"), "0")) t->check = 1;
    const char *tr = getenv("DSV4_TP_TRACE"), *wd = getenv("DSV4_TP_WATCHDOG_S");
    t->trace = tr && *tr && strcmp(tr, "0");
    t->wd_s = wd && *wd ? atof(wd) : gpu || t->trace ? 30.0 : 0.0; /* GPU ranks: on by default */
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
        counted *k = calloc(1, sizeof *k);
        if (!k) {
            dsv4_tp_runner_free(t);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        }
        k->c = (dsv4_comm){"counted",  t->comms[i]->rank, t->comms[i]->size, k, ct_reduce, ct_gather,
                           ct_bcast,   ct_barrier, ct_abort, ct_free, t->comms[i]->capturable};
        k->in = t->comms[i];
        t->ranks[i].cc = k;
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
    if (t->wd_s > 0 && !pthread_create(&t->wd, NULL, watchdog, t)) t->wd_started = 1;
    /* The engine maps pages once for all ranks: page sizes must agree; the page count is the smallest
     * rank's (a pool sized by --gpu-memory-utilization depends on what each GPU's weights left: rank 0
     * also holds the drafter). A rank with more pages never sees the ids above the common count. */
    for (int i = 1; i < n; i++) {
        if (t->ranks[i].it.page_tokens != t->it0.page_tokens || !t->ranks[i].it.set_pages != !t->it0.set_pages) {
            rc = dsv4_err_set(err, DSV4_EINTERNAL,
                              "tensor parallel: rank %d's KV pool (%d pages of %d) differs from rank 0's (%d of %d)", i,
                              t->ranks[i].it.n_pages, t->ranks[i].it.page_tokens, t->it0.n_pages, t->it0.page_tokens);
            dsv4_tp_runner_free(t);
            return rc;
        }
        if (t->ranks[i].it.n_pages != t->it0.n_pages) {
            dsv4_log(DSV4_LOG_INFO, "tensor parallel: rank %d holds %d KV pages, rank 0 %d: the pool is the smaller", i,
                     t->ranks[i].it.n_pages, t->it0.n_pages);
            if (t->ranks[i].it.n_pages < t->it0.n_pages) t->it0.n_pages = t->ranks[i].it.n_pages;
        }
    }
    *out = t;
    return 0;
}

dsv4_runner dsv4_tp_runner_iface(dsv4_tp_runner *t) {
    /* the pool: the common sizes (the smallest rank's page count), set_pages forwarded to every rank */
    dsv4_runner r = {.ctx = t,
                     .vocab = t->it0.vocab,
                     .n_slots = t->it0.n_slots,
                     .forward = tp_forward,
                     .release = tp_release,
                     .reusable = t->it0.reusable ? tp_reusable : NULL,
                     .resume = tp_resume,
                     .copy_slot = tp_copy_slot,
                     .warmup = t->it0.warmup ? tp_warmup : NULL};
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
