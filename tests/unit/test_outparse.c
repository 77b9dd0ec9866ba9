/*
 * Output parser (src/text/outparse.h): the conformance items of
 * spec/SERVING.md §9 that need no model (3, 5, 6, 7, 8, 9, 12, 13; items 4,
 * 10, 11 are the resolver/encoder's and are tested there), §4.3-§4.4
 * (</think> never arrives, runaways), §5.2 repair/coercion and §6.2 guard.
 *
 * Expected values are derived from the spec's rules (the spec is the
 * reference for this layer); JSON arguments are additionally checked to parse.
 *
 * Every case is a model output written in a mini-language (special tokens as
 * control bytes, see SPECIALS) and is fed:
 *   (a) whole: each text run one token, one engine step;
 *   (b) split at every byte boundary k (two tokens), and one token per byte;
 *   (c) random token boundaries and random speculative step sizes (seeded);
 * through a token-id vocab and the detokenizer, as the engine does. All feeds
 * must give the same final result; every delta is also checked for
 * invariants (well-formed UTF-8, no special/DSML text, stream == final).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "text/detok.h"
#include "text/outparse.h"

/* ---- special tokens in case strings ---- */
#define DSML "\x01"  /* ｜DSML｜ */
#define ETHINK "\x02" /* </think> */
#define EOS "\x03"
#define BTHINK "\x04" /* <think> */
#define BOS "\x05"
#define USER "\x06"
static const char *const SPECIAL_TEXT[] = {
    NULL,
    "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C",
    "</think>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<think>",
    "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
};
#define NSPECIAL 7

/* DSML helpers for writing cases */
#define OPEN "\n\n<" DSML "tool_calls>\n"
#define CLOSE "\n</" DSML "tool_calls>"
#define INV(name) "<" DSML "invoke name=\"" name "\">\n"
#define EINV "\n</" DSML "invoke>"
#define PAR(k, s) "<" DSML "parameter name=\"" k "\" string=\"" s "\">"
#define EPAR "</" DSML "parameter>"

/* ---- a dynamic vocab: the test's token ids ---- */
typedef struct { char *b; size_t n; int special; } tv_tok;
typedef struct { tv_tok *t; int n, cap; } tvocab;

static int32_t tv_add(tvocab *v, const char *b, size_t n, int special) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 256;
        v->t = realloc(v->t, (size_t)v->cap * sizeof *v->t);
    }
    v->t[v->n].b = malloc(n + 1);
    memcpy(v->t[v->n].b, b, n);
    v->t[v->n].b[n] = 0;
    v->t[v->n].n = n;
    v->t[v->n].special = special;
    return v->n++;
}
static int tv_piece(void *ctx, int32_t id, const char **b, size_t *n, int *special) {
    tvocab *v = ctx;
    if (id < 0 || id >= v->n) return 1;
    *b = v->t[id].b;
    *n = v->t[id].n;
    *special = v->t[id].special;
    return 0;
}
static void tv_free(tvocab *v) {
    for (int i = 0; i < v->n; i++) free(v->t[i].b);
    free(v->t);
    memset(v, 0, sizeof *v);
}

