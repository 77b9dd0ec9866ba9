/*
 * Per-request streaming output parser (text/outparse.h).
 *
 * This file is the router: it owns the detokenizer, decides the channel
 * (reasoning or content, spec/SERVING.md §4), routes text through the DSML
 * scanner (outparse_dsml.c, §5) and the stop matcher (outparse_stops.c, §6),
 * records deltas and builds the non-streaming result from the same deltas,
 * so streaming and non-streaming views cannot disagree.
 *
 * Stop guard (§6.2): the matcher only sees text where stops are live:
 *  - thinking mode: content after </think> (reasoning only with the §6.3
 *    opt-out);
 *  - chat mode: all content, except after a leading <think> token
 *    (output-side arming, tonyd2wild PR #42) until </think>;
 *  - never tool-call markup (the DSML scanner swallows it before the matcher;
 *    a "\n\n" that may open a call is held by the scanner, which is exactly
 *    the deferral §6.2 asks for).
 *
 * Decisions where the spec leaves room (each covered by a test):
 *  - arguments are compact JSON (§5.2); a string="false" value that parses
 *    is minified with its numbers kept as written (no float round trip);
 *  - a duplicate parameter is streamed twice (fragments cannot be taken
 *    back); JSON parsers keep the last value, which is §5.2's "last wins";
 *  - a block opener cut off by the end of generation after its marker
 *    ("\n\n<｜DSML｜tool_ca") counts as a dropped call, not as text;
 *  - control tokens that are removed (BOS, role markers, </think> in chat
 *    content) are transparent to the text scanners, so stripping can never
 *    splice a marker together and a stop may span them;
 *  - --unterminated-reasoning-as-content changes only the final result;
 *  - a stop that completed in an earlier step but was held back reports
 *    n_kept 0 for the current step; result.completion_tokens is exact.
 */
#include "text/outparse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "text/outparse_buf.h"
#include "text/outparse_dsml.h"
#include "text/outparse_stops.h"

typedef struct op_call {
    char id[32];
    char *name;
    op_buf args;
    int state; /* 0 open, 1 done, 2 dropped */
} op_call;

typedef struct op_delta_rec {
    dsv4_delta_kind kind;
    int tool_index;
    size_t off, len;          /* text in the arena                */
    size_t id_off, name_off;  /* TOOL_HEADER: id and name in arena */
} op_delta_rec;

struct dsv4_outparse {
    /* configuration */
    int thinking, tools_enabled, stop_in_reasoning, unterminated_as_content, raw;
    int (*is_special)(void *ctx, int32_t id);
    void *special_ctx;
    int keep_special_text;
    cJSON *tools;
    int32_t *stop_ids;
    int n_stop_ids;
    uint64_t rng;
    int rng_seeded;

    dsv4_detok *detok;
    op_dsml dsml;
    op_stops stops;
    op_stops shadow; /* the same stops over dormant text, for the metric */
    int stop_suppressed;

    /* state */
    int in_reasoning;  /* current channel: reasoning (1) or content (0) */
    int guard_armed;   /* chat mode: <think> was the first output, stops dormant */
    int seen_output;   /* non-whitespace text or a non-<think> token seen */
    int32_t ntok;      /* index of the next token */
    int32_t cur_tag;   /* index of the token being processed */
    dsv4_end_reason end;
    int stop_which;
    int32_t stop_tag;
    int32_t stop_token;
    int reasoning_tokens;
    int saw_think_close;
    int err_oom;

    /* accumulated non-streaming view */
    op_buf reasoning, content;
    op_call *calls;
    int n_calls, cap_calls;
    dsv4_tool_call *done_calls;
    int counters_tool_fail, counters_stripped;

    /* deltas since the last take */
    op_delta_rec *recs;
    size_t n_recs, cap_recs;
    op_buf arena;
    dsv4_outparse_delta *out;
    size_t cap_out;
    int taken;

    dsv4_outparse_result res;
};

/* ------------------------------------------------------------------ deltas */

static void deltas_reset_if_taken(dsv4_outparse *p) {
    if (!p->taken) return;
    p->n_recs = 0;
    op_buf_clear(&p->arena);
    p->taken = 0;
}

