/*
 * The TCP rendezvous of rendezvous.h. Blocking sockets driven by poll() with
 * one deadline for the whole handshake, so every wait (accept, connect
 * retries, reading a hello, waiting for the go) is bounded by timeout_s.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "parallel/rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "parallel/net.h"

#define HELLO_BYTES (8 + 4 * 3 + 8 + 64)
#define REPLY_BYTES (4 + 256 + DSV4_RDV_ID_BYTES)
static const char MAGIC[8] = {'D', 'S', 'V', '4', 'R', 'D', 'V', '1'};

uint64_t dsv4_rdv_hash(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int resolve(const dsv4_rdv_opts *o, struct addrinfo **res, int passive, dsv4_err *err) {
    int g = dsv4_net_resolve(o->master_addr, o->master_port, passive, res);
    if (g) return dsv4_err_set(err, DSV4_EINVAL, "rendezvous: --master-addr %s: %s", o->master_addr, gai_strerror(g));
    return 0;
}

static void make_hello(const dsv4_rdv_opts *o, uint8_t *h) {
    memset(h, 0, HELLO_BYTES);
    memcpy(h, MAGIC, 8);
    dsv4_net_put32(h + 8, (uint32_t)o->node_rank);
    dsv4_net_put32(h + 12, (uint32_t)o->tp_size);
    dsv4_net_put32(h + 16, (uint32_t)o->nnodes);
    dsv4_net_put64(h + 20, o->config_hash);
    if (o->build_id) strncpy((char *)h + 28, o->build_id, 63);
}

/* Node 0's verdict on a peer's hello: 0 ok, else DSV4_EINVAL with the reason in msg. */
static int check_hello(const dsv4_rdv_opts *o, const uint8_t *h, const int *joined, int *rank, char *msg, size_t n) {
    *rank = -1;
    if (memcmp(h, MAGIC, 8)) return snprintf(msg, n, "a connection that is not a dsv4 rendezvous peer"), DSV4_EINVAL;
    int r = (int)dsv4_net_get32(h + 8), tp = (int)dsv4_net_get32(h + 12), nn = (int)dsv4_net_get32(h + 16);
    uint64_t ch = dsv4_net_get64(h + 20);
    char bid[64], mine[64] = "";
    memcpy(bid, h + 28, 63);
    bid[63] = 0;
    if (o->build_id) snprintf(mine, sizeof mine, "%.63s", o->build_id);
    if (r <= 0 || r >= o->nnodes)
        return snprintf(msg, n, "a node says --node-rank %d, outside [1,%d) for --nnodes %d", r, o->nnodes, o->nnodes),
               DSV4_EINVAL;
    if (joined[r]) return snprintf(msg, n, "two nodes both say --node-rank %d", r), DSV4_EINVAL;
    *rank = r;
    if (nn != o->nnodes) return snprintf(msg, n, "node %d has --nnodes %d, node 0 has %d", r, nn, o->nnodes), DSV4_EINVAL;
    if (tp != o->tp_size)
        return snprintf(msg, n, "node %d has --tensor-parallel-size %d, node 0 has %d", r, tp, o->tp_size), DSV4_EINVAL;
    if (ch != o->config_hash)
        return snprintf(msg, n,
                        "node %d has a different model config.json (hash %016llx, node 0 %016llx): same checkpoint "
                        "on every node?",
                        r, (unsigned long long)ch, (unsigned long long)o->config_hash),
               DSV4_EINVAL;
    if (strcmp(bid, mine))
        return snprintf(msg, n, "node %d runs dsv4 build '%s', node 0 runs '%s'", r, bid, mine), DSV4_EINVAL;
    return 0;
}

static void send_reply(int fd, int status, const char *msg, const uint8_t *id, double deadline) {
    uint8_t rep[REPLY_BYTES];
    memset(rep, 0, sizeof rep);
    dsv4_net_put32(rep, (uint32_t)status);
    snprintf((char *)rep + 4, 256, "%.255s", msg ? msg : "");
    if (id) memcpy(rep + 4 + 256, id, DSV4_RDV_ID_BYTES);
    (void)dsv4_net_io_all(fd, rep, sizeof rep, 1, deadline);
}

