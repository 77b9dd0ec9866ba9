/*
 * One generation request from submit to the last byte (spec/SERVING.md
 * §3.4-3.6): the output parser runs as the engine's token hook, so a stop
 * string cuts the engine's run at the right token (also inside a multi-token
 * speculative step) and usage counts only kept tokens; the HTTP thread turns
 * the parser's deltas into SSE chunks or, at the end, one JSON body.
 *
 * n > 1 (§3.3): one engine request and one parser per choice, all sharing the
 * prompt and the response id; streaming interleaves the choices' chunks by
 * index as their tokens arrive. Logprobs: the HTTP thread copies each
 * choice's records from the engine as it polls tokens (never from the engine
 * hook, which runs under the engine's lock); a streamed chunk carries the
 * records of the tokens fed to the parser up to the delta it shows, and the
 * final chunk whatever is left (tokens held back by stop matching, EOS).
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "engine/constrain.h"
#include "server/service_internal.h"

typedef struct qdelta {
    dsv4_delta_kind kind;
    int tool_index;
    char *text; /* NUL-terminated */
    char tool_id[32];
    char *name;
    int lp_to;  /* tokens fed to the parser when this delta was produced */
} qdelta;

struct job;

/* One choice: an engine request and its parser (SERVING.md §3.3 `n`). */
typedef struct choice {
    struct job *j;
    int index;
    dsv4_request *req;
    dsv4_constraint *con;    /* constrained decoding state (engine thread), or NULL */
    dsv4_outparse *op;       /* guarded by j->mu (engine thread vs HTTP thread) */
    qdelta *q;               /* guarded by j->mu */
    int nq, capq;
    int n_fed;               /* tokens kept by the parser (engine thread, under j->mu) */
    double t_first, t_last;
    int ended;               /* engine finished and the parser was closed */
    int recorded;            /* its metrics were recorded */
    dsv4_finish efinish;
    int sent_final;
    /* logprobs (HTTP thread only) */
    dsv4_token_logprob *lp;  /* records of the tokens polled so far */
    int n_lp, cap_lp, lp_sent;
    long text_off;           /* completions: character offset of the next token */
} choice;

typedef struct job {
    dsv4_service *s;
    int chat, stream, include_usage, include_reasoning;
    int continuous_usage;    /* stream_options.continuous_usage_stats with include_usage */
    int logprobs, top_logprobs;
    int skip_special;        /* skip_special_tokens: special tokens add no text (text_offset) */
    /* prompt log-probabilities (completions): echo_lp = echo + logprobs
     * (legacy lists, prompt first); plp_n = prompt_logprobs N or -1. Taken
     * from choice 0's engine request (HTTP thread only). */
    int echo_lp, plp_n;
    dsv4_token_logprob *plp;
    int32_t *prank;
    int n_plp;               /* records fetched (n_prompt), 0 = not yet */
    int plp_gone;            /* the records will never come (request ended without them) */
    pthread_mutex_t mu;      /* guards every choice's op and q */
    choice *c;
    int n;
    char id[48];
    long created;
    int n_prompt, max_tokens;
    double t0, t_out;
    /* streaming output */
    char *out;
    size_t out_len, out_cap, out_off;
    int sent_role, sent_done;
    char *echo_text;
    dsv4_grammar *grammar;   /* the choices' constraint grammar, owned, or NULL */
    /* streams: the HTTP layer's hang-up test (dsv4_reply.client_gone), checked while nothing is written
     * (the prefill before the first chunk); NULL = unknown */
    int (*gone)(void *);
    void *gone_ctx;
    int probed;              /* the client sent EOF and a keep-alive went out to see whether it still reads */
} job;

/* Has the stream's client hung up? Asked only while the stream writes nothing (a write would tell too).
 * 1: gone (the connection is broken); 2: it sent EOF and no keep-alive has probed it yet (a closed socket
 * answers the keep-alive with a reset, seen by the next call; a half-closed client reads it and stays);
 * 0: no sign. */
