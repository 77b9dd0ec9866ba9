/*
 * The `nccl` communicator (comm.h). libnccl.so.2 is opened with dlopen so the
 * binary neither links nor needs NCCL unless tensor parallelism over GPUs is
 * asked for; the CUDA runtime entry points we need (stream sync, a small
 * device scratch for host broadcasts) are looked up the same way — in the
 * process first (a CUDA build links cudart), then libcudart.so.
 *
 * Why these prototypes are spelled out here rather than taken from nccl.h:
 * the header is not installed where we build (the library comes from the
 * pip wheel nvidia-nccl-cu13); the ABI below is NCCL's stable C API
 * (ncclUniqueId is 128 bytes passed by value; datatype and op enums as in
 * nccl.h 2.x: ncclFloat32 = 7, ncclBfloat16 = 9, ncclSum = 0).
 *
 * Stream order: when the backend has a device stream (be->stream, the CUDA
 * backend) the collectives are queued on it after the ops that produced the
 * buffer and before the ops that read it — no host synchronisation inside a
 * step, and a forward that contains them can be captured in a CUDA graph
 * (NCCL supports capture; the communicator says so with `capturable`).
 * Scratch for the logit all-gather comes from be->buf_alloc (stream-ordered,
 * so a captured graph owns its copy: a later, larger gather cannot free
 * memory an older graph replays into). Without a stream (a host backend) a
 * collective syncs the backend, runs on the legacy default stream and waits.
 *
 * NVLink SHARP / multicast (NVLS) is never asked for: load() sets
 * NCCL_NVLS_ENABLE=0 unless the environment already says otherwise, since a
 * decode step's messages are small (16 KB a row) and multicast objects have
 * put shared GPU hosts out of service (the GPU machine's notes).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* DSV4_TP_ONESHOT unset: use the one-shot all-reduce (comm.h dsv4_comm_nccl_set_oneshot) */
#define DSV4_TP_ONESHOT_DEFAULT 1

typedef int nccl_res;
typedef void *nccl_comm_t;
typedef struct {
    char internal[DSV4_NCCL_ID_BYTES];
} nccl_id;
enum { NCCL_FLOAT32 = 7, NCCL_BF16 = 9, NCCL_UINT8 = 1, NCCL_SUM = 0 };

static struct {
    int loaded;
    void *lib, *cudart;
    char where[1024];
    nccl_res (*get_unique_id)(nccl_id *);
    nccl_res (*comm_init_rank)(nccl_comm_t *, int, nccl_id, int);
    nccl_res (*comm_init_all)(nccl_comm_t *, int, const int *);
    nccl_res (*group_start)(void);
    nccl_res (*group_end)(void);
    nccl_res (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_res (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, void *);
    nccl_res (*bcast)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    nccl_res (*destroy)(nccl_comm_t);
    nccl_res (*abort)(nccl_comm_t);
    const char *(*errstr)(nccl_res);
    int (*stream_sync)(void *);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*memcpy2d)(void *, size_t, const void *, size_t, size_t, size_t, int);
    int (*memcpy2d_async)(void *, size_t, const void *, size_t, size_t, size_t, int, void *);
    int (*get_device_count)(int *);
    int (*set_device)(int);
    int (*get_device)(int *);
} N;

static void *cuda_sym(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (p) return p;
    if (!N.cudart) {
        const char *libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
        for (int i = 0; i < 3 && !N.cudart; i++) N.cudart = dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL);
    }
    return N.cudart ? dlsym(N.cudart, name) : NULL;
}

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static int load_locked(dsv4_err *err);

/* Ranks open their communicators from their own threads at the same time. */
static int load(dsv4_err *err) {
    pthread_mutex_lock(&load_mu);
    int rc = load_locked(err);
    pthread_mutex_unlock(&load_mu);
    return rc;
}