static int master(const dsv4_rdv_opts *o, const uint8_t *id, double timeout, dsv4_err *err) {
    struct addrinfo *ai;
    int rc = resolve(o, &ai, 1, err);
    if (rc) return rc;
    int bind_errno, ls = dsv4_net_listen(ai, &bind_errno);
    freeaddrinfo(ai);
    if (ls < 0) {
        if (bind_errno == EADDRINUSE)
            return dsv4_err_set(err, DSV4_EIO,
                                "rendezvous: port %d on %s is already in use (another dsv4 serve, or pick a free "
                                "--master-port)",
                                o->master_port, o->master_addr);
        return dsv4_err_set(err, DSV4_EIO, "rendezvous: cannot listen on %s:%d: %s", o->master_addr, o->master_port,
                            strerror(bind_errno));
    }
    int n = o->nnodes;
    int *fds = malloc(sizeof(int) * (size_t)n), *joined = calloc((size_t)n, sizeof(int));
    if (!fds || !joined) {
        free(fds);
        free(joined);
        close(ls);
        return dsv4_err_set(err, DSV4_ENOMEM, "rendezvous: out of memory");
    }
    for (int i = 0; i < n; i++) fds[i] = -1;
    double deadline = dsv4_net_now_s() + timeout;
    int have = 1;
    char msg[256];
    rc = 0;
    while (have < n && !rc) {
        struct pollfd pf = {ls, POLLIN, 0};
        /* wake every 10 s to say who is still missing: a long timeout must not look like a hang */
        int left = dsv4_net_ms_left(deadline), slice = left > 10000 ? 10000 : left;
        int pr = poll(&pf, 1, slice);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            char miss[200] = "";
            size_t off = 0;
            for (int r = 1; r < n && off < sizeof miss - 16; r++)
                if (!joined[r]) off += (size_t)snprintf(miss + off, sizeof miss - off, "%s%d", off ? ", " : "", r);
            if (dsv4_net_ms_left(deadline) > 0) {
                dsv4_log(DSV4_LOG_INFO, "rendezvous on %s:%d: waiting for node%s %s of %d (%.0f s left)",
                         o->master_addr, o->master_port, n - have > 1 ? "s" : "", miss, n,
                         dsv4_net_ms_left(deadline) / 1000.0);
                continue;
            }
            /* say what to do: start the missing nodes (pointed at this address), or wait longer */
            rc = dsv4_err_set(err, DSV4_EIO,
                              "rendezvous on %s:%d: waited %.3g s for node%s %s of %d (%d joined); start %s with "
                              "--nnodes %d --node-rank R --master-addr %s --master-port %d and the same checkpoint "
                              "and -tp, or wait longer: DSV4_RDV_TIMEOUT_S=%.3g (seconds) now",
                              o->master_addr, o->master_port, timeout, n - have > 1 ? "s" : "", miss, n, have - 1,
                              n - have > 1 ? "each" : "it", n, o->master_addr, o->master_port, timeout);
            break;
        }
        int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        uint8_t h[HELLO_BYTES];
        double t = dsv4_net_now_s();
        int io = dsv4_net_io_all(fd, h, sizeof h, 0, deadline < t + 10 ? deadline : t + 10);
        if (io) { /* a port scanner or a peer that died: not fatal */
            close(fd);
            continue;
        }
        int r;
        if (check_hello(o, h, joined, &r, msg, sizeof msg)) {
            send_reply(fd, 1, msg, NULL, dsv4_net_now_s() + 2);
            close(fd);
            rc = dsv4_err_set(err, DSV4_EINVAL, "rendezvous on %s:%d: %s", o->master_addr, o->master_port, msg);
            break;
        }
        joined[r] = 1;
        fds[r] = fd;
        have++;
    }
    /* all in (or refused): tell every waiting peer */
    if (!rc) snprintf(msg, sizeof msg, "ok");
    for (int r = 1; r < n; r++) {
        if (fds[r] < 0) continue;
        send_reply(fds[r], rc ? 1 : 0, rc ? err->msg : msg, rc ? NULL : id, dsv4_net_now_s() + 5);
        close(fds[r]);
    }
    free(fds);
    free(joined);
    close(ls);
    return rc;
}

static int peer(const dsv4_rdv_opts *o, uint8_t *id, double timeout, dsv4_err *err) {
    struct addrinfo *ai;
    int rc = resolve(o, &ai, 0, err);
    if (rc) return rc;
    double deadline = dsv4_net_now_s() + timeout;
    int last, fd = dsv4_net_connect(ai, deadline, 100, NULL, 0, &last); /* node 0 may not listen yet */
    freeaddrinfo(ai);
    if (fd < 0)
        return dsv4_err_set(err, DSV4_EIO,
                            "rendezvous: node %d could not reach node 0 at %s:%d within %.3g s (%s); is node 0 "
                            "started with the same --master-addr and --master-port?",
                            o->node_rank, o->master_addr, o->master_port, timeout, strerror(last));
    uint8_t h[HELLO_BYTES], rep[REPLY_BYTES];
    make_hello(o, h);
    int io = dsv4_net_io_all(fd, h, sizeof h, 1, deadline);
    if (!io) io = dsv4_net_io_all(fd, rep, sizeof rep, 0, deadline);
    close(fd);
    if (io == -2)
        return dsv4_err_set(err, DSV4_EIO,
                            "rendezvous: node %d joined node 0 at %s:%d, but not every node did within %.3g s",
                            o->node_rank, o->master_addr, o->master_port, timeout);
    if (io)
        return dsv4_err_set(err, DSV4_EIO, "rendezvous: node %d: the connection to node 0 at %s:%d broke",
                            o->node_rank, o->master_addr, o->master_port);
    rep[4 + 255] = 0;
    if (dsv4_net_get32(rep))
        return dsv4_err_set(err, DSV4_EINVAL, "rendezvous: node 0 at %s:%d refused node %d: %s", o->master_addr,
                            o->master_port, o->node_rank, (const char *)rep + 4);
    memcpy(id, rep + 4 + 256, DSV4_RDV_ID_BYTES);
    return 0;
}

int dsv4_rendezvous(const dsv4_rdv_opts *o, uint8_t id[DSV4_RDV_ID_BYTES], dsv4_err *err) {
    if (o->nnodes < 1 || o->node_rank < 0 || o->node_rank >= o->nnodes)
        return dsv4_err_set(err, DSV4_EINVAL, "rendezvous: --node-rank %d outside [0,%d)", o->node_rank, o->nnodes);
    if (o->nnodes == 1) return 0;
    if (!o->master_addr || o->master_port < 1 || o->master_port > 65535)
        return dsv4_err_set(err, DSV4_EINVAL, "rendezvous: need --master-addr and a --master-port in 1..65535");
    double timeout = o->timeout_s > 0 ? o->timeout_s : DSV4_RDV_DEFAULT_TIMEOUT_S;
    return o->node_rank == 0 ? master(o, id, timeout, err) : peer(o, id, timeout, err);
}
