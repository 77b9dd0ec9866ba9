/*
 * text/encoder.c — DeepSeek-V4 prompt rendering (spec/SERVING.md §1).
 *
 * Pipeline, mirroring the checkpoint encoder (encoding_dsv4.py) plus the
 * server layer around it:
 *   1. normalise the OpenAI messages (§1.3): flatten text parts with "\n",
 *      `function` -> `tool`, reasoning/reasoning_content, tool-call arguments
 *      as objects;
 *   2. attach request tools / response_format to the first system message,
 *      inserting an empty one at index 0 if there is none (vLLM 0.33 wrapper,
 *      §1.6, §1.9);
 *   3. merge tool results (and following user text) into user messages and
 *      re-order results by the preceding assistant's tool_calls ids (§1.3.4-5);
 *   4. in thinking mode with drop_thinking (forced off when tools are
 *      rendered): strip reasoning from assistants before the last user turn
 *      and remove earlier developer messages (§1.4);
 *   5. render each message and its transition, then the §1.11 anchors.
 * Every byte is recorded as special token, encoder markup or client content
 * (see encoder.h for why).
 */
#include "text/encoder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/encoder_json.h"

/* ---- effort prefixes (§1.10): the checkpoint encoder's literal texts ---- */

static const char HIGH_TEXT[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

static const char MAX_TEXT[] =
    "Reasoning Effort: Beyond maximum \xe2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, "
    "and resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and "
    "are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

const char *dsv4_encoder_effort_prefix(dsv4_effort_profile p, dsv4_effort e)
{
    if (p == DSV4_PROFILE_0731) {
        if (e == DSV4_EFFORT_HIGH) return HIGH_TEXT;
        if (e == DSV4_EFFORT_MAX) return MAX_TEXT;
        return "";
    }
    /* preview: only `max` has a prefix, and it is the text 0731 calls high */
    return e == DSV4_EFFORT_MAX ? HIGH_TEXT : "";
}

/* ---- tools block (§1.6), split at {tool_schemas} ---- */

#define DSML DSV4_TOK_DSML
static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
static const char RF_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* ---- prompt builder ---- */

typedef struct builder {
    dsv4_prompt *p;
    int oom;
} builder;

static void put(builder *b, dsv4_seg_kind kind, const char *s, size_t n)
{
    dsv4_prompt *p = b->p;
    if (b->oom || n == 0) return;
    if (p->len + n + 1 > p->cap_text) {
        size_t cap = p->cap_text ? p->cap_text : 1024;
        while (cap < p->len + n + 1) cap *= 2;
        char *t = realloc(p->text, cap);
        if (!t) { b->oom = 1; return; }
        p->text = t;
        p->cap_text = cap;
    }
    memcpy(p->text + p->len, s, n);
    if (kind != DSV4_SEG_SPECIAL && p->nsegs && p->segs[p->nsegs - 1].kind == kind) {
        p->segs[p->nsegs - 1].len += n;
    } else {
        if (p->nsegs == p->cap_segs) {
            size_t cap = p->cap_segs ? p->cap_segs * 2 : 64;
            dsv4_prompt_seg *sg = realloc(p->segs, cap * sizeof *sg);
            if (!sg) { b->oom = 1; return; }
            p->segs = sg;
            p->cap_segs = cap;
        }
        p->segs[p->nsegs++] = (dsv4_prompt_seg){kind, p->len, n};
    }
    p->len += n;
    p->text[p->len] = '\0';
}

static void special(builder *b, const char *tok) { put(b, DSV4_SEG_SPECIAL, tok, strlen(tok)); }
static void content(builder *b, const char *s) { if (s) put(b, DSV4_SEG_CONTENT, s, strlen(s)); }

/* Encoder text: split out the special-token strings it contains. */
static void markup(builder *b, const char *s)
{
    static const char *const toks[] = {DSV4_TOK_BOS, DSV4_TOK_EOS, DSV4_TOK_USER, DSV4_TOK_ASSISTANT,
                                       DSV4_TOK_REMINDER, DSV4_TOK_THINK, DSV4_TOK_END_THINK, DSV4_TOK_DSML};
    const char *run = s;
    while (*s) {
        size_t hit = 0;
        for (size_t i = 0; i < sizeof toks / sizeof toks[0] && !hit; i++) {
            size_t n = strlen(toks[i]);
            if (!strncmp(s, toks[i], n)) hit = n;
        }
        if (hit) {
            put(b, DSV4_SEG_MARKUP, run, (size_t)(s - run));
            put(b, DSV4_SEG_SPECIAL, s, hit);
            s += hit;
            run = s;
        } else {
            s++;
        }
    }
    put(b, DSV4_SEG_MARKUP, run, (size_t)(s - run));
}

void dsv4_prompt_free(dsv4_prompt *p)
{
    if (!p) return;
    free(p->text);
    free(p->segs);
    memset(p, 0, sizeof *p);
}

/* ---- normalised messages ---- */

enum { R_SYSTEM, R_DEVELOPER, R_USER, R_ASSISTANT, R_TOOL, R_REMINDER };

typedef struct tcall {
    const char *id, *name;
    const cJSON *args;               /* a JSON object */
    const dsv4_json_numbers *nums;   /* exact number text for args, or NULL */
} tcall;

typedef struct blk {
    int is_tool;
    const char *tool_id;
    const char *text;
} blk;

typedef struct msg {
    int role, src;          /* src: index in the request's messages (-1: inserted) */
    const char *content;    /* never NULL after normalisation */
    const char *reasoning;  /* NULL = none */
    tcall *calls;
    int ncalls;
    blk *blocks;            /* user messages after merge */
    int nblocks, capblocks;
    int tools, rf, wo_eos;
} msg;

/* Everything allocated while rendering, freed in one place. */
typedef struct arena {
    void **ptr;
    size_t n, cap;
    cJSON **json;
    size_t nj, capj;
    dsv4_json_numbers **nums;
    size_t nn, capn;
    int oom;
} arena;

static dsv4_json_numbers *arena_nums(arena *a)
{
    if (a->nn == a->capn) {
        size_t cap = a->capn ? a->capn * 2 : 8;
        dsv4_json_numbers **q = realloc(a->nums, cap * sizeof *q);
        if (!q) { a->oom = 1; return NULL; }
        a->nums = q;
        a->capn = cap;
    }
    dsv4_json_numbers *t = calloc(1, sizeof *t);
    if (!t) { a->oom = 1; return NULL; }
    a->nums[a->nn++] = t;
    return t;
}

static void *arena_keep(arena *a, void *p)
{
    if (!p) { a->oom = 1; return NULL; }
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        void **q = realloc(a->ptr, cap * sizeof *q);
        if (!q) { free(p); a->oom = 1; return NULL; }
        a->ptr = q;
        a->cap = cap;
    }
    a->ptr[a->n++] = p;
    return p;
}

