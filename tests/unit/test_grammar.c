/*
 * Constrained decoding grammar (src/engine/grammar.h): JSON text accepted or
 * rejected byte by byte, schema keywords enforced or refused by name, and
 * random walks over the real DeepSeek-V4 vocabulary where every token the
 * mask allows is accepted, every token it forbids is rejected, the mask never
 * empties, and finished outputs parse (cJSON) with the schema's shape.
 */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/constrain.h"
#include "engine/grammar.h"
#include "test.h"
#include "test_models.h"

static dsv4_grammar *schema_grammar(const char *json) {
    cJSON *sc = json ? cJSON_Parse(json) : NULL;
    dsv4_grammar *g = NULL;
    dsv4_err err = {0};
    int rc = dsv4_grammar_from_schema(sc, &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", json ? json : "(json_object)", err.msg);
    cJSON_Delete(sc);
    return g;
}

static const char *schema_error(const char *json) {
    static dsv4_err err;
    memset(&err, 0, sizeof err);
    cJSON *sc = cJSON_Parse(json);
    dsv4_grammar *g = NULL;
    int rc = dsv4_grammar_from_schema(sc, &g, &err);
    CHECK_MSG(rc == DSV4_EINVAL, "schema %s was accepted", json);
    dsv4_grammar_free(g);
    cJSON_Delete(sc);
    return err.msg;
}

/* 1 if the whole text is accepted and complete. */
static int matches(const dsv4_grammar *g, const char *text) {
    dsv4_grammar_state s;
    dsv4_grammar_init(g, &s);
    return dsv4_grammar_bytes(g, &s, text, strlen(text)) && dsv4_grammar_is_complete(g, &s);
}

/* 1 if the text is a valid prefix (every byte accepted). */
static int prefix_ok(const dsv4_grammar *g, const char *text) {
    dsv4_grammar_state s;
    dsv4_grammar_init(g, &s);
    return dsv4_grammar_bytes(g, &s, text, strlen(text));
}

#define ACCEPT(g, t) CHECK_MSG(matches(g, t), "should match: %s", t)
#define REJECT(g, t) CHECK_MSG(!matches(g, t), "should not match: %s", t)

static void test_json_object(void) {
    dsv4_grammar *g = schema_grammar(NULL);
    if (!g) return;
    ACCEPT(g, "{}");
    ACCEPT(g, "{\"a\":[1,-2.5e+3,0.25,\"x\\u00e9\\n\\\"\",true,false,null,{\"b\":{}}],\"c\":[]}");
    ACCEPT(g, "{ \"a\" : 1 ,\n  \"b\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
    ACCEPT(g, "{\"a\\u0041\":0}");
    REJECT(g, "[]"); /* json_object: the root is an object */
    REJECT(g, "\"x\"");
    REJECT(g, "{\"a\":}");
    REJECT(g, "{\"a\":01}"); /* no leading zeros */
    REJECT(g, "{\"a\":1.}");
    REJECT(g, "{\"a\":.5}");
    REJECT(g, "{\"a\":\"\\x\"}");
    REJECT(g, "{\"a\":\"\\ud800\"}");      /* no surrogates through \u */
    REJECT(g, "{\"a\":\"\x01\"}");         /* raw control character */
    REJECT(g, "{\"a\":\"\xc0\x80\"}");     /* overlong UTF-8 */
    REJECT(g, "{\"a\":\"\xed\xa0\x80\"}"); /* UTF-8 surrogate */
    REJECT(g, "{\"a\":\"\xe2\x82\"}");     /* truncated UTF-8 */
    REJECT(g, "{\"a\":1,}");
    REJECT(g, "{} "); /* nothing after the value */
    REJECT(g, "{}{}");
    REJECT(g, "{\"a\":tru}");
    REJECT(g, "{\"a\":1"); /* incomplete */
    CHECK(prefix_ok(g, "{\"a\":1"));
    /* whitespace runs are bounded */
    char buf[64];
    snprintf(buf, sizeof buf, "{%*s}", DSV4_GRAMMAR_MAX_WS, "");
    ACCEPT(g, buf);
    snprintf(buf, sizeof buf, "{%*s}", DSV4_GRAMMAR_MAX_WS + 1, "");
    REJECT(g, buf);
    /* numbers are bounded */
    CHECK(matches(g, "{\"a\":12345678901234567890}"));
    CHECK(!prefix_ok(g, "{\"a\":1234567890123456789012345678901234567890"));
    /* nesting is bounded, and at the bound a value can still be closed */
    char deep[256] = "";
    strcat(deep, "{\"a\":");
    for (int i = 0; i < 40; i++)
        strcat(deep, "[");
    CHECK(!prefix_ok(g, deep));
    dsv4_grammar_free(g);
}

static void test_schema_object(void) {
    dsv4_grammar *g = schema_grammar(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,\"maxItems\":2}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    if (!g) return;
    ACCEPT(g, "{\"name\":\"Ann\",\"age\":31}");
    ACCEPT(g, "{\"age\":-4,\"name\":\"\",\"tags\":[\"a\",\"b\"]}");
    REJECT(g, "{\"name\":\"Ann\"}");                          /* age required */
    REJECT(g, "{\"name\":\"Ann\",\"age\":3.5}");              /* integer */
    REJECT(g, "{\"name\":\"Ann\",\"age\":3,\"x\":1}");        /* additionalProperties false */
    REJECT(g, "{\"name\":\"Ann\",\"name\":\"B\",\"age\":3}"); /* duplicate */
    REJECT(g, "{\"name\":1,\"age\":3}");
    REJECT(g, "{\"name\":\"a\",\"age\":3,\"tags\":[]}");                  /* minItems */
    REJECT(g, "{\"name\":\"a\",\"age\":3,\"tags\":[\"a\",\"b\",\"c\"]}"); /* maxItems */
    REJECT(g, "{\"n\\u0061me\":\"a\",\"age\":3}");                        /* escaped declared key */
    /* early rejection: a key prefix no property has */
    CHECK(!prefix_ok(g, "{\"x"));
    CHECK(prefix_ok(g, "{\"na"));
    dsv4_grammar_free(g);

    /* open objects: extra keys take any value, declared ones their schema */
    g = schema_grammar("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\"}}}");
    if (!g) return;
    ACCEPT(g, "{\"n\":1e5,\"other\":{\"x\":[null]}}");
    ACCEPT(g, "{\"nn\":\"s\"}");
    REJECT(g, "{\"n\":\"s\"}");
    REJECT(g, "{\"n\":1,\"n\":2}");
    dsv4_grammar_free(g);

    g = schema_grammar("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}");
    if (!g) return;
    ACCEPT(g, "{\"a\":true,\"b\":false}");
    REJECT(g, "{\"a\":1}");
    dsv4_grammar_free(g);
}

static void test_schema_scalars(void) {
    dsv4_grammar *g = schema_grammar("{\"enum\":[\"red\",\"green\",1,12,null,{\"a\":1}]}");
    if (!g) return;
    ACCEPT(g, "\"red\"");
    ACCEPT(g, "\"green\"");
    ACCEPT(g, "1");
    ACCEPT(g, "12");
    ACCEPT(g, "null");
    ACCEPT(g, "{\"a\":1}");
    REJECT(g, "\"blue\"");
    REJECT(g, "13");
    REJECT(g, "\"re\"");
    dsv4_grammar_free(g);

    g = schema_grammar(
        "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"v\"},\"e\":{\"enum\":[1,12]}},"
        "\"required\":[\"k\",\"e\"]}");
    if (!g) return;
    ACCEPT(g, "{\"k\":\"v\",\"e\":12}");
    ACCEPT(g, "{\"k\":\"v\",\"e\":1}");
    REJECT(g, "{\"k\":\"w\",\"e\":1}");
    REJECT(g, "{\"k\":\"v\",\"e\":2}");
    dsv4_grammar_free(g);

    g = schema_grammar("{\"type\":[\"string\",\"null\"],\"minLength\":2,\"maxLength\":3}");
    if (!g) return;
    ACCEPT(g, "null");
    ACCEPT(g, "\"ab\"");
    ACCEPT(g, "\"a\\nb\"");
    ACCEPT(g, "\"\xc3\xa9\xc3\xa9\""); /* characters, not bytes */
    REJECT(g, "\"a\"");
    REJECT(g, "\"abcd\"");
    REJECT(g, "1");
    dsv4_grammar_free(g);

    g = schema_grammar(
        "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}},"
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"null\"}},\"required\":[\"x\"]}]}");
    if (!g) return;
    ACCEPT(g, "-7");
    ACCEPT(g, "[true,false]");
    ACCEPT(g, "{\"x\":null}");
    REJECT(g, "1.5");
    REJECT(g, "{}");
    REJECT(g, "[1]");
    dsv4_grammar_free(g);

    g = schema_grammar("{\"type\":\"number\"}");
    if (!g) return;
    ACCEPT(g, "0");
    ACCEPT(g, "-0.5E-3");
    REJECT(g, "-");
    REJECT(g, "1e");
    dsv4_grammar_free(g);
}

static void test_schema_errors(void) {
    CHECK_CONTAINS(schema_error("{\"type\":\"integer\",\"minimum\":0}"), "\"minimum\" is not supported");
    CHECK_CONTAINS(
        schema_error("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}"),
        "schema.properties.a: keyword \"pattern\"");
    CHECK_CONTAINS(schema_error("{\"$ref\":\"#/x\"}"), "\"$ref\"");
    CHECK_CONTAINS(schema_error("{\"type\":\"strange\"}"), "unknown type");
    CHECK_CONTAINS(schema_error("{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}"), "anyOf");
    CHECK_CONTAINS(schema_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}"),
                   "\"b\", which is not in");
    CHECK_CONTAINS(schema_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}"), "minItems");
    CHECK_CONTAINS(schema_error("{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}"), "tuples");
    CHECK_CONTAINS(schema_error("{\"enum\":[]}"), "enum");
    CHECK_CONTAINS(schema_error("[1]"), "must be an object");
}

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"unit\":{\"enum\":["
    "\"c\",\"f\"]}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

#define DS DSV4_GRAMMAR_SYM_DSML /* the grammar's byte for the ｜DSML｜ token */
#define DS_TEXT                                                                                              \
    "\xef\xbd\x9c"                                                                                           \
    "DSML"                                                                                                   \
    "\xef\xbd\x9c"

static void test_dsml(void) {
    cJSON *tools = cJSON_Parse(k_tools);
    dsv4_grammar *g = NULL;
    dsv4_err err = {0};
    CHECK_MSG(dsv4_grammar_for_tools(tools, NULL, &g, &err) == 0, "%s", err.msg);
    if (!g) {
        cJSON_Delete(tools);
        return;
    }
    const char *one =
        "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n<" DS
        "parameter name=\"city\" string=\"true\">Paris</" DS "parameter>\n<" DS
        "parameter name=\"days\" string=\"false\">3</" DS "parameter>\n</" DS "invoke>\n</" DS "tool_calls>";
    ACCEPT(g, one);
    const char *two =
        "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"now\">\n\n</" DS "invoke>\n<" DS
        "invoke name=\"get_weather\">\n<" DS "parameter name=\"unit\" string=\"false\">\"f\"</" DS
        "parameter>\n<" DS "parameter name=\"city\" string=\"false\">\"Rome\"</" DS "parameter>\n</" DS
        "invoke>\n</" DS "tool_calls>";
    ACCEPT(g, two);
    /* city is required */
    REJECT(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n\n</" DS "invoke>\n</" DS
              "tool_calls>");
    /* unknown tool, unknown parameter, bad JSON value, raw value for a non-string */
    CHECK(!prefix_ok(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_w\""));
    CHECK(!prefix_ok(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n<" DS
                        "parameter name=\"x\""));
    CHECK(!prefix_ok(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n<" DS
                        "parameter name=\"days\" string=\"false\">3.5"));
    CHECK(!prefix_ok(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n<" DS
                        "parameter name=\"days\" string=\"true\""));
    CHECK(!prefix_ok(g, "Sure!"));
    dsv4_grammar_free(g);

    /* named: that tool, exactly once */
    CHECK_MSG(dsv4_grammar_for_tools(tools, "now", &g, &err) == 0, "%s", err.msg);
    if (g) {
        ACCEPT(g,
               "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"now\">\n\n</" DS "invoke>\n</" DS "tool_calls>");
        REJECT(g, one);
        REJECT(g, "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"now\">\n\n</" DS "invoke>\n<" DS
                  "invoke name=\"now\">\n\n</" DS "invoke>\n</" DS "tool_calls>");
        dsv4_grammar_free(g);
    }
    CHECK(dsv4_grammar_for_tools(tools, "missing", &g, &err) == DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "\"missing\"");
    cJSON_Delete(tools);
}

/* --- random walks over the real vocabulary ------------------------------- */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int bit(const uint32_t *m, int i) {
    return (m[i >> 5] >> (i & 31)) & 1;
}

/*
 * Walk: at each step take the mask, check it is non-empty and agrees with
 * accept on sampled ids (all ids on some steps), then pick a token: often a
 * "closing" one (EOS, } ] " digits) so walks finish, else uniform among the
 * allowed. Returns the text when the walk ended with EOS (malloc'd), or NULL.
 */
static char *walk(const dsv4_tokenizer *tok, const dsv4_gvocab *v, const dsv4_grammar *g, int steps,
                  int full_every) {
    int V = dsv4_gvocab_size(v);
    uint32_t *m = malloc(sizeof(uint32_t) * (size_t)((V + 31) / 32));
    void *scratch = malloc(dsv4_gvocab_scratch_bytes(v));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)V);
    size_t cap = 1 << 16, len = 0;
    char *text = calloc(cap, 1);
    dsv4_grammar_state s;
    dsv4_grammar_init(g, &s);
    static const char *const closers[] = {"}", "]", "\"", "0", "\n</", "</", ">", "\n", "1"};
    int32_t eos = dsv4_gvocab_eos(v), done = 0, bad = 0;
    for (int step = 0; step < steps && !done && !bad; step++) {
        int n = dsv4_gvocab_mask(v, g, &s, m, scratch);
        CHECK_MSG(n > 0, "empty mask at step %d after \"%s\"", step, text);
        if (n <= 0) break;
        /* mask vs accept */
        int checks = step % full_every == 0 ? V : 300;
        for (int k = 0; k < checks; k++) {
            int32_t id = checks == V ? k : (int32_t)(rnd() % (uint32_t)V);
            dsv4_grammar_state t = s;
            int acc = dsv4_gvocab_accept(v, g, &t, id);
            if (acc != bit(m, id)) {
                CHECK_MSG(0, "token %d: mask %d accept %d after \"%s\"", id, bit(m, id), acc, text);
                bad = 1;
                break;
            }
        }
        int cnt = 0;
        for (int i = 0; i < V; i++)
            if (bit(m, i)) ids[cnt++] = i;
        CHECK_EQ_INT(cnt, n);
        int32_t pick = -1;
        if (rnd() % 100 < 60) {
            if (bit(m, eos)) pick = eos;
            for (int c = 0; pick < 0 && c < (int)(sizeof closers / sizeof *closers); c++) {
                int32_t id = dsv4_tokenizer_token_to_id(tok, closers[c]);
                if (id >= 0 && bit(m, id) && rnd() % 2) pick = id;
            }
        }
        if (pick < 0) pick = ids[rnd() % (uint32_t)cnt];
        if (pick == eos) {
            done = 1;
            break;
        }
        CHECK(dsv4_gvocab_accept(v, g, &s, pick));
        size_t bl = 0;
        const char *b = dsv4_tokenizer_token_bytes(tok, pick, &bl);
        if (len + bl + 1 < cap) {
            memcpy(text + len, b, bl);
            len += bl;
        }
    }
    free(m);
    free(scratch);
    free(ids);
    if (!done) {
        free(text);
        return NULL;
    }
    return text;
}