static op_delta_rec *new_rec(dsv4_outparse *p) {
    if (p->n_recs == p->cap_recs) {
        size_t nc = p->cap_recs ? 2 * p->cap_recs : 16;
        op_delta_rec *nr = realloc(p->recs, nc * sizeof *nr);
        if (!nr) {
            p->err_oom = 1;
            return NULL;
        }
        p->recs = nr;
        p->cap_recs = nc;
    }
    op_delta_rec *r = &p->recs[p->n_recs++];
    memset(r, 0, sizeof *r);
    return r;
}

/* Append text of a kind, merging with the previous delta of the same kind.
 * Every record's text is stored NUL-terminated in the arena; a merge removes
 * the NUL of the last record (it must end the arena) and appends. */
static void add_text_delta(dsv4_outparse *p, dsv4_delta_kind kind, int idx, const char *s, size_t n) {
    if (!n) return;
    deltas_reset_if_taken(p);
    op_delta_rec *last = p->n_recs ? &p->recs[p->n_recs - 1] : NULL;
    if (last && last->kind == kind && last->tool_index == idx && last->off + last->len + 1 == p->arena.len) {
        p->arena.len--;
        if (op_buf_put(&p->arena, s, n, NULL, 0) || op_buf_put(&p->arena, "", 1, NULL, 0)) p->err_oom = 1;
        else last->len += n;
        return;
    }
    op_delta_rec *r = new_rec(p);
    if (!r) return;
    r->kind = kind;
    r->tool_index = idx;
    r->off = p->arena.len;
    r->len = n;
    if (op_buf_put(&p->arena, s, n, NULL, 0) || op_buf_put(&p->arena, "", 1, NULL, 0)) p->err_oom = 1;
}

/* ------------------------------------------------------------------- sinks */

static void emit_final(void *ctx, const char *s, size_t n) {
    dsv4_outparse *p = ctx;
    if (!n) return;
    if (p->in_reasoning) {
        if (op_buf_put(&p->reasoning, s, n, NULL, 0)) p->err_oom = 1;
        add_text_delta(p, DSV4_DELTA_REASONING, -1, s, n);
    } else {
        if (op_buf_put(&p->content, s, n, NULL, 0)) p->err_oom = 1;
        add_text_delta(p, DSV4_DELTA_CONTENT, -1, s, n);
    }
}

static void emit_none(void *ctx, const char *s, size_t n) {
    (void)ctx;
    (void)s;
    (void)n;
}

static int stops_live(const dsv4_outparse *p) {
    if (p->stops.n == 0) return 0;
    if (p->in_reasoning) return p->stop_in_reasoning;
    return !p->guard_armed;
}

/* Text released by the DSML scanner (plain text of the current channel),
 * or in raw mode the detokenized text itself (tags NULL: current token). */
static void sink_text(void *ctx, const char *s, const int32_t *tags, size_t n) {
    dsv4_outparse *p = ctx;
    if (p->end != DSV4_END_NONE || !n) return;
    if (!stops_live(p)) {
        if (p->stops.n && !p->stop_suppressed) {
            /* dsv4:stop_suppressed_in_reasoning_total (§3.9): would a stop
             * have fired here without the guard? */
            int w = -1;
            int32_t t = -1;
            if (op_stops_push(&p->shadow, s, tags, p->cur_tag, n, emit_none, NULL, &w, &t) == 1) p->stop_suppressed = 1;
        }
        emit_final(p, s, n);
        return;
    }
    int which = -1;
    int32_t tag = -1;
    int r = op_stops_push(&p->stops, s, tags, p->cur_tag, n, emit_final, p, &which, &tag);
    if (r < 0) p->err_oom = 1;
    if (r == 1) {
        p->end = DSV4_END_STOP_STR;
        p->stop_which = which;
        p->stop_tag = tag;
    }
}

static void sink_block_open(void *ctx) {
    dsv4_outparse *p = ctx;
    /* Markup starts: text held by the stop matcher precedes it and can no
     * longer be extended into a match (stops are dormant in markup). */
    if (p->end == DSV4_END_NONE) op_stops_flush(&p->stops, emit_final, p);
}