static int stream_client_gone(job *j) {
    const int g = j->gone ? j->gone(j->gone_ctx) : 0;
    return g == 1 ? 1 : g == 2 && !j->probed ? 2 : 0;
}

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

/* Move the parser's pending deltas into c->q (j->mu held). Streaming only. */
static void take_deltas_locked(choice *c) {
    size_t nd = 0;
    const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(c->op, &nd);
    if (!c->j->stream) return;
    for (size_t i = 0; i < nd; i++) {
        if (c->nq == c->capq) {
            int cap = c->capq ? c->capq * 2 : 16;
            qdelta *nq = realloc(c->q, sizeof *nq * (size_t)cap);
            if (!nq) return; /* dropped under memory pressure; the final result stays correct */
            c->q = nq;
            c->capq = cap;
        }
        qdelta *x = &c->q[c->nq++];
        memset(x, 0, sizeof *x);
        x->kind = d[i].kind;
        x->tool_index = d[i].tool_index;
        x->lp_to = c->n_fed;
        if (d[i].text) x->text = strndup(d[i].text, d[i].len);
        if (d[i].tool_id) snprintf(x->tool_id, sizeof x->tool_id, "%s", d[i].tool_id);
        if (d[i].tool_name) x->name = strdup(d[i].tool_name);
    }
}

/* Engine hook (engine thread): feed the step's tokens to the parser. */
static int on_tokens(void *user, const int32_t *t, int n, int *keep) {
    choice *c = user;
    pthread_mutex_lock(&c->j->mu);
    int kept = n;
    dsv4_err e = {0};
    if (dsv4_outparse_feed(c->op, t, n, &kept, &e)) dsv4_log(DSV4_LOG_ERROR, "output parser: %s", e.msg);
    int fin = dsv4_outparse_finished(c->op);
    c->n_fed += fin ? kept : n;
    take_deltas_locked(c);
    pthread_mutex_unlock(&c->j->mu);
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

/* Copy the logprob records of n newly polled tokens (HTTP thread, no lock held). */
static void fetch_logprobs(choice *c, int n) {
    if (!c->j->logprobs || n <= 0) return;
    if (c->n_lp + n > c->cap_lp) {
        int cap = (c->n_lp + n) * 2;
        dsv4_token_logprob *nl = realloc(c->lp, sizeof *nl * (size_t)cap);
        if (!nl) return;
        c->lp = nl;
        c->cap_lp = cap;
    }
    c->n_lp += dsv4_request_logprobs(c->req, c->n_lp, n, c->lp + c->n_lp);
}

/*
 * Wait up to timeout_ms for progress of one choice. Returns 1 once it has
 * ended (the parser is then closed and its last deltas queued); *got (may be
 * NULL) receives the number of new tokens.
 */
static int pump(choice *c, int timeout_ms, int *got) {
    if (got) *got = 0;
    if (c->ended) return 1;
    int32_t buf[256];
    dsv4_finish f = DSV4_FINISH_NONE;
    int n = dsv4_request_poll(c->req, buf, 256, &f, timeout_ms);
    double t = now_s();
    if (n > 0) {
        if (c->t_first == 0) c->t_first = t;
        else dsv4_metrics_observe_itl(c->j->s->metrics, (t - c->t_last) / n);
        c->t_last = t;
        fetch_logprobs(c, n);
        if (got) *got = n;
    }
    if (f == DSV4_FINISH_NONE) return 0;
    pthread_mutex_lock(&c->j->mu);
    if (!dsv4_outparse_finished(c->op)) {
        dsv4_err e = {0};
        dsv4_outparse_finish(c->op, end_of(f), &e);
    }
    take_deltas_locked(c);
    pthread_mutex_unlock(&c->j->mu);
    c->efinish = f;
    c->ended = 1;
    return 1;
}

static void record_metrics(choice *c, const dsv4_outparse_result *res);

/* Cancel every choice still running and wait until the engine is done with
 * each (its slot and pages freed); record the metrics of those not recorded
 * yet. Returns the tokens generated by all choices. Safe to call again. */
static int job_stop(job *j) {
    int generated = 0;
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->c[i];
        if (!c->req) continue;
        /* the engine must be done with the hook before c goes away */
        dsv4_request_cancel(c->req);
        while (!pump(c, 1000, NULL)) {}
        /* A stream whose client hung up (MHD closed the connection before
         * the end) never emitted this choice's end: count it here, as
         * "abort" unless the engine had finished it first, so /metrics
         * shows every request finished (SERVING.md §3.9). */
        if (!c->recorded) {
            pthread_mutex_lock(&j->mu);
            record_metrics(c, dsv4_outparse_get_result(c->op));
            pthread_mutex_unlock(&j->mu);
        }
        int np, ng;
        dsv4_request_counts(c->req, &np, &ng);
        generated += ng;
    }
    return generated;
}

