/*
 * The byte-level matcher of src/engine/grammar.h: a pushdown automaton over
 * compiled schema nodes (grammar_compile.c).
 *
 * Each frame matches one thing: a value about to start (F_VALUE, which skips
 * whitespace and then turns into the frame its first byte selects), an
 * object, a key, an array, a string, a number, one of a set of literals
 * (true/false/null, enum/const members, DSML markup), a raw DSML string
 * value, or the DSML block itself. A frame handles a byte with one of three
 * outcomes: consumed, rejected, or "popped without consuming" (numbers and
 * literals end at the first byte that cannot extend them; the parent then
 * sees that byte). Every transition keeps at least one way to finish open, so
 * a state reached by accepted bytes never dead-ends.
 */
#include <string.h>

#include "engine/grammar_internal.h"

enum { F_VALUE = 1, F_OBJ, F_KEY, F_ARR, F_STR, F_NUM, F_LIT, F_RAW, F_DSML };
enum { R_REJ = 0, R_OK = 1, R_AGAIN = 2 };

/* object phases */
enum { O_FIRST, O_NEXT, O_COLON, O_AFTER };
/* array phases */
enum { A_FIRST, A_AFTER };
/* DSML phases */
enum {
    D_START,
    D_NAME,
    D_GOT_NAME,
    D_BODY,
    D_GOT_BODY,
    D_GOT_PNAME,
    D_GOT_FLAG,
    D_PEND,
    D_AFTER,
    D_GOT_AFTER
};

