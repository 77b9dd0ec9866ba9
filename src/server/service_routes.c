/* Chat, completions, tokenize and detokenize handlers (spec/SERVING.md §3.3-3.7). */
#include <stdlib.h>
#include <string.h>

#include "server/service_internal.h"

/* The request with --default-chat-template-kwargs filled in where the client
 * gave nothing (client values always win, §8.1). Returns a new object, or
 * NULL when there are no defaults (use req as is). */
static cJSON *with_default_kwargs(dsv4_service *s, const cJSON *req) {
    if (!s->default_kwargs) return NULL;
    cJSON *dup = cJSON_Duplicate(req, 1);
    if (!dup) return NULL;
    cJSON *kw = cJSON_GetObjectItemCaseSensitive(dup, "chat_template_kwargs");
    if (!cJSON_IsObject(kw)) {
        if (kw) return dup; /* wrong type: let the resolver report it */
        kw = cJSON_AddObjectToObject(dup, "chat_template_kwargs");
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, s->default_kwargs)
        if (!cJSON_GetObjectItemCaseSensitive(kw, it->string))
            cJSON_AddItemToObject(kw, it->string, cJSON_Duplicate(it, 1));
    return dup;
}

/* Context check with the phrase agent clients match on (§3.8). */
static int context_ok(dsv4_service *s, int n_prompt, const dsv4_req_params *p, int chat, dsv4_reply *out) {
    if (n_prompt < s->max_model_len) return 1;
    int c = p->max_tokens_given ? p->gen.max_tokens : 0;
    dsv4_reply_error(out, 400, chat ? "messages" : "prompt",
                     "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                     "(%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                     (long long)s->max_model_len, (long long)n_prompt + c, n_prompt, chat ? "messages" : "prompt",
                     c, chat ? "messages" : "prompt");
    return 0;
}

static void parser_config(dsv4_service *s, const dsv4_req_params *p, const cJSON *req, dsv4_outparse_config *pc) {
    memset(pc, 0, sizeof *pc);
    pc->stops = p->stops;
    pc->n_stops = p->n_stops;
    pc->include_stop_str_in_output = p->include_stop_str;
    pc->stop_in_reasoning = s->stop_in_reasoning;
    const cJSON *sir = cJSON_GetObjectItemCaseSensitive(req, "stop_in_reasoning");
    if (cJSON_IsBool(sir)) pc->stop_in_reasoning = cJSON_IsTrue(sir);
    pc->stop_token_ids = p->stop_ids;
    pc->n_stop_token_ids = p->n_stop_ids;
}

/* outparse's is_special hook: tokenizer.json's "special" flag (§3.6). */
static int tok_is_special(void *ctx, int32_t id) { return dsv4_tokenizer_is_special(ctx, id); }

static void handle_chat(dsv4_service *s, const cJSON *req, const char *raw, size_t len, dsv4_reply *out) {
    dsv4_req_params p;
    if (dsv4_req_params_parse(s, req, 1, &p, out)) {
        dsv4_req_params_free(&p);
        return;
    }
    cJSON *merged = with_default_kwargs(s, req);
    const cJSON *body = merged ? merged : req;
    dsv4_thinking th;
    dsv4_prompt prompt;
    memset(&prompt, 0, sizeof prompt);
    dsv4_tokvec ids = {0};
    dsv4_err err = {0};
    if (dsv4_encoder_build_chat(body, raw, len, &s->enc, s->tok, &th, &prompt, &ids, &err)) {
        dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, NULL, "%s", err.msg);
    } else if (context_ok(s, (int)ids.n, &p, 1, out)) {
        dsv4_outparse_config pc;
        parser_config(s, &p, body, &pc);
        pc.thinking = th.thinking;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
        pc.tools_enabled = cJSON_GetArraySize(tools) > 0 && !(cJSON_IsString(tc) && !strcmp(tc->valuestring, "none"));
        pc.tools = cJSON_IsArray(tools) ? tools : NULL;
        dsv4_service_run_job(s, 1, ids.ids, (int)ids.n, &p, &pc, NULL, out);
    }
    dsv4_tokvec_free(&ids);
    dsv4_prompt_free(&prompt);
    cJSON_Delete(merged);
    dsv4_req_params_free(&p);
}

