/*
 * One generation request from submit to the last byte (spec/SERVING.md
 * §3.4-3.6): the output parser runs as the engine's token hook, so a stop
 * string cuts the engine's run at the right token (also inside a multi-token
 * speculative step) and usage counts only kept tokens; the HTTP thread turns
 * the parser's deltas into SSE chunks or, at the end, one JSON body.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server/service_internal.h"

typedef struct qdelta {
    dsv4_delta_kind kind;
    int tool_index;
    char *text; /* NUL-terminated */
    char tool_id[32];
    char *name;
} qdelta;

typedef struct job {
    dsv4_service *s;
    int chat, stream, include_usage, include_reasoning;
    dsv4_request *req;
    dsv4_outparse *op;
    pthread_mutex_t mu;      /* guards op and q (engine thread vs HTTP thread) */
    qdelta *q;
    int nq, capq;
    char id[48];
    long created;
    int n_prompt, max_tokens;
    double t0, t_first, t_last;
    int ended;               /* engine finished and the parser was closed */
    dsv4_finish efinish;
    /* streaming output */
    char *out;
    size_t out_len, out_cap, out_off;
    int sent_role, sent_final, sent_done;
    char *echo_text;
} job;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void random_hex(char *dst, int n) {
    unsigned char b[32];
    if (getrandom(b, (size_t)(n + 1) / 2, 0) < 0) memset(b, 0x5a, sizeof b);
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) dst[i] = hx[(b[i / 2] >> ((i & 1) ? 0 : 4)) & 15];
    dst[n] = 0;
}

/* Move the parser's pending deltas into j->q (lock held). Streaming only. */
static void take_deltas_locked(job *j) {
    size_t nd = 0;
    const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(j->op, &nd);
    if (!j->stream) return;
    for (size_t i = 0; i < nd; i++) {
        if (j->nq == j->capq) {
            int cap = j->capq ? j->capq * 2 : 16;
            qdelta *nq = realloc(j->q, sizeof *nq * (size_t)cap);
            if (!nq) return; /* dropped under memory pressure; the final result stays correct */
            j->q = nq;
            j->capq = cap;
        }
        qdelta *x = &j->q[j->nq++];
        memset(x, 0, sizeof *x);
        x->kind = d[i].kind;
        x->tool_index = d[i].tool_index;
        if (d[i].text) x->text = strndup(d[i].text, d[i].len);
        if (d[i].tool_id) snprintf(x->tool_id, sizeof x->tool_id, "%s", d[i].tool_id);
        if (d[i].tool_name) x->name = strdup(d[i].tool_name);
    }
}

/* Engine hook (engine thread): feed the step's tokens to the parser. */
static int on_tokens(void *user, const int32_t *t, int n, int *keep) {
    job *j = user;
    pthread_mutex_lock(&j->mu);
    int kept = n;
    dsv4_err e = {0};
    if (dsv4_outparse_feed(j->op, t, n, &kept, &e)) dsv4_log(DSV4_LOG_ERROR, "output parser: %s", e.msg);
    take_deltas_locked(j);
    int fin = dsv4_outparse_finished(j->op);
    pthread_mutex_unlock(&j->mu);
    if (fin) *keep = kept;
    return fin;
}

static dsv4_end_reason end_of(dsv4_finish f) {
    switch (f) {
    case DSV4_FINISH_LENGTH: return DSV4_END_LENGTH;
    case DSV4_FINISH_STOP: return DSV4_END_EOS;
    default: return DSV4_END_ABORT;
    }
}

/*
 * Wait up to timeout_ms for progress. Returns 1 once the request has ended
 * (the parser is then closed and its last deltas queued).
 */
