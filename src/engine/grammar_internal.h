/* Internals shared by grammar_compile.c and grammar_match.c (see grammar.h). */
#ifndef DSV4_ENGINE_GRAMMAR_INTERNAL_H
#define DSV4_ENGINE_GRAMMAR_INTERNAL_H

#include "engine/grammar.h"

/* Node kinds. ANY is compiled to an ANYOF of the generic nodes. */
enum { GK_OBJ = 1, GK_ARR, GK_STR, GK_NUM, GK_INT, GK_LIT, GK_ANYOF };

/* At most 64 properties per object, enum values, tools, parameters (bitmasks). */
#define GR_MAX_SET 64

typedef struct gnode {
    int kind;
    int free;                        /* OBJ: keys outside `properties` allowed */
    int addl;                        /* OBJ: node of those keys' values */
    int nkid, *kid;                  /* OBJ: property value nodes; ANYOF: branches */
    int lit0, nlit;                  /* OBJ: property names; LIT: the literals (pool indices) */
    uint64_t required;               /* OBJ: bit i = property i is required */
    int items, min_items, max_items; /* ARR (max -1 = none) */
    int min_len, max_len;            /* STR (max -1 = none) */
    uint8_t first[32];               /* bytes a value of this node can start with */
} gnode;

struct dsv4_grammar {
    gnode *nodes;
    int n_nodes, cap_nodes;
    char **lit; /* literal pool */
    int *lit_len;
    int n_lit, cap_lit;
    int root;   /* JSON mode: root value node */
    int max_ws; /* whitespace bytes in a row between JSON tokens */
    /* DSML mode (root < 0) */
    int dsml;
    int ntools;
    int n_toolname;  /* LIT node: `NAME">\n` per tool */
    int *tool_obj;   /* [ntools] OBJ node of the parameters (-1: no parameters) */
    int *tool_pname; /* [ntools] LIT node: `KEY" string="` per property (-1: none) */
    int n_open, n_body, n_flag, n_pclose, n_after; /* LIT nodes of the fixed markup */
    int single;                                    /* named function: exactly one invoke */
    uint64_t tool_mask;                            /* tools allowed */
};

/*
 * Fast path of the token mask: when the top frame is inside a JSON string
 * (or a free-form key) between characters, every token whose bytes are
 * complete UTF-8 characters without '"', '\\' or control bytes ("plain") is
 * accepted and leaves the frame as it was (plus its characters); likewise
 * inside a raw DSML value for tokens without '<' or NUL. Returns
 * GR_PLAIN_STR / GR_PLAIN_RAW / GR_PLAIN_NONE; *room = characters a string
 * may still take (-1 = unbounded).
 */
enum { GR_PLAIN_NONE = 0, GR_PLAIN_STR = 1, GR_PLAIN_RAW = 2 };
int dsv4_grammar_plain_class(const dsv4_grammar *g, const dsv4_grammar_state *s, int *room);

#endif
