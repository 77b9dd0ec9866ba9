/* Request fields -> generation parameters (spec/SERVING.md §3.3, §3.6, §7). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server/service_internal.h"

int dsv4_service_is_token_id(const cJSON *it, int vocab) {
    return cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < vocab &&
           it->valuedouble == floor(it->valuedouble);
}

/* A numeric field: absent -> keep *v; wrong type or out of [lo, hi] ((lo, hi] when lo_open) -> 400 naming
 * the interval the field accepts. */
static int num_field_in(const cJSON *req, const char *name, double lo, int lo_open, double hi, double *v,
                        dsv4_reply *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo || (lo_open && j->valuedouble == lo) ||
        j->valuedouble > hi) {
        dsv4_reply_error(out, 400, name, "`%s` must be a number in %c%g, %g]", name, lo_open ? '(' : '[', lo, hi);
        return 1;
    }
    *v = j->valuedouble;
    return 0;
}

static int num_field(const cJSON *req, const char *name, double lo, double hi, double *v, dsv4_reply *out) {
    return num_field_in(req, name, lo, 0, hi, v, out);
}

static int int_field(const cJSON *req, const char *name, double lo, double hi, long long *v, dsv4_reply *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < lo || j->valuedouble > hi) {
        dsv4_reply_error(out, 400, name, "`%s` must be an integer in [%.0f, %.0f]", name, lo, hi);
        return 1;
    }
    *v = (long long)j->valuedouble;
    return 0;
}

static int bool_field(const cJSON *req, const char *name, int *v, dsv4_reply *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(req, name);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsBool(j)) {
        dsv4_reply_error(out, 400, name, "`%s` must be a boolean", name);
        return 1;
    }
    *v = cJSON_IsTrue(j);
    return 0;
}

void dsv4_req_params_free(dsv4_req_params *p) {
    dsv4_grammar_free(p->grammar);
    p->grammar = NULL;
    free(p->bias_ids);
    free(p->bias_vals);
    p->bias_ids = NULL;
    p->bias_vals = NULL;
}

