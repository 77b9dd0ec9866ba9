/* Per-request logits processor over a grammar (src/engine/constrain.h). */
#include <math.h>
#include <stdlib.h>

#include "engine/constrain.h"

struct dsv4_constraint {
    const dsv4_gvocab *v;
    const dsv4_grammar *g;
    dsv4_grammar_state st;
    int armed;  /* reasoning over: the grammar applies */
    int failed; /* a token outside the grammar was produced: EOS only */
    int32_t think_end;
    int consumed; /* generated tokens already fed */
    uint32_t *mask;
    void *scratch;
};

int dsv4_constraint_create(const dsv4_gvocab *v, const dsv4_grammar *g, int thinking, int32_t think_end,
                           dsv4_constraint **out, dsv4_err *err) {
    *out = NULL;
    dsv4_constraint *c = calloc(1, sizeof *c);
    if (c) {
        c->mask = malloc(sizeof(uint32_t) * (size_t)((dsv4_gvocab_size(v) + 31) / 32));
        c->scratch = malloc(dsv4_gvocab_scratch_bytes(v));
    }
    if (!c || !c->mask || !c->scratch) {
        dsv4_constraint_free(c);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a constrained request");
    }
    c->v = v;
    c->g = g;
    c->armed = !thinking;
    c->think_end = think_end;
    dsv4_grammar_init(g, &c->st);
    *out = c;
    return DSV4_OK;
}

void dsv4_constraint_free(dsv4_constraint *c) {
    if (!c) return;
    free(c->mask);
    free(c->scratch);
    free(c);
}

int dsv4_constraint_complete(const dsv4_constraint *c) {
    return c->armed && !c->failed && dsv4_grammar_is_complete(c->g, &c->st);
}

void dsv4_constraint_logits(void *user, const int32_t *out, int n_out, float *logits, int vocab) {
    dsv4_constraint *c = user;
    for (; c->consumed < n_out; c->consumed++) {
        int32_t t = out[c->consumed];
        if (!c->armed) {
            c->armed = t == c->think_end;
            continue;
        }
        if (!c->failed && !dsv4_gvocab_accept(c->v, c->g, &c->st, t)) c->failed = 1;
    }
    if (!c->armed) return;
    int V = dsv4_gvocab_size(c->v);
    if (c->failed) { /* EOS alone */
        int32_t eos = dsv4_gvocab_eos(c->v);
        for (int i = 0; i < (V + 31) / 32; i++)
            c->mask[i] = 0;
        if (eos >= 0 && eos < V) c->mask[eos >> 5] = 1u << (eos & 31);
    } else {
        dsv4_gvocab_mask(c->v, c->g, &c->st, c->mask, c->scratch);
    }
    for (int i = 0; i < vocab; i++)
        if (i >= V || !((c->mask[i >> 5] >> (i & 31)) & 1)) logits[i] = -INFINITY;
}