static cJSON *arena_json(arena *a, cJSON *j)
{
    if (!j) { a->oom = 1; return NULL; }
    if (a->nj == a->capj) {
        size_t cap = a->capj ? a->capj * 2 : 8;
        cJSON **q = realloc(a->json, cap * sizeof *q);
        if (!q) { cJSON_Delete(j); a->oom = 1; return NULL; }
        a->json = q;
        a->capj = cap;
    }
    a->json[a->nj++] = j;
    return j;
}

static void arena_free(arena *a)
{
    for (size_t i = 0; i < a->n; i++) free(a->ptr[i]);
    for (size_t i = 0; i < a->nj; i++) cJSON_Delete(a->json[i]);
    for (size_t i = 0; i < a->nn; i++) {
        dsv4_json_numbers_free(a->nums[i]);
        free(a->nums[i]);
    }
    free(a->ptr);
    free(a->json);
    free(a->nums);
}

static int is_text_part(const char *t)
{
    return !strcmp(t, "text") || !strcmp(t, "input_text") || !strcmp(t, "output_text");
}

/* §1.3 rule 1: string | null | array of text parts, joined with "\n". */
static int flatten(const cJSON *c, int idx, arena *a, const char **out, dsv4_err *err)
{
    if (!c || cJSON_IsNull(c)) { *out = ""; return DSV4_OK; }
    if (cJSON_IsString(c)) { *out = c->valuestring ? c->valuestring : ""; return DSV4_OK; }
    if (!cJSON_IsArray(c))
        return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].content: expected a string, null or an array of parts", idx);
    dsv4_sbuf s = {0};
    int j = 0;
    for (const cJSON *part = c->child; part; part = part->next, j++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t) || !is_text_part(t->valuestring)) {
            dsv4_sbuf_free(&s);
            return dsv4_err_set(err, DSV4_EINVAL,
                                "messages[%d].content[%d]: unsupported content part%s%s%s (this checkpoint "
                                "accepts text parts only)", idx, j, cJSON_IsString(t) ? " type \"" : "",
                                cJSON_IsString(t) ? t->valuestring : "", cJSON_IsString(t) ? "\"" : "");
        }
        if (x && !cJSON_IsNull(x) && !cJSON_IsString(x)) {
            dsv4_sbuf_free(&s);
            return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].content[%d].text: expected a string", idx, j);
        }
        if (j) dsv4_sbuf_put(&s, "\n", 1);
        if (cJSON_IsString(x)) dsv4_sbuf_puts(&s, x->valuestring);
    }
    if (s.oom) { dsv4_sbuf_free(&s); return dsv4_err_set(err, DSV4_ENOMEM, "out of memory"); }
    if (!s.p) { *out = ""; return DSV4_OK; }
    *out = arena_keep(a, s.p);
    return a->oom ? dsv4_err_set(err, DSV4_ENOMEM, "out of memory") : DSV4_OK;
}