static int pump(job *j, int timeout_ms) {
    if (j->ended) return 1;
    int32_t buf[256];
    dsv4_finish f = DSV4_FINISH_NONE;
    int n = dsv4_request_poll(j->req, buf, 256, &f, timeout_ms);
    double t = now_s();
    if (n > 0) {
        if (j->t_first == 0) j->t_first = t;
        else dsv4_metrics_observe_itl(j->s->metrics, (t - j->t_last) / n);
        j->t_last = t;
    }
    if (f == DSV4_FINISH_NONE) return 0;
    pthread_mutex_lock(&j->mu);
    if (!dsv4_outparse_finished(j->op)) {
        dsv4_err e = {0};
        dsv4_outparse_finish(j->op, end_of(f), &e);
    }
    take_deltas_locked(j);
    pthread_mutex_unlock(&j->mu);
    j->efinish = f;
    j->ended = 1;
    return 1;
}

static void job_free(job *j) {
    if (!j) return;
    if (j->req) {
        /* the engine must be done with the hook before j goes away */
        dsv4_request_cancel(j->req);
        dsv4_finish f = DSV4_FINISH_NONE;
        int32_t buf[256];
        while (f == DSV4_FINISH_NONE) dsv4_request_poll(j->req, buf, 256, &f, 1000);
        dsv4_request_release(j->req);
    }
    for (int i = 0; i < j->nq; i++) {
        free(j->q[i].text);
        free(j->q[i].name);
    }
    free(j->q);
    dsv4_outparse_free(j->op);
    pthread_mutex_destroy(&j->mu);
    free(j->out);
    free(j->echo_text);
    free(j);
}

static void record_metrics(job *j, const dsv4_outparse_result *res) {
    double t = now_s();
    dsv4_metrics_observe_request(j->s->metrics, j->t_first ? j->t_first - j->t0 : -1, t - j->t0, 0, j->n_prompt,
                                 res->completion_tokens, j->max_tokens,
                                 j->efinish == DSV4_FINISH_ERROR ? "error" : res->finish_reason);
    dsv4_metrics_count_parser(j->s->metrics, res->reasoning_unterminated, res->tool_parse_failures,
                              res->dsml_stripped);
}

static cJSON *usage_json(job *j, const dsv4_outparse_result *res) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", res->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + res->completion_tokens);
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", 0);
    if (j->chat) {
        cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
        cJSON_AddNumberToObject(cd, "reasoning_tokens", res->reasoning_tokens);
    }
    return u;
}

static void add_stop_reason(cJSON *choice, const dsv4_outparse_result *res) {
    if (res->stop_reason_str) cJSON_AddStringToObject(choice, "stop_reason", res->stop_reason_str);
    else if (res->stop_reason_token >= 0) cJSON_AddNumberToObject(choice, "stop_reason", res->stop_reason_token);
    else cJSON_AddNullToObject(choice, "stop_reason");
}

static cJSON *envelope(job *j, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object",
                            j->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_name);
    return o;
}

