/*
 * Prometheus metrics with vLLM's names and label order (spec/SERVING.md §3.9),
 * so existing dashboards and the seed's scripts (spec-acceptance.py, bench
 * scripts) read dsv4 unchanged. Labels: model_name, engine="0", then the
 * metric's own labels last. Counters end in _total; no _created series. The
 * speculative counters are always present, at 0 when speculation is off.
 */
#ifndef DSV4_SERVER_METRICS_H
#define DSV4_SERVER_METRICS_H

#include <stddef.h>

#include "engine/engine.h"

typedef struct dsv4_metrics dsv4_metrics;

/* model_name: the canonical served name (copied). spec_k: positions exported
 * for per-position acceptance (0 when speculation is off: none exported). */
dsv4_metrics *dsv4_metrics_create(const char *model_name, int spec_k);
void dsv4_metrics_free(dsv4_metrics *m);

/* Histograms of SERVING.md §3.9, observed by the request handlers (seconds). */
void dsv4_metrics_observe_request(dsv4_metrics *m, double ttft_s, double e2e_s, double queue_s,
                                  int prompt_tokens, int generation_tokens, int max_tokens, const char *finish);
void dsv4_metrics_observe_itl(dsv4_metrics *m, double itl_s);
/* Server-specific counters (dsv4:*): reasoning unterminated, stops suppressed in reasoning,
 * tool-call parse failures, DSML stripped. */
void dsv4_metrics_count_parser(dsv4_metrics *m, int reasoning_unterminated, int tool_parse_failures,
                               int dsml_stripped);

/* KV usage for an engine without a state pool (with one, render reads the
 * engine's page counts: st->kv_pages_used / kv_pages_total). */
void dsv4_metrics_set_pool(dsv4_metrics *m, double kv_usage_perc);
/* Labels of vllm:cache_config_info (issue 5): --kv-cache-dtype and prefix caching. */
void dsv4_metrics_set_cache_config(dsv4_metrics *m, const char *cache_dtype, int prefix_caching);

/*
 * dsv4_metrics_render — Prometheus text (version 0.0.4) of everything, with the
 * engine counters read from st (may be NULL before the engine exists).
 * Returns a malloc'd NUL-terminated string, or NULL on allocation failure.
 */
char *dsv4_metrics_render(dsv4_metrics *m, const dsv4_engine_stats *st);

#endif
