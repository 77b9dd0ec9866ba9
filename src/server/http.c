/*
 * libmicrohttpd plumbing (spec/SERVING.md §3.1). The body is accumulated per
 * connection under opts.max_body_bytes (413 beyond it, read no further), then
 * handed to the router, whose reply is sent as-is. One thread per connection
 * keeps long-lived SSE streams from blocking other clients.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "server/server.h"

struct dsv4_server {
    struct MHD_Daemon *d;
    dsv4_router *rt;
    size_t max_body;
};

typedef struct conn_state {
    char *buf;
    size_t len, cap;
    int too_large;
    size_t header_bytes; /* request line + headers; > DSV4_MAX_HEADER_BYTES -> 431 */
} conn_state;

/*
 * Header limits. libmicrohttpd answers requests whose headers do not fit in
 * a connection's memory pool itself, with a fixed HTML body (its
 * REQUEST_TOO_BIG text, 431) that no option or callback can replace; the
 * same holds for the few requests it rejects before calling us (a malformed
 * request line, HTTP/1.1 without Host: 400; an unknown HTTP version: 505).
 * So the pool is made large enough (MHD_POOL_BYTES) to hold headers well
 * beyond our own limit, and we refuse headers over DSV4_MAX_HEADER_BYTES
 * with a JSON 431 in OpenAI's shape (§3.8). Only headers beyond the pool
 * (about 1 MiB) still get libmicrohttpd's HTML. The pool is mmap'ed, so
 * untouched pages cost nothing.
 */
#define DSV4_MAX_HEADER_BYTES ((size_t)64 << 10)
#define MHD_POOL_BYTES ((size_t)1 << 20)

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    size_t *n = cls;
    *n += (key ? strlen(key) : 0) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    dsv4_stream_src *s = cls;
    long n = s->read(s->ctx, buf, max);
    return n < 0 ? MHD_CONTENT_READER_END_OF_STREAM : (ssize_t)n;
}

static void stream_free(void *cls) {
    dsv4_stream_src *s = cls;
    if (s->close) s->close(s->ctx);
    free(s);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, dsv4_reply *r) {
    struct MHD_Response *resp;
    if (r->stream.read) {
        dsv4_stream_src *s = malloc(sizeof *s);
        if (!s) return MHD_NO;
        *s = r->stream;
        memset(&r->stream, 0, sizeof r->stream); /* now owned by the response */
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
        if (!resp) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
    } else {
        resp = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_COPY);
    }
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", r->content_type ? r->content_type : "application/json");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Has the client of this connection gone? 1: the connection is broken (reset
 * or a socket error); 2: the client sent EOF (it closed the socket, or only
 * shut down its sending side and still reads: the two look the same until
 * something is written); 0: no sign. Runs on the connection's own thread
 * while MHD is not reading it, so peeking is safe; pipelined bytes of a next
 * request do not count. */
static int client_gone(void *ctx) {
    int fd = (int)(intptr_t)ctx;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLERR | POLLNVAL)) return 1;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0) return 2;
    return k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    dsv4_server *srv = cls;
    conn_state *st = *con_cls;
    if (!st) { /* first call: headers only */
        st = calloc(1, sizeof *st);
        if (!st) return MHD_NO;
        *con_cls = st;
        st->header_bytes = strlen(method) + strlen(url) + strlen(version) + 4;
        MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_bytes, &st->header_bytes);
        if (st->header_bytes > DSV4_MAX_HEADER_BYTES) st->too_large = 1; /* keep no body; answered 431 */
        return MHD_YES;
    }
    if (*upload_size) { /* a chunk of the body */
        if (!st->too_large && st->len + *upload_size > srv->max_body) st->too_large = 1;
        if (!st->too_large) {
            if (st->len + *upload_size > st->cap) {
                size_t cap = st->cap ? st->cap : 4096;
                while (cap < st->len + *upload_size) cap *= 2;
                char *nb = realloc(st->buf, cap);
                if (!nb) return MHD_NO;
                st->buf = nb;
                st->cap = cap;
            }
            memcpy(st->buf + st->len, upload, *upload_size);
            st->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    dsv4_reply r;
    memset(&r, 0, sizeof r);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) {
        r.client_gone = client_gone;
        r.gone_ctx = (void *)(intptr_t)ci->connect_fd;
    }
    if (st->header_bytes > DSV4_MAX_HEADER_BYTES) {
        dsv4_reply_error(&r, 431, NULL, "request headers are %zu bytes; the limit is %zu bytes", st->header_bytes,
                         DSV4_MAX_HEADER_BYTES);
    } else if (st->too_large) {
        dsv4_reply_error(&r, 413, NULL, "request body exceeds the limit of %zu bytes", srv->max_body);
    } else {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        dsv4_router_handle(srv->rt, method, url, auth, st->buf ? st->buf : "", st->len, &r);
    }
    enum MHD_Result ret = send_reply(c, &r);
    dsv4_reply_free(&r);
    return ret;
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode tc) {
    conn_state *st = *con_cls;
    if (st) {
        free(st->buf);
        free(st);
    }
    *con_cls = NULL;
}

int dsv4_server_start(dsv4_router *rt, const dsv4_server_opts *opts, dsv4_server **out, dsv4_err *err) {
    *out = NULL;
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)opts->port);
    if (opts->port <= 0 || opts->port > 65535)
        return dsv4_err_set(err, DSV4_EINVAL, "--port %d is out of range (1-65535)", opts->port);
    if (inet_pton(AF_INET, opts->host, &addr.sin_addr) != 1)
        return dsv4_err_set(err, DSV4_EINVAL, "--host '%s' is not an IPv4 address", opts->host);
    dsv4_server *srv = calloc(1, sizeof *srv);
    if (!srv) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory starting the HTTP server");
    srv->rt = rt;
    srv->max_body = opts->max_body_bytes;
    /* poll(), not select(): select stops at FD_SETSIZE (1024) descriptors and a
     * flood of half-open connections would lock every client out; the
     * connection limit keeps one client from taking all threads. */
    srv->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                  MHD_USE_ERROR_LOG,
                              (uint16_t)opts->port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)4096, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)1024,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, MHD_POOL_BYTES, MHD_OPTION_END);
    if (!srv->d) {
        free(srv);
        return dsv4_err_set(err, DSV4_EIO, "cannot listen on %s:%d (port in use or not permitted)", opts->host,
                            opts->port);
    }
    *out = srv;
    return DSV4_OK;
}

void dsv4_server_stop(dsv4_server *srv) {
    if (!srv) return;
    MHD_stop_daemon(srv->d);
    free(srv);
}
