/*
 * text/outparse_dsml.h — internal: streaming DSML tool-call scanner of the
 * output parser (spec/SERVING.md §1.7 syntax, §5.2-§5.5). Not a public API.
 *
 * It sits on the text stream of one channel (reasoning or content) and:
 *  - withholds text that may still become the block opener
 *    ("\n\n<｜DSML｜tool_calls>", the "\n\n" being removed, §5.2) or a stray
 *    marker/tag, releasing it as plain text once it cannot (§5.3);
 *  - inside a block, parses invokes and parameters and reports a header per
 *    invoke and JSON argument fragments whose concatenation is the final
 *    compact `arguments` object (§5.3), typed per §1.7/§5.2;
 *  - strips markup that is not a well-formed call, and look-alike markers
 *    (ASCII |DSML|, ‖DSML‖, ｜｜DSML｜｜, cline #13348) from plain text.
 * The real ｜DSML｜ token reaches this scanner as its text.
 */
#ifndef DSV4_TEXT_OUTPARSE_DSML_H
#define DSV4_TEXT_OUTPARSE_DSML_H

#include <cjson/cJSON.h>

#include "text/outparse_buf.h"

typedef struct op_dsml_sink {
    void *ctx;
    /* plain text (tags: per-byte token index) */
    void (*text)(void *ctx, const char *s, const int32_t *tags, size_t n);
    /* a block opener was recognised (markup starts: stops dormant) */
    void (*block_open)(void *ctx);
    /* a new call: index is this scanner's running call index */
    void (*tool_header)(void *ctx, int index, const char *name);
    void (*tool_args)(void *ctx, int index, const char *s, size_t n);
    void (*tool_done)(void *ctx, int index);
    void (*tool_drop)(void *ctx, int index);
    /* markup/markers removed from text, or unparseable block content */
    void (*stripped)(void *ctx, size_t n);
} op_dsml_sink;

enum { OP_DSML_TEXT = 0, OP_DSML_BLOCK, OP_DSML_INVOKE, OP_DSML_PVAL, OP_DSML_SKIP, OP_DSML_AFTER };

typedef struct op_dsml {
    op_dsml_sink sink;
    int tools_enabled;
    const cJSON *tools; /* not owned */
    int state;
    op_buf pend; /* tagged */
    op_buf carry; /* tagged: text held across a stripped block (§5.5) */
    int next_index;
    /* current invoke */
    int cur_index; /* -1 when none */
    char *cur_name;
    int n_emitted;       /* parameters whose text was emitted */
    char *repair_hold;   /* held unwrapped object text (§5.2 repair), or NULL */
    char *repair_key;
    /* current parameter */
    char *pkey;
    int pstring;         /* 1 string="true"; 0 "false"; -1 missing */
    op_buf pval;         /* buffered value (non-string params) */
    int after_logged;
    int malformed_count; /* blocks with unparseable markup (§5.2 kind="malformed") */
    int eof; /* scanning with no more text to come (partial = no match) */
    int oom;
} op_dsml;

void op_dsml_init(op_dsml *d, const op_dsml_sink *sink, int tools_enabled, const cJSON *tools);
void op_dsml_free(op_dsml *d);
/* Push text of one token (tag = its index). Returns -1 on allocation failure. */
int op_dsml_push(op_dsml *d, const char *s, size_t n, int32_t tag);
/* A non-DSML special token interrupts the text: in TEXT state nothing held can
 * become markup any more, so release it. */
void op_dsml_break(op_dsml *d);
/* End of generation: release held text; drop an incomplete call. */
void op_dsml_end(op_dsml *d);
/* Nonzero while inside markup (BLOCK..AFTER). */
int op_dsml_in_markup(const op_dsml *d);

/* JSON helpers shared with tests: escape raw text as JSON string content
 * (no quotes): ", \, control chars; UTF-8 and '/' kept (compact JSON). */
int op_json_escape(op_buf *out, const char *s, size_t n);
#endif