/* The non-streaming body (§3.4, §3.6). */
static void final_body(job *j, dsv4_reply *out) {
    pthread_mutex_lock(&j->mu);
    const dsv4_outparse_result *res = dsv4_outparse_get_result(j->op);
    record_metrics(j, res);
    if (j->efinish == DSV4_FINISH_ERROR) {
        pthread_mutex_unlock(&j->mu);
        dsv4_reply_error(out, 500, NULL, "the engine failed while generating this request (see the server log)");
        return;
    }
    cJSON *o = envelope(j, 0), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        char *content = res->content ? strndup(res->content, res->content_len) : NULL;
        if (content) cJSON_AddStringToObject(m, "content", content);
        else cJSON_AddNullToObject(m, "content");
        free(content);
        if (res->reasoning && j->include_reasoning) {
            char *r = strndup(res->reasoning, res->reasoning_len);
            cJSON_AddStringToObject(m, "reasoning", r ? r : "");
            free(r);
        } else {
            cJSON_AddNullToObject(m, "reasoning");
        }
        cJSON *tcs = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < res->n_tool_calls; i++) {
            cJSON *tc = cJSON_CreateObject(), *fn;
            cJSON_AddStringToObject(tc, "id", res->tool_calls[i].id);
            cJSON_AddStringToObject(tc, "type", "function");
            fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", res->tool_calls[i].name);
            cJSON_AddStringToObject(fn, "arguments", res->tool_calls[i].arguments);
            cJSON_AddItemToArray(tcs, tc);
        }
    } else {
        size_t el = j->echo_text ? strlen(j->echo_text) : 0;
        char *text = malloc(el + res->content_len + 1);
        if (text) {
            if (el) memcpy(text, j->echo_text, el);
            if (res->content_len) memcpy(text + el, res->content, res->content_len);
            text[el + res->content_len] = 0;
        }
        cJSON_AddStringToObject(c, "text", text ? text : "");
        free(text);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", res->finish_reason ? res->finish_reason : "stop");
    add_stop_reason(c, res);
    cJSON_AddItemToObject(o, "usage", usage_json(j, res));
    pthread_mutex_unlock(&j->mu);
    out->status = 200;
    out->content_type = "application/json";
    out->body = cJSON_PrintUnformatted(o);
    out->len = out->body ? strlen(out->body) : 0;
    cJSON_Delete(o);
    if (!out->body) dsv4_reply_error(out, 500, NULL, "out of memory");
}

/* ---- streaming ---- */

static void emit(job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(job *j, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = j->out_cap - j->out_len;
        int n = vsnprintf(j->out ? j->out + j->out_len : NULL, j->out ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (j->out && (size_t)n < room) {
            j->out_len += (size_t)n;
            return;
        }
        size_t cap = (j->out_cap + (size_t)n + 1) * 2;
        char *nb = realloc(j->out, cap);
        if (!nb) return;
        j->out = nb;
        j->out_cap = cap;
    }
}

static void emit_json(job *j, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s) emit(j, "data: %s\n\n", s);
    free(s);
}

/* A chunk with one choice whose delta (chat) or text (completions) is given. */
static cJSON *chunk_with(job *j, cJSON **delta_out) {
    cJSON *o = envelope(j, 1), *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) *delta_out = cJSON_AddObjectToObject(c, "delta");
    else *delta_out = c;
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    return o;
}

/* Turn queued deltas into SSE chunks (lock held). */
static void drain_queue_locked(job *j) {
    for (int i = 0; i < j->nq; i++) {
        qdelta *x = &j->q[i];
        cJSON *d, *o = chunk_with(j, &d);
        switch (x->kind) {
        case DSV4_DELTA_REASONING:
            if (!j->include_reasoning) { cJSON_Delete(o); o = NULL; break; }
            cJSON_AddStringToObject(d, "reasoning", x->text ? x->text : "");
            break;
        case DSV4_DELTA_CONTENT:
            cJSON_AddStringToObject(d, j->chat ? "content" : "text", x->text ? x->text : "");
            break;
        case DSV4_DELTA_TOOL_HEADER: {
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject(), *fn;
            cJSON_AddNumberToObject(tc, "index", x->tool_index);
            cJSON_AddStringToObject(tc, "id", x->tool_id);
            cJSON_AddStringToObject(tc, "type", "function");
            fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", x->name ? x->name : "");
            cJSON_AddStringToObject(fn, "arguments", "");
            cJSON_AddItemToArray(arr, tc);
            break;
        }
        case DSV4_DELTA_TOOL_ARGS: {
            cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject(), *fn;
            cJSON_AddNumberToObject(tc, "index", x->tool_index);
            fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "arguments", x->text ? x->text : "");
            cJSON_AddItemToArray(arr, tc);
            break;
        }
        }
        if (o) emit_json(j, o);
        free(x->text);
        free(x->name);
    }
    j->nq = 0;
}