/* §1.3 rule 7: arguments as object, JSON string, "" / null -> {}. */
static int tool_args(const cJSON *fn, int i, int j, arena *a, const dsv4_encode_opts *o, tcall *tc, dsv4_err *err)
{
    const cJSON **out = &tc->args;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    tc->nums = NULL;
    if (cJSON_IsObject(args)) { *out = args; tc->nums = o->numbers; return DSV4_OK; }
    if (!args || cJSON_IsNull(args) || (cJSON_IsString(args) && !args->valuestring[0])) {
        *out = arena_json(a, cJSON_CreateObject());
        return *out ? DSV4_OK : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    if (!cJSON_IsString(args))
        return dsv4_err_set(err, DSV4_EINVAL,
                            "messages[%d].tool_calls[%d].function.arguments: expected a JSON string or an object", i, j);
    cJSON *parsed = cJSON_ParseWithOpts(args->valuestring, NULL, 1);
    if (!parsed) {
        /* Not JSON: keep it as one string parameter named `arguments`. */
        dsv4_log(DSV4_LOG_WARN, "messages[%d].tool_calls[%d].function.arguments is not JSON (%zu bytes); "
                 "rendering it as a single string parameter", i, j, strlen(args->valuestring));
        cJSON *o = arena_json(a, cJSON_CreateObject());
        if (!o || !cJSON_AddStringToObject(o, "arguments", args->valuestring))
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        *out = o;
        return DSV4_OK;
    }
    if (!cJSON_IsObject(parsed)) {
        cJSON_Delete(parsed);
        return dsv4_err_set(err, DSV4_EINVAL,
                            "messages[%d].tool_calls[%d].function.arguments: JSON must be an object", i, j);
    }
    *out = arena_json(a, parsed);
    if (!*out) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    /* we hold the raw text: keep Python's spelling of every number */
    dsv4_json_numbers *t = arena_nums(a);
    if (!t) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    int rc = dsv4_json_numbers_build(parsed, args->valuestring, strlen(args->valuestring), t);
    if (rc == DSV4_ENOMEM) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    tc->nums = t;
    return DSV4_OK;
}

static int role_of(const char *r)
{
    static const struct { const char *s; int r; } tab[] = {
        {"system", R_SYSTEM}, {"developer", R_DEVELOPER}, {"user", R_USER}, {"assistant", R_ASSISTANT},
        {"tool", R_TOOL}, {"function", R_TOOL}, {"latest_reminder", R_REMINDER},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(r, tab[i].s)) return tab[i].r;
    return -1;
}

static int normalise(const cJSON *messages, const dsv4_encode_opts *o, arena *a, msg *ms, int *nout,
                     int *cont, dsv4_err *err)
{
    int n = 0, rc;
    for (const cJSON *m = messages->child; m; m = m->next, n++) {
        msg *x = &ms[n];
        memset(x, 0, sizeof *x);
        x->src = n;
        if (!cJSON_IsObject(m)) return dsv4_err_set(err, DSV4_EINVAL, "messages[%d]: expected an object", n);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].role: missing or not a string", n);
        x->role = role_of(role->valuestring);
        if (x->role < 0)
            return dsv4_err_set(err, DSV4_EINVAL,
                                "messages[%d].role: unsupported role \"%.40s\" (expected system, developer, user, "
                                "assistant, tool, function or latest_reminder)", n, role->valuestring);
        if (x->role == R_DEVELOPER && o->developer_as_system) x->role = R_SYSTEM;
        if ((rc = flatten(cJSON_GetObjectItemCaseSensitive(m, "content"), n, a, &x->content, err))) return rc;
        if (x->role == R_TOOL) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            x->reasoning = NULL;
            x->calls = NULL;
            /* tool_call_id is used for ordering only; kept in the block below */
            blk *bk = arena_keep(a, malloc(sizeof *bk));
            if (!bk) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            *bk = (blk){1, cJSON_IsString(id) ? id->valuestring : "", x->content};
            x->blocks = bk;
            x->nblocks = 1;
        }
        if (x->role != R_ASSISTANT) continue;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
        const char *rname = "reasoning";
        if (!r || cJSON_IsNull(r)) { r = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"); rname = "reasoning_content"; }
        if (r && !cJSON_IsNull(r)) {
            if (!cJSON_IsString(r))
                return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].%s: expected a string", n, rname);
            x->reasoning = r->valuestring;
        }
        const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tcs && !cJSON_IsNull(tcs)) {
            if (!cJSON_IsArray(tcs))
                return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].tool_calls: expected an array", n);
            int k = cJSON_GetArraySize(tcs);
            if (k > 0) {
                x->calls = arena_keep(a, calloc((size_t)k, sizeof *x->calls));
                if (!x->calls) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            }
            int j = 0;
            for (const cJSON *tc = tcs->child; tc; tc = tc->next, j++) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
                if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn) ||
                    (type && !cJSON_IsNull(type) && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))))
                    return dsv4_err_set(err, DSV4_EINVAL,
                                        "messages[%d].tool_calls[%d]: expected {\"type\": \"function\", \"function\": {...}}", n, j);
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
                if (!cJSON_IsString(name))
                    return dsv4_err_set(err, DSV4_EINVAL, "messages[%d].tool_calls[%d].function.name: missing or not a string", n, j);
                const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
                x->calls[j].id = cJSON_IsString(id) ? id->valuestring : "";
                x->calls[j].name = name->valuestring;
                if ((rc = tool_args(fn, n, j, a, o, &x->calls[j], err))) return rc;
            }
            x->ncalls = k;
        }
        if (m->next == NULL) {
            const cJSON *pre = cJSON_GetObjectItemCaseSensitive(m, "prefix");
            if (cJSON_IsTrue(pre)) *cont = 1;
        }
    }
    *nout = n;
    return DSV4_OK;
}