/* ---- string buffer ---- */
typedef struct { char *s; size_t n, cap; } sb;
static void sb_put(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static const char *sb_str(const sb *b) { return b->s ? b->s : ""; }

/* ---- tokenising a case string under a split mode ---- */
enum { MODE_WHOLE, MODE_SPLIT_AT, MODE_BYTES, MODE_RANDOM };

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Token ids for the case under a mode; the text position counter k counts
 * text bytes only (specials are atomic). */
static int tokenize_case(const char *c, int mode, size_t split_at, uint64_t *rng, tvocab *v, int32_t *ids, int max) {
    int n = 0;
    size_t pos = 0;
    const char *p = c;
    while (*p && n < max) {
        unsigned char ch = (unsigned char)*p;
        if (ch < NSPECIAL && ch > 0) {
            const char *t = SPECIAL_TEXT[ch];
            ids[n++] = tv_add(v, t, strlen(t), 1);
            p++;
            continue;
        }
        size_t run = 0;
        while (p[run] && !((unsigned char)p[run] < NSPECIAL)) run++;
        size_t i = 0;
        while (i < run && n < max) {
            size_t len;
            switch (mode) {
            case MODE_WHOLE: len = run - i; break;
            case MODE_BYTES: len = 1; break;
            case MODE_SPLIT_AT:
                len = run - i;
                if (pos < split_at && split_at < pos + len) len = split_at - pos;
                break;
            default: len = 1 + rng_next(rng) % 7; if (len > run - i) len = run - i;
            }
            ids[n++] = tv_add(v, p + i, len, 0);
            i += len;
            pos += len;
        }
        p += run;
    }
    return n;
}

/* ---- one run of the parser ---- */
typedef struct {
    sb reasoning, content;          /* from deltas */
    sb args[8], names[8], idstr[8]; /* from deltas */
    int n_headers;
    /* final */
    char *f_reasoning, *f_content;  /* NULL = null */
    int n_calls;
    char *f_names[8], *f_args[8];
    char finish[16];
    char stop_reason[64];
    int stop_token;
    int completion_tokens, sum_kept;
    int violations; /* invariant failures seen in deltas */
    int raw;        /* raw mode: special-token text is allowed in content */
    int suppressed; /* result.stop_suppressed_in_reasoning */
} outcome;

static void outcome_free(outcome *o) {
    free(o->reasoning.s);
    free(o->content.s);
    for (int i = 0; i < 8; i++) {
        free(o->args[i].s);
        free(o->names[i].s);
        free(o->idstr[i].s);
        free(o->f_names[i]);
        free(o->f_args[i]);
    }
    free(o->f_reasoning);
    free(o->f_content);
    memset(o, 0, sizeof *o);
}

static int well_formed(const char *s, size_t n) {
    char *o = NULL;
    size_t on = 0;
    if (dsv4_utf8_lossy(s, n, &o, &on)) return 0;
    int ok = on == n && memcmp(o, s, n) == 0;
    free(o);
    return ok;
}

static const char *FORBIDDEN[] = {"DSML", "</think>", "<think>", "end\xE2\x96\x81of", "begin\xE2\x96\x81of",
                                  "\xEF\xBD\x9CUser", "\xEF\xBD\x9C" "Assistant"};

static void collect(dsv4_outparse *p, outcome *o, const char *tag) {
    size_t n = 0;
    const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(p, &n);
    for (size_t i = 0; i < n; i++) {
        if (!well_formed(d[i].text, d[i].len)) {
            o->violations++;
            fprintf(stderr, "[%s] delta not well-formed UTF-8\n", tag);
        }
        if (d[i].kind == DSV4_DELTA_REASONING || d[i].kind == DSV4_DELTA_CONTENT) {
            /* raw mode (§3.6) keeps all special-token text but BOS/EOS/pad */
            for (size_t f = o->raw ? 3 : 0; f < (o->raw ? 5 : sizeof FORBIDDEN / sizeof *FORBIDDEN); f++)
                if (strstr(d[i].text, FORBIDDEN[f])) {
                    o->violations++;
                    fprintf(stderr, "[%s] delta contains forbidden text: \"%s\"\n", tag, d[i].text);
                }
            if (d[i].len == 0) o->violations++;
        }
        switch (d[i].kind) {
        case DSV4_DELTA_REASONING: sb_put(&o->reasoning, d[i].text, d[i].len); break;
        case DSV4_DELTA_CONTENT: sb_put(&o->content, d[i].text, d[i].len); break;
        case DSV4_DELTA_TOOL_HEADER:
            if (d[i].tool_index != o->n_headers || d[i].tool_index >= 8) o->violations++;
            else {
                sb_put(&o->names[d[i].tool_index], d[i].tool_name, strlen(d[i].tool_name));
                sb_put(&o->idstr[d[i].tool_index], d[i].tool_id, strlen(d[i].tool_id));
                o->n_headers++;
            }
            break;
        case DSV4_DELTA_TOOL_ARGS:
            if (d[i].tool_index < 0 || d[i].tool_index >= o->n_headers) o->violations++;
            else sb_put(&o->args[d[i].tool_index], d[i].text, d[i].len);
            break;
        }
    }
}

typedef struct {
    int thinking, tools_enabled, stop_in_reasoning, include_stop, as_content, raw;
    const char *stops[4];
    int n_stops;
    const char *tools_json;
    int32_t stop_token_ids[2];
    int n_stop_ids;
} pcfg;

/* Run one tokenisation of case c; steps of random size when rng != NULL. */
static void run(const pcfg *pc, const char *c, int mode, size_t split_at, uint64_t seed, int whole_step,
                outcome *o, const char *tag) {
    memset(o, 0, sizeof *o);
    o->raw = pc->raw;
    tvocab v = {0};
    int32_t *ids = malloc(8192 * sizeof *ids);
    uint64_t rng = seed;
    int n = tokenize_case(c, mode, split_at, &rng, &v, ids, 8192);
    cJSON *tools = pc->tools_json ? cJSON_Parse(pc->tools_json) : NULL;
    dsv4_outparse_config cfg = {0};
    cfg.thinking = pc->thinking;
    cfg.tools_enabled = pc->tools_enabled;
    cfg.tools = tools;
    cfg.stops = pc->stops;
    cfg.n_stops = pc->n_stops;
    cfg.include_stop_str_in_output = pc->include_stop;
    cfg.stop_in_reasoning = pc->stop_in_reasoning;
    cfg.unterminated_reasoning_as_content = pc->as_content;
    cfg.id_seed = 42;
    cfg.raw = pc->raw;
    /* stop_token_ids are given as special-token texts' kinds: map to our ids */
    int32_t stop_ids[2];
    for (int i = 0; i < pc->n_stop_ids; i++) {
        const char *t = SPECIAL_TEXT[pc->stop_token_ids[i]];
        stop_ids[i] = -1;
        for (int k = 0; k < n; k++)
            if (v.t[ids[k]].special && strcmp(v.t[ids[k]].b, t) == 0) stop_ids[i] = ids[k];
    }
    cfg.stop_token_ids = stop_ids;
    cfg.n_stop_token_ids = pc->n_stop_ids;
    dsv4_detok_vocab vocab = {&v, tv_piece};
    dsv4_err err = {0};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, &vocab, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (!p) goto out;
    int i = 0;
    while (i < n && !dsv4_outparse_finished(p)) {
        int step = whole_step ? n - i : 1;
        if (mode == MODE_RANDOM) step = 1 + (int)(rng_next(&rng) % 6); /* k+1 = 6 */
        if (step > n - i) step = n - i;
        int kept = -1;
        CHECK_EQ_INT(dsv4_outparse_feed(p, ids + i, step, &kept, &err), DSV4_OK);
        if (kept < 0 || kept > step) o->violations++;
        o->sum_kept += kept;
        collect(p, o, tag);
        i += step;
    }
    if (!dsv4_outparse_finished(p)) {
        CHECK_EQ_INT(dsv4_outparse_finish(p, DSV4_END_LENGTH, &err), DSV4_OK);
        collect(p, o, tag);
    }
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    o->f_reasoning = r->reasoning ? strdup(r->reasoning) : NULL;
    o->f_content = r->content ? strdup(r->content) : NULL;
    o->n_calls = r->n_tool_calls;
    for (int k = 0; k < r->n_tool_calls && k < 8; k++) {
        o->f_names[k] = strdup(r->tool_calls[k].name);
        o->f_args[k] = strdup(r->tool_calls[k].arguments);
        cJSON *j = cJSON_Parse(r->tool_calls[k].arguments);
        if (!cJSON_IsObject(j)) {
            o->violations++;
            fprintf(stderr, "[%s] invalid JSON arguments: %s\n", tag, r->tool_calls[k].arguments);
        }
        cJSON_Delete(j);
        /* the streamed fragments of this call concatenate to the final args */
        int found = 0;
        for (int h = 0; h < o->n_headers; h++)
            if (!strcmp(sb_str(&o->idstr[h]), r->tool_calls[k].id)) {
                found = 1;
                if (strcmp(sb_str(&o->args[h]), r->tool_calls[k].arguments) || strcmp(sb_str(&o->names[h]), r->tool_calls[k].name)) {
                    o->violations++;
                    fprintf(stderr, "[%s] streamed args \"%s\" != final \"%s\"\n", tag, sb_str(&o->args[h]),
                            r->tool_calls[k].arguments);
                }
            }
        if (!found) o->violations++;
    }
    snprintf(o->finish, sizeof o->finish, "%s", r->finish_reason ? r->finish_reason : "(null)");
    snprintf(o->stop_reason, sizeof o->stop_reason, "%s", r->stop_reason_str ? r->stop_reason_str : "");
    o->stop_token = r->stop_reason_token;
    o->completion_tokens = r->completion_tokens;
    o->suppressed = r->stop_suppressed_in_reasoning;
    /* streaming == non-streaming for text (except the §4.3 opt-in move) */
    if (!pc->as_content) {
        if (strcmp(sb_str(&o->reasoning), o->f_reasoning ? o->f_reasoning : "") ||
            strcmp(sb_str(&o->content), o->f_content ? o->f_content : "")) {
            o->violations++;
            fprintf(stderr, "[%s] streamed text != final text\n", tag);
        }
    }
    if (o->completion_tokens > o->sum_kept) o->violations++;
    dsv4_outparse_free(p);
out:
    cJSON_Delete(tools);
    tv_tok dummy;
    (void)dummy;
    tv_free(&v);
    free(ids);
}

static int streq_null(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

static int same_outcome(const outcome *a, const outcome *b) {
    if (!streq_null(a->f_reasoning, b->f_reasoning) || !streq_null(a->f_content, b->f_content)) return 0;
    if (a->n_calls != b->n_calls || strcmp(a->finish, b->finish) || strcmp(a->stop_reason, b->stop_reason)) return 0;
    for (int i = 0; i < a->n_calls && i < 8; i++)
        if (strcmp(a->f_names[i], b->f_names[i]) || strcmp(a->f_args[i], b->f_args[i])) return 0;
    return 1;
}

/* ---- expectations ---- */
typedef struct {
    const char *reasoning, *content; /* NULL = JSON null */
    int n_calls;
    const char *names[4], *args[4];
    const char *finish, *stop_reason;
    int suppressed; /* a stop occurred where the guard kept it dormant */
} expect;

static void check_expect(const char *name, const outcome *o, const expect *e) {
    CHECK_MSG(streq_null(o->f_reasoning, e->reasoning), "%s: reasoning \"%s\" != \"%s\"", name,
              o->f_reasoning ? o->f_reasoning : "(null)", e->reasoning ? e->reasoning : "(null)");
    CHECK_MSG(streq_null(o->f_content, e->content), "%s: content \"%s\" != \"%s\"", name,
              o->f_content ? o->f_content : "(null)", e->content ? e->content : "(null)");
    CHECK_MSG(o->n_calls == e->n_calls, "%s: %d tool calls, expected %d", name, o->n_calls, e->n_calls);
    for (int i = 0; i < e->n_calls && i < o->n_calls; i++) {
        CHECK_MSG(!strcmp(o->f_names[i], e->names[i]), "%s: call %d name %s", name, i, o->f_names[i]);
        CHECK_MSG(!strcmp(o->f_args[i], e->args[i]), "%s: call %d args %s != %s", name, i, o->f_args[i], e->args[i]);
    }
    CHECK_MSG(!strcmp(o->finish, e->finish), "%s: finish %s != %s", name, o->finish, e->finish);
    CHECK_MSG(!strcmp(o->stop_reason, e->stop_reason ? e->stop_reason : ""), "%s: stop_reason %s", name,
              o->stop_reason);
    CHECK_MSG(o->suppressed == e->suppressed, "%s: stop_suppressed_in_reasoning %d", name, o->suppressed);
}

/*
 * Feed case c in every mode; every outcome must equal `e` and be free of
 * invariant violations. Returns the whole-feed outcome's completion_tokens.
 */
static void run_all(const char *name, const pcfg *pc, const char *c, const expect *e) {
    outcome o;
    char tag[160];
    int bad_modes = 0;
    snprintf(tag, sizeof tag, "%s/whole", name);
    run(pc, c, MODE_WHOLE, 0, 1, 0, &o, tag);
    check_expect(tag, &o, e);
    CHECK_EQ_INT(o.violations, 0);
    outcome_free(&o);
    snprintf(tag, sizeof tag, "%s/whole-one-step", name);
    run(pc, c, MODE_WHOLE, 0, 1, 1, &o, tag);
    check_expect(tag, &o, e);
    CHECK_EQ_INT(o.violations, 0);
    outcome_free(&o);
    snprintf(tag, sizeof tag, "%s/bytes", name);
    run(pc, c, MODE_BYTES, 0, 1, 0, &o, tag);
    check_expect(tag, &o, e);
    CHECK_EQ_INT(o.violations, 0);
    outcome_free(&o);
    size_t textlen = 0;
    for (const char *q = c; *q; q++) textlen += (unsigned char)*q >= NSPECIAL;
    for (size_t k = 1; k < textlen; k++) {
        snprintf(tag, sizeof tag, "%s/split@%zu", name, k);
        run(pc, c, MODE_SPLIT_AT, k, 1, 0, &o, tag);
        outcome ref;
        run(pc, c, MODE_SPLIT_AT, k, 1, 1, &ref, tag); /* the same tokens in one step */
        if (o.violations || ref.violations || !same_outcome(&o, &ref)) bad_modes++;
        check_expect(tag, &o, e);
        outcome_free(&o);
        outcome_free(&ref);
    }
    for (uint64_t seed = 1; seed <= 24; seed++) {
        snprintf(tag, sizeof tag, "%s/random#%llu", name, (unsigned long long)seed);
        run(pc, c, MODE_RANDOM, 0, seed, 0, &o, tag);
        check_expect(tag, &o, e);
        if (o.violations) bad_modes++;
        outcome_free(&o);
    }
    CHECK_MSG(bad_modes == 0, "%s: %d split feeds violated invariants", name, bad_modes);
}

/* ======================================================================= */

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"metric\":{\"type\":\"boolean\"},"
    "\"tags\":{\"type\":\"array\"}}}}}]";

/* §9 item 3: reasoning_effort "none" + thinking true resolves to chat mode;
 * the parser, given that resolved mode, files everything as content. The
 * trap of §6.4 (parser left in thinking mode) is shown as the contrast. */
static void test_item3_effort_none_thinking_true(void) {
    pcfg chat = {0};
    expect e = {.reasoning = NULL, .content = "The answer is 4.", .finish = "stop"};
    run_all("item3_effort_none_thinking_true", &chat, "The answer is 4." EOS, &e);
    /* leading </think>/<think> control tokens in chat mode are removed (§4.5) */
    run_all("item3_chat_control_tokens_removed", &chat, BTHINK "The answer" ETHINK " is 4." EOS,
            &(expect){.content = "The answer is 4.", .finish = "stop"});
    pcfg trap = {.thinking = 1};
    run_all("item3_contrast_parser_in_thinking", &trap, "The answer is 4." EOS,
            &(expect){.reasoning = "The answer is 4.", .content = NULL, .finish = "stop"});
}

/* §9 item 5: stops dormant in reasoning; the same stop cuts content. */
static void test_item5_stop_in_reasoning(void) {
    const char *out = "The user asks: Question: what is 2+2? Restating. Question: ok." ETHINK
                      "The answer is 4.\nQuestion: anything else?" EOS;
    pcfg think = {.thinking = 1, .stops = {"Question:"}, .n_stops = 1};
    run_all("item5_stop_dormant_in_reasoning", &think, out,
            &(expect){.reasoning = "The user asks: Question: what is 2+2? Restating. Question: ok.",
                      .content = "The answer is 4.\n", .suppressed = 1, .finish = "stop", .stop_reason = "Question:"});
    pcfg chat = {.thinking = 0, .stops = {"Question:"}, .n_stops = 1};
    run_all("item5_thinking_off_stops_at_first", &chat, "Restating. Question: what is 2+2?\nQuestion: again" EOS,
            &(expect){.content = "Restating. ", .finish = "stop", .stop_reason = "Question:"});
    /* one-chunk leak (§6.2): reasoning text with the stop and </think> in one
     * step never fires; whole-one-step feeding covers that */
    run_all("item5_one_chunk_leak", &think, "x Question: y" ETHINK "z" EOS,
            &(expect){.reasoning = "x Question: y", .content = "z", .suppressed = 1, .finish = "stop"});
    /* §6.3 opt-in: stop fires inside reasoning */
    pcfg optin = {.thinking = 1, .stops = {"Question:"}, .n_stops = 1, .stop_in_reasoning = 1};
    run_all("item5_stop_in_reasoning_opt_in", &optin, out,
            &(expect){.reasoning = "The user asks: ", .content = NULL, .finish = "stop", .stop_reason = "Question:"});
    /* output-side arming (§6.2, PR #42): chat prompt, first output <think> */
    run_all("item5_output_side_arming", &chat, "  " BTHINK "Question: hmm" ETHINK "A. Question: b" EOS,
            &(expect){.content = "  Question: hmmA. ", .suppressed = 1, .finish = "stop", .stop_reason = "Question:"});
}

/* §9 item 6: stops spanning tokens / inside one speculative step; earliest
 * completion wins, ties by list order; text after never streamed. */
static void test_item6_stop_earliest_match(void) {
    pcfg a = {.stops = {"OP!", "STOP"}, .n_stops = 2};
    run_all("item6_earliest_completion_wins", &a, "abc STOP! xyz" EOS,
            &(expect){.content = "abc ", .finish = "stop", .stop_reason = "STOP"});
    pcfg tie1 = {.stops = {"XY", "Y"}, .n_stops = 2};
    run_all("item6_tie_list_order_1", &tie1, "aXYb" EOS, &(expect){.content = "a", .finish = "stop", .stop_reason = "XY"});
    pcfg tie2 = {.stops = {"Y", "XY"}, .n_stops = 2};
    run_all("item6_tie_list_order_2", &tie2, "aXYb" EOS,
            &(expect){.content = "aX", .finish = "stop", .stop_reason = "Y"});
    pcfg uni = {.stops = {"终止"}, .n_stops = 1};
    run_all("item6_multibyte_stop_split_chars", &uni, "答案是四。终止之后不可见" EOS,
            &(expect){.content = "答案是四。", .finish = "stop", .stop_reason = "终止"});
    pcfg inc = {.stops = {"END"}, .n_stops = 1, .include_stop = 1};
    run_all("item6_include_stop_str", &inc, "hello ENDafter" EOS,
            &(expect){.content = "hello END", .finish = "stop", .stop_reason = "END"});
    pcfg part = {.stops = {"abcd"}, .n_stops = 1};
    run_all("item6_partial_released_at_end", &part, "xxabc", &(expect){.content = "xxabc", .finish = "length"});
    run_all("item6_partial_released_when_broken", &part, "abcabcabd abcd!" EOS,
            &(expect){.content = "abcabcabd ", .finish = "stop", .stop_reason = "abcd"});
}

/* item 6, the engine's view: where to truncate inside one speculative step. */
static void test_item6_truncation_index(void) {
    tvocab v = {0};
    const char *pieces[] = {"Hel", "lo S", "TO", "P tail", "more"};
    int32_t ids[5];
    for (int i = 0; i < 5; i++) ids[i] = tv_add(&v, pieces[i], strlen(pieces[i]), 0);
    const char *stops[] = {"STOP"};
    dsv4_outparse_config cfg = {.stops = stops, .n_stops = 1, .id_seed = 1};
    dsv4_detok_vocab vocab = {&v, tv_piece};
    dsv4_err err = {0};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, &vocab, &err);
    int kept = -1;
    CHECK_EQ_INT(dsv4_outparse_feed(p, ids, 1, &kept, &err), DSV4_OK);
    CHECK_EQ_INT(kept, 1);
    /* one step of 4 tokens: the stop completes in its 3rd token ("P tail") */
    CHECK_EQ_INT(dsv4_outparse_feed(p, ids + 1, 4, &kept, &err), DSV4_OK);
    CHECK_EQ_INT(kept, 3);
    CHECK(dsv4_outparse_finished(p));
    size_t n = 0;
    const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(p, &n);
    sb all = {0};
    for (size_t i = 0; i < n; i++) sb_put(&all, d[i].text, d[i].len);
    CHECK(strstr(sb_str(&all), "tail") == NULL);
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    CHECK_STR(r->content, "Hello ");
    CHECK_EQ_INT(r->completion_tokens, 4);
    CHECK_STR(r->finish_reason, "stop");
    CHECK_STR(r->stop_reason_str, "STOP");
    CHECK_EQ_INT(dsv4_outparse_feed(p, ids, 1, &kept, &err), DSV4_OK);
    CHECK_EQ_INT(kept, 0);
    free(all.s);
    dsv4_outparse_free(p);
    /* empty stop string -> EINVAL naming it */
    const char *bad[] = {"x", ""};
    dsv4_outparse_config cb = {.stops = bad, .n_stops = 2};
    CHECK(dsv4_outparse_create(&cb, &vocab, &err) == NULL);
    CHECK_EQ_INT(err.code, DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "stop[1]");
    tv_free(&v);
}

/* §9 item 7: no </think>, BOS/EOS, role or DSML text in any delta. */
static void test_item7_no_special_text(void) {
    pcfg t = {.thinking = 1, .tools_enabled = 1, .tools_json = TOOLS};
    run_all("item7_specials_never_emitted", &t,
            BTHINK "plan " BOS "step" USER ETHINK "Hi " BOS "there" USER "!" EOS,
            &(expect){.reasoning = "plan step", .content = "Hi there!", .finish = "stop"});
    pcfg c = {.tools_enabled = 1, .tools_json = TOOLS};
    run_all("item7_stray_dsml_markers_stripped", &c,
            "a " DSML " b </" DSML "parameter> c |DSML| d \xE2\x80\x96" "DSML\xE2\x80\x96 e" EOS,
            &(expect){.content = "a  b  c  d  e", .finish = "stop"});
    run_all("item7_lookalike_block_parsed", &c,
            "ok\n\n<|DSML|tool_calls>\n<|DSML|invoke name=\"bash\">\n<|DSML|parameter name=\"command\" "
            "string=\"true\">pwd</|DSML|parameter>\n</|DSML|invoke>\n</|DSML|tool_calls>" EOS,
            &(expect){.content = "ok", .n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"pwd\"}"},
                      .finish = "tool_calls"});
    /* stripping must not splice a marker together (found by the fuzzer) */
    run_all("item7_no_marker_spliced_by_stripping", &c, "a|DSM|DSML|L|b x|DSM" USER "L|y" EOS,
            &(expect){.content = "ab xy", .finish = "stop"});
    pcfg none = {0};
    run_all("item7_no_marker_spliced_around_stripped_block", &none,
            "a|DSM" OPEN INV("bash") EINV CLOSE "L|b" EOS, &(expect){.content = "ab", .finish = "stop"});
    run_all("item7_lt_and_newlines_released", &c, "a < b\n\nc <x> |y| \xEF\xBD\x9Cz\n" EOS,
            &(expect){.content = "a < b\n\nc <x> |y| \xEF\xBD\x9Cz\n", .finish = "stop"});
}

