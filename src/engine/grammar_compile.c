/*
 * JSON Schema subset -> matcher nodes, and the DSML tool-call grammar
 * (src/engine/grammar.h; spec/SERVING.md §1.7, §3.3, §4.6).
 *
 * Why refuse instead of ignore: a keyword we do not enforce (minimum,
 * pattern, $ref, ...) would let the server return output that a client's
 * validator rejects, while the request "succeeded". SERVING.md §3.3 asks
 * for a 400 naming the unsupported feature instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_internal.h"

#define MAX_NEST 12 /* schema levels (each object/array level takes two frames) */

typedef struct cctx {
    dsv4_grammar *g;
    dsv4_err *err;
    int any; /* the generic value node (json_object's values), built lazily */
} cctx;

static void set_first(gnode *n, int c) {
    n->first[c >> 3] |= (uint8_t)(1u << (c & 7));
}

static int new_node(cctx *x, int kind) {
    dsv4_grammar *g = x->g;
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
        gnode *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return -dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->addl = -1;
    n->items = -1;
    n->max_items = -1;
    n->max_len = -1;
    n->lit0 = g->n_lit;
    return g->n_nodes++;
}

static int add_lit(cctx *x, const char *s, size_t len) {
    dsv4_grammar *g = x->g;
    if (g->n_lit == g->cap_lit) {
        int cap = g->cap_lit ? 2 * g->cap_lit : 16;
        char **nl = realloc(g->lit, sizeof *nl * (size_t)cap);
        if (nl) g->lit = nl;
        int *nn = nl ? realloc(g->lit_len, sizeof *nn * (size_t)cap) : NULL;
        if (!nl || !nn) return dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
        g->lit_len = nn;
        g->cap_lit = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
    memcpy(c, s, len);
    c[len] = 0;
    g->lit[g->n_lit] = c;
    g->lit_len[g->n_lit++] = (int)len;
    return 0;
}

/* A LIT node of the given strings (first bytes from their first byte). */
static int lit_node(cctx *x, const char *const *s, int n) {
    int id = new_node(x, GK_LIT);
    if (id < 0) return id;
    for (int i = 0; i < n; i++) {
        if (add_lit(x, s[i], strlen(s[i]))) return -x->err->code;
        set_first(&x->g->nodes[id], (uint8_t)s[i][0]);
    }
    x->g->nodes[id].nlit = n;
    return id;
}

static int num_node(cctx *x, int integer) {
    int id = new_node(x, integer ? GK_INT : GK_NUM);
    if (id < 0) return id;
    set_first(&x->g->nodes[id], '-');
    for (int c = '0'; c <= '9'; c++)
        set_first(&x->g->nodes[id], c);
    return id;
}

static int str_node(cctx *x) {
    int id = new_node(x, GK_STR);
    if (id >= 0) set_first(&x->g->nodes[id], '"');
    return id;
}

/* The generic JSON value: object (any keys) | array | string | number |
 * true | false | null. Recursive through the object and array nodes. */
static int any_node(cctx *x) {
    if (x->any >= 0) return x->any;
    static const char *const tfn[] = {"true", "false", "null"};
    int any = new_node(x, GK_ANYOF);
    if (any < 0) return any;
    x->any = any;
    int kids[5];
    if ((kids[0] = new_node(x, GK_OBJ)) < 0) return kids[0];
    x->g->nodes[kids[0]].free = 1;
    x->g->nodes[kids[0]].addl = any;
    set_first(&x->g->nodes[kids[0]], '{');
    if ((kids[1] = new_node(x, GK_ARR)) < 0) return kids[1];
    x->g->nodes[kids[1]].items = any;
    set_first(&x->g->nodes[kids[1]], '[');
    if ((kids[2] = str_node(x)) < 0) return kids[2];
    if ((kids[3] = num_node(x, 0)) < 0) return kids[3];
    if ((kids[4] = lit_node(x, tfn, 3)) < 0) return kids[4];
    gnode *a = &x->g->nodes[any];
    a->kid = malloc(sizeof(int) * 5);
    if (!a->kid) return -dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
    memcpy(a->kid, kids, sizeof kids);
    a->nkid = 5;
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 32; b++)
            a->first[b] |= x->g->nodes[kids[i]].first[b];
    return any;
}

