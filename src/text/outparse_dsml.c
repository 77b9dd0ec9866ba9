/*
 * Streaming DSML tool-call scanner (text/outparse_dsml.h).
 *
 * Grammar (spec/SERVING.md §1.7): after optional text the model writes
 *   "\n\n<M tool_calls>\n" INVOKE ("\n" INVOKE)* "\n</M tool_calls>" EOS
 *   INVOKE = <M invoke name="N">\n PARAM ("\n" PARAM)* \n</M invoke>
 *   PARAM  = <M parameter name="K" string="true|false">VALUE</M parameter>
 * where M is the ｜DSML｜ marker (no space in the real text). Only the marker
 * is a special token; everything else is ordinary BPE, so all matching is done
 * in text space with partial matches withheld (§1.1 note, §5.3).
 *
 * Why emit-as-you-go arguments: the streamed fragments must concatenate to
 * the non-streaming `arguments` (§5.3). We build the final arguments *from*
 * the fragments, so the equality holds by construction; the only values that
 * are held back are non-string parameters (coerced when complete, §5.3) and a
 * possible `arguments`/`input` wrapper (§5.2 repair), which can only be
 * decided at the next tag.
 *
 * Duplicate parameter names (§5.2 "last wins"): fragments cannot be taken
 * back, so both keys are emitted; every JSON parser we know (Python json,
 * JavaScript JSON.parse, cJSON lookup of the last) keeps the last value.
 */
#include "text/outparse_dsml.h"

#include "dsv4/common.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Marker alternatives: the real token text first, then look-alikes (§5.2). */
static const char *const MARKS[] = {
    "\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C",
    "|DSML|",
    "\xE2\x80\x96" "DSML" "\xE2\x80\x96",
    "\xEF\xBD\x9C\xEF\xBD\x9C" "DSML" "\xEF\xBD\x9C\xEF\xBD\x9C",
};
#define NMARKS (sizeof MARKS / sizeof MARKS[0])

/* Patterns: '\x01' stands for any marker alternative. */
#define P_OPEN "<\x01tool_calls>"
#define P_OPEN_NL "\n\n<\x01tool_calls>"
#define P_CLOSE_BLOCK "</\x01tool_calls>"
#define P_INVOKE "<\x01invoke"
#define P_CLOSE_INVOKE "</\x01invoke>"
#define P_PARAM "<\x01parameter"
#define P_CLOSE_PARAM "</\x01parameter>"
#define P_TAG "<\x01"
#define P_ENDTAG "</\x01"
#define P_MARK "\x01"

enum { M_NONE = 0, M_PART = 1, M_FULL = 2 };

#define MAX_TAG 4096 /* a tag header longer than this is malformed */
#define MAX_STRAY 256 /* how far to look for the '>' of a stray tag */

/*
 * Match pattern against b[0..n). M_FULL: b starts with an expansion of the
 * pattern (*mlen = its length). M_PART: b is a proper prefix of an expansion
 * (more text needed). M_NONE: neither.
 */
static int pmatch(const char *b, size_t n, const char *pat, size_t *mlen) {
    size_t i = 0;
    for (; *pat; pat++) {
        if (*pat == '\x01') {
            int best = M_NONE;
            for (size_t a = 0; a < NMARKS; a++) {
                size_t al = strlen(MARKS[a]), k = n - i < al ? n - i : al;
                if (memcmp(b + i, MARKS[a], k) != 0) continue;
                if (k < al) {
                    best = M_PART;
                    continue;
                }
                size_t sub = 0;
                int r = pmatch(b + i + al, n - i - al, pat + 1, &sub);
                if (r == M_FULL) {
                    *mlen = i + al + sub;
                    return M_FULL;
                }
                if (r == M_PART) best = M_PART;
            }
            return best;
        }
        if (i == n) return M_PART;
        if (b[i] != *pat) return M_NONE;
        i++;
    }
    *mlen = i;
    return M_FULL;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* ---------------------------------------------------------------- JSON bits */

int op_json_escape(op_buf *out, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char tmp[8];
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                e = tmp;
            }
        }
        if (e) {
            if (op_buf_puts(out, e)) return -1;
        } else if (op_buf_put(out, (const char *)&s[i], 1, NULL, 0)) {
            return -1;
        }
    }
    return 0;
}