/* §9 item 8: streamed fragments == non-streaming args; 2>&1 round-trips. */
static void test_item8_tool_call_streaming(void) {
    pcfg t = {.thinking = 1, .tools_enabled = 1, .tools_json = TOOLS};
    run_all("item8_bash_2>&1_round_trip", &t,
            "Need to list files." ETHINK "Listing.\n\n<" DSML "tool_calls>\n" INV("bash")
                PAR("command", "true") "ls -la /tmp 2>&1" EPAR EINV CLOSE EOS,
            &(expect){.reasoning = "Need to list files.", .content = "Listing.", .n_calls = 1, .names = {"bash"},
                      .args = {"{\"command\":\"ls -la /tmp 2>&1\"}"}, .finish = "tool_calls"});
    /* strings with quotes, backslashes, newlines, '<' and a partial closer;
     * typed values; two invokes; no content before the block */
    run_all("item8_typed_params_two_calls", &t,
            ETHINK OPEN INV("bash") PAR("command", "true")
                "echo \"a\\b\"\n\tcat <x> </" DSML "param 2>&1" EPAR "\n" PAR("timeout", "false") " 30 " EPAR EINV
                "\n" INV("get_weather") PAR("city", "true") "Zürich 日本" EPAR "\n" PAR("days", "false") "3" EPAR
                "\n" PAR("metric", "false") "true" EPAR "\n" PAR("tags", "false") "[ \"a\", 1, {\"k\": null} ]" EPAR
                EINV CLOSE EOS,
            &(expect){.content = NULL, .n_calls = 2, .names = {"bash", "get_weather"},
                      .args = {"{\"command\":\"echo \\\"a\\\\b\\\"\\n\\tcat <x> </" "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
                               "param 2>&1\",\"timeout\":30}",
                               "{\"city\":\"Zürich 日本\",\"days\":3,\"metric\":true,\"tags\":[\"a\",1,{\"k\":null}]}"},
                      .finish = "tool_calls"});
    /* zero parameters -> {} */
    run_all("item8_zero_params", &t, ETHINK OPEN INV("bash") "\n</" DSML "invoke>" CLOSE EOS,
            &(expect){.n_calls = 1, .names = {"bash"}, .args = {"{}"}, .finish = "tool_calls"});
    /* coercion by schema when string="false" is not JSON; unknown-type fallback to string */
    run_all("item8_schema_coercion", &t,
            ETHINK OPEN INV("get_weather") PAR("days", "false") "+7" EPAR "\n" PAR("metric", "false") "True" EPAR
                "\n" PAR("city", "false") "Paris" EPAR EINV CLOSE EOS,
            &(expect){.n_calls = 1, .names = {"get_weather"},
                      .args = {"{\"days\":7,\"metric\":true,\"city\":\"Paris\"}"}, .finish = "tool_calls"});
    /* §5.2 repair: sole `arguments` wrapper unwrapped; kept when not sole */
    run_all("item8_repair_arguments_wrapper", &t,
            ETHINK OPEN INV("get_weather") PAR("arguments", "false") "{\"city\": \"Oslo\", \"days\": 2}" EPAR EINV
                CLOSE EOS,
            &(expect){.n_calls = 1, .names = {"get_weather"}, .args = {"{\"city\":\"Oslo\",\"days\":2}"},
                      .finish = "tool_calls"});
    run_all("item8_repair_not_sole", &t,
            ETHINK OPEN INV("get_weather") PAR("input", "false") "{\"city\": \"Oslo\"}" EPAR "\n" PAR("days", "false")
                "2" EPAR EINV CLOSE EOS,
            &(expect){.n_calls = 1, .names = {"get_weather"}, .args = {"{\"input\":{\"city\":\"Oslo\"},\"days\":2}"},
                      .finish = "tool_calls"});
    /* §4.2: DSML opener while still in reasoning (model forgot </think>) */
    run_all("item8_tool_call_inside_reasoning", &t,
            "I will call bash." OPEN INV("bash") PAR("command", "true") "pwd" EPAR EINV CLOSE EOS,
            &(expect){.reasoning = "I will call bash.", .n_calls = 1, .names = {"bash"},
                      .args = {"{\"command\":\"pwd\"}"}, .finish = "tool_calls"});
    /* text after the closer is discarded (§5.2) */
    run_all("item8_text_after_block_discarded", &t,
            ETHINK "Hi" OPEN INV("bash") PAR("command", "true") "pwd" EPAR EINV CLOSE "trailing junk" EOS,
            &(expect){.content = "Hi", .n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"pwd\"}"},
                      .finish = "tool_calls"});
    /* §6.2: a "\n\n" stop is deferred until we know whether a block starts */
    pcfg s = {.thinking = 1, .tools_enabled = 1, .tools_json = TOOLS, .stops = {"\n\n"}, .n_stops = 1};
    run_all("item8_stop_newlines_deferred_for_tool_call", &s,
            ETHINK "Sure." OPEN INV("bash") PAR("command", "true") "a\n\nb" EPAR EINV CLOSE EOS,
            &(expect){.content = "Sure.", .n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"a\\n\\nb\"}"},
                      .finish = "tool_calls"});
    run_all("item8_stop_newlines_fires_without_tool_call", &s, ETHINK "Sure.\n\nMore text" EOS,
            &(expect){.content = "Sure.", .finish = "stop", .stop_reason = "\n\n"});
    /* duplicate parameter: both keys streamed; JSON parsers keep the last */
    run_all("item8_duplicate_param_last_wins", &t,
            ETHINK OPEN INV("bash") PAR("command", "true") "a" EPAR "\n" PAR("command", "true") "b" EPAR EINV CLOSE EOS,
            &(expect){.n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"a\",\"command\":\"b\"}"},
                      .finish = "tool_calls"});
}