static void emit_end(job *j) {
    pthread_mutex_lock(&j->mu);
    drain_queue_locked(j);
    const dsv4_outparse_result *res = dsv4_outparse_get_result(j->op);
    record_metrics(j, res);
    if (j->efinish == DSV4_FINISH_ERROR) {
        emit(j, "data: {\"error\":{\"message\":\"the engine failed while generating this request\","
                "\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n");
    } else {
        cJSON *d, *o = chunk_with(j, &d);
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        cJSON_ReplaceItemInObject(c, "finish_reason",
                                  cJSON_CreateString(res->finish_reason ? res->finish_reason : "stop"));
        add_stop_reason(c, res);
        if (!j->chat) cJSON_AddStringToObject(d, "text", "");
        emit_json(j, o);
        if (j->include_usage) {
            cJSON *u = envelope(j, 1);
            cJSON_AddArrayToObject(u, "choices");
            cJSON_AddItemToObject(u, "usage", usage_json(j, res));
            emit_json(j, u);
        }
    }
    pthread_mutex_unlock(&j->mu);
    emit(j, "data: [DONE]\n\n");
    j->sent_done = 1;
}

static long stream_read(void *ctx, char *buf, size_t max) {
    job *j = ctx;
    while (j->out_off == j->out_len) {
        j->out_off = j->out_len = 0;
        if (j->sent_done) return -1;
        if (!j->sent_role) {
            cJSON *d, *o = chunk_with(j, &d);
            if (j->chat) {
                cJSON_AddStringToObject(d, "role", "assistant");
                cJSON_AddStringToObject(d, "content", "");
            } else {
                cJSON_AddStringToObject(d, "text", j->echo_text ? j->echo_text : "");
            }
            emit_json(j, o);
            j->sent_role = 1;
            continue;
        }
        int ended = pump(j, 15000);
        pthread_mutex_lock(&j->mu);
        drain_queue_locked(j);
        pthread_mutex_unlock(&j->mu);
        if (ended) emit_end(j);
        else if (j->out_len == 0) emit(j, ": keep-alive\n\n"); /* §3.5: at least every 15 s */
    }
    size_t n = j->out_len - j->out_off;
    if (n > max) n = max;
    memcpy(buf, j->out + j->out_off, n);
    j->out_off += n;
    return (long)n;
}

static void stream_close(void *ctx) { job_free(ctx); }

void dsv4_service_run_job(dsv4_service *s, int chat, const int32_t *ids, int n_ids, dsv4_req_params *p,
                          const dsv4_outparse_config *pc, const char *prompt_text, dsv4_reply *out) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        dsv4_reply_error(out, 500, NULL, "out of memory");
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->s = s;
    j->chat = chat;
    j->stream = p->stream;
    j->include_usage = p->include_usage;
    j->include_reasoning = p->include_reasoning;
    j->n_prompt = n_ids;
    j->t0 = now_s();
    j->created = (long)time(NULL);
    strcpy(j->id, chat ? "chatcmpl-" : "cmpl-");
    random_hex(j->id + strlen(j->id), 32);
    if (p->echo && prompt_text) j->echo_text = strdup(prompt_text);
    dsv4_err err = {0};
    j->op = dsv4_outparse_create(pc, &s->vocab_view, &err);
    if (!j->op) {
        dsv4_reply_error(out, 400, "stop", "%s", err.msg);
        job_free(j);
        return;
    }
    p->gen.on_tokens = on_tokens;
    p->gen.user = j;
    j->max_tokens = p->gen.max_tokens;
    if (dsv4_engine_submit(s->engine, ids, n_ids, &p->gen, &j->req, &err)) {
        if (err.code == DSV4_ERANGE) dsv4_reply_error(out, 400, chat ? "messages" : "prompt", "%s", err.msg);
        else dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, NULL, "%s", err.msg);
        job_free(j);
        return;
    }
    if (p->stream) {
        out->status = 200;
        out->content_type = "text/event-stream";
        out->stream = (dsv4_stream_src){j, stream_read, stream_close};
        return;
    }
    while (!pump(j, -1)) {}
    final_body(j, out);
    job_free(j);
}