static int load_locked(dsv4_err *err) {
    if (N.loaded) return 0;
    N.where[0] = 0;
    if (!getenv("NCCL_NVLS_ENABLE")) setenv("NCCL_NVLS_ENABLE", "0", 0); /* never multicast (banner) */
    /* the first of these that is set is the only one tried: an explicit path that fails is an error */
    const char *cand[3] = {getenv("DSV4_NCCL_LIB"), getenv("NCCL_LIBRARY"), "libnccl.so.2"};
    size_t off = 0;
    for (int i = 0; i < 3 && !N.lib; i++) {
        if (!cand[i] || !cand[i][0]) continue;
        if (off) break;
        N.lib = dlopen(cand[i], RTLD_NOW | RTLD_GLOBAL);
        if (!N.lib && off < sizeof N.where)
            off += (size_t)snprintf(N.where + off, sizeof N.where - off, "%s%s (%s)", off ? "; " : "", cand[i],
                                    dlerror());
    }
    if (!N.lib)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "NCCL not found: tried %s. Set DSV4_NCCL_LIB to libnccl.so.2 (the pip wheel "
                            "nvidia-nccl-cu13 has it under site-packages/nvidia/nccl/lib)",
                            N.where);
#define SYM(f, name) *(void **)&N.f = dlsym(N.lib, name)
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(group_start, "ncclGroupStart"); /* checked where used (dsv4_comm_nccl_create_ranks) */
    SYM(group_end, "ncclGroupEnd");
    SYM(all_reduce, "ncclAllReduce");
    SYM(all_gather, "ncclAllGather");
    SYM(bcast, "ncclBroadcast");
    SYM(destroy, "ncclCommDestroy");
    SYM(abort, "ncclCommAbort");
    SYM(errstr, "ncclGetErrorString");
#undef SYM
    *(void **)&N.stream_sync = cuda_sym("cudaStreamSynchronize");
    *(void **)&N.malloc_ = cuda_sym("cudaMalloc");
    *(void **)&N.free_ = cuda_sym("cudaFree");
    *(void **)&N.memcpy_ = cuda_sym("cudaMemcpy");
    *(void **)&N.memcpy2d = cuda_sym("cudaMemcpy2D");
    *(void **)&N.memcpy2d_async = cuda_sym("cudaMemcpy2DAsync");
    *(void **)&N.get_device_count = cuda_sym("cudaGetDeviceCount");
    *(void **)&N.set_device = cuda_sym("cudaSetDevice");
    *(void **)&N.get_device = cuda_sym("cudaGetDevice");
    if (!N.get_unique_id || !N.comm_init_rank || !N.comm_init_all || !N.all_reduce || !N.all_gather || !N.bcast || !N.destroy ||
        !N.abort || !N.errstr)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "NCCL library lacks the 2.x API (ncclCommInitRank, ...)");
    if (!N.stream_sync || !N.malloc_ || !N.free_ || !N.memcpy_ || !N.memcpy2d || !N.memcpy2d_async ||
        !N.get_device_count)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "NCCL: the CUDA runtime (libcudart) is not available");
    N.loaded = 1;
    return 0;
}

typedef struct nccl_rank {
    dsv4_comm c;
    nccl_comm_t comm;
    int dead;
    void *os;      /* dsv4_cuda_oneshot (CUDA builds, DSV4_TP_ONESHOT=1): small F32 all-reduces */
    int os_on;     /* use it (dsv4_comm_nccl_set_oneshot) */
    void *scratch; /* device bytes for host broadcasts / barriers */
    size_t scratch_cap;
} nccl_rank;

static int nerr(nccl_rank *r, nccl_res res, const char *what, dsv4_err *err) {
    if (res == 0) return 0;
    return dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d/%d: %s: %s", r->c.rank, r->c.size, what, N.errstr(res));
}

static int wait_default_stream(nccl_rank *r, const char *what, dsv4_err *err) {
    int e = N.stream_sync(NULL);
    if (e) return dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d: %s: CUDA error %d", r->c.rank, what, e);
    return 0;
}

static int alive(nccl_rank *r, dsv4_err *err) {
    if (!__atomic_load_n(&r->dead, __ATOMIC_ACQUIRE)) return 0;
    return dsv4_err_set(err, DSV4_EBACKEND,
                        "NCCL rank %d: the communicator was aborted after an earlier failure; restart the server",
                        r->c.rank);
}

