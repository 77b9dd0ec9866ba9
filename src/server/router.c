/*
 * Request routing, authentication and validation (spec/SERVING.md §3).
 *
 * Everything a client can get wrong is answered here, before anything reaches
 * the engine (DESIGN.md "Data flow" step 1): unknown route 404, wrong method
 * 405, missing/invalid key 401, invalid UTF-8 or JSON 400 (the message says
 * where), unknown model 404 listing the served names. The HTTP layer has
 * already enforced the body-size limit (413).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/server.h"
#include "server/service.h"

struct dsv4_router {
    dsv4_server_opts opts;
    pthread_mutex_t mu;
    int ready;
    char why[256];
    time_t created;
    dsv4_service *svc;
};

void dsv4_server_opts_default(dsv4_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8888;
    o->served_names[0] = "deepseek-v4-flash-dspark";
    o->n_served_names = 1;
    o->max_model_len = 1048576;
    o->max_body_bytes = (size_t)64 << 20;
}

dsv4_router *dsv4_router_create(const dsv4_server_opts *opts) {
    dsv4_router *rt = calloc(1, sizeof *rt);
    if (!rt) return NULL;
    rt->opts = *opts;
    pthread_mutex_init(&rt->mu, NULL);
    snprintf(rt->why, sizeof rt->why, "the model is loading");
    rt->created = time(NULL);
    return rt;
}

void dsv4_router_free(dsv4_router *rt) {
    if (!rt) return;
    pthread_mutex_destroy(&rt->mu);
    free(rt);
}

void dsv4_router_set_ready(dsv4_router *rt, int ready, const char *why) {
    pthread_mutex_lock(&rt->mu);
    rt->ready = ready;
    snprintf(rt->why, sizeof rt->why, "%s", why ? why : "");
    pthread_mutex_unlock(&rt->mu);
}

void dsv4_router_set_service(dsv4_router *rt, dsv4_service *svc) {
    pthread_mutex_lock(&rt->mu);
    rt->svc = svc;
    pthread_mutex_unlock(&rt->mu);
}

void dsv4_router_set_max_model_len(dsv4_router *rt, int64_t n) {
    pthread_mutex_lock(&rt->mu);
    rt->opts.max_model_len = n;
    pthread_mutex_unlock(&rt->mu);
}

static dsv4_service *get_service(dsv4_router *rt) {
    pthread_mutex_lock(&rt->mu);
    dsv4_service *s = rt->svc;
    pthread_mutex_unlock(&rt->mu);
    return s;
}

static int is_ready(dsv4_router *rt, char *why, size_t n) {
    pthread_mutex_lock(&rt->mu);
    int r = rt->ready;
    snprintf(why, n, "%s", rt->why);
    pthread_mutex_unlock(&rt->mu);
    return r;
}

/* Constant-time comparison so key checks leak no prefix length (§3.1). */
static int key_equal(const char *a, size_t alen, const char *b) {
    size_t blen = strlen(b);
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < alen; i++) diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (blen ? blen : 1)];
    return diff == 0;
}

static int authorized(const dsv4_router *rt, const char *auth) {
    if (rt->opts.n_api_keys == 0) return 1;
    if (!auth || strncmp(auth, "Bearer ", 7) != 0) return 0;
    const char *k = auth + 7;
    size_t klen = strlen(k);
    int ok = 0;
    for (int i = 0; i < rt->opts.n_api_keys; i++) ok |= key_equal(k, klen, rt->opts.api_keys[i]);
    return ok;
}

/* Strict UTF-8 validation (no overlongs, no surrogates, <= U+10FFFF). Returns the
 * byte offset of the first invalid sequence, or -1 when valid. */
static long utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; c &= 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; c &= 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; c &= 0x07; }
        else return (long)i;
        if (i + len > n) return (long)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (long)i;
            c = (c << 6) | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return (long)i;
        i += len;
    }
    return -1;
}

static cJSON *model_object(const dsv4_router *rt, const char *name) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)rt->created);
    cJSON_AddStringToObject(m, "owned_by", "dsv4");
    cJSON_AddStringToObject(m, "root", rt->opts.model_root ? rt->opts.model_root : name);
    cJSON_AddNullToObject(m, "parent");
    pthread_mutex_lock((pthread_mutex_t *)&rt->mu);
    double mml = (double)rt->opts.max_model_len;
    pthread_mutex_unlock((pthread_mutex_t *)&rt->mu);
    cJSON_AddNumberToObject(m, "max_model_len", mml);
    cJSON_AddNumberToObject(m, "context_length", mml);
    return m;
}

static int served_index(const dsv4_router *rt, const char *name) {
    for (int i = 0; i < rt->opts.n_served_names; i++)
        if (!strcmp(rt->opts.served_names[i], name)) return i;
    return -1;
}