static const char *const k_ignored[] = {"title",      "description", "default",   "examples",
                                        "$schema",    "$id",         "$comment",  "strict",
                                        "deprecated", "readOnly",    "writeOnly", NULL};
static const char *const k_known[] = {"type",      "properties", "required", "additionalProperties",
                                      "items",     "minItems",   "maxItems", "minLength",
                                      "maxLength", "enum",       "const",    "anyOf",
                                      "oneOf",     NULL};

static int in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static int compile(cctx *x, const cJSON *sc, const char *path, int nest);

static int nonneg_int(cctx *x, const cJSON *sc, const char *key, const char *path, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sc, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 ||
        v->valuedouble != (double)(int)v->valuedouble)
        return dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"%s\" must be a non-negative integer", path, key);
    *out = (int)v->valuedouble;
    return 0;
}

/* enum / const: literals of the compact JSON text of each member. */
static int enum_node(cctx *x, const cJSON *vals, int is_const, const char *path) {
    int n = is_const ? 1 : cJSON_GetArraySize(vals);
    if (!is_const && (!cJSON_IsArray(vals) || n < 1))
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"enum\" must be a non-empty array", path);
    if (n > GR_MAX_SET)
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"enum\" has %d values, at most %d are supported",
                             path, n, GR_MAX_SET);
    int id = new_node(x, GK_LIT);
    if (id < 0) return id;
    for (int i = 0; i < n; i++) {
        const cJSON *v = is_const ? vals : cJSON_GetArrayItem(vals, i);
        char *t = cJSON_PrintUnformatted(v);
        if (!t) return -dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
        int dup = 0;
        for (int j = 0; j < i; j++)
            if (!strcmp(x->g->lit[x->g->nodes[id].lit0 + j], t)) dup = 1;
        if (dup) {
            free(t);
            return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"enum\" lists a value twice", path);
        }
        int rc = add_lit(x, t, strlen(t));
        set_first(&x->g->nodes[id], (uint8_t)t[0]);
        free(t);
        if (rc) return -rc;
        x->g->nodes[id].nlit = i + 1;
    }
    return id;
}

static int union_node(cctx *x, const int *kids, int n, const char *path, const char *what) {
    if (n == 1) return kids[0];
    int id = new_node(x, GK_ANYOF);
    if (id < 0) return id;
    gnode *a = &x->g->nodes[id];
    a->kid = malloc(sizeof(int) * (size_t)n);
    if (!a->kid) return -dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
    memcpy(a->kid, kids, sizeof(int) * (size_t)n);
    a->nkid = n;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 32; b++) {
            if (a->first[b] & x->g->nodes[kids[i]].first[b])
                return -dsv4_err_set(
                    x->err, DSV4_EINVAL,
                    "%s: \"%s\" branches %d and an earlier one can start with the same character "
                    "(e.g. two objects); only branches of different JSON types are supported",
                    path, what, i);
            a->first[b] |= x->g->nodes[kids[i]].first[b];
        }
    return id;
}