static int n_all_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *buf, dsv4_err *err) {
    nccl_rank *r = (nccl_rank *)c;
    int rc = alive(r, err);
    if (rc) return rc;
    int dt = buf->dtype == DSV4_DT_F32 ? NCCL_FLOAT32 : buf->dtype == DSV4_DT_BF16 ? NCCL_BF16 : -1;
    if (dt < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "NCCL all_reduce: dtype %s (F32, BF16)", dsv4_dtype_name(buf->dtype));
    size_t n = (size_t)buf->rows * (size_t)buf->cols;
    if (!n) return 0;
#ifdef DSV4_HAVE_CUDA
    /* small decode messages: one kernel over NVLink peer memory (cuda_allreduce.cu); every rank decides
     * the same way (same n, same dtype), so the ranks' sequences of collectives stay in step */
    if (r->os && r->os_on && be->stream &&
        (int64_t)n * (dt == NCCL_BF16 ? 2 : 4) <= dsv4_cuda_oneshot_capacity(r->os))
        return dsv4_cuda_oneshot_all_reduce(r->os, buf->data, (int64_t)n, dt == NCCL_BF16, be->stream, err);
#endif
    if (be->stream) /* in order with the backend's ops (banner) */
        return nerr(r, N.all_reduce(buf->data, buf->data, n, dt, NCCL_SUM, r->comm, be->stream), "ncclAllReduce",
                    err);
    if ((rc = be->sync(be, err))) return rc;
    if ((rc = nerr(r, N.all_reduce(buf->data, buf->data, n, dt, NCCL_SUM, r->comm, NULL), "ncclAllReduce", err)))
        return rc;
    return wait_default_stream(r, "all_reduce", err);
}

static int grow_scratch(nccl_rank *r, size_t n, dsv4_err *err) {
    if (n <= r->scratch_cap) return 0;
    if (r->scratch) N.free_(r->scratch);
    r->scratch = NULL;
    r->scratch_cap = 0;
    if (N.malloc_(&r->scratch, n))
        return dsv4_err_set(err, DSV4_ENOMEM, "NCCL rank %d: cudaMalloc %zu bytes failed", r->c.rank, n);
    r->scratch_cap = n;
    return 0;
}

static int n_all_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *in, dsv4_buf *out, dsv4_err *err) {
    nccl_rank *r = (nccl_rank *)c;
    int rc = alive(r, err), S = c->size;
    if (rc) return rc;
    if (in->dtype != DSV4_DT_F32 || out->dtype != DSV4_DT_F32 || out->rows != in->rows || out->cols != in->cols * S)
        return dsv4_err_set(err, DSV4_EINVAL, "NCCL all_gather: need F32 in [r][c] and out [r][%d*c]", S);
    size_t rows = (size_t)in->rows, cols = (size_t)in->cols, n = rows * cols;
    if (!n) return 0;
    if (be->stream) {
        void *st = be->stream;
        if (rows == 1) /* rank-major is already the wanted layout */
            return nerr(r, N.all_gather(in->data, out->data, n, NCCL_FLOAT32, r->comm, st), "ncclAllGather", err);
        dsv4_buf tmp = {0}; /* [S][rows][cols], stream-ordered (banner) */
        if ((rc = be->buf_alloc(be, DSV4_DT_F32, (int64_t)S * in->rows, in->cols, &tmp, err))) return rc;
        rc = nerr(r, N.all_gather(in->data, tmp.data, n, NCCL_FLOAT32, r->comm, st), "ncclAllGather", err);
        for (int k = 0; k < S && !rc; k++) /* [S][rows][cols] -> [rows][S*cols] */
            if (N.memcpy2d_async((float *)out->data + (size_t)k * cols, (size_t)S * cols * sizeof(float),
                                 (const float *)tmp.data + (size_t)k * n, cols * sizeof(float), cols * sizeof(float),
                                 rows, 3 /* cudaMemcpyDeviceToDevice */, st))
                rc = dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d: all_gather: cudaMemcpy2DAsync failed", r->c.rank);
        be->buf_free(be, &tmp);
        return rc;
    }
    if ((rc = be->sync(be, err))) return rc;
    if (rows == 1) { /* rank-major is already the wanted layout */
        if ((rc = nerr(r, N.all_gather(in->data, out->data, n, NCCL_FLOAT32, r->comm, NULL), "ncclAllGather", err)))
            return rc;
        return wait_default_stream(r, "all_gather", err);
    }
    if ((rc = grow_scratch(r, n * (size_t)S * sizeof(float), err))) return rc;
    if ((rc = nerr(r, N.all_gather(in->data, r->scratch, n, NCCL_FLOAT32, r->comm, NULL), "ncclAllGather", err)))
        return rc;
    if ((rc = wait_default_stream(r, "all_gather", err))) return rc;
    for (int k = 0; k < S; k++) /* [S][rows][cols] -> [rows][S*cols] */
        if (N.memcpy2d((float *)out->data + (size_t)k * cols, (size_t)S * cols * sizeof(float),
                       (const float *)r->scratch + (size_t)k * n, cols * sizeof(float), cols * sizeof(float), rows,
                       3 /* cudaMemcpyDeviceToDevice */))
            return dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d: all_gather: cudaMemcpy2D failed", r->c.rank);
    return 0;
}