static int is_ws(int c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
static int has(const uint8_t *set, int c) {
    return (set[c >> 3] >> (c & 7)) & 1;
}
static uint64_t all_bits(int n) {
    return n >= 64 ? ~0ull : ((1ull << n) - 1);
}

static int ws_ok(const dsv4_grammar *g, dsv4_grammar_state *s) {
    if (s->ws >= g->max_ws) return R_REJ;
    s->ws++;
    return R_OK;
}

static dsv4_gframe *push(dsv4_grammar_state *s, int kind, int node) {
    if (s->depth >= DSV4_GRAMMAR_MAX_DEPTH) return NULL;
    dsv4_gframe *f = &s->f[s->depth++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = node;
    return f;
}

static void push_lit(dsv4_grammar_state *s, int node, uint64_t mask) {
    dsv4_gframe *f = push(s, F_LIT, node);
    if (f) f->b = mask;
}

/* Pop the top frame, handing a literal's match index to the parent. */
static void pop(dsv4_grammar_state *s, int result) {
    s->depth--;
    if (s->depth > 0) s->f[s->depth - 1].c = (int16_t)result;
}

/*
 * UTF-8 well-formedness (Unicode Table 3-7), shared by strings and raw DSML
 * values. sub: 0 = between characters; otherwise the range the next
 * continuation byte must be in and what follows it.
 */
enum { U_TAIL1 = 10, U_E0, U_TAIL2, U_ED, U_F0, U_TAIL3, U_F4 };
static int utf8_lead(uint8_t *sub, int c) {
    if (c >= 0xC2 && c <= 0xDF)
        *sub = U_TAIL1;
    else if (c == 0xE0)
        *sub = U_E0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        *sub = U_TAIL2;
    else if (c == 0xED)
        *sub = U_ED;
    else if (c == 0xF0)
        *sub = U_F0;
    else if (c >= 0xF1 && c <= 0xF3)
        *sub = U_TAIL3;
    else if (c == 0xF4)
        *sub = U_F4;
    else
        return 0;
    return 1;
}
static int utf8_cont(uint8_t *sub, int c) {
    int lo = 0x80, hi = 0xBF, next;
    switch (*sub) {
    case U_TAIL1:
        next = 0;
        break;
    case U_E0:
        lo = 0xA0;
        next = U_TAIL1;
        break;
    case U_TAIL2:
        next = U_TAIL1;
        break;
    case U_ED:
        hi = 0x9F;
        next = U_TAIL1;
        break;
    case U_F0:
        lo = 0x90;
        next = U_TAIL2;
        break;
    case U_TAIL3:
        next = U_TAIL2;
        break;
    case U_F4:
        hi = 0x8F;
        next = U_TAIL2;
        break;
    default:
        return 0;
    }
    if (c < lo || c > hi) return 0;
    *sub = (uint8_t)next;
    return 1;
}

/* JSON string content. sub: 0 normal, 1 after '\', 2..5 \u hex digits
 * (6 = second digit after a 'd': no surrogates), >= 10 UTF-8 tails. */
enum { SB_REJ, SB_NEW, SB_CONT, SB_CLOSE };
static int is_hex(int c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static int str_byte(uint8_t *sub, int c) {
    switch (*sub) {
    case 0:
        if (c == '"') return SB_CLOSE;
        if (c == '\\') {
            *sub = 1;
            return SB_NEW;
        }
        if (c < 0x20) return SB_REJ;
        if (c < 0x80) return SB_NEW;
        return utf8_lead(sub, c) ? SB_NEW : SB_REJ;
    case 1:
        if (c == 'u') {
            *sub = 2;
            return SB_CONT;
        }
        if (strchr("\"\\/bfnrt", c) && c) {
            *sub = 0;
            return SB_CONT;
        }
        return SB_REJ;
    case 2:
        if (!is_hex(c)) return SB_REJ;
        *sub = (c == 'd' || c == 'D') ? 6 : 3;
        return SB_CONT;
    case 6:
        if (c < '0' || c > '7') return SB_REJ;
        *sub = 4;
        return SB_CONT;
    case 3:
    case 4:
    case 5:
        if (!is_hex(c)) return SB_REJ;
        *sub = *sub == 5 ? 0 : (uint8_t)(*sub + 1);
        return SB_CONT;
    default:
        return utf8_cont(sub, c) ? SB_CONT : SB_REJ;
    }
}

/* F_VALUE: whitespace, then the first byte picks the frame. */
static int value_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    if (is_ws(c)) return ws_ok(g, s);
    int n = f->node;
    while (g->nodes[n].kind == GK_ANYOF) {
        const gnode *a = &g->nodes[n];
        int pick = -1;
        for (int i = 0; i < a->nkid && pick < 0; i++)
            if (has(g->nodes[a->kid[i]].first, c)) pick = a->kid[i];
        if (pick < 0) return R_REJ;
        n = pick;
    }
    const gnode *nd = &g->nodes[n];
    if (!has(nd->first, c)) return R_REJ;
    /* room for the deepest frames an object/array needs below it (key or
     * value + string); generic (recursive) values stop nesting here */
    if ((c == '{' || c == '[') && s->depth > DSV4_GRAMMAR_MAX_DEPTH - 3) return R_REJ;
    memset(f, 0, sizeof *f);
    f->node = n;
    switch (nd->kind) {
    case GK_OBJ:
        f->kind = F_OBJ;
        f->phase = O_FIRST;
        return R_OK;
    case GK_ARR:
        f->kind = F_ARR;
        f->phase = A_FIRST;
        return R_OK;
    case GK_STR:
        f->kind = F_STR;
        return R_OK;
    case GK_NUM:
    case GK_INT:
        f->kind = F_NUM;
        return R_AGAIN;
    case GK_LIT:
        f->kind = F_LIT;
        f->b = all_bits(nd->nlit);
        return R_AGAIN;
    default:
        return R_REJ;
    }
}

static int obj_key_possible(const gnode *nd, uint64_t seen) {
    return nd->free || (all_bits(nd->nlit) & ~seen) != 0;
}

static int obj_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    const gnode *nd = &g->nodes[f->node];
    int can_close = (nd->required & ~f->b) == 0;
    if (is_ws(c)) return ws_ok(g, s);
    switch (f->phase) {
    case O_FIRST:
    case O_NEXT:
        if (c == '}' && f->phase == O_FIRST && can_close) {
            pop(s, 0);
            return R_OK;
        }
        if (c != '"' || !obj_key_possible(nd, f->b)) return R_REJ;
        f->phase = O_COLON;
        {
            int node = f->node;
            uint64_t seen = f->b;
            dsv4_gframe *k = push(s, F_KEY, node);
            if (!k) return R_REJ;
            k->flags = (uint8_t)nd->free;
            k->b = nd->free ? all_bits(nd->nlit) : all_bits(nd->nlit) & ~seen;
        }
        return R_OK;
    case O_COLON: {
        if (c != ':') return R_REJ;
        f->phase = O_AFTER;
        int child = f->c >= 0 ? nd->kid[f->c] : nd->addl;
        return push(s, F_VALUE, child) ? R_OK : R_REJ;
    }
    case O_AFTER:
        if (c == '}' && can_close) {
            pop(s, 0);
            return R_OK;
        }
        if (c == ',' && obj_key_possible(nd, f->b)) {
            f->phase = O_NEXT;
            return R_OK;
        }
        return R_REJ;
    }
    return R_REJ;
}

/* F_KEY: node = the object; b = property names still possible; a = bytes
 * so far; flags = other keys allowed. Keys of objects with declared
 * properties are matched raw (no escapes), so "\u0061" cannot smuggle in a
 * declared name with an unchecked value. */
static int key_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    const gnode *nd = &g->nodes[f->node];
    uint8_t sub = f->sub;
    int r = str_byte(&sub, c);
    if (r == SB_REJ) return R_REJ;
    if (r == SB_CLOSE) {
        int match = -1;
        for (int i = 0; i < nd->nlit; i++)
            if (((f->b >> i) & 1) && g->lit_len[nd->lit0 + i] == (int)f->a) match = i;
        dsv4_gframe *obj = &s->f[s->depth - 2];
        if (match < 0 && !f->flags) return R_REJ;
        if (match >= 0 && ((obj->b >> match) & 1)) return R_REJ; /* duplicate */
        if (match >= 0) obj->b |= 1ull << match;
        pop(s, match);
        return R_OK;
    }
    if (nd->nlit > 0 && (c == '\\' || f->sub == 1)) return R_REJ;
    uint64_t nb = 0;
    for (int i = 0; i < nd->nlit; i++)
        if (((f->b >> i) & 1) && g->lit_len[nd->lit0 + i] > (int)f->a &&
            (uint8_t)g->lit[nd->lit0 + i][f->a] == c)
            nb |= 1ull << i;
    if (!nb && !f->flags) return R_REJ;
    f->b = nb;
    f->a++;
    f->sub = sub;
    return R_OK;
}