static int object_node(cctx *x, const cJSON *sc, const char *path, int nest) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sc, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sc, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(sc, "additionalProperties");
    char sub[512];
    if (props && !cJSON_IsObject(props))
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"properties\" must be an object", path);
    int np = cJSON_GetArraySize(props);
    if (np > GR_MAX_SET)
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: %d properties, at most %d are supported", path, np,
                             GR_MAX_SET);
    int *kids = np ? malloc(sizeof(int) * (size_t)np) : NULL;
    if (np && !kids) return -dsv4_err_set(x->err, DSV4_ENOMEM, "out of memory compiling a grammar");
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        snprintf(sub, sizeof sub, "%s.properties.%s", path, p->string);
        for (const char *q = p->string; *q; q++)
            if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20 || *q == '<') {
                free(kids);
                return -dsv4_err_set(x->err, DSV4_EINVAL,
                                     "%s: property names with quotes, backslashes, '<' or "
                                     "control characters are not supported",
                                     sub);
            }
        int k = compile(x, p, sub, nest + 1);
        if (k < 0) {
            free(kids);
            return k;
        }
        kids[i++] = k;
    }
    int addl = -1, free_ = 1;
    if (ap && cJSON_IsFalse(ap))
        free_ = 0;
    else if (ap && cJSON_IsObject(ap)) {
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        addl = compile(x, ap, sub, nest + 1);
    } else if (ap && !cJSON_IsTrue(ap)) {
        free(kids);
        return -dsv4_err_set(x->err, DSV4_EINVAL,
                             "%s: \"additionalProperties\" must be a boolean or a schema", path);
    }
    if (addl < 0 && free_) addl = any_node(x);
    if (addl < 0 && free_) {
        free(kids);
        return addl;
    }
    int id = new_node(x, GK_OBJ);
    if (id < 0) {
        free(kids);
        return id;
    }
    gnode *n = &x->g->nodes[id];
    n->kid = kids;
    n->nkid = np;
    n->free = free_;
    n->addl = addl;
    set_first(n, '{');
    cJSON_ArrayForEach(p, props) {
        if (add_lit(x, p->string, strlen(p->string))) return -x->err->code;
        x->g->nodes[id].nlit++;
    }
    if (req && !cJSON_IsArray(req))
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"required\" must be an array of names", path);
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        int found = -1, j = 0;
        cJSON_ArrayForEach(p, props) {
            if (cJSON_IsString(r) && !strcmp(p->string, r->valuestring)) found = j;
            j++;
        }
        if (found < 0)
            return -dsv4_err_set(x->err, DSV4_EINVAL,
                                 "%s: \"required\" names \"%s\", which is not in \"properties\"", path,
                                 cJSON_IsString(r) ? r->valuestring : "?");
        x->g->nodes[id].required |= 1ull << found;
    }
    return id;
}

static int typed_node(cctx *x, const cJSON *sc, const char *type, const char *path, int nest) {
    static const char *const tf[] = {"true", "false"}, *const nul[] = {"null"};
    if (!strcmp(type, "object")) return object_node(x, sc, path, nest);
    if (!strcmp(type, "string")) {
        int id = str_node(x);
        if (id < 0) return id;
        int mn = 0, mx = -1;
        if (nonneg_int(x, sc, "minLength", path, &mn) || nonneg_int(x, sc, "maxLength", path, &mx))
            return -x->err->code;
        if (mx >= 0 && mn > mx)
            return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"minLength\" is greater than \"maxLength\"",
                                 path);
        x->g->nodes[id].min_len = mn;
        x->g->nodes[id].max_len = mx;
        return id;
    }
    if (!strcmp(type, "number")) return num_node(x, 0);
    if (!strcmp(type, "integer")) return num_node(x, 1);
    if (!strcmp(type, "boolean")) return lit_node(x, tf, 2);
    if (!strcmp(type, "null")) return lit_node(x, nul, 1);
    if (!strcmp(type, "array")) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(sc, "items");
        char sub[512];
        snprintf(sub, sizeof sub, "%s.items", path);
        int items;
        if (it && !cJSON_IsObject(it))
            return -dsv4_err_set(x->err, DSV4_EINVAL,
                                 "%s: \"items\" must be a schema object (tuples are not supported)", path);
        items = it ? compile(x, it, sub, nest + 1) : any_node(x);
        if (items < 0) return items;
        int mn = 0, mx = -1;
        if (nonneg_int(x, sc, "minItems", path, &mn) || nonneg_int(x, sc, "maxItems", path, &mx))
            return -x->err->code;
        if (mx >= 0 && mn > mx)
            return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"minItems\" is greater than \"maxItems\"", path);
        int id = new_node(x, GK_ARR);
        if (id < 0) return id;
        gnode *n = &x->g->nodes[id];
        n->items = items;
        n->min_items = mn;
        n->max_items = mx;
        set_first(n, '[');
        return id;
    }
    return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: unknown type \"%s\"", path, type);
}

