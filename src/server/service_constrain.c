/*
 * Request fields that constrain the output: tool_choice and response_format
 * (spec/SERVING.md §3.3, §4.6; src/engine/grammar.h does the enforcing).
 *
 * Why refuse so much: a constraint the server cannot enforce must not be
 * served as if it were (vLLM #53363: required silently ignored). Every
 * schema keyword outside the supported subset is a 400 naming it.
 */
#include <string.h>

#include "server/service_internal.h"

static int tool_choice_grammar(const cJSON *req, const cJSON *tc, dsv4_req_params *p, dsv4_reply *out) {
    const char *only = NULL;
    if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm)) {
            dsv4_reply_error(
                out, 400, "tool_choice",
                "`tool_choice` object must be {\"type\":\"function\",\"function\":{\"name\":...}}");
            return 1;
        }
        only = nm->valuestring;
    }
    dsv4_err err = {0};
    if (dsv4_grammar_for_tools(cJSON_GetObjectItemCaseSensitive(req, "tools"), only, &p->grammar, &err)) {
        dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500,
                         only && strstr(err.msg, "tool_choice") ? "tool_choice" : "tools", "%s", err.msg);
        return 1;
    }
    return 0;
}

static int constraint_grammar(const cJSON *req, int chat, const cJSON *so_json, dsv4_req_params *p,
                              dsv4_reply *out);

/* vLLM's extra field structured_outputs: {"json": schema, "disable_any_whitespace": bool}
 * (the other vLLM keys, regex/choice/grammar/..., are refused by name). */
static int structured_outputs(const cJSON *req, const cJSON **json, int *compact, dsv4_reply *out) {
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "structured_outputs"), *k;
    if (!so || cJSON_IsNull(so)) return 0;
    if (!cJSON_IsObject(so)) {
        dsv4_reply_error(out, 400, "structured_outputs", "`structured_outputs` must be an object");
        return 1;
    }
    cJSON_ArrayForEach(k, so) {
        if (cJSON_IsNull(k)) continue;
        if (!strcmp(k->string, "disable_any_whitespace") && cJSON_IsBool(k))
            *compact = cJSON_IsTrue(k);
        else if (!strcmp(k->string, "json") && cJSON_IsObject(k))
            *json = k;
        else {
            dsv4_reply_error(
                out, 400, "structured_outputs",
                "`structured_outputs.%s` is not supported (supported: \"json\" as a schema object, "
                "\"disable_any_whitespace\" as a boolean)",
                k->string);
            return 1;
        }
    }
    return 0;
}

int dsv4_req_constraint_parse(dsv4_service *s, const cJSON *req, int chat, dsv4_req_params *p,
                              dsv4_reply *out) {
    (void)s;
    const cJSON *so_json = NULL;
    int compact = 0;
    if (structured_outputs(req, &so_json, &compact, out)) return 1;
    int rc = constraint_grammar(req, chat, so_json, p, out);
    if (!rc && p->grammar && compact) dsv4_grammar_set_max_ws(p->grammar, 0);
    return rc;
}

static int constraint_grammar(const cJSON *req, int chat, const cJSON *so_json, dsv4_req_params *p,
                              dsv4_reply *out) {
    /* tools exist on chat only; /v1/completions takes response_format and structured_outputs */
    const cJSON *tc = chat ? cJSON_GetObjectItemCaseSensitive(req, "tool_choice") : NULL;
    int tc_constrains = 0;
    /* §3.3: "auto", "none", "required" or an object; any other value (a typo
     * such as "any") is refused, not read as auto */
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required"))
            tc_constrains = 1;
        else if (cJSON_IsObject(tc))
            tc_constrains = 1;
        else if (!(cJSON_IsString(tc) &&
                   (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "none")))) {
            dsv4_reply_error(out, 400, "tool_choice",
                             "`tool_choice` must be \"auto\", \"none\", \"required\" or "
                             "{\"type\":\"function\",\"function\":{\"name\":...}}");
            return 1;
        }
    }
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
    const cJSON *rft = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (rf && !cJSON_IsNull(rf) &&
        !(cJSON_IsObject(rf) && cJSON_IsString(rft) &&
          (!strcmp(rft->valuestring, "text") || !strcmp(rft->valuestring, "json_object") ||
           !strcmp(rft->valuestring, "json_schema")))) {
        dsv4_reply_error(out, 400, "response_format",
                         "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"");
        return 1;
    }
    int rf_constrains = cJSON_IsString(rft) && strcmp(rft->valuestring, "text") != 0;
    if (so_json && (rf_constrains || tc_constrains)) {
        dsv4_reply_error(out, 400, "structured_outputs",
                         "`structured_outputs.json` cannot be combined with %s",
                         rf_constrains ? "`response_format`" : "`tool_choice` required or named");
        return 1;
    }
    if (so_json) {
        dsv4_err err = {0};
        if (dsv4_grammar_from_schema(so_json, &p->grammar, &err)) {
            dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, "structured_outputs",
                             "structured_outputs json: %s", err.msg);
            return 1;
        }
        return 0;
    }
    if (tc_constrains && rf_constrains) {
        dsv4_reply_error(
            out, 400, "response_format",
            "`response_format` %s cannot be combined with `tool_choice` %s: the output is a tool call",
            rft->valuestring, cJSON_IsObject(tc) ? "naming a function" : "\"required\"");
        return 1;
    }
    if (tc_constrains) return tool_choice_grammar(req, tc, p, out);
    if (!rf_constrains) return 0;
    const cJSON *schema = NULL;
    if (!strcmp(rft->valuestring, "json_schema")) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
        if (!cJSON_IsObject(js)) {
            dsv4_reply_error(
                out, 400, "response_format",
                "`response_format.json_schema` must be an object {\"name\", \"schema\", \"strict\"}");
            return 1;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st)) {
            dsv4_reply_error(out, 400, "response_format",
                             "`response_format.json_schema.strict` must be a boolean");
            return 1;
        }
        /* strict true or false: the schema is enforced either way (as vLLM does) */
        schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        if (!schema) {
            dsv4_reply_error(out, 400, "response_format", "`response_format.json_schema.schema` is required");
            return 1;
        }
    }
    dsv4_err err = {0};
    if (dsv4_grammar_from_schema(schema, &p->grammar, &err)) {
        dsv4_reply_error(out, err.code == DSV4_EINVAL ? 400 : 500, "response_format",
                         "response_format json_schema: %s", err.msg);
        return 1;
    }
    return 0;
}