static int arr_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    const gnode *nd = &g->nodes[f->node];
    if (is_ws(c)) return ws_ok(g, s);
    if (c == ']' && (f->phase == A_AFTER || nd->min_items == 0) && (int)f->a >= nd->min_items) {
        pop(s, 0);
        return R_OK;
    }
    if (f->phase == A_FIRST) {
        if (nd->max_items == 0) return R_REJ;
        f->phase = A_AFTER;
        f->a = 1;
        return push(s, F_VALUE, nd->items) ? R_AGAIN : R_REJ;
    }
    if (c == ',' && (nd->max_items < 0 || (int)f->a < nd->max_items)) {
        f->a++;
        return push(s, F_VALUE, nd->items) ? R_OK : R_REJ;
    }
    return R_REJ;
}

static int strv_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    const gnode *nd = &g->nodes[f->node];
    int r = str_byte(&f->sub, c);
    if (r == SB_REJ) return R_REJ;
    if (r == SB_CLOSE) {
        if ((int64_t)f->b < nd->min_len) return R_REJ;
        pop(s, 0);
        return R_OK;
    }
    if (r == SB_NEW) {
        if (nd->max_len >= 0 && (int64_t)f->b >= nd->max_len) return R_REJ;
        f->b++;
    }
    return R_OK;
}