/* Remove insignificant whitespace from valid JSON text (numbers kept as written). */
static int json_minify(op_buf *out, const char *s, size_t n) {
    int in_str = 0, esc = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (is_ws(c)) {
            continue;
        }
        if (op_buf_put(out, &c, 1, NULL, 0)) return -1;
    }
    return 0;
}

/* Parse s[0..n) as one complete JSON value (surrounding whitespace allowed). */
static cJSON *json_parse_exact(const char *s, size_t n) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!v) return NULL;
    for (const char *q = end; q && q < s + n; q++)
        if (!is_ws(*q) && *q != '\0') {
            cJSON_Delete(v);
            return NULL;
        }
    return v;
}

/* The tool's `parameters` schema object, or NULL. Accepts the OpenAI shape
 * {"type":"function","function":{...}} and a bare function object. */
static const cJSON *tool_params(const cJSON *tools, const char *name) {
    if (!cJSON_IsArray(tools) || !name) return NULL;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            return cJSON_IsObject(p) ? p : NULL;
        }
    }
    return NULL;
}

/* 1 if `tools` declares a function called `name` (with or without parameters). */
static int tool_known(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0) return 1;
    }
    return 0;
}

static const cJSON *tool_props(const cJSON *tools, const char *name) {
    const cJSON *p = tool_params(tools, name);
    const cJSON *props = p ? cJSON_GetObjectItemCaseSensitive(p, "properties") : NULL;
    return cJSON_IsObject(props) ? props : NULL;
}

/* JSON-schema "type" of a property; for a type list, the first non-null. */
static const char *prop_type(const cJSON *props, const char *key) {
    const cJSON *pr = props ? cJSON_GetObjectItemCaseSensitive(props, key) : NULL;
    const cJSON *ty = pr ? cJSON_GetObjectItemCaseSensitive(pr, "type") : NULL;
    if (cJSON_IsString(ty)) return ty->valuestring;
    if (cJSON_IsArray(ty)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ty) if (cJSON_IsString(e) && strcmp(e->valuestring, "null") != 0) return e->valuestring;
    }
    return NULL;
}

/*
 * JSON text for a non-string parameter value (§5.2): the value itself when it
 * parses as JSON (minified, numbers as written); else coerced by the schema
 * type (number/integer, boolean); else the raw text as a JSON string.
 */
static int value_json(op_buf *out, const char *v, size_t n, const char *type) {
    cJSON *j = json_parse_exact(v, n);
    if (j) {
        cJSON_Delete(j);
        return json_minify(out, v, n);
    }
    size_t a = 0, b = n;
    while (a < b && is_ws(v[a])) a++;
    while (b > a && is_ws(v[b - 1])) b--;
    char *t = strndup(v + a, b - a);
    if (!t) return -1;
    int done = 0, rc = 0;
    if (type && (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) && *t) {
        char *end = NULL;
        double d = strtod(t, &end);
        if (end && *end == '\0' && isfinite(d)) {
            char num[64];
            if (d == floor(d) && fabs(d) < 9007199254740992.0) {
                snprintf(num, sizeof num, "%.0f", d);
            } else {
                for (int prec = 15; prec <= 17; prec++) {
                    snprintf(num, sizeof num, "%.*g", prec, d);
                    if (strtod(num, NULL) == d) break;
                }
            }
            rc = op_buf_puts(out, num);
            done = 1;
        }
    } else if (type && strcmp(type, "boolean") == 0) {
        for (char *q = t; *q; q++) *q = (char)tolower((unsigned char)*q);
        if (!strcmp(t, "true") || !strcmp(t, "1") || !strcmp(t, "yes")) {
            rc = op_buf_puts(out, "true");
            done = 1;
        } else if (!strcmp(t, "false") || !strcmp(t, "0") || !strcmp(t, "no")) {
            rc = op_buf_puts(out, "false");
            done = 1;
        }
    }
    free(t);
    if (done) return rc;
    if (op_buf_puts(out, "\"") || op_json_escape(out, v, n) || op_buf_puts(out, "\"")) return -1;
    return 0;
}