/* §1.3 rules 4-5: tool results and following user text join one user turn. */
static int merge_tools(msg *in, int n, msg *out, int *nout, arena *a, dsv4_err *err)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        msg *m = &in[i];
        if (m->role != R_TOOL && m->role != R_USER) { out[k++] = *m; continue; }
        blk b = m->role == R_TOOL ? m->blocks[0] : (blk){0, NULL, m->content};
        msg *t;
        if (k > 0 && out[k - 1].role == R_USER) {
            t = &out[k - 1];
        } else {
            t = &out[k++];
            *t = *m;
            t->role = R_USER;
            t->blocks = NULL;
            t->nblocks = t->capblocks = 0;
        }
        if (t->nblocks == t->capblocks) {
            int cap = t->capblocks ? t->capblocks * 2 : 4;
            blk *nb = arena_keep(a, malloc((size_t)cap * sizeof *nb));
            if (!nb) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            if (t->nblocks) memcpy(nb, t->blocks, (size_t)t->nblocks * sizeof *nb);
            t->blocks = nb;
            t->capblocks = cap;
        }
        t->blocks[t->nblocks++] = b;
    }
    *nout = k;
    return DSV4_OK;
}

typedef struct keyed {
    int key, pos;
    blk b;
} keyed;

static int keyed_cmp(const void *x, const void *y)
{
    const keyed *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos; /* stable */
}

/* §1.3 rule 5: results in one merged user turn follow the order of the most
 * recent assistant's tool_calls ids (stable; unknown ids sort as 0). */
