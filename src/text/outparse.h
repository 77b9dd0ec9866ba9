/*
 * text/outparse.h — per-request streaming output parser: sampled token ids in,
 * OpenAI deltas {reasoning, content, tool_calls} and a finish state out.
 *
 * Follows spec/SERVING.md §4 (reasoning), §5 (DSML tool calls), §6 (stops),
 * §3.4/§3.5 (response and stream shapes). Pipeline per token:
 *
 *   id -> detok (text.h: whole UTF-8 characters, special tokens as events)
 *      -> reasoning router (§4: thinking starts in reasoning, </think> switches)
 *      -> DSML scanner (§5: withholds opener prefixes, turns blocks into calls,
 *         strips markup and stray markers from text)
 *      -> stop matcher (§6: earliest match, withholds partial matches; fed only
 *         with text where stops are live: never reasoning (unless opted in),
 *         never tool-call markup)
 *      -> deltas (and the non-streaming result, which is by construction the
 *         concatenation of the deltas).
 *
 * Engine use, per request per step (a step may carry several accepted tokens):
 *
 *   dsv4_outparse_feed(p, ids, n, &kept, &err);   // stops early at EOS/stop
 *   deltas = dsv4_outparse_take_deltas(p, &nd);   // stream them
 *   if (dsv4_outparse_finished(p)) ...            // request is done
 *   ... when the engine ends the request itself (max_tokens, context full,
 *   abort): dsv4_outparse_finish(p, DSV4_END_LENGTH), then take the last deltas.
 *   res = dsv4_outparse_get_result(p);               // finish_reason, usage, message
 *
 * Not thread-safe; one instance per request, used by the engine thread.
 */
#ifndef DSV4_TEXT_OUTPARSE_H
#define DSV4_TEXT_OUTPARSE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dsv4/common.h"
#include "text/detok.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-request configuration. Everything is copied at create time. */
typedef struct dsv4_outparse_config {
    /* Resolved mode (SERVING.md §2): nonzero when the prompt ends with <think>.
     * The parser never infers the mode from output text (§4.1). */
    int thinking;
    /* Tool parsing on: the request rendered tools (tools present and
     * tool_choice != "none", §5.1). Off: DSML blocks are stripped (§5.5). */
    int tools_enabled;
    /* The request's `tools` array (OpenAI shape) for schema-typed coercion
     * and the arguments/input repair of §5.2. May be NULL. Duplicated. */
    const cJSON *tools;
    /* Stop strings (§6). Non-empty UTF-8; an empty one is DSV4_EINVAL. */
    const char *const *stops;
    int n_stops;
    int include_stop_str_in_output;
    /* §6.3 opt-out: nonzero = stops are live inside reasoning too
     * (`--stop-in-reasoning active` or request `stop_in_reasoning: true`). */
    int stop_in_reasoning;
    /* stop_token_ids (ids other than EOS that end generation, §6.1). */
    const int32_t *stop_token_ids;
    int n_stop_token_ids;
    /* §4.3 `--unterminated-reasoning-as-content`: at EOS without </think>,
     * the final result reports the reasoning text as content instead
     * (streamed reasoning deltas cannot be taken back). Default 0. */
    int unterminated_reasoning_as_content;
    /* Raw mode for /v1/completions (§3.6): no reasoning split, no tool
     * parsing; all text is content, <think>, </think> and DSML text are
     * output verbatim, BOS/EOS/pad never. With `thinking` set (the raw
     * prompt's last token is <think>) stops are dormant until </think>. */
    int raw;
    /* Raw mode only (§3.6, §4.5; vLLM skip_special_tokens). is_special(ctx,
     * id) says whether id is an added token flagged "special" in
     * tokenizer.json (BOS, EOS, pad, the place-holder tokens; not <think>,
     * </think>, ｜DSML｜ or role markers). With keep_special_text = 0 (the
     * default, skip_special_tokens true) such tokens are dropped from the
     * text; with 1 their text is kept (EOS still ends generation unseen).
     * is_special NULL: only BOS and pad are dropped. */
    int (*is_special)(void *ctx, int32_t id);
    void *special_ctx;
    int keep_special_text;
    /* Tool-call ids: 0 = random from the OS (unguessable, §3.4); nonzero =
     * deterministic ids derived from this seed (tests only). */
    uint64_t id_seed;
    /* min_tokens (§6.2 lists it as unaffected by the guard): a stop string
     * is not checked while fewer than min_tokens tokens have been generated
     * (vLLM semantics: a match completing in token t counts only if
     * t + 1 >= min_tokens). EOS/stop_token_ids are masked by the sampler. */
    int min_tokens;
} dsv4_outparse_config;

/* Kinds of streamed deltas, in the order a client must see them (§3.5). */
typedef enum dsv4_delta_kind {
    DSV4_DELTA_REASONING = 1, /* text for delta.reasoning                           */
    DSV4_DELTA_CONTENT,       /* text for delta.content                             */
    DSV4_DELTA_TOOL_HEADER,   /* new call: tool_index, tool_id, tool_name; args ""   */
    DSV4_DELTA_TOOL_ARGS      /* argument fragment (JSON text) for tool_index        */
} dsv4_delta_kind;

typedef struct dsv4_outparse_delta {
    dsv4_delta_kind kind;
    int tool_index;        /* TOOL_*: 0-based index in this response's tool_calls */
    const char *text;      /* REASONING/CONTENT/TOOL_ARGS: UTF-8, NUL-terminated  */
    size_t len;
    const char *tool_id;   /* TOOL_HEADER: "call_<24 hex>"                         */
    const char *tool_name; /* TOOL_HEADER: function name (raw from the markup)     */
} dsv4_outparse_delta;