/* A client that hung up before its reply was complete: cancel the request
 * and say so, once, with how far it got (SERVING.md §3.5). */
static void job_abort_gone(job *j) {
    int generated = job_stop(j);
    dsv4_log(DSV4_LOG_INFO, "%s: client disconnected%s; request cancelled after %d generated tokens", j->id,
             j->stream ? " during the stream" : "", generated);
}

static void job_free(job *j) {
    if (!j) return;
    job_stop(j);
    for (int i = 0; i < j->n; i++) {
        choice *c = &j->c[i];
        if (c->req) dsv4_request_release(c->req);
        for (int k = 0; k < c->nq; k++) {
            free(c->q[k].text);
            free(c->q[k].name);
        }
        free(c->q);
        free(c->lp);
        dsv4_constraint_free(c->con); /* the engine is done with it: the request ended above */
        dsv4_outparse_free(c->op);
    }
    dsv4_grammar_free(j->grammar);
    free(j->c);
    pthread_mutex_destroy(&j->mu);
    free(j->out);
    free(j->echo_text);
    free(j->plp);
    free(j->prank);
    free(j);
}

static void record_metrics(choice *c, const dsv4_outparse_result *res) {
    job *j = c->j;
    c->recorded = 1;
    double t = now_s();
    dsv4_metrics_observe_request(j->s->metrics, c->t_first ? c->t_first - j->t0 : -1, t - j->t0, 0, j->n_prompt,
                                 res->completion_tokens, j->max_tokens,
                                 c->efinish == DSV4_FINISH_ERROR ? "error" : res->finish_reason);
    dsv4_metrics_count_parser(j->s->metrics, res->reasoning_unterminated, res->tool_parse_failures,
                              res->dsml_stripped);
}

