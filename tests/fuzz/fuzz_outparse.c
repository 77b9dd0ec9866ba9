/*
 * libFuzzer target for the output parser and detokenizer (DESIGN.md
 * "fuzz targets for every parser that reads outside input": model output is
 * outside input). Build with -DDSV4_FUZZ=ON (clang).
 *
 * Input layout: byte 0 = config bits (thinking, tools, raw, stops,
 * stop_in_reasoning); then a token stream where bytes 0x01..0x06 are special
 * tokens (｜DSML｜ </think> EOS <think> BOS <｜User｜>), 0x07 ends the current
 * text token and 0x08 ends the current engine step. Invariants: well-formed
 * UTF-8 deltas, no DSML marker text in chat deltas, streamed == final,
 * tool-call arguments are JSON objects, no crash / leak / UB.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/detok.h"
#include "text/outparse.h"

static const char *const SPECIAL[] = {
    NULL, "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", "</think>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<think>",
    "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
};

static int well_formed(const char *s, size_t n) {
    char *o = NULL;
    size_t on = 0;
    if (dsv4_utf8_lossy(s, n, &o, &on)) return 0;
    int ok = on == n && memcmp(o, s, n) == 0;
    free(o);
    return ok;
}

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

typedef struct { char *s; size_t n; } str;
static void put(str *b, const char *s, size_t n) {
    b->s = realloc(b->s, b->n + n + 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void drain(dsv4_outparse *p, str *reasoning, str *content, int raw) {
    size_t n = 0;
    const dsv4_outparse_delta *d = dsv4_outparse_take_deltas(p, &n);
    for (size_t i = 0; i < n; i++) {
        REQUIRE(well_formed(d[i].text, d[i].len));
        if (d[i].kind == DSV4_DELTA_REASONING || d[i].kind == DSV4_DELTA_CONTENT) {
            /* fuzz text may spell anything as ordinary text, so only the
             * markers stripped in text space can be asserted absent */
            if (!raw) {
                REQUIRE(!memmem(d[i].text, d[i].len, "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C", 10));
                REQUIRE(!memmem(d[i].text, d[i].len, "|DSML|", 6));
            }
            put(d[i].kind == DSV4_DELTA_REASONING ? reasoning : content, d[i].text, d[i].len);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const char *stops[] = {"Question:", "\n\n"};
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"bash\",\"parameters\":"
                               "{\"properties\":{\"n\":{\"type\":\"integer\"}}}}}]");
    dsv4_outparse_config cfg = {.thinking = flags & 1, .tools_enabled = (flags >> 1) & 1, .raw = (flags >> 2) & 1,
                                .stops = stops, .n_stops = (flags >> 3) & 3, .stop_in_reasoning = (flags >> 5) & 1,
                                .tools = tools, .id_seed = 1};
    if (cfg.n_stops > 2) cfg.n_stops = 2;
    dsv4_err err = {0};
    dsv4_outparse *p = dsv4_outparse_create(&cfg, NULL, &err);
    REQUIRE(p);
    str reasoning = {0}, content = {0};
    size_t i = 1;
    while (i < size && !dsv4_outparse_finished(p)) {
        uint8_t c = data[i];
        if (c >= 1 && c <= 6) {
            REQUIRE(dsv4_outparse_push_piece(p, -1, SPECIAL[c], strlen(SPECIAL[c]), 1, NULL, &err) == DSV4_OK);
            i++;
        } else if (c == 7 || c == 8) {
            if (c == 8) drain(p, &reasoning, &content, cfg.raw);
            i++;
        } else {
            size_t j = i;
            while (j < size && (data[j] > 8 || data[j] == 0)) j++;
            REQUIRE(dsv4_outparse_push_piece(p, -1, (const char *)data + i, j - i, 0, NULL, &err) == DSV4_OK);
            i = j;
        }
    }
    if (!dsv4_outparse_finished(p)) REQUIRE(dsv4_outparse_finish(p, DSV4_END_LENGTH, &err) == DSV4_OK);
    drain(p, &reasoning, &content, cfg.raw);
    const dsv4_outparse_result *r = dsv4_outparse_get_result(p);
    REQUIRE(r->finish_reason);
    REQUIRE(r->reasoning_len == reasoning.n && (!reasoning.n || !memcmp(r->reasoning, reasoning.s, reasoning.n)));
    REQUIRE(r->content_len == content.n && (!content.n || !memcmp(r->content, content.s, content.n)));
    for (int k = 0; k < r->n_tool_calls; k++) {
        cJSON *j = cJSON_Parse(r->tool_calls[k].arguments);
        REQUIRE(cJSON_IsObject(j));
        cJSON_Delete(j);
    }
    free(reasoning.s);
    free(content.s);
    dsv4_outparse_free(p);
    cJSON_Delete(tools);
    return 0;
}