/* How generation ended. */
typedef enum dsv4_end_reason {
    DSV4_END_NONE = 0,   /* still running                                    */
    DSV4_END_EOS,        /* <｜end▁of▁sentence｜> generated                   */
    DSV4_END_STOP_STR,   /* a stop string matched                             */
    DSV4_END_STOP_TOKEN, /* a stop_token_ids id was generated                 */
    DSV4_END_LENGTH,     /* engine: max_tokens or context full                */
    DSV4_END_ABORT       /* engine: client gone or engine failure             */
} dsv4_end_reason;

typedef struct dsv4_tool_call {
    char id[32];     /* "call_" + 24 lowercase hex                         */
    char *name;      /* function name                                      */
    char *arguments; /* compact JSON object text (§5.2)                    */
} dsv4_tool_call;

/* The non-streaming view (§3.4). Valid until dsv4_outparse_free. */
typedef struct dsv4_outparse_result {
    const char *reasoning; /* NULL when empty or in chat mode                 */
    size_t reasoning_len;
    const char *content;   /* NULL when empty                                 */
    size_t content_len;
    const dsv4_tool_call *tool_calls; /* complete calls only (§5.2)          */
    int n_tool_calls;
    dsv4_end_reason end;
    const char *finish_reason; /* "stop" "length" "tool_calls" "abort"; NULL while running */
    const char *stop_reason_str;  /* matched stop string, or NULL             */
    int32_t stop_reason_token;    /* matched stop_token_ids id, or -1         */
    /* usage (§3.4): tokens kept (incl. </think>, DSML, EOS; not tokens after a
     * stop match); authoritative even when a stop matched in an earlier step. */
    int completion_tokens;
    int reasoning_tokens;
    /* counters for /metrics (§4.3, §5.2) */
    int reasoning_unterminated;   /* 1 if generation ended inside reasoning */
    int tool_parse_failures;      /* incomplete / malformed calls dropped  */
    int dsml_stripped;            /* markup or markers removed from text   */
    /* appended after the first publication (fields above unchanged): */
    int tool_parse_malformed;     /* of tool_parse_failures: kind="malformed"
                                   * (the rest are kind="unterminated")     */
    int stop_suppressed_in_reasoning; /* 1 if a stop string occurred in text
                                   * where the §6.2 guard kept it dormant  */
} dsv4_outparse_result;

typedef struct dsv4_outparse dsv4_outparse;

/*
 * dsv4_outparse_create — vocab maps ids to bytes (detok.h); may be NULL when
 * only dsv4_outparse_push_piece is used. Errors: DSV4_EINVAL (empty stop
 * string, bad tools), DSV4_ENOMEM. Returns NULL on error.
 */
dsv4_outparse *dsv4_outparse_create(const dsv4_outparse_config *cfg, const dsv4_detok_vocab *vocab,
                                    dsv4_err *err);
void dsv4_outparse_free(dsv4_outparse *p);

/*
 * dsv4_outparse_feed — process the accepted tokens of one step, in order.
 * *n_kept (may be NULL) = how many of ids[0..n) are kept. Processing stops
 * at the first token that ends generation (EOS or a stop_token_ids id: kept;
 * a stop string: kept up to and including the token in which the match
 * completes). Tokens after that are discarded: the engine truncates there and
 * does not count them (§3.4, §6.1). A stop whose text completed in an
 * earlier step but was held back (e.g. a "\n\n" stop deferred to see whether
 * a tool call opens, §6.2) gives *n_kept = 0; result.completion_tokens is
 * the authoritative count. Once finished, further feeds keep 0 tokens.
 * Errors: DSV4_EINVAL (unknown id), DSV4_ENOMEM.
 */
int dsv4_outparse_feed(dsv4_outparse *p, const int32_t *ids, int n, int *n_kept, dsv4_err *err);

/*
 * dsv4_outparse_push_piece — the same for one token given as bytes
 * (special != 0: a special token whose text is bytes) and its id (used only
 * for stop_token_ids and stop_reason; pass -1 if unknown). *ended (may be
 * NULL) is set to 1 when generation ended at or before this token.
 */
int dsv4_outparse_push_piece(dsv4_outparse *p, int32_t id, const char *bytes, size_t len, int special,
                             int *ended, dsv4_err *err);

/*
 * dsv4_outparse_finish — the engine ends generation (DSV4_END_LENGTH or
 * DSV4_END_ABORT). Flushes held-back text (no stop matched, so it is
 * released), drops incomplete tool calls (§5.2). No-op if already finished.
 */
int dsv4_outparse_finish(dsv4_outparse *p, dsv4_end_reason why, dsv4_err *err);

/* Nonzero once generation has ended (by the model, a stop, or finish()). */
int dsv4_outparse_finished(const dsv4_outparse *p);

/*
 * dsv4_outparse_take_deltas — deltas produced since the last take, in stream
 * order, adjacent deltas of one kind merged. The array and its strings stay
 * valid until the next call on p. *n = count (0 when nothing new).
 */
const dsv4_outparse_delta *dsv4_outparse_take_deltas(dsv4_outparse *p, size_t *n);

/* The non-streaming result; finish_reason is NULL until finished. */
const dsv4_outparse_result *dsv4_outparse_get_result(dsv4_outparse *p);

#ifdef __cplusplus
}
#endif
#endif
