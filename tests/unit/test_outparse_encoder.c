/*
 * The output parser against the other end of the text layer:
 *  - §9 items 3 and 4 end to end: the request is resolved once
 *    (text/thinking.h, SERVING.md §2), the prompt renders the mode
 *    (text/encoder.h) and the parser is configured from the same result, so
 *    "prompt says chat, parser says thinking" cannot happen (§6.4);
 *  - §1.7 agreement with the encoder (and §9 items 8 and 10 at this layer):
 *    an assistant turn with tool calls rendered by the encoder as history is
 *    exactly what the model emits, so feeding the rendered turn to the parser
 *    must give back the same arguments (a `bash` command ending in 2>&1
 *    byte-exact), whether the history gave arguments as a JSON string or an
 *    object.
 */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/encoder.h"
#include "text/outparse.h"
#include "text/thinking.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"description\":\"run\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"},\"env\":{\"type\":\"object\"},"
    "\"ratio\":{\"type\":\"number\"},\"flags\":{\"type\":\"array\"},\"dry\":{\"type\":\"boolean\"}}}}}]";

/* Feed a rendered prompt from segment `from` on; text segments in chunks of `chunk` bytes. */
static dsv4_outparse *feed_segments(const dsv4_prompt *pr, size_t from, const dsv4_outparse_config *cfg, size_t chunk,
                                    char *args, size_t args_cap) {
    dsv4_err err = {0};
    dsv4_outparse *p = dsv4_outparse_create(cfg, NULL, &err);
    CHECK_MSG(p != NULL, "%s", err.msg);
    if (!p) return NULL;
    args[0] = 0;
    for (size_t s = from; s < pr->nsegs; s++) {
        const dsv4_prompt_seg *g = &pr->segs[s];
        if (g->kind == DSV4_SEG_SPECIAL) {
            CHECK_EQ_INT(dsv4_outparse_push_piece(p, -1, pr->text + g->off, g->len, 1, NULL, &err), DSV4_OK);
        } else {
            for (size_t o = 0; o < g->len; o += chunk) {
                size_t n = g->len - o < chunk ? g->len - o : chunk;
                CHECK_EQ_INT(dsv4_outparse_push_piece(p, -1, pr->text + g->off + o, n, 0, NULL, &err), DSV4_OK);
            }
        }
        size_t nd = 0;
        const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(p, &nd);
        for (size_t k = 0; k < nd; k++)
            if (d[k].kind == DSV4_DELTA_TOOL_ARGS) strncat(args, d[k].text, args_cap - strlen(args) - 1);
    }
    if (!dsv4_outparse_finished(p)) dsv4_outparse_finish(p, DSV4_END_LENGTH, &err);
    return p;
}

static int seg_is(const dsv4_prompt *pr, size_t s, const char *tok) {
    return pr->segs[s].kind == DSV4_SEG_SPECIAL && pr->segs[s].len == strlen(tok) &&
           memcmp(pr->text + pr->segs[s].off, tok, pr->segs[s].len) == 0;
}

/* Index of the segment after the first </think> that follows the last user
 * turn: the start of the rendered assistant output. (The encoder appends a
 * generation anchor after an assistant-final conversation, §1.11; the parser
 * ends at the turn's EOS before reaching it.) */
static size_t assistant_output_start(const dsv4_prompt *pr) {
    size_t user = 0;
    for (size_t s = 0; s < pr->nsegs; s++)
        if (seg_is(pr, s, DSV4_TOK_USER)) user = s;
    for (size_t s = user; s < pr->nsegs; s++)
        if (seg_is(pr, s, DSV4_TOK_END_THINK)) return s + 1;
    return pr->nsegs;
}

static int ends_with(const dsv4_prompt *pr, const char *s) {
    size_t n = strlen(s);
    return pr->len >= n && memcmp(pr->text + pr->len - n, s, n) == 0;
}

/* §9 items 3, 4: resolve -> render -> parse, one decision. */
static void check_mode(const char *request_json, int want_thinking, const char *name) {
    cJSON *req = cJSON_Parse(request_json);
    dsv4_thinking_defaults def;
    dsv4_thinking_defaults_init(&def, DSV4_PROFILE_0731);
    dsv4_thinking th;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_thinking_resolve(req, &def, &th, &err), DSV4_OK);
    CHECK_MSG(th.thinking == want_thinking, "%s: thinking=%d", name, th.thinking);
    dsv4_encode_opts o;
    dsv4_encode_opts_init(&o, &th, DSV4_PROFILE_0731);
    cJSON *msgs = cJSON_GetObjectItem(req, "messages");
    dsv4_prompt pr = {0};
    CHECK_EQ_INT(dsv4_encoder_render(msgs, &o, &pr, &err), DSV4_OK);
    CHECK_MSG(ends_with(&pr, want_thinking ? "<think>" : "</think>"), "%s: prompt end", name);
    /* the model answers "4" (and, if it thinks, reasons first) */
    dsv4_outparse_config cfg = {.thinking = th.thinking};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, NULL, &err);
    if (want_thinking) dsv4_outparse_push_piece(p, -1, "2+2", 3, 0, NULL, &err);
    if (want_thinking) dsv4_outparse_push_piece(p, -1, "</think>", 8, 1, NULL, &err);
    dsv4_outparse_push_piece(p, -1, "4", 1, 0, NULL, &err);
    dsv4_outparse_push_piece(p, 1, DSV4_TOK_EOS, strlen(DSV4_TOK_EOS), 1, NULL, &err);
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    CHECK_MSG(r->content && !strcmp(r->content, "4"), "%s: content non-null \"4\"", name);
    if (want_thinking) CHECK_STR(r->reasoning, "2+2");
    else CHECK_MSG(r->reasoning == NULL, "%s: reasoning null", name);
    CHECK_STR(r->finish_reason, "stop");
    dsv4_outparse_free(p);
    dsv4_prompt_free(&pr);
    cJSON_Delete(req);
}