static void make_id(dsv4_outparse *p, char out[32]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char r[12];
    if (p->rng_seeded) {
        for (int i = 0; i < 12; i++) {
            /* splitmix64 */
            uint64_t z = (p->rng += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            r[i] = (unsigned char)(z ^ (z >> 31));
        }
    } else {
        size_t got = 0;
        while (got < sizeof r) {
            ssize_t k = getrandom(r + got, sizeof r - got, 0);
            if (k < 0) {
                if (errno == EINTR) continue;
                /* Unreachable on Linux >= 3.17; keep ids unique at least. */
                for (; got < sizeof r; got++) r[got] = (unsigned char)(rand() & 0xFF);
                break;
            }
            got += (size_t)k;
        }
    }
    memcpy(out, "call_", 5);
    for (int i = 0; i < 12; i++) {
        out[5 + 2 * i] = hex[r[i] >> 4];
        out[6 + 2 * i] = hex[r[i] & 15];
    }
    out[29] = '\0';
}

static void sink_tool_header(void *ctx, int index, const char *name) {
    dsv4_outparse *p = ctx;
    if (p->end != DSV4_END_NONE) return;
    if (p->n_calls == p->cap_calls) {
        int nc = p->cap_calls ? 2 * p->cap_calls : 4;
        op_call *na = realloc(p->calls, (size_t)nc * sizeof *na);
        if (!na) {
            p->err_oom = 1;
            return;
        }
        p->calls = na;
        p->cap_calls = nc;
    }
    /* The scanner numbers calls 0,1,2,... in order, so index == n_calls. */
    op_call *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    (void)index;
    make_id(p, c->id);
    c->name = strdup(name);
    if (!c->name) p->err_oom = 1;
    deltas_reset_if_taken(p);
    op_delta_rec *r = new_rec(p);
    if (!r) return;
    r->kind = DSV4_DELTA_TOOL_HEADER;
    r->tool_index = p->n_calls - 1;
    r->off = p->arena.len;
    r->len = 0;
    if (op_buf_put(&p->arena, "", 1, NULL, 0)) p->err_oom = 1;
    r->id_off = p->arena.len;
    if (op_buf_put(&p->arena, c->id, strlen(c->id) + 1, NULL, 0)) p->err_oom = 1;
    r->name_off = p->arena.len;
    if (op_buf_put(&p->arena, name, strlen(name) + 1, NULL, 0)) p->err_oom = 1;
}

static op_call *call_at(dsv4_outparse *p, int index) {
    return (index >= 0 && index < p->n_calls) ? &p->calls[index] : NULL;
}

static void sink_tool_args(void *ctx, int index, const char *s, size_t n) {
    dsv4_outparse *p = ctx;
    op_call *c = call_at(p, index);
    if (p->end != DSV4_END_NONE || !c) return;
    if (op_buf_put(&c->args, s, n, NULL, 0)) p->err_oom = 1;
    add_text_delta(p, DSV4_DELTA_TOOL_ARGS, index, s, n);
}

static void sink_tool_done(void *ctx, int index) {
    dsv4_outparse *p = ctx;
    op_call *c = call_at(p, index);
    if (p->end != DSV4_END_NONE || !c) return;
    c->state = 1;
}

static void sink_tool_drop(void *ctx, int index) {
    dsv4_outparse *p = ctx;
    op_call *c = call_at(p, index);
    if (c) c->state = 2;
    p->counters_tool_fail++;
    dsv4_log(DSV4_LOG_DEBUG, "outparse: dropped incomplete or malformed tool call (index %d)", index);
}

static void sink_stripped(void *ctx, size_t n) {
    dsv4_outparse *p = ctx;
    (void)n;
    p->counters_stripped++;
}

/* --------------------------------------------------------------- lifecycle */

dsv4_outparse *dsv4_outparse_create(const dsv4_outparse_config *cfg, const dsv4_detok_vocab *vocab,
                                    dsv4_err *err) {
    dsv4_outparse *p = calloc(1, sizeof *p);
    if (!p) {
        dsv4_err_set(err, DSV4_ENOMEM, "outparse: out of memory");
        return NULL;
    }
    dsv4_outparse_config zero = {0};
    if (!cfg) cfg = &zero;
    p->thinking = cfg->thinking != 0;
    p->tools_enabled = cfg->tools_enabled != 0;
    p->stop_in_reasoning = cfg->stop_in_reasoning != 0;
    p->unterminated_as_content = cfg->unterminated_reasoning_as_content != 0;
    p->raw = cfg->raw != 0;
    p->is_special = cfg->is_special;
    p->special_ctx = cfg->special_ctx;
    p->keep_special_text = cfg->keep_special_text != 0;
    p->in_reasoning = p->thinking && !p->raw; /* §4.1: from the resolved mode only */
    /* §3.6: raw completions never split reasoning; a prompt ending in
     * <think> arms the stop guard until </think> instead */
    p->guard_armed = p->thinking && p->raw && cfg->n_stops > 0;
    p->stop_token = -1;
    p->stop_which = -1;
    p->stop_tag = -1;
    if (cfg->id_seed) {
        p->rng = cfg->id_seed;
        p->rng_seeded = 1;
    }
    if (cfg->tools) {
        if (!cJSON_IsArray(cfg->tools)) {
            dsv4_err_set(err, DSV4_EINVAL, "outparse: `tools` must be an array");
            goto fail;
        }
        p->tools = cJSON_Duplicate(cfg->tools, 1);
        if (!p->tools) {
            dsv4_err_set(err, DSV4_ENOMEM, "outparse: out of memory copying tools");
            goto fail;
        }
    }
    if (cfg->n_stop_token_ids > 0) {
        p->stop_ids = malloc((size_t)cfg->n_stop_token_ids * sizeof *p->stop_ids);
        if (!p->stop_ids) {
            dsv4_err_set(err, DSV4_ENOMEM, "outparse: out of memory");
            goto fail;
        }
        memcpy(p->stop_ids, cfg->stop_token_ids, (size_t)cfg->n_stop_token_ids * sizeof *p->stop_ids);
        p->n_stop_ids = cfg->n_stop_token_ids;
    }
    if (op_stops_init(&p->stops, cfg->stops, cfg->n_stops, cfg->include_stop_str_in_output, err) != DSV4_OK)
        goto fail;
    if (op_stops_init(&p->shadow, cfg->stops, cfg->n_stops, 0, err) != DSV4_OK) goto fail;
    p->stops.min_tag = cfg->min_tokens > 0 ? cfg->min_tokens - 1 : 0;
    p->detok = dsv4_detok_create(vocab, err);
    if (!p->detok) goto fail;
    op_dsml_sink sink = {p, sink_text, sink_block_open, sink_tool_header, sink_tool_args,
                         sink_tool_done, sink_tool_drop, sink_stripped};
    op_dsml_init(&p->dsml, &sink, p->tools_enabled, p->tools);
    return p;
fail:
    dsv4_outparse_free(p);
    return NULL;
}

void dsv4_outparse_free(dsv4_outparse *p) {
    if (!p) return;
    dsv4_detok_free(p->detok);
    op_dsml_free(&p->dsml);
    op_stops_free(&p->stops);
    op_stops_free(&p->shadow);
    cJSON_Delete(p->tools);
    free(p->stop_ids);
    op_buf_free(&p->reasoning);
    op_buf_free(&p->content);
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        op_buf_free(&p->calls[i].args);
    }
    free(p->calls);
    free(p->done_calls);
    free(p->recs);
    op_buf_free(&p->arena);
    free(p->out);
    free(p);
}