/* Usage over all choices: the prompt counted once (§3.3 `n`). j->mu held. */
static cJSON *usage_json(job *j) {
    int comp = 0, reas = 0;
    for (int i = 0; i < j->n; i++) {
        const dsv4_outparse_result *res = dsv4_outparse_get_result(j->c[i].op);
        comp += res->completion_tokens;
        reas += res->reasoning_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", comp);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + comp);
    /* prompt tokens served from the prefix cache (SERVING.md §8.7); the prompt
     * is counted once, so the best of the choices' requests */
    int cached = 0;
    for (int i = 0; i < j->n; i++)
        if (j->c[i].req) {
            int x = dsv4_request_cached_tokens(j->c[i].req);
            if (x > cached) cached = x;
        }
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", cached);
    if (j->chat) {
        cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
        cJSON_AddNumberToObject(cd, "reasoning_tokens", reas);
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

/* Logprobs of c's records [c->lp_sent, upto) in the endpoint's form, or a JSON
 * null when the request did not ask; advances lp_sent. */
static cJSON *logprobs_upto(choice *c, int upto) {
    job *j = c->j;
    if (!j->logprobs) return cJSON_CreateNull();
    if (upto > c->n_lp) upto = c->n_lp;
    int n = upto > c->lp_sent ? upto - c->lp_sent : 0;
    cJSON *o = j->chat ? dsv4_chat_logprobs_json(j->s, c->lp + c->lp_sent, n, j->top_logprobs)
                       : dsv4_completion_logprobs_json(j->s, c->lp + c->lp_sent, n, j->top_logprobs, j->skip_special,
                                                       &c->text_off);
    c->lp_sent += n;
    return o;
}

/* Wait up to timeout_ms (-1: no limit) for choice 0's prefill to produce the
 * prompt records. Returns 1 when there is nothing more to wait for (fetched,
 * not asked, or the request ended without them: cancelled or failed), 0 on
 * timeout, -1 / -2 when a stream's client hung up / sent EOF meanwhile
 * (stream_client_gone). HTTP thread, j->mu
 * NOT held. */
static int fetch_prompt_logprobs(job *j, int timeout_ms) {
    if (j->n_plp || j->plp_gone || (!j->echo_lp && j->plp_n < 0)) return 1;
    if (!j->plp) j->plp = malloc(sizeof *j->plp * (size_t)j->n_prompt);
    if (!j->prank) j->prank = malloc(sizeof *j->prank * (size_t)j->n_prompt);
    if (!j->plp || !j->prank) return j->plp_gone = 1;
    double t_end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        j->n_plp = dsv4_request_prompt_logprobs(j->c[0].req, j->plp, j->prank, j->n_prompt);
        if (j->n_plp) return 1;
        if (j->c[0].ended) return j->plp_gone = 1;
        int32_t none[1];
        dsv4_finish f = DSV4_FINISH_NONE;
        /* a zero-length poll just waits for the engine's next step (or the end) */
        dsv4_request_poll(j->c[0].req, none, 0, &f, 50);
        if (f != DSV4_FINISH_NONE) {
            j->n_plp = dsv4_request_prompt_logprobs(j->c[0].req, j->plp, j->prank, j->n_prompt);
            if (!j->n_plp) j->plp_gone = 1;
            return 1;
        }
        const int g = j->stream ? stream_client_gone(j) : 0;
        if (g) return -g;
        if (timeout_ms >= 0 && now_s() >= t_end) return 0;
    }
}

/* Append every element of src's arrays to the same-named arrays of dst; frees src. */
static void append_lists(cJSON *dst, cJSON *src) {
    cJSON *a;
    cJSON_ArrayForEach(a, src) {
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, a->string);
        while (cJSON_GetArraySize(a) > 0) cJSON_AddItemToArray(d, cJSON_DetachItemFromArray(a, 0));
    }
    cJSON_Delete(src);
}

/* echo + logprobs (vLLM): the legacy lists of the prompt tokens, offsets from
 * 0 and the first token's logprob and alternatives null (no context). Sets
 * c->text_off to continue after them. NULL when the records are missing. */
static cJSON *prompt_legacy_logprobs(choice *c) {
    job *j = c->j;
    if (!j->echo_lp || !j->n_plp) return NULL;
    long off = 0;
    cJSON *o = dsv4_completion_logprobs_json(j->s, j->plp, j->n_plp, j->top_logprobs, j->skip_special, &off);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(o, "token_logprobs"), 0, cJSON_CreateNull());
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(o, "top_logprobs"), 0, cJSON_CreateNull());
    c->text_off = off;
    return o;
}

/* prompt_logprobs=N (vLLM): [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]
 * holding the prompt token and the N most likely ones at each position. */
static cJSON *prompt_logprobs_list(job *j) {
    if (j->plp_n < 0 || !j->n_plp) return cJSON_CreateNull();
    cJSON *arr = cJSON_CreateArray();
    cJSON_AddItemToArray(arr, cJSON_CreateNull());
    for (int i = 1; i < j->n_plp; i++) {
        const dsv4_token_logprob *r = &j->plp[i];
        cJSON *d = cJSON_CreateObject();
        for (int t = -1; t < r->n_top && t < j->plp_n; t++) {
            int32_t id = t < 0 ? r->token : r->top_ids[t];
            char key[16], *txt = NULL;
            size_t tl = 0;
            snprintf(key, sizeof key, "%d", (int)id);
            if (cJSON_GetObjectItemCaseSensitive(d, key)) continue;
            const char *b = dsv4_tokenizer_token_bytes(j->s->tok, id, &tl);
            if (dsv4_utf8_lossy(b ? b : "", b ? tl : 0, &txt, &tl)) txt = NULL;
            cJSON *e = cJSON_AddObjectToObject(d, key);
            float lp = t < 0 ? r->logprob : r->top_logprobs[t];
            cJSON_AddNumberToObject(e, "logprob", isfinite(lp) ? lp : -9999.0);
            cJSON_AddNumberToObject(e, "rank", t < 0 ? j->prank[i] : t + 1);
            cJSON_AddStringToObject(e, "decoded_token", txt ? txt : "");
            free(txt);
        }
        cJSON_AddItemToArray(arr, d);
    }
    return arr;
}