/* F_NUM phases: 0 start, 1 after '-', 2 leading 0, 3 int digits, 4 after '.',
 * 5 fraction digits, 6 after 'e', 7 after exponent sign, 8 exponent digits.
 * a = bytes so far, d = exponent digits. Terminal: 2, 3, 5, 8. */
static int num_terminal(int ph) {
    return ph == 2 || ph == 3 || ph == 5 || ph == 8;
}
static int num_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    int integer = g->nodes[f->node].kind == GK_INT, dig = c >= '0' && c <= '9';
    int room = f->a < DSV4_GRAMMAR_MAX_NUM;
    int next = -1;
    switch (f->phase) {
    case 0:
        next = c == '-' ? 1 : c == '0' ? 2 : dig ? 3 : -1;
        break;
    case 1:
        next = c == '0' ? 2 : dig ? 3 : -1;
        break;
    case 2:
    case 3:
        if (dig && f->phase == 3 && room)
            next = 3;
        else if (!integer && room && c == '.')
            next = 4;
        else if (!integer && room && (c == 'e' || c == 'E'))
            next = 6;
        break;
    case 4:
        next = dig ? 5 : -1;
        break;
    case 5:
        if (dig && room)
            next = 5;
        else if (room && (c == 'e' || c == 'E'))
            next = 6;
        break;
    case 6:
        next = (c == '+' || c == '-') ? 7 : dig ? 8 : -1;
        break;
    case 7:
        next = dig ? 8 : -1;
        break;
    case 8:
        next = dig && f->d < 3 ? 8 : -1;
        break;
    }
    if (next < 0) {
        if (!num_terminal(f->phase)) return R_REJ;
        pop(s, 0);
        return R_AGAIN;
    }
    if (next == 8) f->d++;
    f->phase = (uint8_t)next;
    f->a++;
    return R_OK;
}

/* F_LIT: b = literals still possible (initial set chosen by the pusher),
 * a = bytes matched. Pops with the matched literal's index as the parent's c. */
static int lit_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    const gnode *nd = &g->nodes[f->node];
    uint64_t nb = 0;
    int done = -1;
    for (int i = 0; i < nd->nlit; i++) {
        if (!((f->b >> i) & 1)) continue;
        int len = g->lit_len[nd->lit0 + i];
        if (len > (int)f->a && (uint8_t)g->lit[nd->lit0 + i][f->a] == c) nb |= 1ull << i;
        if (len == (int)f->a) done = i;
    }
    if (!nb) {
        if (done < 0) return R_REJ;
        pop(s, done);
        return R_AGAIN;
    }
    f->b = nb;
    f->a++;
    int longer = 0, exact = -1;
    for (int i = 0; i < nd->nlit; i++)
        if ((nb >> i) & 1) {
            if (g->lit_len[nd->lit0 + i] > (int)f->a)
                longer = 1;
            else
                exact = i;
        }
    if (!longer) pop(s, exact);
    return R_OK;
}

/* F_RAW: a string="true" DSML value: any UTF-8 text up to '<' (which starts
 * the parameter closer, so values cannot contain '<'). */
static int raw_byte(dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    if (f->sub) return utf8_cont(&f->sub, c) ? R_OK : R_REJ;
    if (c == '<') {
        pop(s, 0);
        return R_AGAIN;
    }
    if (c == 0) return R_REJ;
    if (c < 0x80) return R_OK;
    return utf8_lead(&f->sub, c) ? R_OK : R_REJ;
}

static int param_is_plain_string(const dsv4_grammar *g, int node) {
    const gnode *nd = &g->nodes[node];
    return nd->kind == GK_STR && nd->min_len <= 0 && nd->max_len < 0;
}

/* F_DSML: d = tool, a = parameters so far, b = parameters seen, sub = the
 * current parameter, c = the last literal matched. Each phase pushes the
 * next piece and lets it take the byte. */