/* Returns the node id (>= 0) or -code with x->err set. */
static int compile(cctx *x, const cJSON *sc, const char *path, int nest) {
    if (nest > MAX_NEST)
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: the schema nests deeper than %d levels", path,
                             MAX_NEST);
    if (cJSON_IsTrue(sc)) return any_node(x);
    if (!cJSON_IsObject(sc))
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: a schema must be an object", path);
    const cJSON *k;
    cJSON_ArrayForEach(k, sc) {
        if (in_list(k_known, k->string) || in_list(k_ignored, k->string)) continue;
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: keyword \"%s\" is not supported", path, k->string);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sc, "enum"),
                *co = cJSON_GetObjectItemCaseSensitive(sc, "const");
    if (co) return enum_node(x, co, 1, path);
    if (en) return enum_node(x, en, 0, path);
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(sc, "anyOf");
    const char *what = "anyOf";
    if (!any) {
        any = cJSON_GetObjectItemCaseSensitive(sc, "oneOf");
        what = "oneOf";
    }
    if (any) {
        int n = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || n < 1 || n > 8)
            return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"%s\" must be an array of 1 to 8 schemas", path,
                                 what);
        if (cJSON_GetObjectItemCaseSensitive(sc, "type"))
            return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"%s\" next to \"type\" is not supported", path,
                                 what);
        int kids[8];
        char sub[512];
        for (int i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s.%s[%d]", path, what, i);
            if ((kids[i] = compile(x, cJSON_GetArrayItem(any, i), sub, nest + 1)) < 0) return kids[i];
        }
        return union_node(x, kids, n, path, what);
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
    if (!ty) {
        /* untyped: object/array keywords still apply when present */
        if (cJSON_GetObjectItemCaseSensitive(sc, "properties")) return object_node(x, sc, path, nest);
        if (cJSON_GetObjectItemCaseSensitive(sc, "items")) return typed_node(x, sc, "array", path, nest);
        return any_node(x);
    }
    if (cJSON_IsString(ty)) return typed_node(x, sc, ty->valuestring, path, nest);
    int n = cJSON_GetArraySize(ty);
    if (!cJSON_IsArray(ty) || n < 1 || n > 7)
        return -dsv4_err_set(x->err, DSV4_EINVAL, "%s: \"type\" must be a string or an array of type names",
                             path);
    int kids[7];
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(ty, i);
        if (!cJSON_IsString(t))
            return -dsv4_err_set(x->err, DSV4_EINVAL,
                                 "%s: \"type\" must be a string or an array of type names", path);
        if ((kids[i] = typed_node(x, sc, t->valuestring, path, nest)) < 0) return kids[i];
    }
    return union_node(x, kids, n, path, "type");
}

void dsv4_grammar_free(dsv4_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++)
        free(g->nodes[i].kid);
    for (int i = 0; i < g->n_lit; i++)
        free(g->lit[i]);
    free(g->nodes);
    free(g->lit);
    free(g->lit_len);
    free(g->tool_obj);
    free(g->tool_pname);
    free(g);
}

int dsv4_grammar_from_schema(const cJSON *schema, dsv4_grammar **out, dsv4_err *err) {
    *out = NULL;
    dsv4_grammar *g = calloc(1, sizeof *g);
    if (!g) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory compiling a grammar");
    cctx x = {g, err, -1};
    g->max_ws = DSV4_GRAMMAR_MAX_WS;
    int root;
    if (!schema) { /* json_object: any object */
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "type", "object")) {
            cJSON_Delete(o);
            dsv4_grammar_free(g);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory compiling a grammar");
        }
        root = compile(&x, o, "schema", 0);
        cJSON_Delete(o);
    } else {
        root = compile(&x, schema, "schema", 0);
    }
    if (root < 0) {
        dsv4_grammar_free(g);
        return -root;
    }
    g->root = root;
    *out = g;
    return DSV4_OK;
}

#define DSML DSV4_GRAMMAR_SYM_DSML /* the ｜DSML｜ token (grammar.h, symbols) */