/* One choice of the non-streaming body (j->mu held). */
static cJSON *final_choice(choice *c) {
    job *j = c->j;
    const dsv4_outparse_result *res = dsv4_outparse_get_result(c->op);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", c->index);
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
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
        cJSON_AddStringToObject(o, "text", text ? text : "");
        free(text);
    }
    /* every kept token: reasoning, </think>, content, markup, EOS (usage counts the same) */
    cJSON *plp = j->chat ? NULL : prompt_legacy_logprobs(c);
    cJSON *glp = logprobs_upto(c, res->completion_tokens);
    if (plp && cJSON_IsObject(glp)) append_lists(plp, glp);
    else if (plp) cJSON_Delete(glp);
    cJSON_AddItemToObject(o, "logprobs", plp ? plp : glp);
    if (!j->chat && j->plp_n >= 0) cJSON_AddItemToObject(o, "prompt_logprobs", prompt_logprobs_list(j));
    cJSON_AddStringToObject(o, "finish_reason", res->finish_reason ? res->finish_reason : "stop");
    add_stop_reason(o, res);
    return o;
}

/* The non-streaming body (§3.4, §3.6). */
static void final_body(job *j, dsv4_reply *out) {
    fetch_prompt_logprobs(j, -1);
    pthread_mutex_lock(&j->mu);
    int failed = 0;
    for (int i = 0; i < j->n; i++) {
        record_metrics(&j->c[i], dsv4_outparse_get_result(j->c[i].op));
        failed |= j->c[i].efinish == DSV4_FINISH_ERROR;
    }
    if (failed) {
        pthread_mutex_unlock(&j->mu);
        dsv4_reply_error(out, 500, NULL, "the engine failed while generating this request (see the server log)");
        return;
    }
    cJSON *o = envelope(j, 0), *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->n; i++) cJSON_AddItemToArray(choices, final_choice(&j->c[i]));
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    pthread_mutex_unlock(&j->mu);
    dsv4_reply_json(out, 200, o);
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
    j->t_out = now_s();
}

/* stream_options.continuous_usage_stats (vLLM): every chunk carries the usage
 * so far of the choice it belongs to (vLLM counts per choice; the final usage
 * chunk sums them), §3.5 item 6. comp: the choice's tokens up to this chunk
 * (0 in the role chunk, the delta's lp_to, the final count at the end). */
static void add_running_usage(choice *c, cJSON *o, int comp) {
    job *j = c->j;
    if (!j->continuous_usage) return;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", comp);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + comp);
}

/* A chunk for choice c whose delta (chat) or text (completions) is given;
 * *choice_out (may be NULL) receives the choice object. */
static cJSON *chunk_with(choice *c, cJSON **delta_out, cJSON **choice_out) {
    job *j = c->j;
    cJSON *o = envelope(j, 1), *choices = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", c->index);
    if (j->chat) *delta_out = cJSON_AddObjectToObject(ch, "delta");
    else *delta_out = ch;
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    if (choice_out) *choice_out = ch;
    return o;
}

