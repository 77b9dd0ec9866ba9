/*
 * text/encoder.h — DeepSeek-V4 prompt encoder (spec/SERVING.md §1).
 *
 * Renders OpenAI-style chat messages into the exact prompt string the
 * checkpoint's own Python encoder (encoding/encoding_dsv4.py) produces, after
 * the server-layer rules of §1.3 (normalisation), §1.6 (tools placement,
 * vLLM 0.33 wrapper), §1.9 (response_format) and §1.11 (anchors).
 * Byte-identity is proven by tests/unit/test_encoder_goldens.c against
 * tests/fixtures/encoder/goldens.jsonl (tools/gen_encoder_goldens.py).
 *
 * Why segments: the prompt is returned as one string plus a list of segments
 * saying who wrote each byte. SERVING.md §1.2 "Decision": special-token text
 * emitted by the encoder becomes special ids, but special-token text inside
 * client content (user/system/tool text, tool names and arguments, schemas,
 * earlier assistant text) must be tokenized as ordinary text, so a pasted
 * "<｜Assistant｜>" cannot forge a role marker. The tokenizer therefore:
 *   - maps each DSV4_SEG_SPECIAL segment to its single special id;
 *   - concatenates every maximal run of consecutive MARKUP / CONTENT
 *     segments and encodes that run as ordinary text (no special-token
 *     matching) in ONE call, so BPE pre-tokenization across a markup/content
 *     boundary is the same as on the whole string.
 * For vLLM byte-for-byte parity (--special-tokens-in-content) encode the whole
 * text with special tokens recognised everywhere instead.
 */
#ifndef DSV4_TEXT_ENCODER_H
#define DSV4_TEXT_ENCODER_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "dsv4/common.h"
#include "text/encoder_json.h"
#include "text/thinking.h"
#include "text/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Special-token strings the encoder emits (§1.1; UTF-8, full-width bars). */
#define DSV4_TOK_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DSV4_TOK_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DSV4_TOK_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DSV4_TOK_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DSV4_TOK_REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"
#define DSV4_TOK_THINK "<think>"
#define DSV4_TOK_END_THINK "</think>"
#define DSV4_TOK_DSML "\xef\xbd\x9c" "DSML\xef\xbd\x9c"

typedef enum dsv4_seg_kind {
    DSV4_SEG_SPECIAL = 0, /* exactly one special-token string (DSV4_TOK_*)        */
    DSV4_SEG_MARKUP,      /* encoder-authored ordinary text (templates, tags)     */
    DSV4_SEG_CONTENT,     /* client-supplied text: never special-token matched    */
} dsv4_seg_kind;

typedef struct dsv4_prompt_seg {
    dsv4_seg_kind kind;
    size_t off, len;      /* byte range in dsv4_prompt.text */
} dsv4_prompt_seg;

/* A rendered prompt: NUL-terminated UTF-8 text and its segments, in order,
 * covering the text exactly. Free with dsv4_prompt_free. */
typedef struct dsv4_prompt {
    char *text;
    size_t len;
    dsv4_prompt_seg *segs;
    size_t nsegs, cap_segs, cap_text;
} dsv4_prompt;

/* Rendering options: the resolved thinking pair plus request fields. */
typedef struct dsv4_encode_opts {
    dsv4_effort_profile profile;  /* PREVIEW or 0731 (resolved; see detect_profile) */
    int thinking;                 /* from dsv4_thinking_resolve                     */
    dsv4_effort effort;           /* from dsv4_thinking_resolve (ignored in chat)   */
    int drop_thinking;            /* from dsv4_thinking_resolve                     */
    const cJSON *tools;           /* request "tools" array or NULL                  */
    int tool_choice_none;         /* tool_choice == "none": tools not rendered      */
    const cJSON *response_format; /* request "response_format" or NULL              */
    int render_response_format;   /* default 1 (§1.9)                               */
    int add_generation_prompt;    /* default 1                                      */
    int continue_final_message;   /* default 0 (also set by "prefix": true)         */
    int developer_as_system;      /* --developer-as-system, default 0               */
    int tool_schema_client_order; /* --tool-schema-order client; default 0 = vLLM   */
    /* Hardening, default off for parity (§1.7, §1.8): write the '<' of a
     * literal "</｜DSML｜parameter>" inside a string tool-argument value, and
     * of a literal "</tool_result>" inside a tool result, as "&lt;" so data
     * cannot close the tag (ds4 behaviour). */
    int escape_dsml_param_terminator;
    int escape_tool_result_terminator;
    /* Python's exact text for the number nodes of the request body (so a
     * schema's 1.0 stays "1.0"): build with dsv4_json_numbers_build(body,
     * raw_text, len) right after parsing the body. NULL: numbers print from
     * the double (integral values as integers). Arguments given as JSON
     * strings are always exact. */
    const dsv4_json_numbers *numbers;
} dsv4_encode_opts;

/* Defaults of §1.4: agp 1, continue 0, render_response_format 1, rest 0. */
void dsv4_encode_opts_init(dsv4_encode_opts *o, const dsv4_thinking *th, dsv4_effort_profile profile);

/*
 * dsv4_encode_opts_from_request — fill the request-field part of *o from a
 * chat request body (tools, tool_choice, response_format,
 * add_generation_prompt, continue_final_message); *o must be initialised.
 * Pointers borrow from request. Errors (DSV4_EINVAL, 400) name the field:
 * tools not an array, add_generation_prompt not a boolean, ...
 */
int dsv4_encode_opts_from_request(dsv4_encode_opts *o, const cJSON *request, dsv4_err *err);

