/*
 * The `tcp` communicator (comm.h): ranks that are separate processes, usually
 * on separate hosts (`dsv4 serve --nnodes N` on CPU backends; CI runs two
 * processes on 127.0.0.1).
 *
 * Why a star around rank 0 and not a ring: the determinism contract wants
 * every rank to hold the same bits after a sum. With every partial sent to
 * rank 0, summed there in rank order ((p0 + p1) + p2) + ... — the order the
 * local communicator uses, so a TCP group gives the same bits as threads of
 * one process — and the one result sent back, bit-identity holds by
 * construction. At the sizes a CPU rank all-reduces (one hidden row per token)
 * the extra hop costs latency, not bandwidth; GPUs use NCCL.
 *
 * Every message is a header {op, rows, cols, bytes} (int64, host order: every
 * node runs the same build, which the rendezvous checks) and then the bytes.
 * Rank 0 checks each peer's header against its own, so ranks that disagree
 * about the collective (a shape, an op) fail with both sides named instead of
 * reading garbage. Partials travel as fp32 (BF16 is widened on the sender and
 * rounded once on every rank after the sum, as comm_local does).
 *
 * Failure: abort shuts every socket down (shutdown(2) also wakes a thread of
 * this process blocked in recv on it), the peers then read end-of-file and
 * fail with "rank R ... closed the connection". An aborted or broken TCP
 * communicator stays dead, like NCCL's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/comm.h"
#include "parallel/comm_host.h"
#include "parallel/net.h"

enum { OP_SUM = 1, OP_GATHER, OP_BCAST, OP_BARRIER };
static const char *op_name(int64_t op) {
    return op == OP_SUM ? "all_reduce_sum" : op == OP_GATHER ? "all_gather" : op == OP_BCAST ? "broadcast"
                                                                               : op == OP_BARRIER ? "barrier" : "?";
}
static const char HELLO[8] = {'D', 'S', 'V', '4', 'T', 'C', 'P', '1'};

typedef struct tcp_rank {
    dsv4_comm c;
    int *fd;          /* rank 0: fd[k] to rank k (k >= 1); rank k: fd[0] to rank 0; -1 elsewhere */
    char (*peer)[64]; /* "host:port" of each connected peer, for messages */
    pthread_mutex_t mu;
    int dead;         /* aborted or a connection broke: every later call fails at once */
    char why[200];    /* the first failure, repeated by later calls */
    float *res, *tmp; /* fp32 staging */
    size_t res_cap, tmp_cap; /* bytes */
    dsv4_comm_stage st;      /* BF16 host bytes */
    int per_node;            /* ranks per node, for messages: rank k is on node k / per_node */
} tcp_rank;


static void shut_all(tcp_rank *r) {
    for (int k = 0; k < r->c.size; k++)
        if (r->fd[k] >= 0) shutdown(r->fd[k], SHUT_RDWR);
}

/* Mark the group dead with a reason (the first one sticks) and wake everyone. */
static int fail(tcp_rank *r, int code, dsv4_err *err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(tcp_rank *r, int code, dsv4_err *err, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&r->mu);
    if (!r->dead) {
        r->dead = 1;
        snprintf(r->why, sizeof r->why, "%s", msg);
    }
    pthread_mutex_unlock(&r->mu);
    shut_all(r);
    return dsv4_err_set(err, code, "tcp comm rank %d: %s", r->c.rank, msg);
}