int dsv4_req_params_parse(dsv4_service *s, const cJSON *req, int chat, dsv4_req_params *p, dsv4_reply *out) {
    memset(p, 0, sizeof *p);
    dsv4_gen_params_default(&p->gen);
    p->include_reasoning = 1;
    dsv4_sampling *sp = &p->gen.sampling;
    double d;
    long long ll;

    if (bool_field(req, "stream", &p->stream, out)) return 1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            dsv4_reply_error(out, 400, "stream_options", "`stream_options` must be an object");
            return 1;
        }
        if (bool_field(so, "include_usage", &p->include_usage, out)) return 1;
        if (bool_field(so, "continuous_usage_stats", &p->continuous_usage, out)) return 1;
    }
    /* skip_special_tokens (vLLM, default true): false keeps the text of added
     * tokens flagged "special" in /v1/completions output (§4.5; chat output
     * never carries special-token text). spaces_between_special_tokens is
     * accepted as vLLM does: its fast detokenizer (tokenizers' DecodeStream,
     * used for DeepSeek's PreTrainedTokenizerFast) ignores it. */
    p->skip_special = 1;
    if (bool_field(req, "skip_special_tokens", &p->skip_special, out)) return 1;
    int sbst = 1;
    if (bool_field(req, "spaces_between_special_tokens", &sbst, out)) return 1;
    if (bool_field(req, "include_reasoning", &p->include_reasoning, out)) return 1;

    /* max_tokens: absent -> the remaining context (the engine clamps) */
    ll = -1;
    long long mct = -1;
    if (int_field(req, "max_tokens", 1, 1e9, &ll, out)) return 1;
    if (int_field(req, "max_completion_tokens", 1, 1e9, &mct, out)) return 1;
    if (mct > 0) ll = mct;
    p->max_tokens_given = ll > 0;
    p->gen.max_tokens = ll > 0 ? (int)ll : (int)(s->max_model_len > 1e9 ? 1e9 : s->max_model_len);

    d = sp->temperature;
    if (num_field(req, "temperature", 0, 2, &d, out)) return 1;
    sp->temperature = (float)d;
    d = sp->top_p;
    if (num_field_in(req, "top_p", 0, 1, 1, &d, out)) return 1;
    sp->top_p = (float)d;
    ll = 0;
    if (int_field(req, "top_k", -1, 1e9, &ll, out)) return 1;
    sp->top_k = ll > 0 ? (int)ll : 0;
    d = 0;
    if (num_field(req, "min_p", 0, 1, &d, out)) return 1;
    sp->min_p = (float)d;
    d = 0;
    if (num_field(req, "presence_penalty", -2, 2, &d, out)) return 1;
    sp->presence_penalty = (float)d;
    d = 0;
    if (num_field(req, "frequency_penalty", -2, 2, &d, out)) return 1;
    sp->frequency_penalty = (float)d;
    d = 1;
    if (num_field_in(req, "repetition_penalty", 0, 1, 2, &d, out)) return 1;
    sp->repetition_penalty = (float)d;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(req, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble)) {
            dsv4_reply_error(out, 400, "seed", "`seed` must be an integer");
            return 1;
        }
        sp->seed = (uint64_t)(int64_t)seed->valuedouble;
    } else if (getrandom(&sp->seed, sizeof sp->seed, 0) != sizeof sp->seed) {
        sp->seed = (uint64_t)(uintptr_t)p ^ 0x9E3779B97F4A7C15ull;
    }
    ll = 0;
    if (int_field(req, "min_tokens", 0, 1e9, &ll, out)) return 1;
    p->gen.min_tokens = (int)ll;
    if (p->max_tokens_given && p->gen.min_tokens > p->gen.max_tokens) {
        dsv4_reply_error(out, 400, "min_tokens", "`min_tokens` (%d) must not exceed `max_tokens` (%d)",
                         p->gen.min_tokens, p->gen.max_tokens);
        return 1;
    }
    if (bool_field(req, "ignore_eos", &p->gen.ignore_eos, out)) return 1;
    if (bool_field(req, "include_stop_str_in_output", &p->include_stop_str, out)) return 1;

    /* stop: string or array of non-empty strings (§6) */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsString(stop)) {
            p->stops[p->n_stops++] = stop->valuestring;
        } else if (cJSON_IsArray(stop)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, stop) {
                if (!cJSON_IsString(it)) {
                    dsv4_reply_error(out, 400, "stop", "`stop` must be a string or an array of strings");
                    return 1;
                }
                if (p->n_stops >= DSV4_MAX_STOPS) {
                    dsv4_reply_error(out, 400, "stop", "at most %d stop strings are supported", DSV4_MAX_STOPS);
                    return 1;
                }
                p->stops[p->n_stops++] = it->valuestring;
            }
        } else {
            dsv4_reply_error(out, 400, "stop", "`stop` must be a string or an array of strings");
            return 1;
        }
        for (int i = 0; i < p->n_stops; i++)
            if (!p->stops[i][0]) {
                dsv4_reply_error(out, 400, "stop", "stop strings must not be empty");
                return 1;
            }
    }
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(req, "stop_token_ids");
    if (sti && !cJSON_IsNull(sti)) {
        const cJSON *it;
        if (!cJSON_IsArray(sti)) {
            dsv4_reply_error(out, 400, "stop_token_ids", "`stop_token_ids` must be an array of token ids");
            return 1;
        }
        cJSON_ArrayForEach(it, sti) {
            if (!dsv4_service_is_token_id(it, s->vocab) || p->n_stop_ids >= DSV4_MAX_STOP_IDS) {
                dsv4_reply_error(out, 400, "stop_token_ids", "`stop_token_ids` must hold at most %d ids in [0, %d)",
                                 DSV4_MAX_STOP_IDS, s->vocab);
                return 1;
            }
            p->stop_ids[p->n_stop_ids++] = (int32_t)it->valuedouble;
        }
    }
    p->gen.stop_ids = p->stop_ids;
    p->gen.n_stop_ids = p->n_stop_ids;

    /* logit_bias: {"id": bias} */
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(req, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        int n = cJSON_GetArraySize(lb);
        if (!cJSON_IsObject(lb)) {
            dsv4_reply_error(out, 400, "logit_bias", "`logit_bias` must be an object of token id -> bias");
            return 1;
        }
        p->bias_ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        p->bias_vals = malloc(sizeof(float) * (size_t)(n ? n : 1));
        if (!p->bias_ids || !p->bias_vals) {
            dsv4_reply_error(out, 500, NULL, "out of memory");
            return 1;
        }
        const cJSON *it;
        int k = 0;
        cJSON_ArrayForEach(it, lb) {
            char *end;
            long id = strtol(it->string, &end, 10);
            if (*end || end == it->string || id < 0 || id >= s->vocab || !cJSON_IsNumber(it) ||
                it->valuedouble < -100 || it->valuedouble > 100) {
                dsv4_reply_error(out, 400, "logit_bias",
                                 "`logit_bias` entry \"%s\": keys are token ids in [0, %d), values in [-100, 100]",
                                 it->string, s->vocab);
                return 1;
            }
            p->bias_ids[k] = (int32_t)id;
            p->bias_vals[k++] = (float)it->valuedouble;
        }
        sp->bias_ids = p->bias_ids;
        sp->bias_vals = p->bias_vals;
        sp->n_bias = k;
    }

    /* n: choices sharing the prompt (§3.3) */
    ll = 1;
    if (int_field(req, "n", 1, 8, &ll, out)) return 1;
    p->n = (int)ll;
    /* logprobs: chat `logprobs` bool + `top_logprobs` 0..20; completions the
     * legacy `logprobs` int 0..5 (§3.3, §3.6). Raw target values (§7.2). */
    p->prompt_logprobs = -1;
    if (chat) {
        const cJSON *pl = cJSON_GetObjectItemCaseSensitive(req, "prompt_logprobs");
        if (pl && !cJSON_IsNull(pl)) {
            dsv4_reply_error(out, 400, "prompt_logprobs",
                             "`prompt_logprobs` is supported on /v1/completions only (send the rendered prompt "
                             "from /tokenize there)");
            return 1;
        }
        if (bool_field(req, "logprobs", &p->logprobs, out)) return 1;
        ll = 0;
        if (int_field(req, "top_logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &ll, out)) return 1;
        if (ll > 0 && !p->logprobs) {
            dsv4_reply_error(out, 400, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true");
            return 1;
        }
        p->top_logprobs = (int)ll;
    } else {
        ll = -1;
        if (int_field(req, "logprobs", 0, 5, &ll, out)) return 1;
        p->logprobs = ll >= 0;
        p->top_logprobs = ll > 0 ? (int)ll : 0;
    }
    p->gen.logprobs = p->logprobs;
    p->gen.top_logprobs = p->top_logprobs;

    /* response_format, structured_outputs, chat tool_choice required or named:
     * grammar-constrained decoding (service_constrain.c, SERVING.md §3.3, §4.6) */
    if (dsv4_req_constraint_parse(s, req, chat, p, out)) return 1;
    /* Known fields this build cannot honour: refuse rather than ignore (§3.3). */
    if (!chat) {
        if (bool_field(req, "echo", &p->echo, out)) return 1;
        /* echo + logprobs: the prompt tokens' log-probabilities come first,
         * the first one null (vLLM); prompt_logprobs=N: vLLM's per-choice
         * list of {id: {logprob, rank, decoded_token}} */
        ll = -1;
        if (int_field(req, "prompt_logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &ll, out)) return 1;
        p->prompt_logprobs = (int)ll;
        const cJSON *suf = cJSON_GetObjectItemCaseSensitive(req, "suffix");
        if (suf && !cJSON_IsNull(suf)) {
            dsv4_reply_error(out, 400, "suffix", "`suffix` is not supported");
            return 1;
        }
    }
    return 0;
}
