/*
 * The engine: requests in, tokens out (DESIGN.md "Data flow" step 2).
 *
 * One engine thread owns all mutable state; HTTP threads only submit, poll
 * and cancel (all three lock the engine briefly). Each step the scheduler
 * (spec/DSPARK.md §4.7, spec/SERVING.md §8.6):
 *   1. gives every running request in decode its rows first — one row, or
 *      k+1 verify rows when speculating — so decode never starves;
 *   2. fills the rest of max_num_batched_tokens with prefill chunks, oldest
 *      request first (chunked prefill);
 *   3. admits waiting requests while a slot is free (max_num_seqs).
 * Then it runs the forward, samples or verifies, applies stops, proposes the
 * next drafts, and wakes the requests' consumers.
 *
 * Per-request state lives in the runner under a stable slot (never a batch
 * row), and all of it is position-addressed: rejected speculative rows are
 * overwritten by the next step (spec/DSPARK.md §4.5).
 */
#ifndef DSV4_ENGINE_H
#define DSV4_ENGINE_H

#include <stdint.h>

#include "dsv4/common.h"
#include "engine/runner.h"
#include "engine/sampler.h"

#define DSV4_MAX_SPEC_K 16

typedef struct dsv4_engine_opts {
    int max_num_seqs;           /* running requests (slots in use), <= runner.n_slots */
    int max_num_batched_tokens; /* rows per step, >= max_num_seqs * (k+1) is advisable */
    int64_t max_model_len;      /* prompt + output tokens, per request */
    int spec_k;                 /* drafted tokens per verify step (the maximum); 0 = no speculation */
    int32_t eos_id;             /* end of sentence (1 for DeepSeek-V4) */
    /* k by batch size (vLLM num_speculative_tokens_per_batch_size, spec/DSPARK.md
     * §5.3): entry i = {lo, hi, k}: with lo <= running requests <= hi, draft k
     * (0 = no drafts). Batch sizes no entry covers use spec_k. */
    int k_schedule[8][3];
    int n_k_schedule;
    /* Automatic prefix caching (vLLM --enable-prefix-caching, spec/SERVING.md
     * §8.7); needs runner->reusable and runner->resume, ignored without them.
     * A finished request's slot keeps its state, keyed by its committed
     * tokens, until the slot is needed (LRU); a new request whose prompt
     * shares a prefix with a cached history takes that slot and prefills
     * from the largest position the runner says is exact. When the runner
     * can copy slots and a slot is free, the state at the end of each
     * prompt's prefill is also kept (a copy), so the same prompt or a longer
     * one is a hit even after decoding moved the original slot on. */
    int enable_prefix_caching;
} dsv4_engine_opts;

typedef enum dsv4_finish {
    DSV4_FINISH_NONE = 0,
    DSV4_FINISH_STOP,   /* EOS, a stop token id, or a stop string (on_tokens) */
    DSV4_FINISH_LENGTH, /* max_tokens or the context is full */
    DSV4_FINISH_ABORT,  /* cancelled by the client */
    DSV4_FINISH_ERROR,  /* the forward failed */
} dsv4_finish;

const char *dsv4_finish_name(dsv4_finish f); /* "stop", "length", "abort", "error" */

/*
 * Called on the engine thread after tokens were appended to a request
 * (text-level stop strings, spec/SERVING.md §6, live in the output parser).
 * Return 0 to go on, or 1 to finish with reason STOP keeping only the first
 * *keep of the n new tokens (0 <= *keep <= n).
 */
typedef int (*dsv4_on_tokens_fn)(void *user, const int32_t *tokens, int n, int *keep);