/* §9 item 9: tool call cut by max_tokens -> length, no invalid JSON. */
static void test_item9_tool_call_truncated(void) {
    pcfg t = {.thinking = 1, .tools_enabled = 1, .tools_json = TOOLS};
    run_all("item9_truncated_in_string_value", &t,
            ETHINK "Calling." OPEN INV("bash") PAR("command", "true") "rm -rf /tmp/x 2>",
            &(expect){.content = "Calling.", .finish = "length"});
    run_all("item9_truncated_keeps_complete_calls", &t,
            ETHINK OPEN INV("bash") PAR("command", "true") "pwd" EPAR EINV "\n" INV("get_weather") PAR("days", "false") "1",
            &(expect){.n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"pwd\"}"}, .finish = "length"});
    run_all("item9_truncated_in_opener", &t, ETHINK "Hmm.\n\n<" DSML "tool_ca",
            &(expect){.content = "Hmm.", .finish = "length"});
    /* EOS inside an unterminated block: drop incomplete, keep complete */
    run_all("item9_eos_unterminated_block", &t,
            ETHINK OPEN INV("bash") PAR("command", "true") "pwd" EPAR EINV "\n" INV("bash") PAR("command", "true") "ls" EOS,
            &(expect){.n_calls = 1, .names = {"bash"}, .args = {"{\"command\":\"pwd\"}"}, .finish = "tool_calls"});
    run_all("item9_eos_only_incomplete_call", &t, ETHINK "x" OPEN INV("bash") PAR("command", "true") "ls" EOS,
            &(expect){.content = "x", .finish = "stop"});
    /* malformed markup inside a block: call dropped, nothing leaks */
    run_all("item9_malformed_block_stripped", &t, ETHINK "y" OPEN "<" DSML "invok name=bash>oops" CLOSE EOS,
            &(expect){.content = "y", .finish = "stop"});
}