/* ------------------------------------------------------------- call output */

static void emit_args(op_dsml *d, const char *s, size_t n) {
    if (n) d->sink.tool_args(d->sink.ctx, d->cur_index, s, n);
}

static void emit_args_buf(op_dsml *d, op_buf *b) {
    emit_args(d, b->s ? b->s : "", b->len);
}

/* Emit `{"key":` or `,"key":` for the next parameter. */
static int emit_key(op_dsml *d, const char *key) {
    op_buf b = {0};
    int rc = op_buf_puts(&b, d->n_emitted ? "," : "{") || op_buf_puts(&b, "\"") ||
             op_json_escape(&b, key, strlen(key)) || op_buf_puts(&b, "\":");
    if (!rc) emit_args_buf(d, &b);
    op_buf_free(&b);
    d->n_emitted++;
    return rc ? -1 : 0;
}

/* A held §5.2 repair candidate turned out not to be the only parameter:
 * emit it as the ordinary parameter it is. */
static void flush_repair(op_dsml *d) {
    if (!d->repair_hold) return;
    /* repair_hold holds the minified object text of the wrapper's value */
    if (emit_key(d, d->repair_key) == 0) emit_args(d, d->repair_hold, strlen(d->repair_hold));
    else d->oom = 1;
    free(d->repair_hold);
    free(d->repair_key);
    d->repair_hold = d->repair_key = NULL;
}

static void clear_param(op_dsml *d) {
    free(d->pkey);
    d->pkey = NULL;
    op_buf_clear(&d->pval);
}

static void clear_invoke(op_dsml *d) {
    free(d->cur_name);
    d->cur_name = NULL;
    free(d->repair_hold);
    free(d->repair_key);
    d->repair_hold = d->repair_key = NULL;
    d->cur_index = -1;
    d->n_emitted = 0;
    clear_param(d);
}

static void start_invoke(op_dsml *d, const char *name) {
    clear_invoke(d);
    d->cur_index = d->next_index++;
    d->cur_name = strdup(name);
    if (!d->cur_name) d->oom = 1;
    /* §5.2: an unknown tool name is still returned (clients decide), logged */
    if (cJSON_IsArray(d->tools) && !tool_known(d->tools, name))
        dsv4_log(DSV4_LOG_DEBUG, "outparse: tool call names unknown tool \"%s\"", name);
    d->sink.tool_header(d->sink.ctx, d->cur_index, name);
}

static void drop_invoke(op_dsml *d) {
    if (d->cur_index >= 0) d->sink.tool_drop(d->sink.ctx, d->cur_index);
    clear_invoke(d);
}

static void end_invoke(op_dsml *d) {
    if (d->repair_hold) {
        /* the wrapper was the only parameter: its object is the arguments */
        emit_args(d, d->repair_hold, strlen(d->repair_hold));
    } else {
        emit_args(d, d->n_emitted ? "}" : "{}", d->n_emitted ? 1 : 2);
    }
    d->sink.tool_done(d->sink.ctx, d->cur_index);
    clear_invoke(d);
}

static void start_param(op_dsml *d, const char *key, int is_string) {
    clear_param(d);
    d->pkey = strdup(key);
    if (!d->pkey) d->oom = 1;
    d->pstring = is_string;
    if (is_string == 1) {
        flush_repair(d);
        if (emit_key(d, key) != 0) d->oom = 1;
        emit_args(d, "\"", 1);
    }
}

/* §5.2 repair: sole `arguments`/`input` parameter, name not in the schema,
 * object value whose keys are all schema properties -> unwrap. */