static int sort_tool_results(msg *ms, int n, dsv4_err *err)
{
    const msg *order = NULL;
    for (int i = 0; i < n; i++) {
        msg *m = &ms[i];
        if (m->role == R_ASSISTANT && m->ncalls > 0) {
            int any = 0;
            for (int j = 0; j < m->ncalls; j++) any |= m->calls[j].id[0] != '\0';
            order = any ? m : NULL;
            continue;
        }
        if (m->role != R_USER || !order) continue;
        int ntool = 0;
        for (int j = 0; j < m->nblocks; j++) ntool += m->blocks[j].is_tool;
        if (ntool < 2) continue;
        keyed *kb = malloc((size_t)ntool * sizeof *kb);
        if (!kb) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        int t = 0;
        for (int j = 0; j < m->nblocks; j++) {
            if (!m->blocks[j].is_tool) continue;
            kb[t] = (keyed){0, j, m->blocks[j]};
            for (int c = 0; c < order->ncalls; c++) /* a repeated id keeps its last position */
                if (order->calls[c].id[0] && !strcmp(order->calls[c].id, kb[t].b.tool_id)) kb[t].key = c;
            t++;
        }
        qsort(kb, (size_t)ntool, sizeof *kb, keyed_cmp);
        t = 0;
        for (int j = 0; j < m->nblocks; j++)
            if (m->blocks[j].is_tool) m->blocks[j] = kb[t++].b;
        free(kb);
    }
    return DSV4_OK;
}

static int last_user_index(const msg *ms, int n)
{
    for (int i = n - 1; i >= 0; i--)
        if (ms[i].role == R_USER || ms[i].role == R_DEVELOPER) return i;
    return -1;
}

/* Client text with every occurrence of `term` written as "&lt;" + term+1. */
static void content_escaped(builder *b, const char *s, const char *term)
{
    size_t n = strlen(term);
    for (const char *hit = strstr(s, term); hit; hit = strstr(s, term)) {
        put(b, DSV4_SEG_CONTENT, s, (size_t)(hit - s));
        put(b, DSV4_SEG_CONTENT, "&lt;", 4);
        put(b, DSV4_SEG_CONTENT, hit + 1, n - 1);
        s = hit + n;
    }
    content(b, s);
}

/* ---- request fields: tools and response_format ---- */

static int check_tools(const cJSON *tools, dsv4_err *err)
{
    if (!cJSON_IsArray(tools)) return dsv4_err_set(err, DSV4_EINVAL, "tools: expected an array");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsObject(fn))
            return dsv4_err_set(err, DSV4_EINVAL, "tools[%d].function: expected an object", i);
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
            return dsv4_err_set(err, DSV4_EINVAL, "tools[%d].function.name: missing or not a string", i);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(fn, "description");
        if (d && !cJSON_IsNull(d) && !cJSON_IsString(d))
            return dsv4_err_set(err, DSV4_EINVAL, "tools[%d].function.description: expected a string", i);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (p && !cJSON_IsNull(p) && !cJSON_IsObject(p))
            return dsv4_err_set(err, DSV4_EINVAL, "tools[%d].function.parameters: expected an object", i);
    }
    return DSV4_OK;
}

/* The function object as vLLM's request model re-serialises it (§1.6):
 * name, description, parameters (null when omitted), then strict and
 * defer_loading only when given; other keys dropped. */
static void dump_function(const cJSON *fn, int client_order, const dsv4_json_numbers *nums, dsv4_sbuf *b)
{
    if (client_order) { dsv4_pyjson_dump(fn, nums, b); return; }
    static const char *const fixed[] = {"name", "description", "parameters"};
    static const char *const opt[] = {"strict", "defer_loading"};
    dsv4_sbuf_puts(b, "{");
    for (int i = 0; i < 3; i++) {
        if (i) dsv4_sbuf_puts(b, ", ");
        dsv4_sbuf_puts(b, "\"");
        dsv4_sbuf_puts(b, fixed[i]);
        dsv4_sbuf_puts(b, "\": ");
        dsv4_pyjson_dump(cJSON_GetObjectItemCaseSensitive(fn, fixed[i]), nums, b);
    }
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(fn, opt[i]);
        if (!v || cJSON_IsNull(v)) continue;
        dsv4_sbuf_puts(b, ", \"");
        dsv4_sbuf_puts(b, opt[i]);
        dsv4_sbuf_puts(b, "\": ");
        dsv4_pyjson_dump(v, nums, b);
    }
    dsv4_sbuf_puts(b, "}");
}

static void json_content(builder *b, const cJSON *v, const dsv4_json_numbers *nums)
{
    dsv4_sbuf s = {0};
    dsv4_pyjson_dump(v, nums, &s);
    if (s.oom) b->oom = 1;
    else if (s.p) put(b, DSV4_SEG_CONTENT, s.p, s.len);
    dsv4_sbuf_free(&s);
}

