/*
 * Log-probability objects of the responses (spec/SERVING.md §3.3, §3.6):
 * chat `choices[].logprobs = {"content": [{token, logprob, bytes,
 * top_logprobs: [{token, logprob, bytes}]}]}` and the legacy completions
 * form `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
 *
 * A token's string is the lossy UTF-8 decode of its bytes (a token holding
 * half a character shows U+FFFD, as OpenAI does), and `bytes` its raw bytes,
 * so a client can rebuild exact text from the bytes. Values are the engine's
 * raw target log-probabilities (§7.2); -inf is reported as -9999 (vLLM's
 * clamp), since JSON has no infinity.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/service_internal.h"

static double finite_lp(float x) { return isfinite(x) ? (double)x : -9999.0; }

/* The token's raw bytes and a malloc'ed lossy-UTF-8 string of them (never NULL on success). */
static char *token_text(dsv4_service *s, int32_t id, const char **bytes, size_t *len) {
    *len = 0;
    *bytes = dsv4_tokenizer_token_bytes(s->tok, id, len);
    if (!*bytes) {
        *bytes = "";
        *len = 0;
    }
    char *str = NULL;
    size_t sl;
    if (dsv4_utf8_lossy(*bytes, *len, &str, &sl)) return NULL;
    return str;
}

/* One {token, logprob, bytes} object (chat form). */
static cJSON *chat_entry(dsv4_service *s, int32_t id, float lp) {
    const char *b;
    size_t len;
    char *str = token_text(s, id, &b, &len);
    cJSON *o = cJSON_CreateObject(), *arr;
    cJSON_AddStringToObject(o, "token", str ? str : "");
    cJSON_AddNumberToObject(o, "logprob", finite_lp(lp));
    arr = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < len; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)b[i]));
    free(str);
    return o;
}

cJSON *dsv4_chat_logprobs_json(dsv4_service *s, const dsv4_token_logprob *lp, int n, int top) {
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; i < n; i++) {
        cJSON *e = chat_entry(s, lp[i].token, lp[i].logprob), *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int t = 0; t < lp[i].n_top && t < top; t++)
            cJSON_AddItemToArray(tops, chat_entry(s, lp[i].top_ids[t], lp[i].top_logprobs[t]));
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

/* Code points of a UTF-8 string (text_offset counts characters, like Python's len). */
static long n_chars(const char *str) {
    long n = 0;
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

long dsv4_text_chars(const char *str) { return str ? n_chars(str) : 0; }

cJSON *dsv4_completion_logprobs_json(dsv4_service *s, const dsv4_token_logprob *lp, int n, int top,
                                     int skip_special, long *text_offset) {
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *tlp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = 0; i < n; i++) {
        const char *b;
        size_t len;
        char *str = token_text(s, lp[i].token, &b, &len);
        cJSON_AddItemToArray(toks, cJSON_CreateString(str ? str : ""));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(finite_lp(lp[i].logprob)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*text_offset));
        if (str && !(skip_special && dsv4_tokenizer_is_special(s->tok, lp[i].token))) *text_offset += n_chars(str);
        /* the top `top` alternatives plus the sampled token (OpenAI: up to logprobs+1 entries) */
        cJSON *d = cJSON_CreateObject();
        for (int t = 0; t < lp[i].n_top && t < top; t++) {
            char *ts = token_text(s, lp[i].top_ids[t], &b, &len);
            if (ts && !cJSON_GetObjectItemCaseSensitive(d, ts))
                cJSON_AddNumberToObject(d, ts, finite_lp(lp[i].top_logprobs[t]));
            free(ts);
        }
        if (str && !cJSON_GetObjectItemCaseSensitive(d, str)) cJSON_AddNumberToObject(d, str, finite_lp(lp[i].logprob));
        cJSON_AddItemToArray(tops, d);
        free(str);
    }
    return o;
}