/* §9 item 12: tool_choice "none" -> no tool parsing, DSML removed. */
static void test_item12_tool_choice_none(void) {
    pcfg t = {.thinking = 0, .tools_enabled = 0};
    run_all("item12_tool_choice_none_strips_dsml", &t,
            "I cannot call tools." OPEN INV("bash") PAR("command", "true") "ls" EPAR EINV CLOSE " Done." EOS,
            &(expect){.content = "I cannot call tools. Done.", .finish = "stop"});
}

/* §9 item 13: response_format json_object with thinking: JSON in content,
 * reasoning free text (the constraint is armed at </think>, §4.6). */
static void test_item13_json_object_thinking(void) {
    pcfg t = {.thinking = 1};
    run_all("item13_json_in_content_reasoning_free", &t,
            "The user wants {json}; I'll answer with an object." ETHINK "{\"answer\": 4, \"unit\": \"none\"}" EOS,
            &(expect){.reasoning = "The user wants {json}; I'll answer with an object.",
                      .content = "{\"answer\": 4, \"unit\": \"none\"}", .finish = "stop"});
}

/* §4.3: </think> never arrives; §4.4: runaways are not cut by stops. */
static void test_think_never_arrives(void) {
    pcfg t = {.thinking = 1, .stops = {"Question:"}, .n_stops = 1};
    run_all("s4_3_length_in_reasoning", &t, "Thinking... Question: still thinking",
            &(expect){.reasoning = "Thinking... Question: still thinking", .content = NULL, .suppressed = 1, .finish = "length"});
    run_all("s4_3_eos_in_reasoning", &t, "Thinking done" EOS,
            &(expect){.reasoning = "Thinking done", .content = NULL, .finish = "stop"});
    pcfg ac = {.thinking = 1, .as_content = 1};
    run_all("s4_3_unterminated_as_content", &ac, "Just the answer" EOS,
            &(expect){.reasoning = NULL, .content = "Just the answer", .finish = "stop"});
    /* runaway: a verbatim loop full of the stop string runs to max_tokens */
    sb loop = {0};
    for (int i = 0; i < 40; i++) sb_put(&loop, "Wait, Question: is it 4? ", 25);
    char *runaway = strdup(loop.s);
    run_all("s4_4_runaway_not_cut_by_stop", &t, runaway,
            &(expect){.reasoning = runaway, .content = NULL, .suppressed = 1, .finish = "length"});
    free(runaway);
    free(loop.s);
    /* thinking budget (§4.3 row 2): the engine inserts </think>; continues */
    run_all("s4_3_forced_think_close", &t, "long reasoning" ETHINK "Final. Question: x" EOS,
            &(expect){.reasoning = "long reasoning", .content = "Final. ", .finish = "stop", .stop_reason = "Question:"});
}