static void render_tools(builder *b, const dsv4_encode_opts *o)
{
    markup(b, "\n\n");
    markup(b, TOOLS_HEAD);
    int first = 1;
    for (const cJSON *t = o->tools->child; t; t = t->next) {
        if (!first) markup(b, "\n");
        first = 0;
        dsv4_sbuf s = {0};
        dump_function(cJSON_GetObjectItemCaseSensitive(t, "function"), o->tool_schema_client_order, o->numbers, &s);
        if (s.oom) b->oom = 1;
        else if (s.p) put(b, DSV4_SEG_CONTENT, s.p, s.len);
        dsv4_sbuf_free(&s);
    }
    markup(b, TOOLS_TAIL);
}

static void render_rf(builder *b, const dsv4_encode_opts *o)
{
    markup(b, "\n\n");
    markup(b, RF_HEAD);
    json_content(b, o->response_format, o->numbers);
}

/* ---- DSML tool-call history (§1.7) ---- */

static void render_tool_calls(builder *b, const msg *m, int escape)
{
    markup(b, "\n\n<" DSML "tool_calls>\n");
    for (int j = 0; j < m->ncalls; j++) {
        if (j) markup(b, "\n");
        markup(b, "<" DSML "invoke name=\"");
        content(b, m->calls[j].name);
        markup(b, "\">\n");
        const cJSON *args = m->calls[j].args;
        int first = 1;
        for (const cJSON *c = args->child; c; c = c->next) {
            const char *k = c->string ? c->string : "";
            int seen = 0;
            for (const cJSON *e = args->child; e != c && !seen; e = e->next) seen = e->string && !strcmp(e->string, k);
            if (seen) continue;
            const cJSON *v = c; /* duplicate key: first position, last value */
            for (const cJSON *e = c->next; e; e = e->next)
                if (e->string && !strcmp(e->string, k)) v = e;
            if (!first) markup(b, "\n");
            first = 0;
            markup(b, "<" DSML "parameter name=\"");
            content(b, k);
            if (cJSON_IsString(v)) {
                markup(b, "\" string=\"true\">");
                if (escape) content_escaped(b, v->valuestring, "</" DSML "parameter>");
                else content(b, v->valuestring);
            } else {
                markup(b, "\" string=\"false\">");
                json_content(b, v, m->calls[j].nums);
            }
            markup(b, "</" DSML "parameter>");
        }
        markup(b, "\n</" DSML "invoke>");
    }
    markup(b, "\n</" DSML "tool_calls>");
}

/* ---- rendering ---- */

void dsv4_encode_opts_init(dsv4_encode_opts *o, const dsv4_thinking *th, dsv4_effort_profile profile)
{
    memset(o, 0, sizeof *o);
    o->profile = profile;
    if (th) {
        o->thinking = th->thinking;
        o->effort = th->effort;
        o->drop_thinking = th->drop_thinking;
    } else {
        o->drop_thinking = 1;
    }
    o->render_response_format = 1;
    o->add_generation_prompt = 1;
}

static int opt_bool(const cJSON *req, const char *key, int *out, dsv4_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, key);
    if (!v || cJSON_IsNull(v)) return DSV4_OK;
    if (!cJSON_IsBool(v)) return dsv4_err_set(err, DSV4_EINVAL, "%s: expected a boolean", key);
    *out = cJSON_IsTrue(v);
    return DSV4_OK;
}