/* /v1/completions prompt: a string, or an array of token ids (§3.6). */
static int completion_prompt(dsv4_service *s, const cJSON *req, dsv4_tokvec *ids, char **text, dsv4_reply *out) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 1 && !cJSON_IsNumber(cJSON_GetArrayItem(pr, 0)))
        pr = cJSON_GetArrayItem(pr, 0); /* a batch of one */
    dsv4_err err = {0};
    if (cJSON_IsString(pr)) {
        *text = strdup(pr->valuestring);
        const char *t = pr->valuestring;
        if (dsv4_text_prompt_tokenize(s->tok, t, strlen(t), 1, 1, ids, &err)) {
            dsv4_reply_error(out, 400, "prompt", "%s", err.msg);
            return 1;
        }
    } else if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) > 0) {
        /* Token ids are used exactly as given, no BOS added: vLLM passes
         * prompt_token_ids straight to the engine (its tokenizer, which adds
         * BOS, only runs on text). SERVING.md §3.6 speaks of text prompts. */
        const cJSON *it;
        cJSON_ArrayForEach(it, pr) {
            if (!dsv4_service_is_token_id(it, s->vocab)) {
                dsv4_reply_error(out, 400, "prompt",
                                 cJSON_IsArray(it) || cJSON_IsString(it)
                                     ? "batched prompts (several prompts in one request) are not supported yet"
                                     : "`prompt` token ids must be integers in [0, %d)",
                                 s->vocab);
                return 1;
            }
            dsv4_tokvec_push(ids, (int32_t)it->valuedouble);
        }
        char *dec = NULL;
        size_t dl;
        if (!dsv4_tokenizer_decode(s->tok, ids->ids, ids->n, 1, &dec, &dl, &err)) *text = dec;
    } else {
        dsv4_reply_error(out, 400, "prompt", "`prompt` must be a non-empty string or an array of token ids");
        return 1;
    }
    return 0;
}

/* echo + logprobs and prompt_logprobs list every prompt token: bounded (§3.6). */
static int prompt_logprobs_ok(const dsv4_req_params *p, int n_prompt, dsv4_reply *out) {
    if (!(p->echo && p->logprobs) && p->prompt_logprobs < 0) return 1;
    if (n_prompt <= DSV4_MAX_PROMPT_LOGPROB_TOKENS) return 1;
    dsv4_reply_error(out, 400, p->prompt_logprobs >= 0 ? "prompt_logprobs" : "echo",
                     "prompt log-probabilities (%s) are limited to prompts of %d tokens; this prompt has %d",
                     p->prompt_logprobs >= 0 ? "`prompt_logprobs`" : "`echo` with `logprobs`",
                     DSV4_MAX_PROMPT_LOGPROB_TOKENS, n_prompt);
    return 0;
}

static void handle_completions(dsv4_service *s, const cJSON *req, dsv4_reply *out) {
    dsv4_req_params p;
    dsv4_tokvec ids = {0};
    char *text = NULL;
    if (!dsv4_req_params_parse(s, req, 0, &p, out) && !completion_prompt(s, req, &ids, &text, out) &&
        context_ok(s, (int)ids.n, &p, 0, out) && prompt_logprobs_ok(&p, (int)ids.n, out)) {
        dsv4_outparse_config pc;
        parser_config(s, &p, req, &pc);
        pc.raw = 1;
        pc.is_special = tok_is_special;
        pc.special_ctx = s->tok;
        pc.keep_special_text = !p.skip_special;
        int32_t think = dsv4_tokenizer_special_id(s->tok, DSV4_TOK_THINK);
        pc.thinking = ids.n > 0 && ids.ids[ids.n - 1] == think; /* the guard arms after a raw <think> */
        dsv4_service_run_job(s, 0, ids.ids, (int)ids.n, &p, &pc, text, out);
    }
    free(text);
    dsv4_tokvec_free(&ids);
    dsv4_req_params_free(&p);
}