static int repair_candidate(op_dsml *d, const char *key, const char *v, size_t n) {
    if (d->n_emitted != 0 || d->repair_hold) return 0;
    if (strcmp(key, "arguments") != 0 && strcmp(key, "input") != 0) return 0;
    const cJSON *props = tool_props(d->tools, d->cur_name);
    if (!props || cJSON_GetObjectItemCaseSensitive(props, key)) return 0;
    cJSON *j = json_parse_exact(v, n);
    int ok = cJSON_IsObject(j);
    const cJSON *e;
    if (ok) cJSON_ArrayForEach(e, j) if (!cJSON_GetObjectItemCaseSensitive(props, e->string)) ok = 0;
    cJSON_Delete(j);
    return ok;
}

static void end_param(op_dsml *d) {
    if (d->pstring == 1) {
        emit_args(d, "\"", 1);
    } else {
        const char *v = d->pval.s ? d->pval.s : "";
        op_buf jb = {0};
        const char *type = prop_type(tool_props(d->tools, d->cur_name), d->pkey);
        if (value_json(&jb, v, d->pval.len, type) != 0) {
            d->oom = 1;
        } else if (repair_candidate(d, d->pkey, v, d->pval.len)) {
            d->repair_hold = strdup(jb.s);
            d->repair_key = strdup(d->pkey);
            if (!d->repair_hold || !d->repair_key) d->oom = 1;
        } else {
            flush_repair(d);
            if (emit_key(d, d->pkey) != 0) d->oom = 1;
            emit_args_buf(d, &jb);
        }
        op_buf_free(&jb);
    }
    clear_param(d);
}

/* ---------------------------------------------------------------- scanning */

static void release_text(op_dsml *d, size_t n) {
    if (!n) return;
    d->sink.text(d->sink.ctx, d->pend.s, d->pend.tag, n);
    op_buf_consume(&d->pend, n);
}

static void strip(op_dsml *d, size_t n) {
    if (!n) return;
    d->sink.stripped(d->sink.ctx, n);
    op_buf_consume(&d->pend, n);
}

/*
 * Why hold a marker-prefix suffix: removing markup splices the text on its
 * two sides, and "|DSM" + <removed> + "L|" would otherwise leave a look-alike
 * marker in content. Text that could start a marker stays pending until what
 * follows it is settled, and every removal rescans from there.
 */
static size_t mark_prefix_suffix(const char *b, size_t n) {
    size_t best = 0;
    for (size_t a = 0; a < NMARKS; a++) {
        size_t al = strlen(MARKS[a]), k = al - 1 < n ? al - 1 : n;
        for (; k > best; k--)
            if (memcmp(b + n - k, MARKS[a], k) == 0) break;
        if (k > best) best = k;
    }
    return best;
}

/* Release pend[0..i) except a suffix that may splice into a marker; returns
 * that suffix's length (now at the start of pend). */
static size_t release_safe(op_dsml *d, size_t i) {
    size_t k = mark_prefix_suffix(d->pend.s, i);
    release_text(d, i - k);
    return k;
}

static void strip_at(op_dsml *d, size_t off, size_t n) {
    if (!n) return;
    d->sink.stripped(d->sink.ctx, n);
    op_buf_cut(&d->pend, off, n);
}

/* A block opener of m bytes starts at pend[i]. */
static void open_block(op_dsml *d, size_t i, size_t m) {
    if (d->tools_enabled) {
        release_text(d, i);
        op_buf_consume(&d->pend, m);
        d->sink.block_open(d->sink.ctx);
        d->state = OP_DSML_BLOCK;
    } else {
        /* §5.5: the block is removed and text resumes after it; keep a
         * marker-prefix suffix aside so the splice is rescanned */
        size_t k = release_safe(d, i);
        op_buf_clear(&d->carry);
        if (op_buf_put(&d->carry, d->pend.s, k, d->pend.tag, 0)) d->oom = 1;
        op_buf_consume(&d->pend, k + m);
        d->sink.block_open(d->sink.ctx);
        d->sink.stripped(d->sink.ctx, m);
        d->state = OP_DSML_SKIP;
    }
}