/* Turn c's queued deltas into SSE chunks (j->mu held). */
static void drain_queue_locked(choice *c) {
    job *j = c->j;
    int i;
    for (i = 0; i < c->nq; i++) {
        qdelta *x = &c->q[i];
        /* The engine hook queues a delta as soon as its tokens are decoded, but
         * their logprob records arrive only when this thread polls them. A delta
         * whose records are not here yet waits (with those after it) for the
         * next poll, so its chunk carries exactly its own tokens' logprobs; with
         * n > 1 the other choices are polled after the first one wakes, and
         * sending early made their logprobs lag one chunk behind their text. */
        if (j->logprobs && !c->ended && x->lp_to > c->n_lp) break;
        cJSON *d, *ch, *o = chunk_with(c, &d, &ch);
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
        if (o) {
            /* the tokens this delta covers (all polled: see the top of the loop) */
            if (j->logprobs) cJSON_ReplaceItemInObject(ch, "logprobs", logprobs_upto(c, x->lp_to));
            add_running_usage(c, o, x->lp_to);
            emit_json(j, o);
        }
        free(x->text);
        free(x->name);
    }
    if (i < c->nq) memmove(c->q, c->q + i, sizeof *c->q * (size_t)(c->nq - i)); /* q may be NULL when empty */
    c->nq -= i;
}

/* c has ended: its last deltas and its final chunk (j->mu held). Returns 1 on an engine failure. */
static int emit_choice_end_locked(choice *c) {
    job *j = c->j;
    drain_queue_locked(c);
    c->sent_final = 1;
    const dsv4_outparse_result *res = dsv4_outparse_get_result(c->op);
    record_metrics(c, res);
    if (c->efinish == DSV4_FINISH_ERROR) return 1;
    cJSON *d, *ch, *o = chunk_with(c, &d, &ch);
    cJSON_ReplaceItemInObject(ch, "finish_reason", cJSON_CreateString(res->finish_reason ? res->finish_reason : "stop"));
    add_stop_reason(ch, res);
    if (!j->chat) cJSON_AddStringToObject(d, "text", "");
    /* tokens no delta covered: held back by stop matching, special tokens, EOS */
    if (j->logprobs && c->lp_sent < res->completion_tokens)
        cJSON_ReplaceItemInObject(ch, "logprobs", logprobs_upto(c, res->completion_tokens));
    add_running_usage(c, o, res->completion_tokens);
    emit_json(j, o);
    return 0;
}

/*
 * Wait for progress of any choice. n = 1 blocks on it up to 15 s (the
 * keep-alive period); n > 1 polls every choice and then blocks briefly on
 * the first unfinished one, so chunks interleave as the choices advance.
 * Returns 1 when every choice has ended.
 */
static int pump_all(job *j) {
    if (j->n == 1) return pump(&j->c[0], 15000, NULL);
    int all = 1, progress = 0;
    for (int i = 0; i < j->n; i++) {
        int got = 0;
        int was = j->c[i].ended;
        all &= pump(&j->c[i], 0, &got);
        progress |= got > 0 || (!was && j->c[i].ended);
    }
    if (all || progress) return all;
    for (int i = 0; i < j->n; i++)
        if (!j->c[i].ended) {
            pump(&j->c[i], 50, NULL); /* whatever it brings is drained by the caller; the next call sees the end */
            break;
        }
    return 0;
}

/*
 * Wait up to timeout_ms for choice 0's first token (or its end). Returns 1
 * once there, 0 on timeout, -1 / -2 when the client hung up / sent EOF
 * meanwhile (stream_client_gone). Why the
 * first chunk waits for it: vLLM sends its first chunk (the chat role, or
 * completion text) with the first output, and clients measure TTFT at the
 * first chunk — vLLM's `bench serve` counts any chunk with choices — so a
 * chunk sent before the prefill made every TTFT read ~1 ms and moved the
 * prefill into the first inter-token gap. Why the hang-up check: nothing is
 * written during the prefill, so a client that goes away (a cancelled agent
 * call) was noticed only at its first token, after the whole prefill ran
 * for nobody; now within a poll period (50 ms) as a non-streaming request.
 */
static int first_output(job *j, int timeout_ms) {
    choice *c = &j->c[0];
    if (c->ended || c->t_first != 0) return 1;
    if (timeout_ms < 0) timeout_ms = 0; /* the budget is spent: one short poll, then the keep-alive */
    double t_end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        int got = 0;
        if (pump(c, 50, &got) || got > 0) return 1;
        const int g = stream_client_gone(j);
        if (g) return -g;
        if (now_s() >= t_end) return 0;
    }
}