/* stop_token_ids end generation in every state (§6.1); EOS in content */
static void test_stop_token_ids(void) {
    pcfg t = {.thinking = 1, .stop_token_ids = {6 /* USER */}, .n_stop_ids = 1};
    run_all("s6_1_stop_token_in_reasoning", &t, "abc" USER "def" EOS,
            &(expect){.reasoning = "abc", .finish = "stop"});
}

/* min_tokens: a stop completing before min_tokens tokens is not checked */
static void feed_pieces(dsv4_outparse *p, const char *const *pieces, int n) {
    dsv4_err err = {0};
    for (int i = 0; i < n && !dsv4_outparse_finished(p); i++)
        CHECK_EQ_INT(dsv4_outparse_push_piece(p, -1, pieces[i], strlen(pieces[i]), 0, NULL, &err), DSV4_OK);
    if (!dsv4_outparse_finished(p)) dsv4_outparse_finish(p, DSV4_END_LENGTH, &err);
}

static void test_min_tokens(void) {
    const char *stops[] = {"STOP"};
    const char *pieces[] = {"ab", "STOP", "cd", "STOP", "ef"};
    dsv4_err err = {0};
    dsv4_outparse_config cfg = {.stops = stops, .n_stops = 1, .min_tokens = 3};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, NULL, &err);
    feed_pieces(p, pieces, 5);
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    CHECK_STR(r->content, "abSTOPcd");
    CHECK_STR(r->finish_reason, "stop");
    CHECK_EQ_INT(r->completion_tokens, 4);
    dsv4_outparse_free(p);
    /* a match spanning into token min_tokens-1 counts */
    const char *span[] = {"xST", "OPy"};
    dsv4_outparse_config c2 = {.stops = stops, .n_stops = 1, .min_tokens = 2};
    p = dsv4_outparse_create(&c2, NULL, &err);
    feed_pieces(p, span, 2);
    r = dsv4_outparse_get_result(p);
    CHECK_STR(r->content, "x");
    CHECK_STR(r->finish_reason, "stop");
    dsv4_outparse_free(p);
}