static int n_broadcast(dsv4_comm *c, void *host, size_t n, int root, dsv4_err *err) {
    nccl_rank *r = (nccl_rank *)c;
    int rc = alive(r, err);
    if (rc) return rc;
    if (!n) return 0;
    if ((rc = grow_scratch(r, n, err))) return rc;
    if (c->rank == root && N.memcpy_(r->scratch, host, n, 1 /* H2D */))
        return dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d: broadcast: cudaMemcpy failed", r->c.rank);
    if ((rc = nerr(r, N.bcast(r->scratch, r->scratch, n, NCCL_UINT8, root, r->comm, NULL), "ncclBroadcast", err)))
        return rc;
    if ((rc = wait_default_stream(r, "broadcast", err))) return rc;
    if (c->rank != root && N.memcpy_(host, r->scratch, n, 2 /* D2H */))
        return dsv4_err_set(err, DSV4_EBACKEND, "NCCL rank %d: broadcast: cudaMemcpy failed", r->c.rank);
    return 0;
}

static int n_barrier(dsv4_comm *c, dsv4_err *err) {
    nccl_rank *r = (nccl_rank *)c;
    int rc = alive(r, err);
    if (rc || (rc = grow_scratch(r, sizeof(float), err))) return rc;
    if ((rc = nerr(r, N.all_reduce(r->scratch, r->scratch, 1, NCCL_FLOAT32, NCCL_SUM, r->comm, NULL), "barrier", err)))
        return rc;
    return wait_default_stream(r, "barrier", err);
}

/* Any thread may abort any rank's handle (tp_runner.c aborts them all when one
 * rank fails): the exchange makes sure ncclCommAbort runs once per handle. */
static void n_abort(dsv4_comm *c) {
    nccl_rank *r = (nccl_rank *)c;
    if (__atomic_exchange_n(&r->dead, 1, __ATOMIC_ACQ_REL)) return;
#ifdef DSV4_HAVE_CUDA
    dsv4_cuda_oneshot_abort(r->os); /* a one-shot kernel waiting for a dead peer returns */
#endif
    N.abort(r->comm);
}

static void n_free(dsv4_comm *c) {
    if (!c) return;
    nccl_rank *r = (nccl_rank *)c;
#ifdef DSV4_HAVE_CUDA
    dsv4_cuda_oneshot_free(r->os);
#endif
    if (!__atomic_load_n(&r->dead, __ATOMIC_ACQUIRE)) N.destroy(r->comm);
    if (r->scratch) N.free_(r->scratch);
    free(r);
}

int dsv4_nccl_unique_id(uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_err *err) {
    int rc = load(err);
    if (rc) return rc;
    nccl_id u;
    nccl_res res = N.get_unique_id(&u);
    if (res) return dsv4_err_set(err, DSV4_EBACKEND, "ncclGetUniqueId: %s", N.errstr(res));
    memcpy(id, u.internal, DSV4_NCCL_ID_BYTES);
    return 0;
}

/* The communicator handle of one rank (every constructor below fills it the same way). */
static void rank_handle(nccl_rank *r, int rank, int size) {
    r->c = (dsv4_comm){"nccl", rank, size, r, n_all_reduce, n_all_gather, n_broadcast, n_barrier, n_abort, n_free, 1};
}