static long stream_read(void *ctx, char *buf, size_t max) {
    job *j = ctx;
    while (j->out_off == j->out_len) {
        j->out_off = j->out_len = 0;
        if (j->sent_done) return -1;
        if (!j->sent_role) {
            /* the first chunk carries the prompt's logprobs and comes with the first token: wait
             * for both, one 14.5 s budget between keep-alives, as any stream (§3.5) */
            const double t_ka = now_s() + 14.5;
            int ready = fetch_prompt_logprobs(j, 14500);
            if (ready > 0) ready = first_output(j, (int)(1000 * (t_ka - now_s())));
            if (ready == -1) return -1; /* hung up: end the response; stream_close cancels the request */
            if (ready == -2) j->probed = 1; /* EOF: the keep-alive below tells a closed client from a half-closed one */
            if (ready <= 0) {
                emit(j, ": keep-alive\n\n");
                j->t_out = now_s();
                continue;
            }
            for (int i = 0; i < j->n; i++) {
                /* completions: no empty first chunk (vLLM sends none: it would read as a token to a client
                 * timing chunks); only the echoed prompt or the prompt's logprobs open the stream */
                if (!j->chat && !j->echo_text && !j->echo_lp && j->plp_n < 0) break;
                cJSON *d, *ch, *o = chunk_with(&j->c[i], &d, &ch);
                if (j->chat) {
                    cJSON_AddStringToObject(d, "role", "assistant");
                    cJSON_AddStringToObject(d, "content", "");
                } else {
                    cJSON_AddStringToObject(d, "text", j->echo_text ? j->echo_text : "");
                    cJSON *plp = prompt_legacy_logprobs(&j->c[i]);
                    if (plp) cJSON_ReplaceItemInObject(ch, "logprobs", plp);
                    if (j->plp_n >= 0) cJSON_AddItemToObject(ch, "prompt_logprobs", prompt_logprobs_list(j));
                }
                add_running_usage(&j->c[i], o, 0);
                emit_json(j, o);
            }
            j->sent_role = 1;
            /* the first tokens' deltas go out with it, not one token later */
            pthread_mutex_lock(&j->mu);
            for (int i = 0; i < j->n; i++)
                if (!j->c[i].ended) drain_queue_locked(&j->c[i]);
            pthread_mutex_unlock(&j->mu);
            continue;
        }
        int ended = pump_all(j), failed = 0;
        pthread_mutex_lock(&j->mu);
        for (int i = 0; i < j->n; i++) {
            choice *c = &j->c[i];
            if (c->ended && !c->sent_final) failed |= emit_choice_end_locked(c);
            else if (!c->sent_final) drain_queue_locked(c);
        }
        if (failed) {
            emit(j, "data: {\"error\":{\"message\":\"the engine failed while generating this request\","
                    "\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n");
            ended = 1;
        } else if (ended && j->include_usage) {
            cJSON *u = envelope(j, 1);
            cJSON_AddArrayToObject(u, "choices");
            cJSON_AddItemToObject(u, "usage", usage_json(j));
            emit_json(j, u);
        }
        pthread_mutex_unlock(&j->mu);
        if (ended) {
            emit(j, "data: [DONE]\n\n");
            j->sent_done = 1;
        } else if (j->out_len == 0 && now_s() - j->t_out >= 14.5) {
            emit(j, ": keep-alive\n\n"); /* §3.5: at least every 15 s */
            j->t_out = now_s();
        }
    }
    size_t n = j->out_len - j->out_off;
    if (n > max) n = max;
    memcpy(buf, j->out + j->out_off, n);
    j->out_off += n;
    return (long)n;
}

/* MHD is done with the stream: after [DONE], or because the client went away
 * (a write failed) or the server is stopping. */
static void stream_close(void *ctx) {
    job *j = ctx;
    if (!j->sent_done) job_abort_gone(j);
    job_free(j);
}