/* §3.6 raw completions: no reasoning/tool parsing, <think>/</think>/DSML
 * verbatim, BOS/EOS never; the guard arms when the prompt ends with <think>. */
static void test_raw_completions(void) {
    pcfg g = {.raw = 1, .thinking = 1, .stops = {"Question:"}, .n_stops = 1};
    run_all("s3_6_raw_guard_until_think_close", &g, "Q Question: x" ETHINK "A. Question: b" EOS,
            &(expect){.content = "Q Question: x</think>A. ", .suppressed = 1, .finish = "stop", .stop_reason = "Question:"});
    pcfg r = {.raw = 1, .stops = {"Question:"}, .n_stops = 1};
    run_all("s3_6_raw_stops_from_first_char", &r, BOS "Q Question: x" ETHINK "y" EOS,
            &(expect){.content = "Q ", .finish = "stop", .stop_reason = "Question:"});
    pcfg t = {.raw = 1, .tools_enabled = 1};
    run_all("s3_6_raw_dsml_verbatim", &t, "x" OPEN INV("bash") PAR("command", "true") "ls" EPAR EINV CLOSE EOS,
            &(expect){.content = "x\n\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
                                 "invoke name=\"bash\">\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
                                 "parameter name=\"command\" string=\"true\">ls</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
                                 "parameter>\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "invoke>\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
                                 "tool_calls>",
                      .finish = "stop"});
}