typedef struct dsv4_gen_params {
    dsv4_sampling sampling;
    int max_tokens;          /* >= 1; generated tokens incl. the final EOS */
    int min_tokens;          /* EOS / stop ids ignored before this many tokens */
    int ignore_eos;
    const int32_t *stop_ids; /* stop_token_ids (always active) */
    int n_stop_ids;
    int use_spec;            /* speculate for this request when the engine can */
    int logprobs;            /* nonzero: keep a dsv4_token_logprob per generated token
                              * (dsv4_request_logprobs); off = no extra work per step */
    int top_logprobs;        /* 0..DSV4_MAX_TOP_LOGPROBS alternatives per token (needs logprobs) */
    /* Prompt logprobs (vLLM prompt_logprobs, /v1/completions echo+logprobs):
     * nonzero = keep a record per prompt token from logits of every prompt
     * row (dsv4_request_prompt_logprobs). Such a request is never served from
     * the prefix cache (every row must be computed) and prefills in chunks of
     * at most DSV4_PROMPT_LOGPROB_CHUNK rows (bounds the logits buffer). */
    int prompt_logprobs;
    int prompt_top_logprobs; /* 0..DSV4_MAX_TOP_LOGPROBS alternatives per prompt token */
    /* nonzero: the prefix cache (enable_prefix_caching) neither serves this
     * request nor keeps its state (no snapshot, its slot emptied when it
     * ends). For the server's warm-up, whose BOS would otherwise show as a
     * cached token of the first client request (SERVING.md §3.3, §8.5). */
    int no_prefix_cache;
    dsv4_on_tokens_fn on_tokens;
    void *user;
    /* Constrained decoding (spec/SERVING.md §4.6, src/engine/constrain.h):
     * when set, called on the engine thread before each of this request's
     * tokens is sampled, with every token generated so far (out [n_out]) and
     * a copy of the raw logits row [vocab] to mask in place (-inf = not
     * allowed). Logprobs stay those of the raw row (§7.2). A request with a
     * logits_proc never speculates (k = 0): drafts would need the mask at
     * every draft position, and one row per step is simple and exact. */
    void (*logits_proc)(void *proc_user, const int32_t *out, int n_out, float *logits, int vocab);
    void *proc_user;
} dsv4_gen_params;

void dsv4_gen_params_default(dsv4_gen_params *p);

typedef struct dsv4_engine dsv4_engine;
typedef struct dsv4_request dsv4_request;

/*
 * Per-engine counters (spec/DSPARK.md §5.7, SERVING.md §3.9), declared
 * through one list so that dsv4_engine_stats_diff covers every field by
 * construction: C = a cumulative counter (differenced), A = an array of
 * counters, G = a gauge (a current value, taken from the newer snapshot).
 * A new field is added to this list, as one of the three, or not at all.
 */
#define DSV4_ENGINE_STATS_FIELDS(C, A, G)                                                         \
    C(uint64_t, steps)                                                                          \
    C(uint64_t, prompt_tokens)                                                                  \
    C(uint64_t, generation_tokens)                                                              \
    C(uint64_t, spec_drafts)                                                                    \
    C(uint64_t, spec_draft_tokens)                                                              \
    C(uint64_t, spec_accepted_tokens)                                                           \
    A(uint64_t, spec_accepted_per_pos, DSV4_MAX_SPEC_K)                                         \
    /* request-steps that verified position i (k varies) */                                     \
    A(uint64_t, spec_draft_per_pos, DSV4_MAX_SPEC_K)                                            \
    /* DSPARK.md §5.7 timing: wall seconds in the drafter's propose calls, and in                \
     * the forwards of steps that verified at least one draft */                                \
    C(double, spec_draft_seconds)                                                               \
    C(double, spec_verify_seconds)                                                              \
    /* drafter errors (logged; those steps decode without drafts) */                            \
    C(uint64_t, spec_draft_failures)                                                            \
    /* prefix caching, in tokens (vLLM prefix_cache_queries / _hits): prompt                     \
     * tokens of admitted requests, and the ones whose state was reused */                      \
    C(uint64_t, prefix_queries)                                                                 \
    C(uint64_t, prefix_hits)                                                                    \
    C(uint64_t, prefix_snapshots) /* prompt states copied into a free slot */                   \
    /* requests sent back to waiting for lack of pages (recomputed) */                          \
    C(uint64_t, preemptions)                                                                    \
    /* steps whose tokens were picked from greedy ids computed where the logits                 \
     * are (runner forward_ids, issue 7): no logits row came back to the host */                \
    C(uint64_t, greedy_id_steps)                                                                \
    G(int, running)                                                                             \
    G(int, waiting)                                                                             \
    /* state pool (0 when the runner has none): pages in use by running                         \
     * requests (histories kept for the prefix cache count as free, as in vLLM) */              \
    G(int, kv_pages_total)                                                                      \
    G(int, kv_pages_used)                                                                       \
    G(int, kv_page_tokens)                                                                      \
    G(int64_t, kv_page_bytes)

#define DSV4_STATS_DECL_(t, name) t name;
#define DSV4_STATS_DECL_ARR_(t, name, n) t name[n];
typedef struct dsv4_engine_stats {
    DSV4_ENGINE_STATS_FIELDS(DSV4_STATS_DECL_, DSV4_STATS_DECL_ARR_, DSV4_STATS_DECL_)
} dsv4_engine_stats;

/*
 * dsv4_engine_stats_diff — out = counters of `now` minus those of `base`
 * (every C and A field of DSV4_ENGINE_STATS_FIELDS), gauges as in `now`.
 * For "since warm-up" metrics (src/server/service.c). out may alias either
 * input. No errors.
 */
void dsv4_engine_stats_diff(const dsv4_engine_stats *now, const dsv4_engine_stats *base, dsv4_engine_stats *out);

