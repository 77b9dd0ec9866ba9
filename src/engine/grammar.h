/*
 * Constrained decoding (spec/SERVING.md §3.3 `response_format`, `tool_choice`;
 * §4.6 "Interaction with structured output and tools").
 *
 * A grammar is a byte-level matcher: a JSON pushdown automaton whose value
 * nodes come from a JSON-Schema subset (grammar_compile.c), or the DSML
 * tool-call block of §1.7 whose parameter values are such JSON values. The
 * matcher state is a small value (a stack of frames, grammar_match.c), so the
 * token mask (grammar_vocab.c) walks a byte trie of the vocabulary copying the
 * state once per trie edge: a step costs one matcher byte per distinct token
 * prefix the grammar still allows, not vocab x token length.
 *
 * Why our own and not xgrammar/llguidance (what vLLM uses): those are C++/Rust
 * with their own tokenizer plumbing; the founders' rules keep the core C11.
 *
 * Schema subset (anything else is refused with the keyword named, never
 * silently ignored): type (string or array of object, array, string, number,
 * integer, boolean, null), properties, required, additionalProperties (bool or
 * a schema), items, minItems, maxItems, minLength, maxLength, enum, const,
 * anyOf / oneOf whose branches start with different bytes (e.g. string | null,
 * but not two objects), title / description / default / examples / $schema /
 * strict (annotations, ignored).
 *
 * Whitespace between JSON tokens is limited to DSV4_GRAMMAR_MAX_WS bytes in a
 * row, numbers to about DSV4_GRAMMAR_MAX_NUM bytes and nesting to
 * DSV4_GRAMMAR_MAX_DEPTH frames, so the model cannot loop on blanks forever.
 * After the value (or the DSML block) is complete, only EOS is allowed.
 */
#ifndef DSV4_ENGINE_GRAMMAR_H
#define DSV4_ENGINE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dsv4/common.h"
#include "text/tokenizer.h"

#define DSV4_GRAMMAR_MAX_DEPTH 32
#define DSV4_GRAMMAR_MAX_WS 16
#define DSV4_GRAMMAR_MAX_NUM 24

typedef struct dsv4_grammar dsv4_grammar;

/* One frame of the matcher stack (fields are per frame kind, grammar_match.c). */
typedef struct dsv4_gframe {
    uint8_t kind, phase, sub, flags;
    int16_t c;
    uint16_t d;
    int32_t node;
    uint32_t a;
    uint64_t b;
} dsv4_gframe;

/* Matcher state: a plain value, copy it with memcpy (only the first `depth`
 * frames matter). */
typedef struct dsv4_grammar_state {
    int32_t depth;
    int32_t ws; /* whitespace bytes in a row */
    dsv4_gframe f[DSV4_GRAMMAR_MAX_DEPTH];
} dsv4_grammar_state;

/*
 * dsv4_grammar_from_schema — compile a JSON Schema (cJSON object, not kept).
 * schema NULL = response_format json_object: any JSON object.
 * Errors: DSV4_EINVAL with a message naming the JSON path and keyword, e.g.
 * "schema.properties.age: keyword \"minimum\" is not supported"; DSV4_ENOMEM.
 */
int dsv4_grammar_from_schema(const cJSON *schema, dsv4_grammar **out, dsv4_err *err);

/*
 * dsv4_grammar_for_tools — the DSML tool-call block (SERVING.md §1.7) for
 * tool_choice "required" (only NULL: one or more invokes of any tool in
 * `tools`, the request's OpenAI tools array) or a named function (only = the
 * name: exactly one invoke of it). Each invoke's parameters follow that tool's
 * `parameters` schema: names from `properties`, every `required` one present,
 * each at most once; values string="true" raw text (without '<') for plain
 * string parameters, or string="false" JSON matching the property schema.
 * Emitted form: "\n\n<｜DSML｜tool_calls>\n" INVOKE ("\n" INVOKE)*
 * "\n</｜DSML｜tool_calls>". Errors: DSV4_EINVAL naming tools[i] and the
 * problem (unknown `only` name, unsupported schema keyword, ...).
 */
int dsv4_grammar_for_tools(const cJSON *tools, const char *only, dsv4_grammar **out, dsv4_err *err);