/* ------------------------------------------------------------------ events */

static int all_ws(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

static void push_text(dsv4_outparse *p, const char *s, size_t n) {
    if (!n || p->end != DSV4_END_NONE) return;
    if (!all_ws(s, n)) p->seen_output = 1;
    if (p->raw) sink_text(p, s, NULL, n); /* §3.6: no tool parsing */
    else if (op_dsml_push(&p->dsml, s, n, p->cur_tag) < 0) p->err_oom = 1;
}

/* Raw mode (§3.6): special-token text other than BOS/EOS/pad is output
 * verbatim. <think>/</think> are never stop candidates (§6.2): held text is
 * released first, then the token's text is emitted outside the matcher. */
static void push_special_raw(dsv4_outparse *p, int32_t id, dsv4_special_kind kind, const char *text, size_t len) {
    /* skip_special_tokens (vLLM default true) drops the tokens tokenizer.json
     * flags "special" (BOS, pad, place-holders); false keeps their text */
    int flagged = p->is_special ? id >= 0 && p->is_special(p->special_ctx, id)
                                : kind == DSV4_SPECIAL_BOS || kind == DSV4_SPECIAL_PAD;
    if (flagged && !p->keep_special_text) return;
    switch (kind) {
    case DSV4_SPECIAL_THINK_OPEN:
    case DSV4_SPECIAL_THINK_CLOSE:
        if (p->end == DSV4_END_NONE) op_stops_flush(&p->stops, emit_final, p);
        if (kind == DSV4_SPECIAL_THINK_OPEN && !p->seen_output && !p->guard_armed && p->stops.n) p->guard_armed = 1;
        if (kind == DSV4_SPECIAL_THINK_CLOSE) {
            op_stops_flush(&p->shadow, emit_none, NULL);
            p->guard_armed = 0;
        }
        p->seen_output = 1;
        emit_final(p, text, len);
        return;
    default:
        push_text(p, text, len);
        p->seen_output = 1;
        return;
    }
}

/* Switch the channel from reasoning to content at </think> (§4.2). */
static void leave_reasoning(dsv4_outparse *p) {
    if (!op_dsml_in_markup(&p->dsml)) op_dsml_break(&p->dsml);
    if (p->end == DSV4_END_NONE) op_stops_flush(&p->stops, emit_final, p);
    op_stops_flush(&p->shadow, emit_none, NULL);
    p->in_reasoning = 0;
}

static void push_special(dsv4_outparse *p, dsv4_special_kind kind, const char *text, size_t len) {
    switch (kind) {
    case DSV4_SPECIAL_DSML:
        /* part of tool-call markup: the scanner works in text space (§1.1) */
        if (op_dsml_push(&p->dsml, text, len, p->cur_tag) < 0) p->err_oom = 1;
        p->seen_output = 1;
        return;
    case DSV4_SPECIAL_THINK_CLOSE:
        /* never a stop candidate, never emitted (§4.2, §6.2) */
        if (p->in_reasoning) {
            p->saw_think_close = 1;
            leave_reasoning(p);
        } else if (p->guard_armed) {
            /* stops go live after this point: settle held text first */
            if (!op_dsml_in_markup(&p->dsml)) op_dsml_break(&p->dsml);
            op_stops_flush(&p->shadow, emit_none, NULL);
            p->guard_armed = 0;
        }
        /* otherwise (chat mode, content) a dropped control token is
         * transparent: the text on both sides is scanned as one */
        p->seen_output = 1;
        return;
    case DSV4_SPECIAL_THINK_OPEN:
        /* dropped everywhere (§4.2 stray <think>, §4.5 chat mode); in chat
         * mode as the first output it arms the stop guard (§6.2) */
        if (!p->thinking && !p->seen_output && !p->guard_armed && p->stops.n) {
            if (!op_dsml_in_markup(&p->dsml)) op_dsml_break(&p->dsml);
            if (p->end == DSV4_END_NONE) op_stops_flush(&p->stops, emit_final, p);
            p->guard_armed = 1;
        }
        p->seen_output = 1;
        return;
    default:
        /* BOS, pad, role markers, others: stripped (§3.5, §5.4). Being
         * removed, they are transparent: text on both sides is scanned as
         * one, so no marker can be spliced together around them. */
        p->seen_output = 1;
        return;
    }
}

static int is_stop_id(const dsv4_outparse *p, int32_t id) {
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* End of generation by the model or the engine: flush and settle. */
static void finalize(dsv4_outparse *p, dsv4_end_reason why) {
    if (p->end == DSV4_END_NONE) {
        dsv4_detok_out o;
        if (dsv4_detok_flush(p->detok, &o, NULL) == DSV4_OK && o.len) push_text(p, o.text, o.len);
        if (!p->raw) op_dsml_end(&p->dsml);
        if (p->end == DSV4_END_NONE) op_stops_flush(&p->stops, emit_final, p);
    }
    if (p->end == DSV4_END_NONE) p->end = why;
    if (p->end != DSV4_END_STOP_STR && !p->raw) op_dsml_end(&p->dsml);
    if (p->thinking && !p->raw && !p->saw_think_close) p->res.reasoning_unterminated = 1;
}

static int process_token(dsv4_outparse *p, int32_t id, const dsv4_detok_out *o) {
    p->cur_tag = p->ntok++;
    int was_reasoning = p->in_reasoning;
    if (id >= 0 && o->special != DSV4_SPECIAL_EOS && is_stop_id(p, id)) {
        /* §6.1: ends generation in every state; like vLLM, the stop token's
         * own text is kept only with include_stop_str_in_output (bytes of an
         * earlier token completed by it are always kept) */
        if (o->len && (p->stops.include || o->special != DSV4_SPECIAL_NONE)) push_text(p, o->text, o->len);
        if (p->end == DSV4_END_NONE) {
            p->stop_token = id;
            finalize(p, DSV4_END_STOP_TOKEN);
        }
    } else {
        if (o->len) push_text(p, o->text, o->len);
        if (p->end == DSV4_END_NONE && o->special == DSV4_SPECIAL_EOS) finalize(p, DSV4_END_EOS);
        else if (p->end == DSV4_END_NONE && o->special != DSV4_SPECIAL_NONE && p->raw)
            push_special_raw(p, id, o->special, o->special_text, o->special_len);
        else if (p->end == DSV4_END_NONE && o->special != DSV4_SPECIAL_NONE)
            push_special(p, o->special, o->special_text, o->special_len);
    }
    if (was_reasoning && p->in_reasoning && o->special != DSV4_SPECIAL_EOS) p->reasoning_tokens++;
    if (p->end == DSV4_END_STOP_STR) finalize(p, DSV4_END_STOP_STR);
    return p->err_oom ? DSV4_ENOMEM : DSV4_OK;
}

int dsv4_outparse_push_piece(dsv4_outparse *p, int32_t id, const char *bytes, size_t len, int special,
                             int *ended, dsv4_err *err) {
    if (ended) *ended = p->end != DSV4_END_NONE;
    if (p->end != DSV4_END_NONE) return DSV4_OK;
    dsv4_detok_out o;
    int rc = dsv4_detok_push_bytes(p->detok, bytes, len, special, &o, err);
    if (rc) return rc;
    rc = process_token(p, id, &o);
    if (ended) *ended = p->end != DSV4_END_NONE;
    if (rc) return dsv4_err_set(err, rc, "outparse: out of memory");
    return DSV4_OK;
}

int dsv4_outparse_feed(dsv4_outparse *p, const int32_t *ids, int n, int *n_kept, dsv4_err *err) {
    if (n_kept) *n_kept = 0;
    if (p->end != DSV4_END_NONE) return DSV4_OK;
    int32_t base = p->ntok;
    for (int i = 0; i < n; i++) {
        dsv4_detok_out o;
        int rc = dsv4_detok_push(p->detok, ids[i], &o, err);
        if (rc) return rc;
        rc = process_token(p, ids[i], &o);
        if (rc) return dsv4_err_set(err, rc, "outparse: out of memory");
        if (p->end != DSV4_END_NONE) {
            if (n_kept) {
                int32_t last = p->end == DSV4_END_STOP_STR ? p->stop_tag : p->cur_tag;
                *n_kept = last + 1 - base > 0 ? (int)(last + 1 - base) : 0;
            }
            return DSV4_OK;
        }
    }
    if (n_kept) *n_kept = n;
    return DSV4_OK;
}

int dsv4_outparse_finish(dsv4_outparse *p, dsv4_end_reason why, dsv4_err *err) {
    if (p->end != DSV4_END_NONE) return DSV4_OK;
    if (why != DSV4_END_LENGTH && why != DSV4_END_ABORT)
        return dsv4_err_set(err, DSV4_EINVAL, "outparse_finish: reason must be LENGTH or ABORT (got %d)", (int)why);
    finalize(p, why);
    if (p->err_oom) return dsv4_err_set(err, DSV4_ENOMEM, "outparse: out of memory");
    return DSV4_OK;
}

int dsv4_outparse_finished(const dsv4_outparse *p) { return p->end != DSV4_END_NONE; }

const dsv4_outparse_delta *dsv4_outparse_take_deltas(dsv4_outparse *p, size_t *n) {
    deltas_reset_if_taken(p);
    *n = 0;
    if (!p->n_recs) return NULL;
    if (p->cap_out < p->n_recs) {
        dsv4_outparse_delta *no = realloc(p->out, p->n_recs * sizeof *no);
        if (!no) return NULL;
        p->out = no;
        p->cap_out = p->n_recs;
    }
    for (size_t i = 0; i < p->n_recs; i++) {
        op_delta_rec *r = &p->recs[i];
        dsv4_outparse_delta *d = &p->out[i];
        memset(d, 0, sizeof *d);
        d->kind = r->kind;
        d->tool_index = r->tool_index;
        d->text = p->arena.s + r->off;
        d->len = r->len;
        if (r->kind == DSV4_DELTA_TOOL_HEADER) {
            d->tool_id = p->arena.s + r->id_off;
            d->tool_name = p->arena.s + r->name_off;
            d->text = "";
            d->len = 0;
        }
    }
    *n = p->n_recs;
    p->taken = 1;
    return p->out;
}

const dsv4_outparse_result *dsv4_outparse_get_result(dsv4_outparse *p) {
    dsv4_outparse_result *r = &p->res;
    int unterminated = r->reasoning_unterminated;
    r->end = p->end;
    r->tool_calls = NULL;
    r->n_tool_calls = 0;
    int n_done = 0;
    for (int i = 0; i < p->n_calls; i++) n_done += p->calls[i].state == 1;
    free(p->done_calls);
    p->done_calls = n_done ? calloc((size_t)n_done, sizeof *p->done_calls) : NULL;
    if (p->done_calls) {
        int k = 0;
        for (int i = 0; i < p->n_calls; i++) {
            if (p->calls[i].state != 1) continue;
            memcpy(p->done_calls[k].id, p->calls[i].id, sizeof p->calls[i].id);
            p->done_calls[k].name = p->calls[i].name;
            p->done_calls[k].arguments = p->calls[i].args.s ? p->calls[i].args.s : "";
            k++;
        }
        r->tool_calls = p->done_calls;
        r->n_tool_calls = k;
    }
    r->reasoning = p->reasoning.len ? p->reasoning.s : NULL;
    r->reasoning_len = p->reasoning.len;
    r->content = p->content.len ? p->content.s : NULL;
    r->content_len = p->content.len;
    if (p->end == DSV4_END_EOS && unterminated && p->unterminated_as_content && !r->content) {
        /* §4.3 flag: the model answered without deliberating */
        r->content = r->reasoning;
        r->content_len = r->reasoning_len;
        r->reasoning = NULL;
        r->reasoning_len = 0;
    }
    r->stop_reason_str = p->end == DSV4_END_STOP_STR ? p->stops.str[p->stop_which] : NULL;
    r->stop_reason_token = p->end == DSV4_END_STOP_TOKEN ? p->stop_token : -1;
    switch (p->end) {
    case DSV4_END_NONE: r->finish_reason = NULL; break;
    case DSV4_END_EOS:
    case DSV4_END_STOP_TOKEN: r->finish_reason = r->n_tool_calls ? "tool_calls" : "stop"; break;
    case DSV4_END_STOP_STR: r->finish_reason = "stop"; break;
    case DSV4_END_LENGTH: r->finish_reason = "length"; break;
    case DSV4_END_ABORT: r->finish_reason = "abort"; break;
    }
    r->completion_tokens = p->end == DSV4_END_STOP_STR ? p->stop_tag + 1 : p->ntok;
    r->reasoning_tokens = p->reasoning_tokens;
    r->tool_parse_failures = p->counters_tool_fail;
    r->tool_parse_malformed = p->dsml.malformed_count;
    r->stop_suppressed_in_reasoning = p->stop_suppressed;
    r->dsml_stripped = p->counters_stripped;
    return r;
}
