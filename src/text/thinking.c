/*
 * text/thinking.c — resolve (thinking, effort) once per request
 * (spec/SERVING.md §2). See thinking.h for the contract.
 *
 * Deviation kept on purpose (§2): vLLM uses Python truthiness for the
 * thinking switch, so the string "false" turned thinking ON. Here every
 * switch goes through one explicit coercion table.
 */
#include "text/thinking.h"

#include <strings.h>
#include <string.h>

void dsv4_thinking_defaults_init(dsv4_thinking_defaults *d, dsv4_effort_profile profile)
{
    d->profile = profile;
    d->default_thinking = DSV4_EFFORT_NONE;
    d->default_reasoning_effort = DSV4_EFFORT_HIGH;
    d->default_drop_thinking = 1;
}

const char *dsv4_effort_name(dsv4_effort e)
{
    switch (e) {
    case DSV4_EFFORT_LOW: return "low";
    case DSV4_EFFORT_HIGH: return "high";
    case DSV4_EFFORT_MAX: return "max";
    default: return "none";
    }
}

const char *dsv4_profile_name(dsv4_effort_profile p)
{
    switch (p) {
    case DSV4_PROFILE_PREVIEW: return "preview";
    case DSV4_PROFILE_0731: return "0731";
    default: return "auto";
    }
}

int dsv4_effort_parse(const char *s, int allow_off, dsv4_effort *out, dsv4_err *err)
{
    if (s && !strcmp(s, "low")) *out = DSV4_EFFORT_LOW;
    else if (s && !strcmp(s, "high")) *out = DSV4_EFFORT_HIGH;
    else if (s && !strcmp(s, "max")) *out = DSV4_EFFORT_MAX;
    else if (s && allow_off && (!strcmp(s, "off") || !strcmp(s, "none"))) *out = DSV4_EFFORT_NONE;
    else
        return dsv4_err_set(err, DSV4_EINVAL, "invalid effort \"%s\" (expected %slow, high or max)",
                            s ? s : "(null)", allow_off ? "off, " : "");
    return DSV4_OK;
}

int dsv4_profile_parse(const char *s, dsv4_effort_profile *out, dsv4_err *err)
{
    if (s && !strcmp(s, "auto")) *out = DSV4_PROFILE_AUTO;
    else if (s && !strcmp(s, "preview")) *out = DSV4_PROFILE_PREVIEW;
    else if (s && !strcmp(s, "0731")) *out = DSV4_PROFILE_0731;
    else
        return dsv4_err_set(err, DSV4_EINVAL,
                            "invalid reasoning-effort profile \"%s\" (expected auto, preview or 0731)",
                            s ? s : "(null)");
    return DSV4_OK;
}

/* Request effort spellings (§1.10). OFF is a distinct outcome, not a level. */
enum { REQ_ABSENT = 0, REQ_OFF, REQ_LOW, REQ_MEDIUM, REQ_HIGH, REQ_XHIGH, REQ_MAX };

static int effort_value(const cJSON *v, const char *param, int *out, dsv4_err *err)
{
    static const struct { const char *s; int v; } tab[] = {
        {"none", REQ_OFF}, {"off", REQ_OFF}, {"minimal", REQ_LOW}, {"low", REQ_LOW},
        {"medium", REQ_MEDIUM}, {"high", REQ_HIGH}, {"xhigh", REQ_XHIGH},
        {"max", REQ_MAX}, {"ultra", REQ_MAX},
    };
    *out = REQ_ABSENT;
    if (!v || cJSON_IsNull(v)) return DSV4_OK;
    if (!cJSON_IsString(v) || !v->valuestring)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "%s: must be a string (none, off, minimal, low, medium, high, xhigh, max, ultra)",
                            param);
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcasecmp(v->valuestring, tab[i].s)) {
            *out = tab[i].v;
            return DSV4_OK;
        }
    return dsv4_err_set(err, DSV4_EINVAL,
                        "%s: unknown value \"%.64s\" (expected none, off, minimal, low, medium, high, "
                        "xhigh, max or ultra)", param, v->valuestring);
}

/* Boolean coercion for every thinking switch (§2). *out: -1 absent, 0, 1. */
static int bool_value(const cJSON *v, const char *field, int *out, dsv4_err *err)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off", ""};
    *out = -1;
    if (!v || cJSON_IsNull(v)) return DSV4_OK;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        return DSV4_OK;
    }
    if (cJSON_IsNumber(v) && (v->valuedouble == 0.0 || v->valuedouble == 1.0)) {
        *out = v->valuedouble == 1.0;
        return DSV4_OK;
    }
    if (cJSON_IsString(v) && v->valuestring) {
        for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
            if (!strcasecmp(v->valuestring, yes[i])) { *out = 1; return DSV4_OK; }
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
            if (!strcasecmp(v->valuestring, no[i])) { *out = 0; return DSV4_OK; }
    }
    return dsv4_err_set(err, DSV4_EINVAL,
                        "%s: expected a boolean (true/false, 0/1, or \"true\"/\"false\"/\"yes\"/\"no\"/"
                        "\"on\"/\"off\")", field);
}

/* Top-level `thinking` also takes DeepSeek's {"type": "enabled"|"disabled"}. */
static int thinking_field(const cJSON *v, int *out, dsv4_err *err)
{
    if (cJSON_IsObject(v)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "enabled")) { *out = 1; return DSV4_OK; }
        if (cJSON_IsString(t) && !strcmp(t->valuestring, "disabled")) { *out = 0; return DSV4_OK; }
        return dsv4_err_set(err, DSV4_EINVAL, "thinking.type: expected \"enabled\" or \"disabled\"");
    }
    return bool_value(v, "thinking", out, err);
}