static void unknown_model(const dsv4_router *rt, const char *name, dsv4_reply *out) {
    char avail[1024] = "";
    size_t off = 0;
    for (int i = 0; i < rt->opts.n_served_names && off < sizeof avail; i++)
        off += (size_t)snprintf(avail + off, sizeof avail - off, "%s%s", i ? ", " : "",
                                rt->opts.served_names[i]);
    dsv4_reply_error(out, 404, "model", "The model `%s` does not exist. Available: %s", name, avail);
}

static void route_models(dsv4_router *rt, const char *id, dsv4_reply *out) {
    /* before ready the context length is not known yet (it comes from the loaded
     * config): a 503 like /health, not a model card with a placeholder length */
    char why[256];
    if (!is_ready(rt, why, sizeof why)) {
        dsv4_reply_error(out, 503, NULL, "not ready: %s", why);
        return;
    }
    if (id) {
        if (served_index(rt, id) < 0) {
            unknown_model(rt, id, out);
            return;
        }
        dsv4_reply_json(out, 200, model_object(rt, id));
        return;
    }
    cJSON *root = cJSON_CreateObject(), *data;
    cJSON_AddStringToObject(root, "object", "list");
    data = cJSON_AddArrayToObject(root, "data");
    for (int i = 0; i < rt->opts.n_served_names; i++)
        cJSON_AddItemToArray(data, model_object(rt, rt->opts.served_names[i]));
    dsv4_reply_json(out, 200, root);
}

/* Byte offset -> "line L, column C" for JSON error messages. */
static void json_where(const char *body, size_t off, char *buf, size_t n) {
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (body[i] == '\n') { line++; col = 1; } else col++;
    }
    snprintf(buf, n, "line %d, column %d (byte %zu)", line, col, off);
}

/*
 * Parse and pre-validate a generation request body: valid UTF-8, a JSON object,
 * and a known `model` (empty/absent = canonical, §3.2). Returns the parsed
 * object, or NULL with *out filled.
 */
static cJSON *parse_request(dsv4_router *rt, const char *body, size_t len, dsv4_reply *out) {
    if (len == 0) {
        dsv4_reply_error(out, 400, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    long bad = utf8_invalid_at((const unsigned char *)body, len);
    if (bad >= 0) {
        dsv4_reply_error(out, 400, NULL, "request body is not valid UTF-8 (first invalid byte at offset %ld)",
                         bad);
        return NULL;
    }
    const char *end = NULL;
    cJSON *req = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!req) {
        char where[96];
        size_t off = end ? (size_t)(end - body) : 0;
        if (off > len) off = len;
        json_where(body, off, where, sizeof where);
        dsv4_reply_error(out, 400, NULL, "invalid JSON in request body at %s", where);
        return NULL;
    }
    size_t rest = end ? (size_t)(end - body) : len;
    while (rest < len && (body[rest] == ' ' || body[rest] == '\t' || body[rest] == '\n' || body[rest] == '\r'))
        rest++;
    if (rest < len) { /* `{...} xyz`: refuse rather than silently ignore what follows */
        char where[96];
        json_where(body, rest, where, sizeof where);
        cJSON_Delete(req);
        dsv4_reply_error(out, 400, NULL, "unexpected data after the JSON object at %s", where);
        return NULL;
    }
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        dsv4_reply_error(out, 400, NULL, "request body must be a JSON object");
        return NULL;
    }
    cJSON *model = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) {
            cJSON_Delete(req);
            dsv4_reply_error(out, 400, "model", "`model` must be a string");
            return NULL;
        }
        if (model->valuestring[0] && served_index(rt, model->valuestring) < 0 &&
            !rt->opts.accept_any_model_name) {
            unknown_model(rt, model->valuestring, out);
            cJSON_Delete(req);
            return NULL;
        }
    }
    return req;
}

static void route_generate(dsv4_router *rt, dsv4_svc_route route, const char *body, size_t len, dsv4_reply *out) {
    cJSON *req = parse_request(rt, body, len, out);
    if (!req) return;
    char why[256];
    dsv4_service *svc = get_service(rt);
    if (!is_ready(rt, why, sizeof why) || !svc) {
        cJSON_Delete(req);
        dsv4_reply_error(out, 503, NULL, "the server is not ready: %s", why);
        return;
    }
    dsv4_service_handle(svc, route, req, body, len, out);
    cJSON_Delete(req);
}