/* Back to TEXT after a stripped block: the carried text goes first. */
static void resume_text(op_dsml *d) {
    d->state = OP_DSML_TEXT;
    if (!d->carry.len) return;
    if (op_buf_put(&d->carry, d->pend.s ? d->pend.s : "", d->pend.len, d->pend.tag, 0)) {
        d->oom = 1;
        return;
    }
    op_buf t = d->pend;
    d->pend = d->carry;
    d->carry = t;
    op_buf_clear(&d->carry);
}

/*
 * Parse `\s+ident="value"`* `\s*>` from b[pos..n). Returns 1 and *end (index
 * after '>'), 0 when more text is needed, -1 when malformed. Known attributes
 * `name` and `string` are returned malloc'ed (caller frees).
 */
static int parse_attrs(const char *b, size_t n, size_t pos, size_t *end, char **name, char **string) {
    *name = *string = NULL;
    for (;;) {
        size_t p = pos, ws = 0;
        while (p < n && is_ws(b[p])) p++, ws++;
        if (p == n) goto more;
        if (b[p] == '>') {
            *end = p + 1;
            return 1;
        }
        if (!ws) goto bad;
        size_t id0 = p;
        while (p < n && (isalnum((unsigned char)b[p]) || b[p] == '_' || b[p] == '-')) p++;
        if (p == n) goto more;
        size_t id1 = p;
        if (id1 == id0) goto bad;
        while (p < n && is_ws(b[p])) p++;
        if (p == n) goto more;
        if (b[p] != '=') goto bad;
        p++;
        while (p < n && is_ws(b[p])) p++;
        if (p == n) goto more;
        if (b[p] != '"') goto bad;
        p++;
        const char *q = memchr(b + p, '"', n - p);
        if (!q) goto more;
        size_t v0 = p, v1 = (size_t)(q - b);
        char **slot = NULL;
        if (id1 - id0 == 4 && memcmp(b + id0, "name", 4) == 0) slot = name;
        else if (id1 - id0 == 6 && memcmp(b + id0, "string", 6) == 0) slot = string;
        if (slot) {
            free(*slot);
            *slot = strndup(b + v0, v1 - v0);
        }
        pos = v1 + 1;
    }
more:
    free(*name);
    free(*string);
    *name = *string = NULL;
    return 0;
bad:
    free(*name);
    free(*string);
    *name = *string = NULL;
    return -1;
}

/* Malformed markup inside a block: drop the call in progress, skip the block. */
static void malformed(op_dsml *d) {
    d->malformed_count++;
    if (d->cur_index >= 0) drop_invoke(d);
    else d->sink.tool_drop(d->sink.ctx, -1);
    d->state = OP_DSML_SKIP;
}