int dsv4_encode_opts_from_request(dsv4_encode_opts *o, const cJSON *req, dsv4_err *err)
{
    int rc;
    if (!cJSON_IsObject(req)) return dsv4_err_set(err, DSV4_EINVAL, "request body: expected a JSON object");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    o->tools = NULL;
    if (tools && !cJSON_IsNull(tools)) {
        if ((rc = check_tools(tools, err))) return rc;
        o->tools = tools;
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
    o->tool_choice_none = cJSON_IsString(tc) && !strcmp(tc->valuestring, "none");
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
    o->response_format = NULL;
    if (rf && !cJSON_IsNull(rf)) {
        if (!cJSON_IsObject(rf)) return dsv4_err_set(err, DSV4_EINVAL, "response_format: expected an object");
        o->response_format = rf;
    }
    if ((rc = opt_bool(req, "add_generation_prompt", &o->add_generation_prompt, err))) return rc;
    if ((rc = opt_bool(req, "continue_final_message", &o->continue_final_message, err))) return rc;
    return DSV4_OK;
}

static int rf_renders(const dsv4_encode_opts *o)
{
    if (!o->render_response_format || !cJSON_IsObject(o->response_format)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o->response_format, "type");
    return cJSON_IsString(t) && (!strcmp(t->valuestring, "json_object") || !strcmp(t->valuestring, "json_schema"));
}

int dsv4_encoder_render(const cJSON *messages, const dsv4_encode_opts *o, dsv4_prompt *out, dsv4_err *err)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsArray(messages)) return dsv4_err_set(err, DSV4_EINVAL, "messages: expected an array");
    int n_in = cJSON_GetArraySize(messages);
    if (n_in == 0) return dsv4_err_set(err, DSV4_EINVAL, "messages: must not be empty");
    if (o->profile != DSV4_PROFILE_PREVIEW && o->profile != DSV4_PROFILE_0731)
        return dsv4_err_set(err, DSV4_EINVAL, "encoder: reasoning-effort profile not resolved");

    int rc = DSV4_OK, n = 0, cont = o->continue_final_message;
    arena a = {0};
    msg *ms = arena_keep(&a, calloc((size_t)n_in + 1, sizeof *ms));
    msg *mm = arena_keep(&a, calloc((size_t)n_in + 1, sizeof *mm));
    if (!ms || !mm) { rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory"); goto done; }
    /* normalise into ms[1..] so that a system message can be inserted at 0 */
    if ((rc = normalise(messages, o, &a, ms + 1, &n, &cont, err))) goto done;
    msg *list = ms + 1;
    if (cont && list[n - 1].role != R_ASSISTANT) {
        rc = dsv4_err_set(err, DSV4_EINVAL,
                          "continue_final_message: the last message (messages[%d]) must be an assistant message", n - 1);
        goto done;
    }
    if (o->tools && (rc = check_tools(o->tools, err))) goto done;

    int tools_on = o->tools && cJSON_GetArraySize(o->tools) > 0 && !o->tool_choice_none;
    int rf_on = rf_renders(o);
    if (tools_on || rf_on) {
        int k = -1;
        for (int i = 0; i < n && k < 0; i++)
            if (list[i].role == R_SYSTEM) k = i;
        if (k < 0) {
            list = ms;
            memset(&list[0], 0, sizeof list[0]);
            list[0].role = R_SYSTEM;
            list[0].src = -1;
            list[0].content = "";
            n++;
            k = 0;
        }
        list[k].tools = tools_on;
        list[k].rf = rf_on;
    }
    if (cont) list[n - 1].wo_eos = 1;

    int nm = 0;
    if ((rc = merge_tools(list, n, mm, &nm, &a, err))) goto done;
    if ((rc = sort_tool_results(mm, nm, err))) goto done;

    int drop = o->drop_thinking && !tools_on;
    if (o->thinking && drop) {
        int lu = last_user_index(mm, nm), k = 0;
        for (int i = 0; i < nm; i++) {
            msg m = mm[i];
            if (i < lu && m.role == R_DEVELOPER) continue;
            if (i < lu && m.role == R_ASSISTANT) m.reasoning = NULL;
            mm[k++] = m;
        }
        nm = k;
    }
    int lu = last_user_index(mm, nm);

    builder b = {out, 0};
    special(&b, DSV4_TOK_BOS);
    for (int i = 0; i < nm; i++) {
        const msg *m = &mm[i];
        if (i == 0 && o->thinking) markup(&b, dsv4_encoder_effort_prefix(o->profile, o->effort));
        switch (m->role) {
        case R_SYSTEM:
            content(&b, m->content);
            if (m->tools) render_tools(&b, o);
            if (m->rf) render_rf(&b, o);
            break;
        case R_DEVELOPER:
            if (!m->content[0]) {
                rc = dsv4_err_set(err, DSV4_EINVAL, "messages[%d].content: a developer message must not be empty", m->src);
                goto done;
            }
            special(&b, DSV4_TOK_USER);
            content(&b, m->content);
            if (m->tools) render_tools(&b, o);
            if (m->rf) render_rf(&b, o);
            break;
        case R_USER:
            special(&b, DSV4_TOK_USER);
            for (int j = 0; j < m->nblocks; j++) {
                if (j) markup(&b, "\n\n");
                if (m->blocks[j].is_tool) {
                    markup(&b, "<tool_result>");
                    if (o->escape_tool_result_terminator) content_escaped(&b, m->blocks[j].text, "</tool_result>");
                    else content(&b, m->blocks[j].text);
                    markup(&b, "</tool_result>");
                } else {
                    content(&b, m->blocks[j].text);
                }
            }
            break;
        case R_REMINDER:
            special(&b, DSV4_TOK_REMINDER);
            content(&b, m->content);
            break;
        case R_ASSISTANT: {
            if (o->thinking && (!drop || i > lu)) {
                content(&b, m->reasoning);
                /* §1.11: continuing a turn that so far has only reasoning
                 * leaves the reasoning open. */
                int open = m->wo_eos && !m->content[0] && m->reasoning && m->reasoning[0] && m->ncalls == 0;
                if (!open) special(&b, DSV4_TOK_END_THINK);
            }
            content(&b, m->content);
            if (m->ncalls) render_tool_calls(&b, m, o->escape_dsml_param_terminator);
            if (!m->wo_eos) special(&b, DSV4_TOK_EOS);
            break;
        }
        default:
            rc = dsv4_err_set(err, DSV4_EINTERNAL, "encoder: unmerged tool message");
            goto done;
        }
        /* Transition (generation anchor), as the checkpoint encoder does it,
         * with the vLLM 0.33 rule for system messages. */
        int last = i == nm - 1;
        int next = last ? -1 : mm[i + 1].role;
        if (!last && next != R_ASSISTANT && next != R_REMINDER) continue;
        if (m->role == R_USER || m->role == R_DEVELOPER || (m->role == R_SYSTEM && (last || next == R_ASSISTANT))) {
            if (last && !o->add_generation_prompt) continue;
            special(&b, DSV4_TOK_ASSISTANT);
            special(&b, o->thinking && (!drop || i >= lu) ? DSV4_TOK_THINK : DSV4_TOK_END_THINK);
        }
    }
    /* §1.11 Deviation: an assistant-final conversation gets a fresh anchor. */
    if (!cont && mm[nm - 1].role == R_ASSISTANT && o->add_generation_prompt) {
        special(&b, DSV4_TOK_ASSISTANT);
        special(&b, o->thinking ? DSV4_TOK_THINK : DSV4_TOK_END_THINK);
    }
    if (b.oom || a.oom) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory rendering the prompt");

done:
    arena_free(&a);
    if (rc) dsv4_prompt_free(out);
    return rc;
}

