/*
 * text/encoder_json.c — Python-compatible JSON serialisation for the prompt
 * encoder. Contract and known limits in encoder_json.h.
 */
#include "text/encoder_json.h"

#include "dsv4/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsv4_sbuf_put(dsv4_sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void dsv4_sbuf_puts(dsv4_sbuf *b, const char *s) { dsv4_sbuf_put(b, s, strlen(s)); }

void dsv4_sbuf_free(dsv4_sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void dsv4_pyjson_float(double d, char *out, size_t cap)
{
    if (isnan(d)) { snprintf(out, cap, "NaN"); return; }
    if (isinf(d)) { snprintf(out, cap, d > 0 ? "Infinity" : "-Infinity"); return; }
    if (d == 0.0) { snprintf(out, cap, signbit(d) ? "-0.0" : "0.0"); return; }
    /* Shortest %.{p}e that round-trips: digits and decimal exponent. */
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e = [-]D[.DDD]e[+-]XX */
    const char *q = e;
    int neg = 0;
    if (*q == '-') { neg = 1; q++; }
    char digits[32];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    digits[nd] = '\0';
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = '\0';
    char buf[64];
    size_t k = 0;
    if (neg) buf[k++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        buf[k++] = digits[0];
        if (nd > 1) {
            buf[k++] = '.';
            for (int i = 1; i < nd; i++) buf[k++] = digits[i];
        }
        k += (size_t)snprintf(buf + k, sizeof buf - k, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        buf[k++] = '0';
        buf[k++] = '.';
        for (int i = 0; i < -exp10 - 1; i++) buf[k++] = '0';
        for (int i = 0; i < nd; i++) buf[k++] = digits[i];
        buf[k] = '\0';
    } else {
        for (int i = 0; i <= exp10; i++) buf[k++] = i < nd ? digits[i] : '0';
        buf[k++] = '.';
        if (nd > exp10 + 1)
            for (int i = exp10 + 1; i < nd; i++) buf[k++] = digits[i];
        else
            buf[k++] = '0';
        buf[k] = '\0';
    }
    snprintf(out, cap, "%s", buf);
}

static void dump_string(const char *s, dsv4_sbuf *b)
{
    static const char hex[] = "0123456789abcdef";
    dsv4_sbuf_put(b, "\"", 1);
    const char *run = s;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        char u[7];
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (*p < 0x20) {
                u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
                u[4] = hex[*p >> 4]; u[5] = hex[*p & 15]; u[6] = '\0';
                esc = u;
            }
        }
        if (esc) {
            dsv4_sbuf_put(b, run, (size_t)((const char *)p - run));
            dsv4_sbuf_puts(b, esc);
            run = (const char *)p + 1;
        }
    }
    dsv4_sbuf_puts(b, run);
    dsv4_sbuf_put(b, "\"", 1);
}

struct dsv4_json_num {
    const cJSON *node;
    char *text;
};

static int num_cmp(const void *a, const void *b)
{
    const cJSON *x = ((const struct dsv4_json_num *)a)->node, *y = ((const struct dsv4_json_num *)b)->node;
    return x < y ? -1 : x > y;
}

static size_t count_numbers(const cJSON *v)
{
    if (cJSON_IsNumber(v)) return 1;
    size_t n = 0;
    for (const cJSON *c = v ? v->child : NULL; c && (cJSON_IsArray(v) || cJSON_IsObject(v)); c = c->next)
        n += count_numbers(c);
    return n;
}

static void collect_numbers(const cJSON *v, struct dsv4_json_num *e, size_t *k)
{
    if (cJSON_IsNumber(v)) { e[(*k)++].node = v; return; }
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return;
    for (const cJSON *c = v->child; c; c = c->next) collect_numbers(c, e, k);
}

void dsv4_json_numbers_free(dsv4_json_numbers *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++) free(t->e[i].text);
    free(t->e);
    t->e = NULL;
    t->n = 0;
}