/* One scanning step; returns 1 if progress was made, 0 if more text is needed. */
static int step(op_dsml *d) {
    op_buf *pb = &d->pend;
    const char *b = pb->s;
    size_t n = pb->len, m = 0;
    if (n == 0) return 0;
    switch (d->state) {
    case OP_DSML_TEXT: {
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)b[i];
            int r;
            if (c == '\n' || c == '<') {
                r = pmatch(b + i, n - i, c == '\n' ? P_OPEN_NL : P_OPEN, &m);
                if (r == M_PART && d->eof) r = M_NONE;
                if (r == M_FULL) {
                    open_block(d, i, m);
                    return 1;
                }
                if (r == M_PART) {
                    release_safe(d, i);
                    return 0;
                }
                if (c == '\n') continue;
                r = pmatch(b + i, n - i, P_TAG, &m);
                if (r == M_NONE) r = pmatch(b + i, n - i, P_ENDTAG, &m);
                if (r == M_PART && d->eof) r = M_NONE;
                if (r == M_NONE) continue;
                size_t k = release_safe(d, i);
                if (r == M_PART) return 0;
                /* stray tag at pend[k]: drop through its '>', deciding on the
                 * first MAX_STRAY bytes only so the result does not depend on
                 * how the text was split into tokens */
                b = pb->s;
                n = pb->len;
                size_t win = n - k < MAX_STRAY ? n - k : MAX_STRAY;
                const char *gt = win > m ? memchr(b + k + m, '>', win - m) : NULL;
                if (gt) strip_at(d, k, (size_t)(gt - (b + k)) + 1);
                else if (n - k < MAX_STRAY && !d->eof) return 0;
                else strip_at(d, k, m);
                return 1;
            }
            if (c == '|' || c == 0xEF || c == 0xE2) {
                r = pmatch(b + i, n - i, P_MARK, &m);
                if (r == M_PART && d->eof) r = M_NONE;
                if (r == M_NONE) continue;
                size_t k = release_safe(d, i);
                if (r == M_PART) return 0;
                strip_at(d, k, m);
                return 1;
            }
        }
        release_text(d, n);
        return 0;
    }
    case OP_DSML_BLOCK:
    case OP_DSML_INVOKE: {
        size_t i = 0;
        while (i < n && is_ws(b[i])) i++;
        if (i) {
            op_buf_consume(pb, i);
            return 1;
        }
        int inv = d->state == OP_DSML_INVOKE;
        int r = pmatch(b, n, inv ? P_PARAM : P_INVOKE, &m);
        if (r == M_FULL) {
            char *name = NULL, *str = NULL;
            size_t end = 0;
            /* only the first MAX_TAG bytes count (split-independent) */
            int a = parse_attrs(b, n < MAX_TAG ? n : MAX_TAG, m, &end, &name, &str);
            if (a == 0) {
                if (n >= MAX_TAG) malformed(d);
                return n >= MAX_TAG;
            }
            if (a < 0 || !name) {
                free(name);
                free(str);
                malformed(d);
                return 1;
            }
            op_buf_consume(pb, end);
            if (inv) {
                int is_string = !str ? -1 : strcmp(str, "true") == 0 ? 1 : 0;
                start_param(d, name, is_string);
                d->state = OP_DSML_PVAL;
            } else {
                start_invoke(d, name);
                d->state = OP_DSML_INVOKE;
            }
            free(name);
            free(str);
            return 1;
        }
        int r2 = pmatch(b, n, inv ? P_CLOSE_INVOKE : P_CLOSE_BLOCK, &m);
        if (r2 == M_FULL) {
            op_buf_consume(pb, m);
            if (inv) {
                end_invoke(d);
                d->state = OP_DSML_BLOCK;
            } else {
                d->state = OP_DSML_AFTER;
            }
            return 1;
        }
        if (r == M_PART || r2 == M_PART) return 0;
        malformed(d);
        return 1;
    }
    case OP_DSML_PVAL: {
        size_t i = 0;
        for (; i < n; i++) {
            if (b[i] != '<') continue;
            int r = pmatch(b + i, n - i, P_CLOSE_PARAM, &m);
            if (r == M_NONE) continue;
            break;
        }
        /* b[0..i) is value text; at i either the closer, a partial closer, or the end */
        if (i) {
            if (d->pstring == 1) {
                op_buf e = {0};
                if (op_json_escape(&e, b, i) == 0) emit_args_buf(d, &e);
                else d->oom = 1;
                op_buf_free(&e);
            } else if (op_buf_put(&d->pval, b, i, NULL, 0)) {
                d->oom = 1;
            }
            op_buf_consume(pb, i);
            return 1;
        }
        if (pmatch(b, n, P_CLOSE_PARAM, &m) == M_FULL) {
            op_buf_consume(pb, m);
            end_param(d);
            d->state = OP_DSML_INVOKE;
            return 1;
        }
        return 0; /* partial closer: wait */
    }
    case OP_DSML_SKIP: {
        for (size_t i = 0; i < n; i++) {
            if (b[i] != '<') continue;
            int r = pmatch(b + i, n - i, P_CLOSE_BLOCK, &m);
            if (r == M_NONE) continue;
            strip(d, i);
            if (r == M_PART) return 0;
            strip(d, m);
            if (d->tools_enabled) d->state = OP_DSML_AFTER;
            else resume_text(d);
            return 1;
        }
        strip(d, n);
        return 0;
    }
    case OP_DSML_AFTER:
    default:
        /* §5.2: text after the closer is discarded (logged) */
        if (!d->after_logged) {
            d->after_logged = 1;
            dsv4_log(DSV4_LOG_DEBUG, "outparse: discarding text after the tool-call block");
        }
        strip(d, n);
        return 0;
    }
}

