/*
 * text/thinking.h — the ONE place that decides thinking mode and reasoning
 * effort for a request (spec/SERVING.md §2, §1.10, §6.4, §8.1).
 *
 * Why one function: prompt rendering, the reasoning parser, the stop guard
 * and the metrics must all see the same (thinking, effort) pair. The vLLM bug
 * class "prompt says chat, parser says thinking" (reasoning_effort "none" +
 * thinking true: whole answer filed as reasoning, content null) cannot happen
 * when every consumer reads the dsv4_thinking produced here.
 */
#ifndef DSV4_TEXT_THINKING_H
#define DSV4_TEXT_THINKING_H

#include <cjson/cJSON.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reasoning-effort profile of a checkpoint (SERVING.md §0.1). */
typedef enum dsv4_effort_profile {
    DSV4_PROFILE_AUTO = 0, /* detect from encoding/encoding_dsv4.py (encoder.h) */
    DSV4_PROFILE_PREVIEW,  /* only REASONING_EFFORT_MAX: high (no prefix), max  */
    DSV4_PROFILE_0731,     /* REASONING_EFFORT_PROMPTS: low (no prefix), high, max */
} dsv4_effort_profile;

/* Resolved effort level, in the terms of the encoder's prefix table (§1.10). */
typedef enum dsv4_effort {
    DSV4_EFFORT_NONE = 0, /* thinking off: no level                        */
    DSV4_EFFORT_LOW,      /* 0731 only (no prefix); preview maps low -> high */
    DSV4_EFFORT_HIGH,
    DSV4_EFFORT_MAX,
} dsv4_effort;

/* Server-side defaults (CLI flags); always lowest priority (§2 rule 4). */
typedef struct dsv4_thinking_defaults {
    dsv4_effort_profile profile;          /* resolved: PREVIEW or 0731 (AUTO -> error) */
    /* --default-thinking {off,low,high,max}: NONE = off (the default, §0.3). */
    dsv4_effort default_thinking;
    /* --default-reasoning-effort {low,high,max}: effort when thinking is on
     * and nothing (request or --default-thinking level) names one. Default HIGH. */
    dsv4_effort default_reasoning_effort;
    int default_drop_thinking;            /* 1 (encoder default)        */
} dsv4_thinking_defaults;

/* The resolved pair plus what the HTTP layer reports about it. */
typedef struct dsv4_thinking {
    int thinking;            /* 1 = thinking mode, 0 = chat mode                    */
    dsv4_effort effort;      /* level for the prompt prefix; NONE iff thinking == 0 */
    int drop_thinking;       /* chat_template_kwargs.drop_thinking (default 1)      */
    /* 1 when reasoning_effort none/off overrode a thinking switch that said on:
     * log a warning and send `x-thinking-applied: off` (§2 rule 1). */
    int forced_off;
} dsv4_thinking;

/* Fill *d with the §0.3 defaults for a profile: thinking off, effort high, drop on. */
void dsv4_thinking_defaults_init(dsv4_thinking_defaults *d, dsv4_effort_profile profile);

/*
 * dsv4_thinking_resolve — decide thinking mode and effort for one chat
 * request (spec/SERVING.md §2; mapping table §1.10).
 *
 *   request: the parsed JSON body (object; NULL = empty request). Read keys:
 *     chat_template_kwargs.{thinking, enable_thinking, reasoning_effort,
 *     drop_thinking}, thinking (bool / "true" / {"type":"enabled"|"disabled"}),
 *     enable_thinking, reasoning_effort, reasoning.effort.
 *   d: server defaults (d->profile must be PREVIEW or 0731).
 *   out: the resolved pair.
 *
 * Precedence: (1) an effort of none/off from any source -> off; (2) the most
 * specific explicit thinking switch; (3) any effort value -> on; (4) server
 * default. Booleans: true/false, numbers 0/1, strings true/1/yes/on and
 * false/0/no/off/"" (case-insensitive); the string "false" means OFF.
 * Efforts (case-insensitive): none off | minimal low | medium | high | xhigh |
 * max ultra, mapped per profile as in §1.10.
 *
 * Errors (DSV4_EINVAL, an HTTP 400): an unknown effort spelling or a
 * non-string effort ("reasoning_effort: unknown value \"x\"...", message
 * starts with the parameter path), an uncoercible switch (names the field),
 * d->profile AUTO or unknown. *out is written only on success.
 */
int dsv4_thinking_resolve(const cJSON *request, const dsv4_thinking_defaults *d,
                          dsv4_thinking *out, dsv4_err *err);

/*
 * Parsers for CLI values. dsv4_effort_parse: "low|high|max" -> level ("off"
 * and "none" -> NONE when allow_off, for --default-thinking). Case-sensitive.
 * dsv4_profile_parse: "auto|preview|0731". Both return DSV4_EINVAL naming
 * the value on anything else.
 */
int dsv4_effort_parse(const char *s, int allow_off, dsv4_effort *out, dsv4_err *err);
int dsv4_profile_parse(const char *s, dsv4_effort_profile *out, dsv4_err *err);
const char *dsv4_effort_name(dsv4_effort e);            /* "none","low","high","max" */
const char *dsv4_profile_name(dsv4_effort_profile p);   /* "auto","preview","0731"  */

#ifdef __cplusplus
}
#endif
#endif