int dsv4_grammar_for_tools(const cJSON *tools, const char *only, dsv4_grammar **out, dsv4_err *err) {
    *out = NULL;
    int nt = cJSON_GetArraySize(tools);
    if (!cJSON_IsArray(tools) || nt < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "tool_choice %s needs a non-empty `tools` array",
                            only ? "naming a function" : "\"required\"");
    if (nt > GR_MAX_SET)
        return dsv4_err_set(err, DSV4_EINVAL, "tools: at most %d tools are supported", GR_MAX_SET);
    dsv4_grammar *g = calloc(1, sizeof *g);
    if (g) {
        g->tool_obj = malloc(sizeof(int) * (size_t)nt);
        g->tool_pname = malloc(sizeof(int) * (size_t)nt);
    }
    if (!g || !g->tool_obj || !g->tool_pname) {
        dsv4_grammar_free(g);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory compiling a grammar");
    }
    cctx x = {g, err, -1};
    g->max_ws = DSV4_GRAMMAR_MAX_WS;
    g->dsml = 1;
    g->root = -1;
    g->ntools = nt;
    g->single = only != NULL;
    int rc = 0;
    char path[128], buf[1024];
    static const char *const open[] = {"\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\""};
    static const char *const body[] = {"<" DSML "parameter name=\"", "</" DSML "invoke>",
                                       "\n</" DSML "invoke>"};
    static const char *const flag[] = {"true\">", "false\">"};
    static const char *const pclose[] = {"</" DSML "parameter>\n"};
    static const char *const after[] = {"\n<" DSML "invoke name=\"", "\n</" DSML "tool_calls>"};
    if ((g->n_open = lit_node(&x, open, 1)) < 0 || (g->n_body = lit_node(&x, body, 3)) < 0 ||
        (g->n_flag = lit_node(&x, flag, 2)) < 0 || (g->n_pclose = lit_node(&x, pclose, 1)) < 0 ||
        (g->n_after = lit_node(&x, after, 2)) < 0) {
        rc = err->code;
        goto fail;
    }
    /* per tool: parameters, then its `KEY" string="` literals */
    const char **names = calloc((size_t)nt, sizeof *names);
    if (!names) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory compiling a grammar");
        goto fail;
    }
    for (int i = 0; i < nt && !rc; i++) {
        const cJSON *t = cJSON_GetArrayItem(tools, i);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 256 ||
            strpbrk(nm->valuestring, "\"<\n")) {
            rc = dsv4_err_set(err, DSV4_EINVAL,
                              "tools[%d].function.name must be a non-empty name without quotes, "
                              "'<' or newlines",
                              i);
            break;
        }
        names[i] = nm->valuestring;
        for (int j = 0; j < i; j++)
            if (!strcmp(names[j], names[i]))
                rc = dsv4_err_set(err, DSV4_EINVAL,
                                  "tools[%d]: the name \"%s\" is "
                                  "used twice",
                                  i, names[i]);
        if (!only || !strcmp(only, names[i])) g->tool_mask |= 1ull << i;
        g->tool_obj[i] = g->tool_pname[i] = -1;
        if (rc || !params || cJSON_IsNull(params)) continue;
        snprintf(path, sizeof path, "tools[%d].function.parameters", i);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(params, "type");
        if (!cJSON_IsObject(params) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object")))) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "%s must be an object schema (\"type\": \"object\")", path);
            break;
        }
        int obj = compile(&x, params, path, 1);
        if (obj < 0) {
            rc = -obj;
            break;
        }
        if (g->nodes[obj].kind != GK_OBJ) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "%s must be an object schema", path);
            break;
        }
        g->tool_obj[i] = obj;
        gnode o = g->nodes[obj];
        if (o.nlit == 0) continue;
        int pn = new_node(&x, GK_LIT);
        if (pn < 0) {
            rc = -pn;
            break;
        }
        for (int j = 0; j < o.nlit && !rc; j++) {
            int len = snprintf(buf, sizeof buf, "%s\" string=\"", g->lit[o.lit0 + j]);
            if (len >= (int)sizeof buf)
                rc = dsv4_err_set(err, DSV4_EINVAL, "%s: a property name is too long", path);
            else
                rc = add_lit(&x, buf, (size_t)len);
        }
        g->nodes[pn].nlit = o.nlit;
        g->tool_pname[i] = pn;
    }
    if (!rc && only && !g->tool_mask)
        rc = dsv4_err_set(err, DSV4_EINVAL, "tool_choice names the function \"%s\", which is not in `tools`",
                          only);
    if (!rc) {
        int id = new_node(&x, GK_LIT);
        if (id < 0) rc = -id;
        for (int i = 0; i < nt && !rc; i++) {
            int len = snprintf(buf, sizeof buf, "%s\">\n", names[i]);
            rc = add_lit(&x, buf, (size_t)len);
        }
        if (!rc) {
            g->nodes[id].nlit = nt;
            g->n_toolname = id;
        }
    }
    free(names);
    if (rc) goto fail;
    *out = g;
    return DSV4_OK;
fail:
    dsv4_grammar_free(g);
    return rc ? rc : DSV4_EINTERNAL;
}