void dsv4_grammar_free(dsv4_grammar *g);

/* Whitespace bytes allowed in a row between JSON tokens (default
 * DSV4_GRAMMAR_MAX_WS; 0 = compact JSON only, vLLM's
 * structured_outputs.disable_any_whitespace). Clamped to [0, 255]. Call
 * before any state is initialised. */
void dsv4_grammar_set_max_ws(dsv4_grammar *g, int max_ws);

/* Start state (before the first byte). */
void dsv4_grammar_init(const dsv4_grammar *g, dsv4_grammar_state *s);

/* Feed one byte; 1 = accepted (s advanced), 0 = rejected (s unchanged). */
int dsv4_grammar_byte(const dsv4_grammar *g, dsv4_grammar_state *s, uint8_t byte);

/* Feed n bytes; 1 = all accepted, 0 = one was rejected (s unchanged). */
int dsv4_grammar_bytes(const dsv4_grammar *g, dsv4_grammar_state *s, const void *bytes, size_t n);

/* 1 when the output may end here (EOS allowed). */
int dsv4_grammar_is_complete(const dsv4_grammar *g, const dsv4_grammar_state *s);

/* 1 when no further byte is accepted (the value / block is closed). */
int dsv4_grammar_is_closed(const dsv4_grammar *g, const dsv4_grammar_state *s);

/*
 * Symbols: added tokens the grammars must see as one unit. Symbol i is the
 * byte DSV4_GRAMMAR_SYM(i) (0xFF - i, never part of well-formed UTF-8, so no
 * ordinary token can spell it); the vocabulary maps extra[i] to it. The DSML
 * grammar writes ｜DSML｜ as symbol 0, so the marker is always the special
 * token (128825), as the model was trained, never a byte-by-byte spelling.
 */
#define DSV4_GRAMMAR_SYM(i) (0xFF - (i))
#define DSV4_GRAMMAR_MAX_SYM 8
#define DSV4_GRAMMAR_SYM_DSML "\xff"

/*
 * The vocabulary side: a byte trie of every token's decoded bytes
 * (dsv4_tokenizer_token_bytes). Added tokens (BOS/EOS, <think>, role
 * markers, ...) are never allowed except extra[0..n_extra) (n_extra <=
 * DSV4_GRAMMAR_MAX_SYM), which stand for the symbol bytes above (extra[0]
 * must be ｜DSML｜ for the DSML grammar), and EOS, which is allowed exactly
 * when the grammar is complete. Tokens containing a byte >= 0xF8 are never
 * allowed (they cannot be part of valid UTF-8 text). vocab = the model's
 * logits width (ids >= the tokenizer's size are never allowed).
 * Built once per server (immutable afterwards; thread-safe to share).
 */
typedef struct dsv4_gvocab dsv4_gvocab;

int dsv4_gvocab_create(const dsv4_tokenizer *tok, int vocab, int32_t eos_id, const int32_t *extra,
                       int n_extra, dsv4_gvocab **out, dsv4_err *err);
void dsv4_gvocab_free(dsv4_gvocab *v);
int dsv4_gvocab_size(const dsv4_gvocab *v);    /* vocab passed at create */
int32_t dsv4_gvocab_eos(const dsv4_gvocab *v); /* eos_id passed at create */

/*
 * dsv4_gvocab_mask — allowed [ceil(vocab/32)] uint32 words, bit i%32 of word
 * i/32 set when token i may come next from state s. Returns the number of
 * allowed ids (>= 1 for any state reached by accepted tokens: the grammar
 * never dead-ends). scratch: dsv4_gvocab_scratch_bytes(v) bytes.
 */
size_t dsv4_gvocab_scratch_bytes(const dsv4_gvocab *v);
int dsv4_gvocab_mask(const dsv4_gvocab *v, const dsv4_grammar *g, const dsv4_grammar_state *s,
                     uint32_t *allowed, void *scratch);

/* Advance s by token id's bytes: 1 = accepted, 0 = not allowed (s unchanged).
 * EOS is "accepted" (s unchanged) exactly when s is complete. */
int dsv4_gvocab_accept(const dsv4_gvocab *v, const dsv4_grammar *g, dsv4_grammar_state *s, int32_t id);

#endif