static void route_health(dsv4_router *rt, dsv4_reply *out) {
    char why[256];
    if (!is_ready(rt, why, sizeof why)) {
        dsv4_reply_error(out, 503, NULL, "not ready: %s", why);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    dsv4_reply_json(out, 200, o);
}

typedef enum { R_HEALTH, R_VERSION, R_MODELS, R_MODEL_ID, R_CHAT, R_COMPLETIONS, R_TOKENIZE,
               R_DETOKENIZE, R_METRICS, R_NONE } route_id;

static route_id match_route(const char *path, const char **id, const char **want_method) {
    *id = NULL;
    *want_method = "GET";
    if (!strcmp(path, "/health") || !strcmp(path, "/ping")) return R_HEALTH;
    if (!strcmp(path, "/version")) return R_VERSION;
    if (!strcmp(path, "/metrics")) return R_METRICS;
    if (!strcmp(path, "/v1/models")) return R_MODELS;
    if (!strncmp(path, "/v1/models/", 11) && path[11]) {
        *id = path + 11;
        return R_MODEL_ID;
    }
    *want_method = "POST";
    if (!strcmp(path, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(path, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(path, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(path, "/detokenize")) return R_DETOKENIZE;
    return R_NONE;
}

/* Build facts for /version: DSV4_GIT_COMMIT and DSV4_BUILD_TYPE come from
 * CMake (set when the build was configured); CUDA from DSV4_HAVE_CUDA. */
#ifndef DSV4_GIT_COMMIT
#define DSV4_GIT_COMMIT ""
#endif
#ifndef DSV4_BUILD_TYPE
#define DSV4_BUILD_TYPE ""
#endif
#ifdef DSV4_HAVE_CUDA
#define DSV4_BUILD_CUDA 1
#else
#define DSV4_BUILD_CUDA 0
#endif

/* GET /version (SERVING.md §3.7): vLLM's {"version"} plus additive keys. The
 * profile is null while the model is loading. */
static void route_version(dsv4_router *rt, dsv4_reply *out) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", "0.1.0-dev");
    const char *commit = DSV4_GIT_COMMIT, *type = DSV4_BUILD_TYPE;
    char build[160];
    snprintf(build, sizeof build, "%s%s%s%s", commit[0] ? commit : "unknown", type[0] ? " " : "", type,
             DSV4_BUILD_CUDA ? " cuda" : " cpu-only");
    cJSON_AddStringToObject(o, "build", build);
    if (commit[0]) cJSON_AddStringToObject(o, "git_commit", commit);
    else cJSON_AddNullToObject(o, "git_commit");
    cJSON_AddStringToObject(o, "build_type", type[0] ? type : "unspecified");
    cJSON_AddBoolToObject(o, "cuda", DSV4_BUILD_CUDA);
    cJSON_AddStringToObject(o, "checkpoint", rt->opts.model_root ? rt->opts.model_root : "");
    dsv4_service *svc = get_service(rt);
    if (svc) cJSON_AddStringToObject(o, "reasoning_effort_profile", dsv4_service_profile_name(svc));
    else cJSON_AddNullToObject(o, "reasoning_effort_profile");
    dsv4_reply_json(out, 200, o);
}

void dsv4_router_handle(dsv4_router *rt, const char *method, const char *path, const char *auth,
                        const char *body, size_t len, dsv4_reply *out) {
    int (*gone)(void *) = out->client_gone;
    void *gone_ctx = out->gone_ctx;
    memset(out, 0, sizeof *out);
    out->client_gone = gone;
    out->gone_ctx = gone_ctx;
    const char *id, *want;
    route_id r = match_route(path, &id, &want);
    if (r == R_NONE) {
        dsv4_reply_error(out, 404, NULL, "no route for %s %s", method, path);
        return;
    }
    int open_route = r == R_HEALTH || (r == R_METRICS && !rt->opts.metrics_need_auth);
    if (!open_route && !authorized(rt, auth)) {
        dsv4_reply_error(out, 401, NULL, "missing or invalid API key (send `Authorization: Bearer <key>`)");
        return;
    }
    if (strcmp(method, want) != 0) {
        dsv4_reply_error(out, 405, NULL, "%s %s is not allowed; use %s", method, path, want);
        return;
    }
    switch (r) {
    case R_HEALTH: route_health(rt, out); return;
    case R_MODELS: route_models(rt, NULL, out); return;
    case R_MODEL_ID: route_models(rt, id, out); return;
    case R_VERSION: {
        route_version(rt, out);
        return;
    }
    case R_CHAT: route_generate(rt, DSV4_SVC_CHAT, body, len, out); return;
    case R_COMPLETIONS: route_generate(rt, DSV4_SVC_COMPLETIONS, body, len, out); return;
    case R_TOKENIZE: route_generate(rt, DSV4_SVC_TOKENIZE, body, len, out); return;
    case R_DETOKENIZE: route_generate(rt, DSV4_SVC_DETOKENIZE, body, len, out); return;
    case R_METRICS:
        out->status = 200;
        out->content_type = "text/plain; version=0.0.4";
    {
        dsv4_service *svc = get_service(rt);
        out->body = svc ? dsv4_service_metrics(svc) : strdup("# dsv4: the model is loading\n");
    }
        out->len = out->body ? strlen(out->body) : 0;
        return;
    case R_NONE: break;
    }
}