void op_dsml_init(op_dsml *d, const op_dsml_sink *sink, int tools_enabled, const cJSON *tools) {
    memset(d, 0, sizeof *d);
    d->sink = *sink;
    d->tools_enabled = tools_enabled;
    d->tools = tools;
    d->pend.tagged = 1;
    d->carry.tagged = 1;
    d->cur_index = -1;
}

void op_dsml_free(op_dsml *d) {
    clear_invoke(d);
    op_buf_free(&d->pend);
    op_buf_free(&d->carry);
    op_buf_free(&d->pval);
}

int op_dsml_push(op_dsml *d, const char *s, size_t n, int32_t tag) {
    if (op_buf_put(&d->pend, s, n, NULL, tag)) return -1;
    while (step(d)) {
    }
    return d->oom ? -1 : 0;
}

void op_dsml_break(op_dsml *d) {
    if (d->state == OP_DSML_TEXT) {
        /* Nothing held can become markup across a special token: rescan with
         * partial matches counting as no match (complete markers and stray
         * tags are still stripped), which releases everything. */
        d->eof = 1;
        while (step(d)) {
        }
        d->eof = 0;
    }
}

void op_dsml_break(op_dsml *d);

/* At end of generation: a held partial opener that already got past the
 * marker ("\n\n<｜DSML｜tool_ca") is a tool call cut off by the token limit,
 * not text (§5.2 length rule, §9 item 9); drop it. Returns 1 if dropped. */
static int drop_truncated_opener(op_dsml *d) {
    const char *b = d->pend.s;
    size_t n = d->pend.len, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != '\n' && b[i] != '<') continue;
        if (pmatch(b + i, n - i, P_OPEN_NL, &m) != M_PART && pmatch(b + i, n - i, P_OPEN, &m) != M_PART) continue;
        size_t j = i;
        while (j < n && b[j] == '\n') j++;
        if (pmatch(b + j, n - j, P_TAG, &m) != M_FULL) continue;
        if (d->tools_enabled) d->sink.tool_drop(d->sink.ctx, -1);
        else d->sink.stripped(d->sink.ctx, n - i);
        /* drop the opener; what precedes it is settled by the normal scan */
        op_buf_cut(&d->pend, i, n - i);
        op_dsml_break(d);
        return 1;
    }
    return 0;
}

void op_dsml_end(op_dsml *d) {
    switch (d->state) {
    case OP_DSML_TEXT:
        if (!drop_truncated_opener(d)) op_dsml_break(d);
        break;
    case OP_DSML_BLOCK:
    case OP_DSML_INVOKE:
    case OP_DSML_PVAL:
        if (d->cur_index >= 0) drop_invoke(d);
        else d->sink.tool_drop(d->sink.ctx, -1); /* block never closed */
        op_buf_clear(&d->pend);
        d->state = OP_DSML_AFTER;
        break;
    case OP_DSML_SKIP:
        op_buf_clear(&d->pend);
        if (!d->tools_enabled) {
            /* unterminated stripped block: text held before it still counts */
            resume_text(d);
            op_dsml_break(d);
        }
        break;
    default:
        op_buf_clear(&d->pend);
        break;
    }
}

int op_dsml_in_markup(const op_dsml *d) { return d->state != OP_DSML_TEXT; }