/* 0 when n GPUs are visible; else the error, starting with `what` (who asks for them, with its verb). */
static int need_gpus(int n, const char *what, dsv4_err *err) {
    int have = dsv4_cuda_visible_devices(err);
    if (have < 0) return err ? (err->code ? err->code : DSV4_EBACKEND) : DSV4_EBACKEND;
    if (have < n)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "%s %d GPUs on this host, but %d %s visible (CUDA_VISIBLE_DEVICES / the GPUs present)",
                            what, n, have, have == 1 ? "is" : "are");
    return 0;
}

int dsv4_comm_nccl_create(int rank, int size, const uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_comm **out,
                          dsv4_err *err) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size)
        return dsv4_err_set(err, DSV4_EINVAL, "NCCL: rank %d outside [0,%d)", rank, size);
    int rc = load(err);
    if (rc) return rc;
    nccl_rank *r = calloc(1, sizeof *r);
    if (!r) return dsv4_err_set(err, DSV4_ENOMEM, "NCCL: out of memory");
    rank_handle(r, rank, size);
    nccl_id u;
    memcpy(u.internal, id, DSV4_NCCL_ID_BYTES);
    if ((rc = nerr(r, N.comm_init_rank(&r->comm, size, u, rank), "ncclCommInitRank", err))) {
        free(r);
        return rc;
    }
    *out = &r->c;
    return 0;
}

int dsv4_cuda_visible_devices(dsv4_err *err) {
    int rc = load(err), n = 0;
    if (rc) return -1;
    int e = N.get_device_count(&n);
    if (e) {
        dsv4_err_set(err, DSV4_EBACKEND, "cudaGetDeviceCount: CUDA error %d (no usable GPU or driver)", e);
        return -1;
    }
    return n;
}

int dsv4_comm_nccl_create_all(int n, dsv4_comm **ranks, dsv4_err *err) {
    for (int i = 0; i < n && i < 64; i++) ranks[i] = NULL;
    if (n < 1 || n > 64) return dsv4_err_set(err, DSV4_EINVAL, "NCCL: %d ranks outside [1,64]", n);
    char what[64];
    snprintf(what, sizeof what, "--tensor-parallel-size %d needs", n);
    int rc = need_gpus(n, what, err);
    if (rc) return rc;
    nccl_comm_t comms[64];
    int devs[64];
    for (int i = 0; i < n; i++) devs[i] = i;
    nccl_res res = N.comm_init_all(comms, n, devs);
    if (res) return dsv4_err_set(err, DSV4_EBACKEND, "NCCL: ncclCommInitAll over %d GPUs: %s", n, N.errstr(res));
    for (int i = 0; i < n; i++) {
        nccl_rank *r = calloc(1, sizeof *r);
        if (!r) {
            for (int j = i; j < n; j++) N.destroy(comms[j]);
            for (int j = 0; j < i; j++) {
                ranks[j]->free(ranks[j]);
                ranks[j] = NULL;
            }
            return dsv4_err_set(err, DSV4_ENOMEM, "NCCL: out of memory");
        }
        rank_handle(r, i, n);
        r->comm = comms[i];
        ranks[i] = &r->c;
    }
#ifdef DSV4_HAVE_CUDA
    /* DSV4_TP_ONESHOT: 1 on, 0 off, unset = DSV4_TP_ONESHOT_DEFAULT (on: measured faster than NCCL on
     * the 2x H200 machine, bench/results/2026-12-01-tp2-oneshot-allreduce.md); messages up to
     * DSV4_TP_ONESHOT_MAX bytes (default 1 MB = 64 rows of 4096 F32), NCCL above */
    const char *on = getenv("DSV4_TP_ONESHOT"), *mx = getenv("DSV4_TP_ONESHOT_MAX");
    int want = on && on[0] ? strcmp(on, "0") != 0 : DSV4_TP_ONESHOT_DEFAULT;
    if (n >= 2 && n <= 8 && want) {
        long long cap = mx && atoll(mx) > 0 ? atoll(mx) : 1024 * 1024;
        dsv4_cuda_oneshot *os[8];
        dsv4_err oe = {0};
        if (dsv4_cuda_oneshot_create(n, cap, os, &oe)) {
            dsv4_log(DSV4_LOG_WARN, "tensor parallel: one-shot all-reduce unavailable (%s); NCCL for all sizes", oe.msg);
        } else {
            for (int i = 0; i < n; i++) {
                ((nccl_rank *)ranks[i])->os = os[i];
                ((nccl_rank *)ranks[i])->os_on = 1;
            }
            dsv4_log(DSV4_LOG_INFO, "tensor parallel: one-shot all-reduce over NVLink peer memory for messages up "
                                    "to %lld bytes, NCCL above (DSV4_TP_ONESHOT=0: NCCL only)", cap);
        }
    }
#endif
    return 0;
}