void dsv4_service_run_job(dsv4_service *s, int chat, const int32_t *ids, int n_ids, dsv4_req_params *p,
                          const dsv4_outparse_config *pc, const char *prompt_text, dsv4_reply *out) {
    job *j = calloc(1, sizeof *j);
    int n = p->n > 0 ? p->n : 1;
    if (j) j->c = calloc((size_t)n, sizeof *j->c);
    if (!j || !j->c) {
        free(j);
        dsv4_reply_error(out, 500, NULL, "out of memory");
        return;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->s = s;
    j->chat = chat;
    j->stream = p->stream;
    j->include_usage = p->include_usage;
    /* vLLM: per-chunk usage only when include_usage is set too */
    j->continuous_usage = p->include_usage && p->continuous_usage;
    j->include_reasoning = p->include_reasoning;
    j->logprobs = p->logprobs;
    j->top_logprobs = p->top_logprobs;
    j->echo_lp = !chat && p->echo && p->logprobs;
    j->skip_special = p->skip_special;
    j->plp_n = chat ? -1 : p->prompt_logprobs;
    j->n_prompt = n_ids;
    j->t0 = j->t_out = now_s();
    j->created = (long)time(NULL);
    strcpy(j->id, chat ? "chatcmpl-" : "cmpl-");
    random_hex(j->id + strlen(j->id), 32);
    if (p->echo && prompt_text) j->echo_text = strdup(prompt_text);
    j->max_tokens = p->gen.max_tokens;
    j->grammar = p->grammar; /* the job outlives p when streaming */
    p->grammar = NULL;
    uint64_t seed = p->gen.sampling.seed;
    dsv4_err err = {0};
    for (int i = 0; i < n; i++) {
        choice *c = &j->c[i];
        c->j = j;
        c->index = i;
        c->text_off = dsv4_text_chars(j->echo_text);
        j->n = i + 1;
        c->op = dsv4_outparse_create(pc, &s->vocab_view, &err);
        if (!c->op) {
            dsv4_reply_error(out, 400, "stop", "%s", err.msg);
            job_free(j);
            return;
        }
        p->gen.on_tokens = on_tokens;
        p->gen.user = c;
        if (j->grammar) {
            if (dsv4_constraint_create(s->gvocab, j->grammar, pc->thinking, s->think_end, &c->con, &err)) {
                dsv4_reply_error(out, 500, NULL, "%s", err.msg);
                job_free(j);
                return;
            }
            p->gen.logits_proc = dsv4_constraint_logits;
            p->gen.proc_user = c->con;
        }
        p->gen.sampling.seed = seed + (uint64_t)i; /* choice i: seed + i (§3.3 `n`) */
        /* prompt records from choice 0 only: the prompt is shared */
        p->gen.prompt_logprobs = i == 0 && (j->echo_lp || j->plp_n >= 0);
        p->gen.prompt_top_logprobs = j->plp_n > j->top_logprobs ? j->plp_n : j->top_logprobs;
        if (dsv4_engine_submit(s->engine, ids, n_ids, &p->gen, &c->req, &err)) {
            if (err.code == DSV4_ERANGE) dsv4_reply_error(out, 400, chat ? "messages" : "prompt", "%s", err.msg);
            else dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, NULL, "%s", err.msg);
            job_free(j);
            return;
        }
    }
    if (p->stream) {
        j->gone = out->client_gone;
        j->gone_ctx = out->gone_ctx;
        out->status = 200;
        out->content_type = "text/event-stream";
        out->stream = (dsv4_stream_src){j, stream_read, stream_close};
        return;
    }
    /* §3.5: a client that hangs up is aborted within a poll period, as a
     * stream's is; job_free cancels every choice and counts it as "abort". */
    for (int i = 0; i < n; i++)
        while (!pump(&j->c[i], out->client_gone ? 250 : -1, NULL))
            if (out->client_gone && out->client_gone(out->gone_ctx)) {
                job_abort_gone(j);
                job_free(j);
                dsv4_reply_error(out, 400, NULL, "client disconnected");
                return;
            }
    final_body(j, out);
    job_free(j);
}
