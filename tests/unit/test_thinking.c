/*
 * dsv4_thinking_resolve against every row of spec/SERVING.md §2 (precedence,
 * sources, boolean coercion), the request-value mapping table of §1.10 for
 * both profiles, §6.4 (none + thinking true) and §8.1 (server defaults lowest).
 */
#include <string.h>

#include "test.h"
#include "text/thinking.h"

typedef struct row {
    const char *body;       /* request JSON */
    dsv4_effort_profile p;
    dsv4_effort def_thinking, def_effort;
    int want_rc, want_thinking;
    dsv4_effort want_effort;
    int want_forced_off;
    const char *err_has;    /* substring of the error message */
} row;

#define P7 DSV4_PROFILE_0731
#define PP DSV4_PROFILE_PREVIEW
#define N DSV4_EFFORT_NONE
#define L DSV4_EFFORT_LOW
#define H DSV4_EFFORT_HIGH
#define M DSV4_EFFORT_MAX
#define E DSV4_EINVAL

static const row rows[] = {
    /* rule 4: server default off (§0.3, §8.1) */
    {"{}", P7, N, H, 0, 0, N, 0, NULL},
    {"{}", PP, N, H, 0, 0, N, 0, NULL},
    /* rule 4: --default-thinking level; request values still win */
    {"{}", P7, M, H, 0, 1, M, 0, NULL},
    {"{}", P7, L, H, 0, 1, L, 0, NULL},
    {"{}", PP, L, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"high\"}", P7, M, H, 0, 1, H, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":false}}", P7, M, H, 0, 0, N, 0, NULL},
    /* rule 1: none/off beats any switch (§6.4 trap) */
    {"{\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"thinking\":true}}", P7, N, H, 0, 0, N, 1, NULL},
    {"{\"reasoning_effort\":\"off\",\"chat_template_kwargs\":{\"thinking\":true}}", PP, N, H, 0, 0, N, 1, NULL},
    {"{\"chat_template_kwargs\":{\"reasoning_effort\":\"none\"},\"thinking\":true}", P7, N, H, 0, 0, N, 1, NULL},
    {"{\"reasoning\":{\"effort\":\"off\"},\"enable_thinking\":true}", P7, N, H, 0, 0, N, 1, NULL},
    {"{\"reasoning_effort\":\"none\"}", P7, M, H, 0, 0, N, 0, NULL},
    {"{\"reasoning_effort\":\"NONE\"}", P7, N, H, 0, 0, N, 0, NULL},
    /* rule 2: explicit switches, most specific first; string "false" is off */
    {"{\"chat_template_kwargs\":{\"thinking\":true}}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":\"false\"}}", P7, N, H, 0, 0, N, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":\"false\"}}", P7, H, H, 0, 0, N, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":false},\"reasoning_effort\":\"max\"}", P7, N, H, 0, 0, N, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":false},\"thinking\":true}", P7, N, H, 0, 0, N, 0, NULL},
    {"{\"chat_template_kwargs\":{\"enable_thinking\":true},\"thinking\":false}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"chat_template_kwargs\":{\"thinking\":null,\"enable_thinking\":\"on\"}}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"thinking\":{\"type\":\"enabled\"}}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"thinking\":{\"type\":\"disabled\"},\"enable_thinking\":true}", P7, N, H, 0, 0, N, 0, NULL},
    {"{\"enable_thinking\":\"YES\"}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"thinking\":1}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"thinking\":0}", P7, M, H, 0, 0, N, 0, NULL},
    {"{\"thinking\":\"\"}", P7, M, H, 0, 0, N, 0, NULL},
    {"{\"thinking\":\"No\"}", P7, N, H, 0, 0, N, 0, NULL},
    {"{\"thinking\":\"1\"}", P7, N, H, 0, 1, H, 0, NULL},
    /* thinking on, no effort: --default-thinking level, else --default-reasoning-effort */
    {"{\"thinking\":true}", P7, N, L, 0, 1, L, 0, NULL},
    {"{\"thinking\":true}", PP, N, L, 0, 1, H, 0, NULL},
    {"{\"thinking\":true}", P7, N, M, 0, 1, M, 0, NULL},
    {"{\"thinking\":true}", P7, L, M, 0, 1, L, 0, NULL},
    /* rule 3: an effort value alone turns thinking on; §1.10 mapping, both profiles */
    {"{\"reasoning_effort\":\"minimal\"}", P7, N, H, 0, 1, L, 0, NULL},
    {"{\"reasoning_effort\":\"minimal\"}", PP, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"low\"}", P7, N, H, 0, 1, L, 0, NULL},
    {"{\"reasoning_effort\":\"low\"}", PP, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"medium\"}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"medium\"}", PP, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"high\"}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"high\"}", PP, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"xhigh\"}", P7, N, H, 0, 1, H, 0, NULL},
    {"{\"reasoning_effort\":\"xhigh\"}", PP, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":\"max\"}", P7, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":\"max\"}", PP, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":\"ultra\"}", P7, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":\"Max\"}", P7, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":null}", P7, N, H, 0, 0, N, 0, NULL},
    /* effort sources, most specific first */
    {"{\"chat_template_kwargs\":{\"reasoning_effort\":\"max\"},\"reasoning_effort\":\"low\"}", P7, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning_effort\":\"low\",\"reasoning\":{\"effort\":\"max\"}}", P7, N, H, 0, 1, L, 0, NULL},
    {"{\"reasoning\":{\"effort\":\"max\"}}", P7, N, H, 0, 1, M, 0, NULL},
    {"{\"reasoning\":{\"effort\":\"low\"},\"chat_template_kwargs\":{\"thinking\":true}}", P7, N, H, 0, 1, L, 0, NULL},
    /* errors: 400 naming the parameter, never "invalid JSON" */
    {"{\"reasoning_effort\":\"turbo\"}", P7, N, H, E, 0, N, 0, "reasoning_effort: unknown value \"turbo\""},
    {"{\"reasoning_effort\":3}", P7, N, H, E, 0, N, 0, "reasoning_effort"},
    {"{\"chat_template_kwargs\":{\"reasoning_effort\":\"hi\"}}", P7, N, H, E, 0, N, 0, "chat_template_kwargs.reasoning_effort"},
    {"{\"reasoning\":{\"effort\":\"x\"}}", P7, N, H, E, 0, N, 0, "reasoning.effort"},
    {"{\"chat_template_kwargs\":{\"thinking\":\"maybe\"}}", P7, N, H, E, 0, N, 0, "chat_template_kwargs.thinking"},
    {"{\"chat_template_kwargs\":{\"enable_thinking\":2}}", P7, N, H, E, 0, N, 0, "chat_template_kwargs.enable_thinking"},
    {"{\"thinking\":{\"type\":\"auto\"}}", P7, N, H, E, 0, N, 0, "thinking.type"},
    {"{\"enable_thinking\":[]}", P7, N, H, E, 0, N, 0, "enable_thinking"},
    {"{\"chat_template_kwargs\":{\"drop_thinking\":\"perhaps\"}}", P7, N, H, E, 0, N, 0, "chat_template_kwargs.drop_thinking"},
    {"{\"chat_template_kwargs\":7}", P7, N, H, E, 0, N, 0, "chat_template_kwargs"},
    {"{}", DSV4_PROFILE_AUTO, N, H, E, 0, N, 0, "profile"},
};