static void test_walks(void) {
    dsv4_tokenizer *tok = tm_load_tokenizer();
    if (!tok) return;
    int32_t dsml = dsv4_tokenizer_special_id(tok, DS_TEXT);
    int32_t eos = dsv4_tokenizer_special_id(tok, "<\xef\xbd\x9c"
                                                 "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
    CHECK(dsml > 0 && eos >= 0);
    dsv4_gvocab *v = NULL;
    dsv4_err err = {0};
    CHECK_MSG(dsv4_gvocab_create(tok, dsv4_tokenizer_vocab_size(tok), eos, &dsml, 1, &v, &err) == 0, "%s",
              err.msg);
    if (!v) {
        dsv4_tokenizer_free(tok);
        return;
    }
    const char *schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
        "\"n\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},\"xs\":{\"type\":\"array\",\"items\":"
        "{\"type\":\"number\"},\"maxItems\":3},\"kind\":{\"enum\":[\"a\",\"b\",7]}},"
        "\"required\":[\"name\",\"n\",\"ok\",\"kind\"],\"additionalProperties\":false}",
    };
    int finished = 0;
    for (int si = 0; si < 2; si++) {
        dsv4_grammar *g = schema_grammar(schemas[si]);
        if (!g) continue;
        for (int w = 0; w < 6; w++) {
            char *text = walk(tok, v, g, 400, w == 0 ? 25 : 1000);
            if (!text) continue;
            finished++;
            cJSON *j = cJSON_Parse(text);
            CHECK_MSG(cJSON_IsObject(j), "walk output does not parse as an object: %s", text);
            if (si == 1 && j) {
                CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "name")));
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "n");
                CHECK(cJSON_IsNumber(n) && n->valuedouble == floor(n->valuedouble));
                CHECK(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "ok")));
                CHECK(cJSON_GetObjectItemCaseSensitive(j, "kind") != NULL);
                CHECK(cJSON_GetArraySize(j) <= 5);
            }
            cJSON_Delete(j);
            free(text);
        }
        dsv4_grammar_free(g);
    }
    CHECK_MSG(finished >= 4, "only %d of 12 walks finished", finished);
    /* DSML: the walk's output is a complete block naming a known tool */
    cJSON *tools = cJSON_Parse(k_tools);
    dsv4_grammar *g = NULL;
    CHECK(dsv4_grammar_for_tools(tools, NULL, &g, &err) == 0);
    int dfin = 0;
    for (int w = 0; g && w < 6; w++) {
        char *text = walk(tok, v, g, 400, w == 0 ? 40 : 1000);
        if (!text) continue;
        dfin++;
        const char *opener = "\n\n<" DS_TEXT "tool_calls>\n<" DS_TEXT "invoke name=\"";
        CHECK(!strncmp(text, opener, strlen(opener)));
        CHECK(strstr(text, "</" DS_TEXT "tool_calls>") != NULL);
        free(text);
    }
    CHECK_MSG(dfin >= 2, "only %d of 6 DSML walks finished", dfin);
    if (g) { /* where the marker goes, the ｜DSML｜ token is the only choice (no byte spelling) */
        dsv4_grammar_state s;
        dsv4_grammar_init(g, &s);
        CHECK(dsv4_grammar_bytes(g, &s, "\n\n<", 3));
        uint32_t *m = malloc(sizeof(uint32_t) * (size_t)((dsv4_gvocab_size(v) + 31) / 32));
        void *scratch = malloc(dsv4_gvocab_scratch_bytes(v));
        CHECK_EQ_INT(dsv4_gvocab_mask(v, g, &s, m, scratch), 1);
        CHECK(bit(m, dsml));
        free(m);
        free(scratch);
    }
    dsv4_grammar_free(g);
    cJSON_Delete(tools);

    /* the request-level processor: unarmed until </think>, then masked */
    g = schema_grammar(NULL);
    int32_t think_end = dsv4_tokenizer_special_id(tok, "</think>");
    dsv4_constraint *c = NULL;
    if (g && dsv4_constraint_create(v, g, 1, think_end, &c, &err) == 0) {
        int V = dsv4_gvocab_size(v);
        float *lg = calloc((size_t)V, sizeof(float));
        int32_t hist[3] = {100, think_end, dsv4_tokenizer_token_to_id(tok, "{")};
        dsv4_constraint_logits(c, hist, 1, lg, V);
        CHECK(lg[100] == 0.0f && lg[eos] == 0.0f); /* reasoning: free */
        dsv4_constraint_logits(c, hist, 2, lg, V);
        CHECK(lg[hist[2]] == 0.0f && lg[100] < -1e30f && lg[eos] < -1e30f);
        for (int i = 0; i < V; i++)
            lg[i] = 0;
        dsv4_constraint_logits(c, hist, 3, lg, V);
        int32_t close = dsv4_tokenizer_token_to_id(tok, "}");
        CHECK(lg[close] == 0.0f && lg[hist[2]] < -1e30f);
        free(lg);
        dsv4_constraint_free(c);
    }
    dsv4_grammar_free(g);
    dsv4_gvocab_free(v);
    dsv4_tokenizer_free(tok);
}

int main(void) {
    test_json_object();
    test_schema_object();
    test_schema_scalars();
    test_schema_errors();
    test_dsml();
    test_walks();
    return TEST_REPORT();
}