static int dsml_byte(const dsv4_grammar *g, dsv4_grammar_state *s, dsv4_gframe *f, int c) {
    (void)c;
    int obj, pn;
    switch (f->phase) {
    case D_START:
        f->phase = D_NAME;
        push_lit(s, g->n_open, 1);
        return R_AGAIN;
    case D_NAME:
        f->phase = D_GOT_NAME;
        push_lit(s, g->n_toolname, g->tool_mask);
        return R_AGAIN;
    case D_GOT_NAME:
        f->d = (uint16_t)f->c;
        f->a = 0;
        f->b = 0;
        f->phase = D_BODY;
        return R_AGAIN;
    case D_BODY: {
        obj = g->tool_obj[f->d];
        const gnode *nd = obj >= 0 ? &g->nodes[obj] : NULL;
        uint64_t unseen = nd ? all_bits(nd->nlit) & ~f->b : 0, req = nd ? nd->required : 0;
        uint64_t m = 0;
        if (unseen) m |= 1;
        if (f->a > 0 && (req & ~f->b) == 0) m |= 2;
        if (f->a == 0 && req == 0) m |= 4;
        f->phase = D_GOT_BODY;
        push_lit(s, g->n_body, m);
        return R_AGAIN;
    }
    case D_GOT_BODY:
        if (f->c != 0) {
            f->phase = D_AFTER;
            return R_AGAIN;
        }
        obj = g->tool_obj[f->d];
        pn = g->tool_pname[f->d];
        f->phase = D_GOT_PNAME;
        push_lit(s, pn, all_bits(g->nodes[obj].nlit) & ~f->b);
        return R_AGAIN;
    case D_GOT_PNAME:
        f->sub = (uint8_t)f->c;
        f->b |= 1ull << f->c;
        f->a++;
        f->phase = D_GOT_FLAG;
        obj = g->tool_obj[f->d];
        push_lit(s, g->n_flag, param_is_plain_string(g, g->nodes[obj].kid[f->sub]) ? 3 : 2);
        return R_AGAIN;
    case D_GOT_FLAG:
        f->phase = D_PEND;
        obj = g->tool_obj[f->d];
        if (f->c == 0)
            push(s, F_RAW, -1);
        else
            push(s, F_VALUE, g->nodes[obj].kid[f->sub]);
        return R_AGAIN;
    case D_PEND:
        f->phase = D_BODY;
        push_lit(s, g->n_pclose, 1);
        return R_AGAIN;
    case D_AFTER:
        f->phase = D_GOT_AFTER;
        push_lit(s, g->n_after, g->single ? 2 : 3);
        return R_AGAIN;
    case D_GOT_AFTER:
        if (f->c == 1) return R_REJ; /* the block is closed */
        f->phase = D_NAME;
        return R_AGAIN;
    }
    return R_REJ;
}

static int frame_byte(const dsv4_grammar *g, dsv4_grammar_state *s, int c) {
    dsv4_gframe *f = &s->f[s->depth - 1];
    switch (f->kind) {
    case F_VALUE:
        return value_byte(g, s, f, c);
    case F_OBJ:
        return obj_byte(g, s, f, c);
    case F_KEY:
        return key_byte(g, s, f, c);
    case F_ARR:
        return arr_byte(g, s, f, c);
    case F_STR:
        return strv_byte(g, s, f, c);
    case F_NUM:
        return num_byte(g, s, f, c);
    case F_LIT:
        return lit_byte(g, s, f, c);
    case F_RAW:
        return raw_byte(s, f, c);
    case F_DSML:
        return dsml_byte(g, s, f, c);
    }
    return R_REJ;
}

/* One byte on s in place; on rejection s is left partly modified (callers
 * work on a copy). */
static int step_inplace(const dsv4_grammar *g, dsv4_grammar_state *s, int c) {
    if (!is_ws(c)) s->ws = 0;
    /* a DSML phase change or a popped number/literal hands the byte on;
     * bounded: each AGAIN either pops a frame or advances a DSML phase */
    for (int guard = 0; guard < 4 * DSV4_GRAMMAR_MAX_DEPTH + 16; guard++) {
        if (s->depth == 0) return 0;
        int r = frame_byte(g, s, c);
        if (r != R_AGAIN) return r == R_OK;
    }
    return 0;
}