static void test_items_3_4_one_decision(void) {
    check_mode("{\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"}],\"reasoning_effort\":\"none\","
               "\"chat_template_kwargs\":{\"thinking\":true}}",
               0, "item3_effort_none_thinking_true");
    check_mode("{\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"}],\"chat_template_kwargs\":{\"thinking\":\"false\"}}",
               0, "item4_thinking_string_false");
    check_mode("{\"messages\":[{\"role\":\"user\",\"content\":\"2+2?\"}],\"chat_template_kwargs\":{\"thinking\":true}}", 1,
               "items3_4_contrast_thinking_true");
}

/* §1.7 round trip through encoder history rendering. */
static void roundtrip(const char *args_json, int as_string, const char *name) {
    cJSON *args = cJSON_Parse(args_json);
    cJSON *tools = cJSON_Parse(TOOLS);
    cJSON *msgs = cJSON_CreateArray();
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", "do it");
    cJSON_AddItemToArray(msgs, u);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", "Sure.");
    cJSON *calls = cJSON_AddArrayToObject(a, "tool_calls");
    for (int i = 0; i < 2; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", i ? "call_2" : "call_1");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", "bash");
        if (as_string) cJSON_AddStringToObject(f, "arguments", args_json);
        else cJSON_AddItemToObject(f, "arguments", cJSON_Duplicate(args, 1));
        cJSON_AddItemToArray(calls, c);
    }
    cJSON_AddItemToArray(msgs, a);
    dsv4_encode_opts o;
    dsv4_encode_opts_init(&o, NULL, DSV4_PROFILE_0731);
    o.tools = tools;
    dsv4_prompt pr = {0};
    dsv4_err err = {0};
    CHECK_MSG(dsv4_encoder_render(msgs, &o, &pr, &err) == DSV4_OK, "%s: %s", name, err.msg);
    size_t from = assistant_output_start(&pr);
    CHECK(from < pr.nsegs);
    dsv4_outparse_config cfg = {.thinking = 0, .tools_enabled = 1, .tools = tools};
    char *expect_compact = cJSON_PrintUnformatted(args);
    for (size_t chunk = 1; chunk <= 64; chunk *= 4) {
        char streamed[4096];
        dsv4_outparse *p = feed_segments(&pr, from, &cfg, chunk, streamed, sizeof streamed);
        if (!p) break;
        const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
        CHECK_STR(r->content, "Sure.");
        CHECK_STR(r->finish_reason, "tool_calls");
        CHECK_EQ_INT(r->n_tool_calls, 2);
        for (int i = 0; i < r->n_tool_calls; i++) {
            cJSON *got = cJSON_Parse(r->tool_calls[i].arguments);
            CHECK_MSG(cJSON_Compare(got, args, 1), "%s: args %s != %s", name, r->tool_calls[i].arguments, args_json);
            cJSON_Delete(got);
            CHECK_STR(r->tool_calls[i].name, "bash");
        }
        /* both calls' fragments, concatenated, equal both final arguments */
        if (r->n_tool_calls == 2) {
            char both[4096];
            snprintf(both, sizeof both, "%s%s", r->tool_calls[0].arguments, r->tool_calls[1].arguments);
            CHECK_STR(streamed, both);
        }
        /* integers, strings, arrays, objects, booleans re-serialise as cJSON
         * compact does (no floats in these cases) */
        if (!strstr(args_json, ".")) CHECK_STR(r->n_tool_calls ? r->tool_calls[0].arguments : "", expect_compact);
        dsv4_outparse_free(p);
    }
    free(expect_compact);
    dsv4_prompt_free(&pr);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(args);
}

static void test_item8_item10_roundtrip_with_encoder(void) {
    const char *cases[] = {
        "{\"command\":\"ls -la /tmp 2>&1\"}",
        "{\"command\":\"echo \\\"hi\\\" > f.txt && cat <f.txt 2>&1 | grep -c '\\\\n'\\n\\tdone\",\"timeout\":30}",
        "{\"command\":\"日本語 🙂 </tag> & <x>\",\"env\":{\"A\":\"1\",\"B\":[1,2,{\"c\":null}]},\"dry\":true,"
        "\"flags\":[\"-a\",\"-b\"]}",
        "{\"ratio\":1.5,\"timeout\":-7,\"command\":\"\"}",
        "{}",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        roundtrip(cases[i], 0, "item10_dict_arguments");
        roundtrip(cases[i], 1, "item10_string_arguments");
    }
}

int main(void) {
    test_items_3_4_one_decision();
    test_item8_item10_roundtrip_with_encoder();
    return TEST_REPORT();
}
