/* Internals shared by service.c, service_params.c and service_job.c. */
#ifndef DSV4_SERVER_SERVICE_INTERNAL_H
#define DSV4_SERVER_SERVICE_INTERNAL_H

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/model_runner.h"
#include "server/service.h"
#include "text/detok.h"
#include "text/outparse.h"
#include "text/tokenizer.h"

#define DSV4_MAX_STOPS 16
#define DSV4_MAX_STOP_IDS 64

struct dsv4_service {
    char model_name[256];
    dsv4_tokenizer *tok;
    dsv4_detok_vocab vocab_view;
    dsv4_encoder_config enc;
    cJSON *default_kwargs; /* --default-chat-template-kwargs */
    int stop_in_reasoning;
    dsv4_model_runner *mr;
    struct dsv4_tp_runner *tp; /* instead of mr under --tensor-parallel-size > 1 */
    struct dsv4_multinode *mn; /* --nnodes > 1 on node 0: mr is rank 0's slice, driven as step-plan leader */
    dsv4_engine *engine;
    dsv4_metrics *metrics;
    int32_t eos_id;
    int vocab;
    int64_t max_model_len;
    dsv4_gvocab *gvocab;   /* token trie for constrained decoding (engine/grammar.h) */
    int32_t think_end;     /* </think>: the constraint arms after it */
    /* engine counters at the end of warm-up: /metrics reports the counters
     * minus these, so warm-up tokens and steps never show (§8.5, §3.9) */
    dsv4_engine_stats warm_base;
};

/*
 * A token id given in a request (`prompt` ids, `stop_token_ids`, /detokenize
 * `tokens`): nonzero when it is a JSON number that is an integer in
 * [0, vocab). 1.5 is refused rather than truncated to 1, as vLLM's
 * `list[int]` validation does (SERVING.md §3.6).
 */
int dsv4_service_is_token_id(const cJSON *it, int vocab);

/* Everything taken from one request body before it is submitted. */
typedef struct dsv4_req_params {
    int stream, include_usage, include_reasoning;
    int continuous_usage;        /* stream_options.continuous_usage_stats (vLLM): usage in every chunk */
    int skip_special;            /* skip_special_tokens, default 1 (vLLM; §3.6, §4.5) */
    int max_tokens_given;
    dsv4_gen_params gen;
    const char *stops[DSV4_MAX_STOPS];
    int n_stops;
    int32_t stop_ids[DSV4_MAX_STOP_IDS];
    int n_stop_ids;
    int include_stop_str;
    int echo;                    /* /v1/completions */
    int n;                       /* choices, 1..8 (§3.3) */
    int logprobs, top_logprobs;  /* chat logprobs/top_logprobs; completions logprobs=N -> 1, N */
    int prompt_logprobs;         /* completions `prompt_logprobs` (vLLM): alternatives, -1 = not asked */
    int32_t *bias_ids;           /* logit_bias, owned */
    float *bias_vals;
    dsv4_grammar *grammar;       /* response_format / tool_choice constraint, owned (NULL = none) */
} dsv4_req_params;

/* Longest prompt whose log-probabilities are returned (echo + logprobs,
 * prompt_logprobs): the response lists every prompt token, so this bounds
 * its size (~10 MB of JSON) and the per-token records (~170 B each). The
 * logits buffer is bounded separately (DSV4_PROMPT_LOGPROB_CHUNK rows). */
#define DSV4_MAX_PROMPT_LOGPROB_TOKENS 32768

/*
 * Read the sampling/limit/stream fields shared by both endpoints
 * (SERVING.md §3.3, §3.6). Errors fill *out with a 400 naming the field and
 * return nonzero. p->bias_* must be freed with dsv4_req_params_free.
 */
int dsv4_req_params_parse(dsv4_service *s, const cJSON *req, int chat, dsv4_req_params *p, dsv4_reply *out);
void dsv4_req_params_free(dsv4_req_params *p);

/*
 * The chat fields that constrain the output (SERVING.md §3.3, §4.6):
 * tool_choice ("auto" | "none" | "required" | {"type":"function",
 * "function":{"name":...}}) and response_format ({"type":"text" |
 * "json_object" | "json_schema", "json_schema":{"name","schema","strict"}}),
 * and vLLM's extra `structured_outputs` {"json": schema,
 * "disable_any_whitespace": bool}. Sets p->grammar for required / named / json_object / json_schema. Errors
 * (a 400 in *out naming the field and, for schemas, the keyword): unknown
 * values, missing or unknown function names, invalid or unsupported schemas,
 * both a response_format and a required/named tool_choice.
 */
int dsv4_req_constraint_parse(dsv4_service *s, const cJSON *req, int chat, dsv4_req_params *p, dsv4_reply *out);

/*
 * Submit prompt ids with params and a parser configured by pc, then answer:
 * a JSON body (non-streaming, waits for the end) or a streaming reply.
 * prompt_text (may be NULL) is echoed by /v1/completions when p->echo.
 */
void dsv4_service_run_job(dsv4_service *s, int chat, const int32_t *ids, int n_ids, dsv4_req_params *p,
                          const dsv4_outparse_config *pc, const char *prompt_text, dsv4_reply *out);

/*
 * Logprob objects (service_logprobs.c, SERVING.md §3.3, §3.6) for records
 * lp [n]; top = alternatives to list per token (the request's top_logprobs /
 * legacy logprobs). Chat: {"content": [...]}. Completions (legacy): {tokens,
 * token_logprobs, top_logprobs, text_offset}; *text_offset is the character
 * offset of the first token in the choice's text and is advanced past them;
 * with skip_special, tokens flagged special (BOS, EOS, place-holders) add no
 * characters, as the returned text does not hold them.
 */
cJSON *dsv4_chat_logprobs_json(dsv4_service *s, const dsv4_token_logprob *lp, int n, int top);
cJSON *dsv4_completion_logprobs_json(dsv4_service *s, const dsv4_token_logprob *lp, int n, int top,
                                     int skip_special, long *text_offset);
/* Characters (code points) of a UTF-8 string; 0 for NULL. */
long dsv4_text_chars(const char *str);

#endif