static int check_dead(tcp_rank *r, dsv4_err *err) {
    pthread_mutex_lock(&r->mu);
    int d = r->dead;
    char why[200];
    snprintf(why, sizeof why, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
    if (!d) return 0;
    return dsv4_err_set(err, DSV4_EBACKEND, "tcp comm rank %d: the group is down (%s)", r->c.rank, why);
}

/* Exactly n bytes to / from peer k; a broken connection kills the group with a message naming k. */
static int xfer(tcp_rank *r, int k, void *buf, size_t n, int writing, dsv4_err *err) {
    uint8_t *p = buf;
    while (n) {
        ssize_t got = writing ? send(r->fd[k], p, n, MSG_NOSIGNAL) : recv(r->fd[k], p, n, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            pthread_mutex_lock(&r->mu);
            int was_dead = r->dead;
            pthread_mutex_unlock(&r->mu);
            if (was_dead) return check_dead(r, err);
            return fail(r, DSV4_EBACKEND, err,
                        "rank %d (node %d at %s) closed the connection: it exited, crashed or aborted%s%s%s", k,
                        k / r->per_node, r->peer[k], got ? " (" : "", got ? strerror(errno) : "", got ? ")" : "");
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int send_msg(tcp_rank *r, int k, int64_t op, int64_t rows, int64_t cols, const void *data, size_t n,
                    dsv4_err *err) {
    int64_t h[4] = {op, rows, cols, (int64_t)n};
    int rc = xfer(r, k, h, sizeof h, 1, err);
    if (!rc && n) rc = xfer(r, k, (void *)data, n, 1, err);
    return rc;
}

/* Receive a header from k and check it is the collective we are in (same op, shape, size). */
static int recv_hdr(tcp_rank *r, int k, int64_t op, int64_t rows, int64_t cols, size_t n, dsv4_err *err) {
    int64_t h[4];
    int rc = xfer(r, k, h, sizeof h, 0, err);
    if (rc) return rc;
    if (h[0] != op || h[1] != rows || h[2] != cols || h[3] != (int64_t)n)
        return fail(r, DSV4_EINVAL, err,
                    "rank %d is in %s [%lld,%lld] (%lld bytes), rank %d in %s [%lld,%lld] (%zu bytes)", k,
                    op_name(h[0]), (long long)h[1], (long long)h[2], (long long)h[3], r->c.rank, op_name(op),
                    (long long)rows, (long long)cols, n);
    return 0;
}

static int tall_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *buf, dsv4_err *err) {
    tcp_rank *r = (tcp_rank *)c;
    if (c->size == 1) return 0;
    int rc = check_dead(r, err);
    if (rc) return rc;
    size_t n = (size_t)buf->rows * (size_t)buf->cols, bytes = n * sizeof(float);
    if ((rc = dsv4_comm_host_read(&r->st, be, buf, &r->res, &r->res_cap, err))) {
        c->abort(c);
        return rc;
    }
    if (c->rank == 0) {
        void *t = r->tmp;
        if ((rc = dsv4_comm_host_grow(r->st.who, &t, &r->tmp_cap, bytes ? bytes : 1, err)))
            return fail(r, rc, err, "%s", err->msg);
        r->tmp = t;
        for (int k = 1; k < c->size; k++) { /* rank order: ((p0 + p1) + p2) + ... */
            if ((rc = recv_hdr(r, k, OP_SUM, buf->rows, buf->cols, bytes, err))) return rc;
            if (bytes && (rc = xfer(r, k, r->tmp, bytes, 0, err))) return rc;
            dsv4_comm_host_accumulate(r->res, r->tmp, n);
        }
        for (int k = 1; k < c->size; k++)
            if ((rc = send_msg(r, k, OP_SUM, buf->rows, buf->cols, r->res, bytes, err))) return rc;
    } else {
        if ((rc = send_msg(r, 0, OP_SUM, buf->rows, buf->cols, r->res, bytes, err))) return rc;
        if ((rc = recv_hdr(r, 0, OP_SUM, buf->rows, buf->cols, bytes, err))) return rc;
        if (bytes && (rc = xfer(r, 0, r->res, bytes, 0, err))) return rc;
    }
    return dsv4_comm_host_write(&r->st, be, buf, r->res, err);
}

static int tall_gather(dsv4_comm *c, dsv4_backend *be, const dsv4_buf *in, dsv4_buf *out, dsv4_err *err) {
    tcp_rank *r = (tcp_rank *)c;
    int N = c->size;
    if (in->dtype != DSV4_DT_F32 || out->dtype != DSV4_DT_F32 || out->rows != in->rows || out->cols != in->cols * N)
        return dsv4_err_set(err, DSV4_EINVAL, "tcp comm all_gather: need F32 in [r][c] and out [r][%d*c]", N);
    int rc = check_dead(r, err);
    if (rc) return rc;
    size_t rows = (size_t)in->rows, cols = (size_t)in->cols, part = rows * cols * sizeof(float);
    size_t whole = part * (size_t)N;
    if ((rc = dsv4_comm_host_read(&r->st, be, in, &r->tmp, &r->tmp_cap, err))) {
        c->abort(c);
        return rc;
    }
    void *res = r->res;
    if ((rc = dsv4_comm_host_grow(r->st.who, &res, &r->res_cap, whole ? whole : 1, err)))
        return fail(r, rc, err, "%s", err->msg);
    r->res = res;
    if (c->rank == 0) {
        for (size_t i = 0; i < rows; i++) memcpy(r->res + i * cols * N, r->tmp + i * cols, cols * sizeof(float));
        for (int k = 1; k < N; k++) {
            if ((rc = recv_hdr(r, k, OP_GATHER, in->rows, in->cols, part, err))) return rc;
            if (part && (rc = xfer(r, k, r->tmp, part, 0, err))) return rc;
            for (size_t i = 0; i < rows; i++)
                memcpy(r->res + i * cols * N + (size_t)k * cols, r->tmp + i * cols, cols * sizeof(float));
        }
        for (int k = 1; k < N; k++)
            if ((rc = send_msg(r, k, OP_GATHER, out->rows, out->cols, r->res, whole, err))) return rc;
    } else {
        if ((rc = send_msg(r, 0, OP_GATHER, in->rows, in->cols, r->tmp, part, err))) return rc;
        if ((rc = recv_hdr(r, 0, OP_GATHER, out->rows, out->cols, whole, err))) return rc;
        if (whole && (rc = xfer(r, 0, r->res, whole, 0, err))) return rc;
    }
    return whole ? be->buf_write(be, out, r->res, err) : 0;
}

/* root 0 sends to every peer; another root sends to rank 0, which relays to the rest. */
static int tbroadcast(dsv4_comm *c, void *host, size_t n, int root, dsv4_err *err) {
    tcp_rank *r = (tcp_rank *)c;
    if (root < 0 || root >= c->size) return dsv4_err_set(err, DSV4_EINVAL, "tcp comm broadcast: root %d", root);
    int rc = check_dead(r, err);
    if (rc || c->size == 1) return rc;
    if (c->rank == 0) {
        if (root != 0) {
            if ((rc = recv_hdr(r, root, OP_BCAST, root, 0, n, err))) return rc;
            if (n && (rc = xfer(r, root, host, n, 0, err))) return rc;
        }
        for (int k = 1; k < c->size; k++)
            if (k != root && (rc = send_msg(r, k, OP_BCAST, root, 0, host, n, err))) return rc;
        return 0;
    }
    if (c->rank == root) return send_msg(r, 0, OP_BCAST, root, 0, host, n, err);
    if ((rc = recv_hdr(r, 0, OP_BCAST, root, 0, n, err))) return rc;
    return n ? xfer(r, 0, host, n, 0, err) : 0;
}

static int tbarrier(dsv4_comm *c, dsv4_err *err) {
    tcp_rank *r = (tcp_rank *)c;
    int rc = check_dead(r, err);
    if (rc || c->size == 1) return rc;
    if (c->rank == 0) {
        for (int k = 1; k < c->size; k++)
            if ((rc = recv_hdr(r, k, OP_BARRIER, 0, 0, 0, err))) return rc;
        for (int k = 1; k < c->size; k++)
            if ((rc = send_msg(r, k, OP_BARRIER, 0, 0, NULL, 0, err))) return rc;
        return 0;
    }
    if ((rc = send_msg(r, 0, OP_BARRIER, 0, 0, NULL, 0, err))) return rc;
    return recv_hdr(r, 0, OP_BARRIER, 0, 0, 0, err);
}

static void tabort(dsv4_comm *c) {
    tcp_rank *r = (tcp_rank *)c;
    pthread_mutex_lock(&r->mu);
    if (!r->dead) {
        r->dead = 1;
        snprintf(r->why, sizeof r->why, "rank %d aborted", c->rank);
    }
    pthread_mutex_unlock(&r->mu);
    shut_all(r);
}

static void tfree(dsv4_comm *c) {
    if (!c) return;
    tcp_rank *r = (tcp_rank *)c;
    for (int k = 0; k < c->size; k++)
        if (r->fd[k] >= 0) close(r->fd[k]);
    pthread_mutex_destroy(&r->mu);
    free(r->fd);
    free(r->peer);
    free(r->res);
    free(r->tmp);
    free(r->st.raw);
    free(r);
}

int dsv4_comm_tcp_check(dsv4_comm *c, dsv4_err *err) {
    if (!c || strcmp(c->name, "tcp")) return 0;
    tcp_rank *r = (tcp_rank *)c;
    int rc = check_dead(r, err);
    if (rc) return rc;
    for (int k = 0; k < c->size; k++) {
        if (r->fd[k] < 0) continue;
        struct pollfd pf = {r->fd[k], POLLRDHUP, 0};
        if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return fail(r, DSV4_EBACKEND, err,
                        "rank %d (node %d at %s) closed the connection: it exited, crashed or aborted", k,
                        k / r->per_node, r->peer[k]);
    }
    return 0;
}

/* ---- setup ---- */

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small step messages must not wait for Nagle */
    /* a host that vanishes without a FIN (power loss, cable) is noticed in about a minute instead of never */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 30, intvl = 5, cnt = 6;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

static int setup_root(tcp_rank *r, const char *addr, int port, double deadline, dsv4_err *err) {
    struct addrinfo *ai;
    int g = dsv4_net_resolve(addr, port, 1, &ai);
    if (g) return dsv4_err_set(err, DSV4_EINVAL, "tcp comm: %s: %s", addr, gai_strerror(g));
    int e, ls = dsv4_net_listen(ai, &e);
    freeaddrinfo(ai);
    if (ls < 0)
        return dsv4_err_set(err, DSV4_EIO, "tcp comm: cannot listen on %s:%d: %s%s", addr, port, strerror(e),
                            e == EADDRINUSE ? " (the communicator uses --master-port + 1: pick a --master-port whose "
                                              "next port is free)"
                                            : "");
    int have = 1, rc = 0;
    while (have < r->c.size && !rc) {
        double left = deadline - dsv4_net_now_s();
        struct pollfd pf = {ls, POLLIN, 0};
        int pr = left <= 0 ? 0 : poll(&pf, 1, dsv4_net_ms_left(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            char miss[160] = "";
            size_t off = 0;
            for (int k = 1; k < r->c.size && off < sizeof miss - 16; k++)
                if (r->fd[k] < 0) off += (size_t)snprintf(miss + off, sizeof miss - off, "%s%d", off ? ", " : "", k);
            rc = dsv4_err_set(err, DSV4_EIO, "tcp comm on %s:%d: rank(s) %s did not connect in time", addr, port, miss);
            break;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(ls, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd < 0) continue;
        uint8_t h[16];
        double t = dsv4_net_now_s();
        if (dsv4_net_io_all(fd, h, sizeof h, 0, t + 10 < deadline ? t + 10 : deadline) ||
            memcmp(h, HELLO, 8)) { /* a port scanner or a dead peer: not fatal */
            close(fd);
            continue;
        }
        int k = (int)dsv4_net_get32(h + 8), sz = (int)dsv4_net_get32(h + 12);
        if (k <= 0 || k >= r->c.size || r->fd[k] >= 0 || sz != r->c.size) {
            close(fd);
            rc = dsv4_err_set(err, DSV4_EINVAL, "tcp comm on %s:%d: a peer says rank %d of %d (this group: %d ranks%s)",
                              addr, port, k, sz, r->c.size, k > 0 && k < r->c.size && r->fd[k] >= 0 ? ", duplicate" : "");
            break;
        }
        tune(fd);
        r->fd[k] = fd;
        dsv4_net_addr_name((struct sockaddr *)&ss, sl, r->peer[k], sizeof r->peer[k]);
        have++;
    }
    close(ls);
    if (rc) return rc;
    uint8_t go = 1; /* every rank is in: let the peers start */
    for (int k = 1; k < r->c.size; k++)
        if (dsv4_net_io_all(r->fd[k], &go, 1, 1, deadline))
            return dsv4_err_set(err, DSV4_EIO, "tcp comm: rank %d (%s) left during setup", k, r->peer[k]);
    return 0;
}

static int setup_peer(tcp_rank *r, const char *addr, int port, double deadline, dsv4_err *err) {
    struct addrinfo *ai;
    int g = dsv4_net_resolve(addr, port, 0, &ai);
    if (g) return dsv4_err_set(err, DSV4_EINVAL, "tcp comm: %s: %s", addr, gai_strerror(g));
    /* rank 0 may not be listening yet: retry until the deadline */
    int last, fd = dsv4_net_connect(ai, deadline, 50, r->peer[0], sizeof r->peer[0], &last);
    freeaddrinfo(ai);
    if (fd < 0)
        return dsv4_err_set(err, DSV4_EIO, "tcp comm rank %d: could not reach rank 0 at %s:%d (%s)", r->c.rank, addr,
                            port, strerror(last));
    tune(fd);
    r->fd[0] = fd;
    uint8_t h[16], go = 0;
    memcpy(h, HELLO, 8);
    dsv4_net_put32(h + 8, (uint32_t)r->c.rank);
    dsv4_net_put32(h + 12, (uint32_t)r->c.size);
    int io = dsv4_net_io_all(fd, h, sizeof h, 1, deadline);
    if (!io) io = dsv4_net_io_all(fd, &go, 1, 0, deadline);
    if (io)
        return dsv4_err_set(err, DSV4_EIO, "tcp comm rank %d: rank 0 at %s:%d %s", r->c.rank, addr, port,
                            io == -2 ? "did not start the group in time (another rank missing?)"
                                     : "closed the connection during setup (see its log)");
    return 0;
}

int dsv4_comm_tcp_create(const char *addr, int port, int rank, int size, double timeout_s, dsv4_comm **out,
                         dsv4_err *err) {
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size)
        return dsv4_err_set(err, DSV4_EINVAL, "tcp comm: rank %d of %d", rank, size);
    if (size > 1 && (!addr || port < 1 || port > 65535))
        return dsv4_err_set(err, DSV4_EINVAL, "tcp comm: need an address and a port in 1..65535 (got %d)", port);
    tcp_rank *r = calloc(1, sizeof *r);
    if (!r) return dsv4_err_set(err, DSV4_ENOMEM, "tcp comm: out of memory");
    r->fd = malloc(sizeof(int) * (size_t)size);
    r->peer = calloc((size_t)size, sizeof *r->peer);
    pthread_mutex_init(&r->mu, NULL);
    r->st.who = "tcp comm";
    r->per_node = 1;
    r->c = (dsv4_comm){.name = "tcp", .rank = rank, .size = size, .ctx = r, .all_reduce_sum = tall_reduce,
                       .all_gather = tall_gather, .broadcast = tbroadcast, .barrier = tbarrier, .abort = tabort,
                       .free = tfree};
    if (!r->fd || !r->peer) {
        free(r->fd);
        r->fd = NULL;
        free(r->peer);
        free(r);
        return dsv4_err_set(err, DSV4_ENOMEM, "tcp comm: out of memory");
    }
    for (int k = 0; k < size; k++) r->fd[k] = -1;
    double deadline = dsv4_net_now_s() + (timeout_s > 0 ? timeout_s : 300.0);
    int rc = size == 1 ? 0 : rank == 0 ? setup_root(r, addr, port, deadline, err) : setup_peer(r, addr, port, deadline, err);
    if (rc) {
        tfree(&r->c);
        return rc;
    }
    *out = &r->c;
    return 0;
}

/* ---- several ranks of one group in this process (comm.h dsv4_comm_tcp_create_ranks) ---- */

typedef struct tcp_job {
    const char *addr;
    int port, rank, size, rc;
    double timeout_s;
    dsv4_comm *out;
    dsv4_err err;
} tcp_job;

static void *tcp_job_run(void *arg) {
    tcp_job *j = arg;
    j->rc = dsv4_comm_tcp_create(j->addr, j->port, j->rank, j->size, j->timeout_s, &j->out, &j->err);
    return NULL;
}

/*
 * Why one thread per rank: dsv4_comm_tcp_create returns only once the whole
 * group is connected (rank 0 sends "go" after the last peer), so the ranks of
 * this process must join at the same time; the first runs on the caller's
 * thread (on node 0 that is rank 0, the listener).
 */
int dsv4_comm_tcp_create_ranks(const char *addr, int port, int first, int n, int size, double timeout_s,
                               dsv4_comm **out, dsv4_err *err) {
    for (int i = 0; i < n && i < 64; i++) out[i] = NULL;
    if (n < 1 || n > 64 || first < 0 || first + n > size)
        return dsv4_err_set(err, DSV4_EINVAL, "tcp comm: ranks %d..%d of %d", first, first + n - 1, size);
    tcp_job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    int *started = calloc((size_t)n, sizeof *started);
    if (!jobs || !th || !started) {
        free(jobs);
        free(th);
        free(started);
        return dsv4_err_set(err, DSV4_ENOMEM, "tcp comm: out of memory");
    }
    int rc = 0;
    for (int i = 0; i < n; i++) jobs[i] = (tcp_job){addr, port, first + i, size, 0, timeout_s, NULL, {0}};
    for (int i = 1; i < n; i++) {
        if (pthread_create(&th[i], NULL, tcp_job_run, &jobs[i])) {
            jobs[i].rc = dsv4_err_set(&jobs[i].err, DSV4_ENOMEM, "tcp comm: cannot start a thread for rank %d",
                                      first + i);
            continue;
        }
        started[i] = 1;
    }
    /* a rank whose thread did not start never connects: the others time out naming it */
    tcp_job_run(&jobs[0]);
    for (int i = 1; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        if (jobs[i].rc && !rc) {
            rc = jobs[i].rc;
            dsv4_err_set(err, rc, "%s", jobs[i].err.msg);
        }
    for (int i = 0; i < n; i++) {
        if (rc && jobs[i].out) jobs[i].out->free(jobs[i].out);
        out[i] = rc ? NULL : jobs[i].out;
        if (out[i]) ((tcp_rank *)out[i])->per_node = n; /* every node holds n ranks: messages name rank / n */
    }
    free(jobs);
    free(th);
    free(started);
    return rc;
}
