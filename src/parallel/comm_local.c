/*
 * The `local` communicator (comm.h): N ranks that are threads of one process.
 *
 * Why host staging through buf_read/buf_write instead of touching buffer
 * memory directly: it works for every backend (a CUDA rank's buffer is device
 * memory), and this communicator is the CI transport and the correctness
 * oracle, not the fast path.
 *
 * All-reduce: each rank copies its partial into its own staging slot,
 * barrier, each rank sums slot 0 + slot 1 + ... in rank order into its
 * private result (so every rank computes the same fp32 additions in the same
 * order: bit-identical results), barrier (nobody rewrites a slot another rank
 * is still reading), write back.
 *
 * The barrier is a mutex/condvar generation barrier with an abort flag
 * (pthread_barrier cannot be interrupted).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm.h"
#include "parallel/comm_host.h"

typedef struct local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, arrived, refs, aborted;
    unsigned gen;
    /* per-rank staging (owned and resized only by that rank, read by all between barriers) */
    float **slot;
    size_t *cap;        /* bytes */
    int64_t *rows, *cols; /* shape each rank announced for the current collective */
    void *bcast;        /* broadcast staging (root's) */
} local_group;

typedef struct local_rank {
    dsv4_comm c;
    local_group *g;
    float *res;         /* private result of the reduction */
    size_t res_cap;     /* bytes */
    dsv4_comm_stage st; /* BF16 host bytes */
} local_rank;

static int lbarrier(dsv4_comm *c, dsv4_err *err) {
    local_group *g = ((local_rank *)c)->g;
    pthread_mutex_lock(&g->mu);
    int rc = 0;
    if (g->aborted) {
        rc = DSV4_EBACKEND;
    } else if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        unsigned gen = g->gen;
        while (gen == g->gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        if (gen == g->gen) rc = DSV4_EBACKEND;
    }
    pthread_mutex_unlock(&g->mu);
    if (rc) return dsv4_err_set(err, rc, "local comm rank %d: a peer rank failed (collective aborted)", c->rank);
    return 0;
}

static void labort(dsv4_comm *c) {
    local_group *g = ((local_rank *)c)->g;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void dsv4_comm_local_recover(dsv4_comm *c) {
    local_group *g = ((local_rank *)c)->g;
    pthread_mutex_lock(&g->mu);
    g->aborted = 0;
    g->arrived = 0;
    pthread_mutex_unlock(&g->mu);
}

/* Copy buf into this rank's staging slot as fp32; announces the shape. */
static int stage(local_rank *r, dsv4_backend *be, const dsv4_buf *buf, dsv4_err *err) {
    local_group *g = r->g;
    int me = r->c.rank;
    int rc = dsv4_comm_host_read(&r->st, be, buf, &g->slot[me], &g->cap[me], err);
    if (rc) return rc;
    g->rows[me] = buf->rows;
    g->cols[me] = buf->cols;
    return 0;
}

/* After the first barrier: every rank announced the same shape? */
static int same_shape(local_rank *r, const char *what, dsv4_err *err) {
    local_group *g = r->g;
    for (int i = 1; i < g->n; i++)
        if (g->rows[i] != g->rows[0] || g->cols[i] != g->cols[0])
            return dsv4_err_set(err, DSV4_EINVAL, "local comm %s: rank %d has [%lld,%lld], rank 0 [%lld,%lld]", what,
                                i, (long long)g->rows[i], (long long)g->cols[i], (long long)g->rows[0],
                                (long long)g->cols[0]);
    return 0;
}

static int lall_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *buf, dsv4_err *err) {
    local_rank *r = (local_rank *)c;
    local_group *g = r->g;
    if (g->n == 1) return 0;
    int rc = stage(r, be, buf, err);
    if (rc) {
        labort(c);
        return rc;
    }
    if ((rc = lbarrier(c, err))) return rc;
    size_t n = (size_t)buf->rows * (size_t)buf->cols;
    void *res = r->res;
    rc = same_shape(r, "all_reduce_sum", err);
    if (!rc) rc = dsv4_comm_host_grow("local comm", &res, &r->res_cap, (n ? n : 1) * sizeof(float), err);
    r->res = res;
    if (!rc) {
        /* rank order on every rank: ((p0 + p1) + p2) + ... */
        memcpy(r->res, g->slot[0], n * sizeof(float));
        for (int k = 1; k < g->n; k++) dsv4_comm_host_accumulate(r->res, g->slot[k], n);
    }
    int rc2 = lbarrier(c, err);
    if (rc) return rc;
    if (rc2) return rc2;
    return dsv4_comm_host_write(&r->st, be, buf, r->res, err);
}