/* Map a level (request or default) onto the profile's prefix table (§1.10). */
static dsv4_effort map_level(int req, dsv4_effort_profile p)
{
    switch (req) {
    case REQ_LOW: return p == DSV4_PROFILE_0731 ? DSV4_EFFORT_LOW : DSV4_EFFORT_HIGH;
    case REQ_MEDIUM: return DSV4_EFFORT_HIGH; /* vendor mapping; vLLM maps medium->low (Deviation) */
    case REQ_HIGH: return DSV4_EFFORT_HIGH;
    case REQ_XHIGH: return p == DSV4_PROFILE_0731 ? DSV4_EFFORT_HIGH : DSV4_EFFORT_MAX;
    case REQ_MAX: return DSV4_EFFORT_MAX;
    default: return DSV4_EFFORT_NONE;
    }
}

static int level_to_req(dsv4_effort e)
{
    return e == DSV4_EFFORT_LOW ? REQ_LOW : e == DSV4_EFFORT_HIGH ? REQ_HIGH
         : e == DSV4_EFFORT_MAX ? REQ_MAX : REQ_ABSENT;
}

int dsv4_thinking_resolve(const cJSON *request, const dsv4_thinking_defaults *d,
                          dsv4_thinking *out, dsv4_err *err)
{
    if (!d || (d->profile != DSV4_PROFILE_PREVIEW && d->profile != DSV4_PROFILE_0731))
        return dsv4_err_set(err, DSV4_EINVAL, "thinking resolver: reasoning-effort profile not resolved");
    if (request && !cJSON_IsObject(request))
        return dsv4_err_set(err, DSV4_EINVAL, "request body: expected a JSON object");
    const cJSON *ctk = request ? cJSON_GetObjectItemCaseSensitive(request, "chat_template_kwargs") : NULL;
    if (ctk && !cJSON_IsNull(ctk) && !cJSON_IsObject(ctk))
        return dsv4_err_set(err, DSV4_EINVAL, "chat_template_kwargs: expected an object");
    if (!cJSON_IsObject(ctk)) ctk = NULL;
    const cJSON *reasoning = request ? cJSON_GetObjectItemCaseSensitive(request, "reasoning") : NULL;
    if (!cJSON_IsObject(reasoning)) reasoning = NULL;

    /* Effort sources, most specific first. */
    const struct { const cJSON *v; const char *param; } esrc[3] = {
        {ctk ? cJSON_GetObjectItemCaseSensitive(ctk, "reasoning_effort") : NULL,
         "chat_template_kwargs.reasoning_effort"},
        {request ? cJSON_GetObjectItemCaseSensitive(request, "reasoning_effort") : NULL, "reasoning_effort"},
        {reasoning ? cJSON_GetObjectItemCaseSensitive(reasoning, "effort") : NULL, "reasoning.effort"},
    };
    int req_effort = REQ_ABSENT, any_off = 0;
    for (int i = 0; i < 3; i++) {
        int v;
        int rc = effort_value(esrc[i].v, esrc[i].param, &v, err);
        if (rc) return rc;
        if (v == REQ_OFF) any_off = 1;
        if (req_effort == REQ_ABSENT && v != REQ_ABSENT) req_effort = v;
    }

    /* Thinking switches, most specific first; all present ones must coerce. */
    int sw = -1;
    {
        int v, rc;
        if (ctk) {
            rc = bool_value(cJSON_GetObjectItemCaseSensitive(ctk, "thinking"),
                            "chat_template_kwargs.thinking", &v, err);
            if (rc) return rc;
            if (sw < 0) sw = v;
            rc = bool_value(cJSON_GetObjectItemCaseSensitive(ctk, "enable_thinking"),
                            "chat_template_kwargs.enable_thinking", &v, err);
            if (rc) return rc;
            if (sw < 0) sw = v;
        }
        if (request) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(request, "thinking");
            v = -1;
            if (t && !cJSON_IsNull(t)) {
                rc = thinking_field(t, &v, err);
                if (rc) return rc;
            }
            if (sw < 0) sw = v;
            rc = bool_value(cJSON_GetObjectItemCaseSensitive(request, "enable_thinking"),
                            "enable_thinking", &v, err);
            if (rc) return rc;
            if (sw < 0) sw = v;
        }
    }

    int drop = d->default_drop_thinking ? 1 : 0;
    if (ctk) {
        int v;
        int rc = bool_value(cJSON_GetObjectItemCaseSensitive(ctk, "drop_thinking"),
                            "chat_template_kwargs.drop_thinking", &v, err);
        if (rc) return rc;
        if (v >= 0) drop = v;
    }

    dsv4_thinking r = {0};
    r.drop_thinking = drop;
    if (any_off) {                       /* rule 1 */
        r.thinking = 0;
        r.forced_off = sw == 1;
    } else if (sw >= 0) {                /* rule 2 */
        r.thinking = sw;
    } else if (req_effort != REQ_ABSENT) { /* rule 3 */
        r.thinking = 1;
    } else {                             /* rule 4 */
        r.thinking = d->default_thinking != DSV4_EFFORT_NONE;
    }
    if (r.thinking) {
        int lvl = req_effort;
        if (lvl == REQ_ABSENT) lvl = level_to_req(d->default_thinking);
        if (lvl == REQ_ABSENT) lvl = level_to_req(d->default_reasoning_effort);
        if (lvl == REQ_ABSENT) lvl = REQ_HIGH;
        r.effort = map_level(lvl, d->profile);
    }
    *out = r;
    return DSV4_OK;
}