/* ---- item 7 fuzz: random outputs mixing text, specials and DSML ---- */
static void gen_random(uint64_t *rng, sb *out) {
    static const char *const parts[] = {
        "hello", " ", "\n", "\n\n", "<", ">", "|", "｜", "世界", "🙂", "e\xCC\x81", "2>&1", "\"", "\\", "Question:",
        "STOP", DSML, ETHINK, BTHINK, BOS, USER, OPEN, CLOSE, INV("bash"), INV("get_weather"), EINV,
        PAR("command", "true"), PAR("days", "false"), PAR("tags", "false"), EPAR, "</", "<" DSML, "[1, 2]", "42",
        "tool_calls>", "|DSML|", "invoke", "\xE2\x80\x96",
    };
    int n = 1 + (int)(rng_next(rng) % 40);
    for (int i = 0; i < n; i++) {
        const char *p = parts[rng_next(rng) % (sizeof parts / sizeof *parts)];
        sb_put(out, p, strlen(p));
    }
    /* half of them a well-formed call */
    if (rng_next(rng) % 2) {
        const char *call = OPEN INV("bash") PAR("command", "true") "ls 2>&1" EPAR EINV CLOSE;
        sb_put(out, call, strlen(call));
    }
    if (rng_next(rng) % 3) sb_put(out, EOS, 1);
}

static void test_item7_fuzz(void) {
    uint64_t rng = 7;
    int cases = 0, bad = 0, differ = 0;
    for (int i = 0; i < 600; i++) {
        sb c = {0};
        gen_random(&rng, &c);
        pcfg cfg = {.thinking = (int)(rng_next(&rng) % 2), .tools_enabled = (int)(rng_next(&rng) % 2),
                    .tools_json = TOOLS, .stops = {"Question:", "STOP"}, .n_stops = (int)(rng_next(&rng) % 3),
                    .raw = rng_next(&rng) % 4 == 0};
        outcome ref, o;
        run(&cfg, c.s, MODE_WHOLE, 0, 1, 0, &ref, "fuzz/whole");
        bad += ref.violations != 0;
        for (uint64_t seed = 1; seed <= 3; seed++) {
            run(&cfg, c.s, MODE_RANDOM, 0, seed * 1000 + (uint64_t)i, 0, &o, "fuzz/random");
            bad += o.violations != 0;
            if (!same_outcome(&ref, &o)) {
                differ++;
                if (differ < 4) fprintf(stderr, "fuzz case %d differs between splits\n", i);
            }
            outcome_free(&o);
        }
        run(&cfg, c.s, MODE_BYTES, 0, 1, 0, &o, "fuzz/bytes");
        bad += o.violations != 0;
        differ += !same_outcome(&ref, &o);
        outcome_free(&o);
        outcome_free(&ref);
        free(c.s);
        cases++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(differ, 0);
    CHECK_EQ_INT(cases, 600);
}

int main(void) {
    test_item3_effort_none_thinking_true();
    test_item5_stop_in_reasoning();
    test_item6_stop_earliest_match();
    test_item6_truncation_index();
    test_item7_no_special_text();
    test_item8_tool_call_streaming();
    test_item9_tool_call_truncated();
    test_item12_tool_choice_none();
    test_item13_json_object_thinking();
    test_think_never_arrives();
    test_stop_token_ids();
    test_raw_completions();
    test_min_tokens();
    test_item7_fuzz();
    return TEST_REPORT();
}
