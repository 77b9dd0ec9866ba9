/*
 * The OpenAI-compatible HTTP front end (spec/SERVING.md §3).
 *
 * Split in two so the interesting part is testable without sockets:
 *   router.c  — a pure function from (method, path, Authorization, body) to a
 *               reply (status, content type, body); all validation, auth and
 *               error shapes live here (SERVING.md §3.1, §3.2, §3.7, §3.8);
 *   http.c    — libmicrohttpd plumbing: accumulate the body under a size
 *               limit, call the router, send the reply.
 * Generation routes reach the engine through dsv4_server_gen hooks; until an
 * engine is attached they answer 503 (SERVING.md §3.1 "Readiness").
 */
#ifndef DSV4_SERVER_H
#define DSV4_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dsv4/common.h"

#define DSV4_SERVER_MAX_KEYS 16
#define DSV4_SERVER_MAX_NAMES 16

typedef struct dsv4_server_opts {
    const char *host;                 /* bind address, default "127.0.0.1" (§0.3) */
    int port;                         /* default 8888 */
    const char *api_keys[DSV4_SERVER_MAX_KEYS]; /* empty: no auth (§3.1) */
    int n_api_keys;
    const char *served_names[DSV4_SERVER_MAX_NAMES]; /* [0] is canonical (§3.2) */
    int n_served_names;
    const char *model_root;           /* checkpoint path shown as "root" */
    int64_t max_model_len;            /* tokens */
    size_t max_body_bytes;            /* 413 above it; default 64 MiB (§3.1) */
    int metrics_need_auth;            /* 0: /metrics open like /health */
    int accept_any_model_name;        /* map unknown names to the served model */
} dsv4_server_opts;

/* Fill opts with the defaults of SERVING.md §0.3. */
void dsv4_server_opts_default(dsv4_server_opts *opts);

/*
 * A streamed body (SSE): the HTTP layer calls read until it returns -1.
 * read blocks until it has bytes (the producer sends keep-alive comments
 * while waiting, SERVING.md §3.5) and returns how many it wrote (> 0), or -1
 * at the end. close is called exactly once, at the end or when the client
 * goes away (then the producer cancels its request).
 */
/* read: bytes written to buf (> 0), or -1 to end the stream (done, or the client is gone: close says which). */
typedef struct dsv4_stream_src {
    void *ctx;
    long (*read)(void *ctx, char *buf, size_t max);
    void (*close)(void *ctx);
} dsv4_stream_src;

/* A reply produced by the router. body is malloc'd and owned by the reply;
 * when stream.read is set the body is streamed instead (body unused). */
typedef struct dsv4_reply {
    int status;
    const char *content_type; /* static string */
    char *body;
    size_t len;
    dsv4_stream_src stream;
    /* Set by the HTTP layer before dsv4_router_handle (which keeps them):
     * client_gone(gone_ctx) is nonzero once the client has hung up, so a
     * request can be aborted while nothing is written to it (a non-streaming
     * request, a stream before its first chunk; SERVING.md §3.5): 1 = the
     * connection is broken, 2 = the client sent EOF (closed, or half-closed
     * and still reading: a stream tells them apart by writing a keep-alive
     * comment, which a closed socket answers with a reset). Valid while the
     * connection lives (the stream's close). NULL = unknown. */
    int (*client_gone)(void *gone_ctx);
    void *gone_ctx;
} dsv4_reply;

void dsv4_reply_free(dsv4_reply *r);

/*
 * dsv4_reply_error — fill r with an OpenAI/vLLM error body (SERVING.md §3.8):
 *   {"error":{"message":msg,"type":"<Phrase>Error","param":param|null,"code":status}}
 * status: HTTP status (400, 401, 404, 405, 413, 429, 500, 503). param may be NULL.
 * Returns 0, or DSV4_ENOMEM (r then holds a static fallback body).
 */
int dsv4_reply_error(dsv4_reply *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * dsv4_reply_json — fill r with status and obj printed as JSON; takes
 * ownership of obj (deleted). Allocation failure gives a 500 error body.
 */
void dsv4_reply_json(dsv4_reply *r, int status, cJSON *obj);

/* State shared by the router and the HTTP layer. */
typedef struct dsv4_router dsv4_router;

/* Create/free a router over opts (copied). Returns NULL on allocation failure. */
dsv4_router *dsv4_router_create(const dsv4_server_opts *opts);
void dsv4_router_free(dsv4_router *rt);

/* The generation service behind the router (server/service.h); NULL = none. */
struct dsv4_service;
void dsv4_router_set_service(dsv4_router *rt, struct dsv4_service *svc);

/* Set the context length shown by /v1/models (known once the model is loaded). */
void dsv4_router_set_max_model_len(dsv4_router *rt, int64_t n);

/* Mark the engine ready (1) or not (0); why is shown in 503 bodies while not ready. */
void dsv4_router_set_ready(dsv4_router *rt, int ready, const char *why);

/*
 * dsv4_router_handle — answer one request.
 *   method: "GET", "POST", ...; path: URL path without query string;
 *   auth: value of the Authorization header or NULL; body/len: request body.
 * Always fills *out (never fails; allocation failure gives a 500 with a static body).
 */
void dsv4_router_handle(dsv4_router *rt, const char *method, const char *path, const char *auth,
                        const char *body, size_t len, dsv4_reply *out);

/* A running HTTP server (libmicrohttpd, one thread per connection). */
typedef struct dsv4_server dsv4_server;

/*
 * dsv4_server_start — bind host:port and serve rt (not owned) in background threads.
 * Errors: DSV4_EINVAL (bad host), DSV4_EIO (cannot bind: message names host:port).
 */
int dsv4_server_start(dsv4_router *rt, const dsv4_server_opts *opts, dsv4_server **out, dsv4_err *err);
void dsv4_server_stop(dsv4_server *srv);

#endif