void dsv4_grammar_init(const dsv4_grammar *g, dsv4_grammar_state *s) {
    memset(s, 0, sizeof *s);
    if (g->dsml)
        push(s, F_DSML, -1);
    else
        push(s, F_VALUE, g->root);
}

static void state_copy(dsv4_grammar_state *dst, const dsv4_grammar_state *src) {
    dst->depth = src->depth;
    dst->ws = src->ws;
    memcpy(dst->f, src->f, sizeof(dsv4_gframe) * (size_t)src->depth);
}

int dsv4_grammar_byte(const dsv4_grammar *g, dsv4_grammar_state *s, uint8_t byte) {
    dsv4_grammar_state t;
    state_copy(&t, s);
    if (!step_inplace(g, &t, byte)) return 0;
    state_copy(s, &t);
    return 1;
}

int dsv4_grammar_bytes(const dsv4_grammar *g, dsv4_grammar_state *s, const void *bytes, size_t n) {
    dsv4_grammar_state t;
    state_copy(&t, s);
    for (size_t i = 0; i < n; i++)
        if (!step_inplace(g, &t, ((const uint8_t *)bytes)[i])) return 0;
    state_copy(s, &t);
    return 1;
}

/* For the vocabulary walk: next = s + byte; 1 if accepted. */
int dsv4_grammar_step_into(const dsv4_grammar *g, const dsv4_grammar_state *s, dsv4_grammar_state *next,
                           int c);
int dsv4_grammar_step_into(const dsv4_grammar *g, const dsv4_grammar_state *s, dsv4_grammar_state *next,
                           int c) {
    state_copy(next, s);
    return step_inplace(g, next, c);
}

int dsv4_grammar_is_complete(const dsv4_grammar *g, const dsv4_grammar_state *s) {
    if (g->dsml) {
        const dsv4_gframe *f = &s->f[0];
        return s->depth == 1 && f->phase == D_GOT_AFTER && f->c == 1;
    }
    /* a number or literal at the end of the root ends with the output */
    int d = s->depth;
    while (d > 0) {
        const dsv4_gframe *f = &s->f[d - 1];
        if (f->kind == F_NUM && num_terminal(f->phase)) {
            d--;
            continue;
        }
        if (f->kind == F_LIT) {
            const gnode *nd = &g->nodes[f->node];
            int done = 0;
            for (int i = 0; i < nd->nlit; i++)
                if (((f->b >> i) & 1) && g->lit_len[nd->lit0 + i] == (int)f->a) done = 1;
            if (done) {
                d--;
                continue;
            }
        }
        break;
    }
    return d == 0;
}

void dsv4_grammar_set_max_ws(dsv4_grammar *g, int max_ws) {
    g->max_ws = max_ws < 0 ? 0 : max_ws > 255 ? 255 : max_ws;
}

int dsv4_grammar_plain_class(const dsv4_grammar *g, const dsv4_grammar_state *s, int *room) {
    *room = -1;
    if (s->depth == 0) return GR_PLAIN_NONE;
    const dsv4_gframe *f = &s->f[s->depth - 1];
    if (f->sub != 0) return GR_PLAIN_NONE;
    if (f->kind == F_STR) {
        const gnode *nd = &g->nodes[f->node];
        if (nd->max_len >= 0) *room = nd->max_len - (int)f->b;
        return GR_PLAIN_STR;
    }
    if (f->kind == F_KEY && f->flags) return GR_PLAIN_STR;
    if (f->kind == F_RAW) return GR_PLAIN_RAW;
    return GR_PLAIN_NONE;
}

int dsv4_grammar_is_closed(const dsv4_grammar *g, const dsv4_grammar_state *s) {
    return g->dsml ? dsv4_grammar_is_complete(g, s) : s->depth == 0;
}