int64_t dsv4_comm_nccl_oneshot_max(const dsv4_comm *c) {
    if (!c || strcmp(c->name, "nccl")) return 0;
#ifdef DSV4_HAVE_CUDA
    const nccl_rank *r = (const nccl_rank *)c;
    return r->os ? dsv4_cuda_oneshot_capacity(r->os) : 0;
#else
    return 0;
#endif
}

int dsv4_comm_nccl_set_oneshot(dsv4_comm *c, int on) {
    if (!c || strcmp(c->name, "nccl")) return 0;
    nccl_rank *r = (nccl_rank *)c;
    r->os_on = on && r->os;
    return r->os_on;
}

/*
 * Several ranks of a multi-node group in this process (comm.h
 * dsv4_comm_nccl_create_ranks). NCCL's rule: one thread that initialises
 * several ranks must do it inside ncclGroupStart / ncclGroupEnd (each
 * ncclCommInitRank would otherwise block waiting for the ranks it has not
 * reached yet); each init runs on its GPU's context, so the device is set
 * before each call and restored after. The one-shot NVLink path is not set up
 * here: its peer memory spans one host, and a sum over the hosts' ranks goes
 * through NCCL.
 */
int dsv4_comm_nccl_create_ranks(int first, int n, int size, const uint8_t id[DSV4_NCCL_ID_BYTES], dsv4_comm **out,
                                dsv4_err *err) {
    for (int i = 0; i < n && i < 64; i++) out[i] = NULL;
    if (n < 1 || n > 64 || first < 0 || first + n > size)
        return dsv4_err_set(err, DSV4_EINVAL, "NCCL: ranks %d..%d of %d", first, first + n - 1, size);
    char what[64];
    snprintf(what, sizeof what, "%d ranks per node need", n);
    int rc = need_gpus(n, what, err);
    if (rc) return rc;
    if (!N.group_start || !N.group_end || !N.set_device || !N.get_device)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "NCCL: ncclGroupStart/End or cudaSetDevice missing (several ranks per node need them)");
    nccl_rank *rk[64] = {0};
    for (int i = 0; i < n; i++)
        if (!(rk[i] = calloc(1, sizeof *rk[i]))) {
            for (int j = 0; j < i; j++) free(rk[j]);
            return dsv4_err_set(err, DSV4_ENOMEM, "NCCL: out of memory");
        }
    int dev0 = 0;
    N.get_device(&dev0);
    nccl_id u;
    memcpy(u.internal, id, DSV4_NCCL_ID_BYTES);
    nccl_res res = N.group_start(), res_init = 0;
    int cuda_bad = -1;
    for (int i = 0; i < n && !res; i++) {
        if (N.set_device(i)) {
            cuda_bad = i;
            break;
        }
        nccl_res r1 = N.comm_init_rank(&rk[i]->comm, size, u, first + i);
        if (r1 && !res_init) res_init = r1;
    }
    nccl_res res_end = res ? 0 : N.group_end(); /* close the group we opened, whatever happened inside */
    N.set_device(dev0);
    rc = 0;
    if (res) rc = dsv4_err_set(err, DSV4_EBACKEND, "NCCL: ncclGroupStart: %s", N.errstr(res));
    else if (cuda_bad >= 0) rc = dsv4_err_set(err, DSV4_EBACKEND, "NCCL: cudaSetDevice(%d) failed", cuda_bad);
    else if (res_init || res_end)
        rc = dsv4_err_set(err, DSV4_EBACKEND, "NCCL: ncclCommInitRank of ranks %d..%d of %d: %s", first,
                          first + n - 1, size, N.errstr(res_init ? res_init : res_end));
    for (int i = 0; i < n; i++) {
        if (rc) {
            if (rk[i]->comm) N.abort(rk[i]->comm);
            free(rk[i]);
            continue;
        }
        rank_handle(rk[i], first + i, size);
        out[i] = &rk[i]->c;
    }
    return rc;
}
