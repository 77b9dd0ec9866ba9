/* Prometheus metrics (src/server/metrics.h; spec/SERVING.md §3.9). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"

#define NB_TIME 16
#define NB_TOK 12
static const double time_buckets[NB_TIME] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                             0.25,  0.5,   1.0,  2.5,  5.0,  10.0, 30.0, 60.0};
static const double tok_buckets[NB_TOK] = {1, 8, 16, 64, 128, 256, 512, 1024, 4096, 16384, 65536, 1048576};

typedef struct hist {
    const double *le;
    int nb;
    unsigned long long counts[NB_TIME + 1]; /* per bucket (not cumulative) + overflow */
    double sum;
    unsigned long long n;
} hist;

static void hist_obs(hist *h, double v) {
    int i = 0;
    while (i < h->nb && v > h->le[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

enum { FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_ERROR, FIN_N };
static const char *fin_names[FIN_N] = {"stop", "length", "abort", "error"};

struct dsv4_metrics {
    pthread_mutex_t mu;
    char model[256];
    int spec_k;
    hist ttft, itl, e2e, queue, prompt_tok, gen_tok, max_tok;
    unsigned long long success[FIN_N];
    unsigned long long reasoning_unterminated, tool_parse_failures, dsml_stripped;
    double kv_usage;
    char cache_dtype[32];   /* --kv-cache-dtype, for cache_config_info */
    int prefix_caching;
};

dsv4_metrics *dsv4_metrics_create(const char *model_name, int spec_k) {
    dsv4_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    snprintf(m->model, sizeof m->model, "%s", model_name);
    snprintf(m->cache_dtype, sizeof m->cache_dtype, "auto");
    m->spec_k = spec_k < 0 ? 0 : spec_k > DSV4_MAX_SPEC_K ? DSV4_MAX_SPEC_K : spec_k;
    hist *th[] = {&m->ttft, &m->itl, &m->e2e, &m->queue};
    for (int i = 0; i < 4; i++) th[i]->le = time_buckets, th[i]->nb = NB_TIME;
    hist *tk[] = {&m->prompt_tok, &m->gen_tok, &m->max_tok};
    for (int i = 0; i < 3; i++) tk[i]->le = tok_buckets, tk[i]->nb = NB_TOK;
    return m;
}

void dsv4_metrics_free(dsv4_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void dsv4_metrics_observe_request(dsv4_metrics *m, double ttft_s, double e2e_s, double queue_s,
                                  int prompt_tokens, int generation_tokens, int max_tokens, const char *finish) {
    pthread_mutex_lock(&m->mu);
    if (ttft_s >= 0) hist_obs(&m->ttft, ttft_s);
    hist_obs(&m->e2e, e2e_s);
    hist_obs(&m->queue, queue_s);
    hist_obs(&m->prompt_tok, prompt_tokens);
    hist_obs(&m->gen_tok, generation_tokens);
    hist_obs(&m->max_tok, max_tokens);
    for (int i = 0; i < FIN_N; i++)
        if (finish && !strcmp(finish, fin_names[i])) m->success[i]++;
    if (finish && !strcmp(finish, "tool_calls")) m->success[FIN_STOP]++; /* a natural end */
    pthread_mutex_unlock(&m->mu);
}

void dsv4_metrics_observe_itl(dsv4_metrics *m, double itl_s) {
    pthread_mutex_lock(&m->mu);
    hist_obs(&m->itl, itl_s);
    pthread_mutex_unlock(&m->mu);
}

void dsv4_metrics_count_parser(dsv4_metrics *m, int reasoning_unterminated, int tool_parse_failures,
                               int dsml_stripped) {
    pthread_mutex_lock(&m->mu);
    m->reasoning_unterminated += (unsigned)reasoning_unterminated;
    m->tool_parse_failures += (unsigned)tool_parse_failures;
    m->dsml_stripped += (unsigned)dsml_stripped;
    pthread_mutex_unlock(&m->mu);
}

void dsv4_metrics_set_cache_config(dsv4_metrics *m, const char *cache_dtype, int prefix_caching) {
    pthread_mutex_lock(&m->mu);
    snprintf(m->cache_dtype, sizeof m->cache_dtype, "%s", cache_dtype ? cache_dtype : "auto");
    m->prefix_caching = prefix_caching;
    pthread_mutex_unlock(&m->mu);
}

void dsv4_metrics_set_pool(dsv4_metrics *m, double kv_usage_perc) {
    pthread_mutex_lock(&m->mu);
    m->kv_usage = kv_usage_perc;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer; on allocation failure it stops growing and reports NULL at the end. */
typedef struct sbuf { char *s; size_t len, cap; int oom; } sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
        char *ns = realloc(b->s, cap);
        if (!ns) { b->oom = 1; return; }
        b->s = ns;
        b->cap = cap;
    }
}

static void put_hist(sbuf *b, const char *model, const char *name, const char *help, const hist *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{model_name=\"%s\",engine=\"0\",le=\"%g\"} %llu\n", name, model, h->le[i], cum);
    }
    cum += h->counts[h->nb];
    put(b, "%s_bucket{model_name=\"%s\",engine=\"0\",le=\"+Inf\"} %llu\n", name, model, cum);
    put(b, "%s_sum{model_name=\"%s\",engine=\"0\"} %.9g\n", name, model, h->sum);
    put(b, "%s_count{model_name=\"%s\",engine=\"0\"} %llu\n", name, model, h->n);
}

static void put_scalar(sbuf *b, const char *model, const char *type, const char *name, const char *help,
                       double v) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s{model_name=\"%s\",engine=\"0\"} %.17g\n", name, help, name, type, name,
        model, v);
}

char *dsv4_metrics_render(dsv4_metrics *m, const dsv4_engine_stats *st) {
    dsv4_engine_stats z;
    memset(&z, 0, sizeof z);
    if (!st) st = &z;
    sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.s) return NULL;
    pthread_mutex_lock(&m->mu);
    const char *M = m->model;
    put_scalar(&b, M, "gauge", "vllm:num_requests_running", "Requests in the running batch.", st->running);
    put_scalar(&b, M, "gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", st->waiting);
    put_scalar(&b, M, "gauge", "vllm:kv_cache_usage_perc", "KV state pool usage (0-1): pages held by running requests.",
               st->kv_pages_total > 0 ? (double)st->kv_pages_used / st->kv_pages_total : m->kv_usage);
    if (st->kv_pages_total > 0) { /* vLLM's cache_config_info: the pool's configuration as labels */
        put(&b, "# HELP vllm:cache_config_info Information of the KV cache (state pool) configuration.\n"
                "# TYPE vllm:cache_config_info gauge\n"
                "vllm:cache_config_info{model_name=\"%s\",engine=\"0\",block_size=\"%d\",num_gpu_blocks=\"%d\","
                "cache_dtype=\"%s\",enable_prefix_caching=\"%s\",block_bytes=\"%lld\"} 1\n",
                M, st->kv_page_tokens, st->kv_pages_total, m->cache_dtype, m->prefix_caching ? "True" : "False",
                (long long)st->kv_page_bytes);
        put_scalar(&b, M, "gauge", "dsv4:kv_cache_pool_blocks", "Pages (blocks) in the KV state pool.",
                   st->kv_pages_total);
        put_scalar(&b, M, "gauge", "dsv4:kv_cache_pool_blocks_used", "Pages held by running requests.",
                   st->kv_pages_used);
    }
    put_scalar(&b, M, "counter", "vllm:prompt_tokens_total", "Prefill tokens processed.",
               (double)st->prompt_tokens);
    put_scalar(&b, M, "counter", "vllm:generation_tokens_total", "Generated tokens (accepted, incl. bonus).",
               (double)st->generation_tokens);
    put_scalar(&b, M, "counter", "vllm:num_preemptions_total", "Requests preempted (recomputed) for lack of KV pages.",
               (double)st->preemptions);
    put_scalar(&b, M, "counter", "vllm:prefix_cache_queries_total",
               "Prefix cache queries, in prompt tokens of admitted requests.", (double)st->prefix_queries);
    put_scalar(&b, M, "counter", "vllm:prefix_cache_hits_total", "Prefix cache hits, in prompt tokens reused.",
               (double)st->prefix_hits);
    put_scalar(&b, M, "counter", "vllm:prompt_tokens_cached_total",
               "Prompt tokens whose state came from the prefix cache.", (double)st->prefix_hits);
    put(&b, "# HELP vllm:request_success_total Finished requests by finish reason.\n"
            "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < FIN_N; i++)
        put(&b, "vllm:request_success_total{model_name=\"%s\",engine=\"0\",finished_reason=\"%s\"} %llu\n", M,
            fin_names[i], m->success[i]);
    put_hist(&b, M, "vllm:time_to_first_token_seconds", "Time to first token.", &m->ttft);
    put_hist(&b, M, "vllm:inter_token_latency_seconds", "Inter-token latency.", &m->itl);
    put_hist(&b, M, "vllm:e2e_request_latency_seconds", "End-to-end request latency.", &m->e2e);
    put_hist(&b, M, "vllm:request_queue_time_seconds", "Time waiting before the first step.", &m->queue);
    put_hist(&b, M, "vllm:request_prompt_tokens", "Prompt tokens per request.", &m->prompt_tok);
    put_hist(&b, M, "vllm:request_generation_tokens", "Generated tokens per request.", &m->gen_tok);
    put_hist(&b, M, "vllm:request_params_max_tokens", "max_tokens per request.", &m->max_tok);
    put_scalar(&b, M, "counter", "vllm:spec_decode_num_drafts_total", "Verification steps that carried a draft.",
               (double)st->spec_drafts);
    put_scalar(&b, M, "counter", "vllm:spec_decode_num_draft_tokens_total", "Drafted tokens.",
               (double)st->spec_draft_tokens);
    put_scalar(&b, M, "counter", "vllm:spec_decode_num_accepted_tokens_total", "Accepted draft tokens.",
               (double)st->spec_accepted_tokens);
    put(&b, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens by position.\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n");
    /* present with speculation off too (zeros over the DSpark block of 5), SERVING.md §9 item 19 */
    int npos = m->spec_k > 0 ? m->spec_k : 5;
    for (int i = 0; i < npos; i++)
        put(&b,
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\",engine=\"0\",position=\"%d\"} "
            "%llu\n",
            M, i, (unsigned long long)st->spec_accepted_per_pos[i]);
    put(&b, "# HELP dsv4:spec_decode_num_draft_tokens_per_pos_total Request-steps that verified a draft at this "
            "position (k varies with the batch size).\n"
            "# TYPE dsv4:spec_decode_num_draft_tokens_per_pos_total counter\n");
    for (int i = 0; i < npos; i++)
        put(&b,
            "dsv4:spec_decode_num_draft_tokens_per_pos_total{model_name=\"%s\",engine=\"0\",position=\"%d\"} "
            "%llu\n",
            M, i, (unsigned long long)st->spec_draft_per_pos[i]);
    put_scalar(&b, M, "counter", "dsv4:spec_decode_draft_seconds_total", "Wall seconds spent drafting.",
               st->spec_draft_seconds);
    put_scalar(&b, M, "counter", "dsv4:spec_decode_verify_seconds_total",
               "Wall seconds of forwards that verified drafts.", st->spec_verify_seconds);
    put_scalar(&b, M, "counter", "dsv4:reasoning_unterminated_total", "Requests that ended inside reasoning.",
               (double)m->reasoning_unterminated);
    put_scalar(&b, M, "counter", "dsv4:tool_call_parse_failures_total", "Incomplete or malformed tool calls.",
               (double)m->tool_parse_failures);
    put_scalar(&b, M, "counter", "dsv4:dsml_stripped_total", "DSML markup removed from text.",
               (double)m->dsml_stripped);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