int main(void)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *r = &rows[i];
        cJSON *req = cJSON_Parse(r->body);
        CHECK(req != NULL);
        dsv4_thinking_defaults d;
        dsv4_thinking_defaults_init(&d, r->p);
        d.default_thinking = r->def_thinking;
        d.default_reasoning_effort = r->def_effort;
        dsv4_thinking t = {-1, -1, -1, -1};
        dsv4_err err = {0};
        int rc = dsv4_thinking_resolve(req, &d, &t, &err);
        CHECK_MSG(rc == r->want_rc, "row %zu %s: rc %d (%s)", i, r->body, rc, err.msg);
        if (rc == 0 && r->want_rc == 0) {
            CHECK_MSG(t.thinking == r->want_thinking && t.effort == r->want_effort &&
                      t.forced_off == r->want_forced_off,
                      "row %zu %s [%s]: got thinking=%d effort=%s forced_off=%d", i, r->body,
                      dsv4_profile_name(r->p), t.thinking, dsv4_effort_name(t.effort), t.forced_off);
            CHECK(t.drop_thinking == 1);
        }
        if (r->err_has) CHECK_CONTAINS(err.msg, r->err_has);
        cJSON_Delete(req);
    }

    /* drop_thinking is read from chat_template_kwargs only */
    {
        cJSON *req = cJSON_Parse("{\"chat_template_kwargs\":{\"drop_thinking\":false,\"thinking\":true}}");
        dsv4_thinking_defaults d;
        dsv4_thinking_defaults_init(&d, P7);
        dsv4_thinking t;
        CHECK(dsv4_thinking_resolve(req, &d, &t, NULL) == 0);
        CHECK_EQ_INT(t.drop_thinking, 0);
        cJSON_Delete(req);
        CHECK(dsv4_thinking_resolve(NULL, &d, &t, NULL) == 0);
        CHECK_EQ_INT(t.thinking, 0);
    }
    /* CLI parsers */
    {
        dsv4_effort e;
        dsv4_effort_profile p;
        dsv4_err err = {0};
        CHECK(dsv4_effort_parse("off", 1, &e, NULL) == 0 && e == N);
        CHECK(dsv4_effort_parse("max", 0, &e, NULL) == 0 && e == M);
        CHECK(dsv4_effort_parse("off", 0, &e, &err) == E);
        CHECK_CONTAINS(err.msg, "\"off\"");
        CHECK(dsv4_profile_parse("0731", &p, NULL) == 0 && p == P7);
        CHECK(dsv4_profile_parse("preview", &p, NULL) == 0 && p == PP);
        CHECK(dsv4_profile_parse("auto", &p, NULL) == 0 && p == DSV4_PROFILE_AUTO);
        CHECK(dsv4_profile_parse("0732", &p, &err) == E);
        CHECK_CONTAINS(err.msg, "0732");
    }
    return TEST_REPORT();
}