/*
 * dsv4_engine_create — runner (copied) executes forwards; drafter (copied) may
 * be NULL (no speculation). When the runner has forward_ids, a step whose
 * logit rows are all plain greedy (no logit_bias, penalties, logits_proc or
 * logprobs) asks it for the rows' greedy ids instead of their logits (issue
 * 7; same tokens, 4 bytes a row read back); the environment variable
 * DSV4_DEVICE_ARGMAX=0, read here, keeps every step on full logits. Errors: DSV4_EINVAL naming the option
 * (max_num_seqs > runner slots, spec_k > drafter->max_k or > DSV4_MAX_SPEC_K, ...).
 */
int dsv4_engine_create(const dsv4_engine_opts *opts, const dsv4_runner *runner, const dsv4_drafter *drafter,
                       dsv4_engine **out, dsv4_err *err);
/* Free the engine; outstanding requests are finished with ABORT first.
 * Release every request handle before this: handles do not outlive the engine. */
void dsv4_engine_free(dsv4_engine *e);

/*
 * dsv4_engine_submit — queue a request. prompt [n] token ids (copied), params
 * copied (stop_ids and logit_bias arrays too). Errors (the request is not
 * queued): DSV4_ERANGE when n >= max_model_len, with the OpenAI phrase
 * "maximum context length is" (SERVING.md §3.8); DSV4_EINVAL for bad params
 * or an empty prompt. *out holds one reference for the caller: release it.
 */
int dsv4_engine_submit(dsv4_engine *e, const int32_t *prompt, int n, const dsv4_gen_params *params,
                       dsv4_request **out, dsv4_err *err);

/*
 * dsv4_request_poll — copy up to cap generated tokens not yet read into buf.
 * Blocks up to timeout_ms (<0: forever) when nothing is new and the request is
 * not finished. Returns the number copied; *finish is NONE until every token
 * has been read and the request ended.
 */
int dsv4_request_poll(dsv4_request *r, int32_t *buf, int cap, dsv4_finish *finish, int timeout_ms);

/*
 * dsv4_request_logprobs — copy the log-probability records of generated
 * tokens [first, first + n) (indices count generated tokens from 0, as poll
 * hands them out) into out [n]. Only tokens generated so far are available.
 * Each record is computed from the raw target logits of the row that produced
 * the token (under speculation: the verify row of each accepted draft, and of
 * the correction / bonus token), spec/SERVING.md §3.3, §7.2.
 * Returns the number copied (0 when the request did not ask for logprobs).
 */
int dsv4_request_logprobs(dsv4_request *r, int first, int n, dsv4_token_logprob *out);

/* Rows per prefill step of a request with prompt_logprobs (logits kept: rows x vocab floats). */
#define DSV4_PROMPT_LOGPROB_CHUNK 64

/*
 * dsv4_request_prompt_logprobs — once the request's prefill is complete,
 * copy its prompt records to out [n_prompt]: out[i] (i >= 1) is prompt token
 * i under the raw logits of row i - 1; out[0] (no context) is zeroed. rank
 * (may be NULL) [n_prompt] receives each token's rank under those logits
 * (1 = most likely; vLLM's "rank"; rank[0] = 0). Returns n_prompt, or 0
 * while the prefill runs, when the request did not ask
 * (gen_params.prompt_logprobs) or when cap < n_prompt.
 */
int dsv4_request_prompt_logprobs(dsv4_request *r, dsv4_token_logprob *out, int32_t *rank, int cap);

/* Ask the engine to stop a request; its slot is freed in the next step. */
void dsv4_request_cancel(dsv4_request *r);
/* Drop the caller's reference. */
void dsv4_request_release(dsv4_request *r);
/* Number of prompt tokens and generated tokens so far (for usage). */
void dsv4_request_counts(dsv4_request *r, int *prompt_tokens, int *generated_tokens);
/* Prompt tokens whose state came from the prefix cache (0 before admission or
 * on a miss): usage.prompt_tokens_details.cached_tokens (spec/SERVING.md §3.3). */
int dsv4_request_cached_tokens(dsv4_request *r);

/*
 * dsv4_engine_step — run one scheduling step on the calling thread.
 * Returns the number of requests still waiting or running (0 = idle), or a
 * negative value after an internal error (err filled).
 */
int dsv4_engine_step(dsv4_engine *e, dsv4_err *err);

/* Run steps on a background thread until dsv4_engine_stop / free. */
int dsv4_engine_start(dsv4_engine *e, dsv4_err *err);
void dsv4_engine_stop(dsv4_engine *e);

void dsv4_engine_get_stats(dsv4_engine *e, dsv4_engine_stats *s);

#endif