static int lall_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *in, dsv4_buf *out, dsv4_err *err) {
    local_rank *r = (local_rank *)c;
    local_group *g = r->g;
    int N = g->n;
    if (in->dtype != DSV4_DT_F32 || out->dtype != DSV4_DT_F32 || out->rows != in->rows ||
        out->cols != in->cols * N)
        return dsv4_err_set(err, DSV4_EINVAL, "local comm all_gather: need F32 in [r][c] and out [r][%d*c]", N);
    int rc = stage(r, be, in, err);
    if (rc) {
        labort(c);
        return rc;
    }
    if ((rc = lbarrier(c, err))) return rc;
    size_t rows = (size_t)in->rows, cols = (size_t)in->cols, n = rows * cols * (size_t)N;
    void *res = r->res;
    rc = same_shape(r, "all_gather", err);
    if (!rc) rc = dsv4_comm_host_grow("local comm", &res, &r->res_cap, (n ? n : 1) * sizeof(float), err);
    r->res = res;
    for (int k = 0; k < N && !rc; k++)
        for (size_t i = 0; i < rows; i++)
            memcpy(r->res + i * cols * N + k * cols, g->slot[k] + i * cols, cols * sizeof(float));
    int rc2 = lbarrier(c, err);
    if (rc) return rc;
    if (rc2) return rc2;
    return n ? be->buf_write(be, out, r->res, err) : 0;
}

static int lbroadcast(dsv4_comm *c, void *host, size_t n, int root, dsv4_err *err) {
    local_rank *r = (local_rank *)c;
    local_group *g = r->g;
    if (root < 0 || root >= g->n) return dsv4_err_set(err, DSV4_EINVAL, "local comm broadcast: root %d", root);
    if (c->rank == root) g->bcast = host;
    int rc = lbarrier(c, err);
    if (rc) return rc;
    if (c->rank != root && n) memcpy(host, g->bcast, n);
    return lbarrier(c, err);
}

/* Release the group once no rank handle refers to it (slot buffers included). */
static void group_free(local_group *g) {
    for (int i = 0; g->slot && i < g->n; i++) free(g->slot[i]);
    free(g->slot);
    free(g->cap);
    free(g->rows);
    free(g->cols);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

static void lfree(dsv4_comm *c) {
    if (!c) return;
    local_rank *r = (local_rank *)c;
    local_group *g = r->g;
    free(r->res);
    free(r->st.raw);
    free(r);
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) group_free(g);
}

int dsv4_comm_local_create(int n, dsv4_comm **ranks, dsv4_err *err) {
    if (n < 1) return dsv4_err_set(err, DSV4_EINVAL, "local comm: %d ranks", n);
    local_group *g = calloc(1, sizeof *g);
    if (!g) return dsv4_err_set(err, DSV4_ENOMEM, "local comm: out of memory");
    g->n = n;
    g->slot = calloc((size_t)n, sizeof(float *));
    g->cap = calloc((size_t)n, sizeof(size_t));
    g->rows = calloc((size_t)n, sizeof(int64_t));
    g->cols = calloc((size_t)n, sizeof(int64_t));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    int ok = g->slot && g->cap && g->rows && g->cols;
    for (int i = 0; i < n; i++) ranks[i] = NULL;
    for (int i = 0; i < n && ok; i++) {
        local_rank *r = calloc(1, sizeof *r);
        if (!r) {
            ok = 0;
            break;
        }
        r->g = g;
        r->st.who = "local comm";
        r->c = (dsv4_comm){"local", i, n, NULL, lall_reduce, lall_gather, lbroadcast, lbarrier, labort, lfree, 0};
        r->c.ctx = r;
        g->refs++;
        ranks[i] = &r->c;
    }
    if (ok) return 0;
    if (g->refs == 0) { /* no handle holds the group: free it here */
        group_free(g);
    } else {
        for (int i = 0; i < n; i++)
            if (ranks[i]) lfree(ranks[i]), ranks[i] = NULL;
    }
    return dsv4_err_set(err, DSV4_ENOMEM, "local comm: out of memory");
}