/* ---- profile detection (§0.1) ---- */

int dsv4_encoder_detect_profile(const char *ckpt_dir, dsv4_effort_profile override,
                                dsv4_effort_profile *out, dsv4_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/encoding/encoding_dsv4.py", ckpt_dir ? ckpt_dir : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (override == DSV4_PROFILE_PREVIEW || override == DSV4_PROFILE_0731) {
            *out = override;
            return DSV4_OK;
        }
        return dsv4_err_set(err, DSV4_EIO,
                            "%s: not found; refusing to start without knowing the reasoning-effort profile "
                            "(give --reasoning-effort-profile preview|0731)", path);
    }
    dsv4_sbuf s = {0};
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) dsv4_sbuf_put(&s, buf, k);
    int rd_err = ferror(f);
    fclose(f);
    if (rd_err || s.oom) {
        dsv4_sbuf_free(&s);
        return dsv4_err_set(err, rd_err ? DSV4_EIO : DSV4_ENOMEM, "%s: read failed", path);
    }
    dsv4_effort_profile found = DSV4_PROFILE_AUTO;
    if (s.p && strstr(s.p, "REASONING_EFFORT_PROMPTS")) found = DSV4_PROFILE_0731;
    else if (s.p && strstr(s.p, "REASONING_EFFORT_MAX")) found = DSV4_PROFILE_PREVIEW;
    dsv4_sbuf_free(&s);
    if (override == DSV4_PROFILE_PREVIEW || override == DSV4_PROFILE_0731) {
        if (found != DSV4_PROFILE_AUTO && found != override)
            dsv4_log(DSV4_LOG_WARN, "%s looks like the %s profile; using %s as requested", path,
                     dsv4_profile_name(found), dsv4_profile_name(override));
        *out = override;
        return DSV4_OK;
    }
    if (found == DSV4_PROFILE_AUTO)
        return dsv4_err_set(err, DSV4_EFORMAT,
                            "%s: defines neither REASONING_EFFORT_PROMPTS (0731) nor REASONING_EFFORT_MAX "
                            "(preview); give --reasoning-effort-profile", path);
    *out = found;
    return DSV4_OK;
}