/*
 * dsv4_encoder_render — render messages (a cJSON array of OpenAI chat
 * messages, as received) into *out (zero-initialise it; free with
 * dsv4_prompt_free). spec/SERVING.md §1.3-§1.11.
 *
 * Errors (DSV4_EINVAL = HTTP 400; message starts with the field path, e.g.
 * "messages[2].tool_calls[0].function.arguments: ..."): empty or non-array
 * messages; unknown role; content not string/null/array of text parts
 * (image/audio/file parts rejected on text checkpoints); developer message
 * with empty content (the encoder refuses it); tool call without a string
 * function.name; arguments string that parses to non-object JSON or
 * arguments of another type; continue_final_message with a last message that
 * is not assistant; malformed tools. On error *out is left empty.
 */
int dsv4_encoder_render(const cJSON *messages, const dsv4_encode_opts *o, dsv4_prompt *out, dsv4_err *err);

void dsv4_prompt_free(dsv4_prompt *p);

/*
 * dsv4_encoder_detect_profile — decide the reasoning-effort profile of a
 * checkpoint (spec/SERVING.md §0.1). Reads <ckpt_dir>/encoding/encoding_dsv4.py:
 * contains "REASONING_EFFORT_PROMPTS" -> 0731; else "REASONING_EFFORT_MAX" ->
 * preview. override (--reasoning-effort-profile) PREVIEW/0731 wins (a
 * mismatch with the file is logged); AUTO means detect.
 * Errors: file absent and override AUTO -> DSV4_EIO ("refusing to start"
 * message: fail closed, MiaAI-Lab #107); file present, AUTO, neither
 * constant found -> DSV4_EFORMAT.
 */
int dsv4_encoder_detect_profile(const char *ckpt_dir, dsv4_effort_profile override,
                                dsv4_effort_profile *out, dsv4_err *err);

/*
 * dsv4_prompt_tokenize — token ids of a rendered prompt, APPENDED to *out
 * (spec/SERVING.md §1.2). No BOS is added (the prompt starts with it).
 *   special_in_content = 0 (default, hardened): SPECIAL segments become their
 *     single id; each maximal run of MARKUP/CONTENT segments is encoded as
 *     ordinary text (allow_special = 0) in one call.
 *   special_in_content = 1 (--special-tokens-in-content, vLLM parity): the
 *     whole text is encoded with every added-token string recognised.
 * Errors: a SPECIAL segment that is not a single added token of this
 * tokenizer -> DSV4_EFORMAT naming the token (the server checks the markers
 * at startup, §1.1); tokenizer errors are passed through.
 */
int dsv4_prompt_tokenize(const dsv4_prompt *p, const dsv4_tokenizer *tok, int special_in_content,
                         dsv4_tokvec *out, dsv4_err *err);

/*
 * dsv4_text_prompt_tokenize — token ids of a raw text prompt (/v1/completions
 * `prompt`, /tokenize `prompt`, `dsv4 tokenize`), APPENDED to *out
 * (spec/SERVING.md §3.6, §3.7). add_special (vLLM add_special_tokens, default
 * true there): BOS is put first unless the text already starts with the BOS
 * string and allow_special recognises it (**Deviation** §3.6: vLLM's
 * tokenizer would double it). allow_special as in dsv4_tokenizer_encode.
 * A tokenizer without the BOS token gets none. Errors: those of
 * dsv4_tokenizer_encode; DSV4_ENOMEM.
 */
int dsv4_text_prompt_tokenize(const dsv4_tokenizer *tok, const char *text, size_t len, int allow_special,
                              int add_special, dsv4_tokvec *out, dsv4_err *err);

/* Server-side encoder settings (CLI flags) for dsv4_encoder_build_chat. */
typedef struct dsv4_encoder_config {
    dsv4_thinking_defaults thinking;  /* profile + --default-thinking etc.   */
    int special_tokens_in_content;    /* --special-tokens-in-content (vLLM)  */
    int developer_as_system;          /* --developer-as-system               */
    int tool_schema_client_order;     /* --tool-schema-order client          */
    int render_response_format;       /* default 1 (--render-response-format)*/
    int escape_dsml_param_terminator; /* hardening, default 0                */
    int escape_tool_result_terminator;/* hardening, default 0                */
} dsv4_encoder_config;

/* §0.3 defaults: thinking off, effort high, drop on, response_format rendered, rest off. */
void dsv4_encoder_config_init(dsv4_encoder_config *cfg, dsv4_effort_profile profile);

/*
 * dsv4_encoder_build_chat — the whole chat-request path from a parsed body to
 * prompt ids, in the one correct order (spec/SERVING.md §1-§2):
 * dsv4_thinking_resolve -> options from the body -> number table from `raw`
 * (the exact text `body` was parsed from; NULL/0 to skip) -> render
 * body.messages -> tokenize (ids appended to *ids; tok may be NULL to skip).
 * *th receives the resolved pair every other component must use; *prompt
 * must be zero-initialised and is freed by the caller (dsv4_prompt_free).
 * Errors: those of the steps, DSV4_EINVAL ones being HTTP 400s that name the
 * field; on error *prompt is empty.
 */
int dsv4_encoder_build_chat(const cJSON *body, const char *raw, size_t raw_len, const dsv4_encoder_config *cfg,
                            const dsv4_tokenizer *tok, dsv4_thinking *th, dsv4_prompt *prompt, dsv4_tokvec *ids,
                            dsv4_err *err);

/* Literal effort prefix for a resolved level on a profile ("" when none). */
const char *dsv4_encoder_effort_prefix(dsv4_effort_profile p, dsv4_effort e);

#ifdef __cplusplus
}
#endif
#endif