static void handle_tokenize(dsv4_service *s, const cJSON *req, const char *raw, size_t len, dsv4_reply *out) {
    dsv4_tokvec ids = {0};
    dsv4_err err = {0};
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (msgs) {
        cJSON *merged = with_default_kwargs(s, req);
        dsv4_thinking th;
        dsv4_prompt prompt;
        memset(&prompt, 0, sizeof prompt);
        int rc = dsv4_encoder_build_chat(merged ? merged : req, raw, len, &s->enc, s->tok, &th, &prompt, &ids, &err);
        dsv4_prompt_free(&prompt);
        cJSON_Delete(merged);
        if (rc) {
            dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, NULL, "%s", err.msg);
            dsv4_tokvec_free(&ids);
            return;
        }
    } else if (cJSON_IsString(pr)) {
        /* vLLM's /tokenize: add_special_tokens defaults to true (BOS first) */
        const cJSON *ast = cJSON_GetObjectItemCaseSensitive(req, "add_special_tokens");
        if (dsv4_text_prompt_tokenize(s->tok, pr->valuestring, strlen(pr->valuestring), 1, !cJSON_IsFalse(ast), &ids,
                                      &err)) {
            dsv4_reply_error(out, 400, "prompt", "%s", err.msg);
            dsv4_tokvec_free(&ids);
            return;
        }
    } else {
        dsv4_reply_error(out, 400, "prompt", "give `prompt` (a string) or `messages`");
        return;
    }
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddNumberToObject(o, "count", (double)ids.n);
    cJSON_AddNumberToObject(o, "max_model_len", (double)s->max_model_len);
    for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids.ids[i]));
    dsv4_tokvec_free(&ids);
    dsv4_reply_json(out, 200, o);
}

static void handle_detokenize(dsv4_service *s, const cJSON *req, dsv4_reply *out) {
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(req, "tokens"), *it;
    if (!cJSON_IsArray(toks)) {
        dsv4_reply_error(out, 400, "tokens", "`tokens` must be an array of token ids");
        return;
    }
    dsv4_tokvec ids = {0};
    cJSON_ArrayForEach(it, toks) {
        if (!dsv4_service_is_token_id(it, dsv4_tokenizer_vocab_size(s->tok))) {
            dsv4_reply_error(out, 400, "tokens", "`tokens` must be integers in [0, %d)",
                             dsv4_tokenizer_vocab_size(s->tok));
            dsv4_tokvec_free(&ids);
            return;
        }
        dsv4_tokvec_push(&ids, (int32_t)it->valuedouble);
    }
    char *text = NULL;
    size_t tl;
    dsv4_err err = {0};
    if (dsv4_tokenizer_decode(s->tok, ids.ids, ids.n, 0, &text, &tl, &err)) {
        dsv4_reply_error(out, 400, "tokens", "%s", err.msg);
        dsv4_tokvec_free(&ids);
        return;
    }
    dsv4_tokvec_free(&ids);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text);
    free(text);
    dsv4_reply_json(out, 200, o);
}

void dsv4_service_handle(dsv4_service *s, dsv4_svc_route route, const cJSON *req, const char *raw, size_t len,
                         dsv4_reply *out) {
    switch (route) {
    case DSV4_SVC_CHAT: handle_chat(s, req, raw, len, out); return;
    case DSV4_SVC_COMPLETIONS: handle_completions(s, req, out); return;
    case DSV4_SVC_TOKENIZE: handle_tokenize(s, req, raw, len, out); return;
    case DSV4_SVC_DETOKENIZE: handle_detokenize(s, req, out); return;
    }
}