int dsv4_json_numbers_build(const cJSON *root, const char *text, size_t len, dsv4_json_numbers *out)
{
    out->e = NULL;
    out->n = 0;
    size_t n = count_numbers(root);
    if (n == 0) return 0;
    struct dsv4_json_num *e = calloc(n, sizeof *e);
    if (!e) return DSV4_ENOMEM;
    size_t k = 0;
    collect_numbers(root, e, &k);
    /* Number tokens of the text, in order; strings skipped. */
    size_t t = 0;
    for (size_t i = 0; i < len && text[i];) {
        char c = text[i];
        if (c == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\') i++;
            i++;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9')) { i++; continue; }
        size_t j = i;
        int is_float = 0;
        while (j < len && (strchr("+-.eE", text[j]) || (text[j] >= '0' && text[j] <= '9'))) {
            if (text[j] == '.' || text[j] == 'e' || text[j] == 'E') is_float = 1;
            j++;
        }
        if (t == n) { t++; break; }
        char tok[400];
        size_t tl = j - i < sizeof tok - 1 ? j - i : sizeof tok - 1;
        memcpy(tok, text + i, tl);
        tok[tl] = '\0';
        char buf[420];
        if (is_float) dsv4_pyjson_float(strtod(tok, NULL), buf, sizeof buf);
        else snprintf(buf, sizeof buf, "%s", strcmp(tok, "-0") ? tok : "0");
        /* the token must be the number cJSON parsed at this position */
        if (strtod(tok, NULL) != e[t].node->valuedouble && !(is_float && isinf(strtod(tok, NULL)))) { t = n + 1; break; }
        e[t].text = strdup(buf);
        if (!e[t].text) {
            struct dsv4_json_numbers tmp = {e, n};
            dsv4_json_numbers_free(&tmp);
            return DSV4_ENOMEM;
        }
        t++;
        i = j;
    }
    if (t != n) {
        struct dsv4_json_numbers tmp = {e, n};
        dsv4_json_numbers_free(&tmp);
        return DSV4_EINVAL;
    }
    qsort(e, n, sizeof *e, num_cmp);
    out->e = e;
    out->n = n;
    return 0;
}

static const char *known_number(const cJSON *v, const dsv4_json_numbers *nums)
{
    if (!nums || !nums->n) return NULL;
    struct dsv4_json_num key = {v, NULL};
    const struct dsv4_json_num *hit = bsearch(&key, nums->e, nums->n, sizeof key, num_cmp);
    return hit ? hit->text : NULL;
}

static void dump_number(double d, dsv4_sbuf *b)
{
    char buf[64];
    if (isfinite(d) && d == floor(d) && fabs(d) <= 9007199254740992.0)
        snprintf(buf, sizeof buf, "%lld", (long long)d);
    else
        dsv4_pyjson_float(d, buf, sizeof buf);
    dsv4_sbuf_puts(b, buf);
}

void dsv4_pyjson_dump(const cJSON *v, const dsv4_json_numbers *nums, dsv4_sbuf *b)
{
    if (!v || cJSON_IsNull(v)) { dsv4_sbuf_puts(b, "null"); return; }
    if (cJSON_IsTrue(v)) { dsv4_sbuf_puts(b, "true"); return; }
    if (cJSON_IsFalse(v)) { dsv4_sbuf_puts(b, "false"); return; }
    if (cJSON_IsNumber(v)) {
        const char *t = known_number(v, nums);
        if (t) dsv4_sbuf_puts(b, t);
        else dump_number(v->valuedouble, b);
        return;
    }
    if (cJSON_IsString(v)) { dump_string(v->valuestring ? v->valuestring : "", b); return; }
    if (cJSON_IsArray(v)) {
        dsv4_sbuf_put(b, "[", 1);
        int first = 1;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (!first) dsv4_sbuf_put(b, ", ", 2);
            first = 0;
            dsv4_pyjson_dump(c, nums, b);
        }
        dsv4_sbuf_put(b, "]", 1);
        return;
    }
    if (cJSON_IsObject(v)) {
        dsv4_sbuf_put(b, "{", 1);
        int first = 1;
        for (const cJSON *c = v->child; c; c = c->next) {
            const char *k = c->string ? c->string : "";
            int seen = 0;
            for (const cJSON *e = v->child; e != c; e = e->next)
                if (e->string && !strcmp(e->string, k)) { seen = 1; break; }
            if (seen) continue;
            const cJSON *val = c; /* duplicate key: last value, first position */
            for (const cJSON *e = c->next; e; e = e->next)
                if (e->string && !strcmp(e->string, k)) val = e;
            if (!first) dsv4_sbuf_put(b, ", ", 2);
            first = 0;
            dump_string(k, b);
            dsv4_sbuf_put(b, ": ", 2);
            dsv4_pyjson_dump(val, nums, b);
        }
        dsv4_sbuf_put(b, "}", 1);
        return;
    }
    dsv4_sbuf_puts(b, "null"); /* cJSON_Raw / invalid: not produced by the parser */
}
