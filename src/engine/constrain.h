/*
 * A request's constrained-decoding state: the logits processor the engine
 * calls before each of the request's tokens is sampled (dsv4_gen_params
 * logits_proc; spec/SERVING.md §4.6).
 *
 * The constraint is armed at once (thinking off) or right after the model's
 * `</think>` token (thinking on: the reasoning is never constrained, so the
 * JSON / tool call lands in the post-reasoning segment, §4.6). Armed, every
 * disallowed id's logit becomes -inf; the grammar advances by the tokens the
 * engine reports as generated. A token the grammar did not allow (only
 * possible when EOS is ignored, ignore_eos / min_tokens) ends the constraint
 * in a state that allows EOS alone.
 */
#ifndef DSV4_ENGINE_CONSTRAIN_H
#define DSV4_ENGINE_CONSTRAIN_H

#include <stdint.h>

#include "engine/grammar.h"

typedef struct dsv4_constraint dsv4_constraint;

/*
 * dsv4_constraint_create — g and v must outlive the constraint (not owned).
 * thinking: the prompt opened a reasoning segment; think_end: the `</think>`
 * id (128822 for DeepSeek-V4). Errors: DSV4_ENOMEM.
 */
int dsv4_constraint_create(const dsv4_gvocab *v, const dsv4_grammar *g, int thinking, int32_t think_end,
                           dsv4_constraint **out, dsv4_err *err);
void dsv4_constraint_free(dsv4_constraint *c);

/*
 * dsv4_constraint_logits — the engine hook (signature of dsv4_gen_params
 * logits_proc). out [n_out]: every token generated so far (the new ones since
 * the last call are fed to the grammar); logits [vocab] f32, modified in
 * place.
 */
void dsv4_constraint_logits(void *c, const int32_t *out, int n_out, float *logits, int vocab);

/* 1 once the grammar's output is complete (EOS allowed). */
int dsv4_constraint_complete(const dsv4_constraint *c);

#endif
