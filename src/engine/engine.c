/* The engine step loop (src/engine/engine.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/engine.h"
#include "engine/spec_verify.h"

typedef enum { RQ_WAITING, RQ_PREFILL, RQ_DECODE, RQ_DONE } rq_state;

struct dsv4_request {
    dsv4_engine *e;
    int refs;             /* caller + engine (while listed) */
    rq_state st;
    int slot;
    int32_t *tok;         /* prompt followed by generated tokens */
    int n_prompt, n_tok, cap;
    int64_t n_computed;   /* positions whose state is committed in the runner */
    dsv4_gen_params p;    /* arrays below are owned copies */
    int32_t *stop_ids, *bias_ids;
    float *bias_vals;
    int n_read;           /* generated tokens handed to the consumer */
    dsv4_finish finish;
    int cancel;
    int n_drafts;         /* drafts to verify in the next step */
    int32_t drafts[DSV4_MAX_SPEC_K];
    dsv4_token_logprob *lp; /* [cap - n_prompt] per generated token, or NULL (not asked) */
    dsv4_token_logprob *plp; /* [n_prompt] per prompt token, or NULL (prompt_logprobs not asked) */
    int32_t *prank;       /* [n_prompt] rank of each prompt token (with plp) */
    int plp_ready;        /* every prompt record is filled */
    float *q;             /* [spec_k][vocab] draft distributions, or NULL (argmax drafts) */
    int q_valid;
    int n_cached;         /* prompt positions reused from the prefix cache */
    int n_prefill;        /* positions to prefill before decoding: n_prompt, or after a
                           * preemption the prompt + generated tokens but the last */
    struct dsv4_request *next;
};

/* Host sampling scratch of one thread (decode_segment). */
typedef struct samp_ws {
    float *probs;    /* [(k+1)][vocab] */
    float *vscratch; /* [vocab] */
    float *mlogits;  /* [vocab] masked copy of a row (constrained requests) */
    void *sscratch;  /* dsv4_sampling_scratch_bytes(vocab) */
} samp_ws;

struct dsv4_engine {
    dsv4_engine_opts o;
    dsv4_runner run;
    dsv4_drafter dr;
    int has_drafter;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_out;
    dsv4_request *head, *tail; /* all live requests, arrival order */
    int *free_slots, n_free;
    /* prefix cache: what each free slot's state holds (len 0 = nothing) */
    struct slot_cache {
        int32_t *tok;     /* [len] committed tokens of the history */
        int64_t len, cap;
        uint64_t used;    /* LRU stamp */
    } *cache;
    uint64_t clock;
    int caching;          /* enable_prefix_caching and the runner supports it */
    /* state pool (runner page_tokens > 0): free page ids, and the pages each
     * slot maps (a free slot keeps its pages while it caches a history) */
    int paged;
    int32_t *page_free;   /* [n_pages] stack */
    int n_page_free;
    int32_t *spages;      /* [n_slots][slot_max_pages] */
    int *snp;             /* [n_slots] pages mapped */
    int slot_max_pages;
    dsv4_engine_stats st;
    pthread_t thread;
    int thread_on, stopping;
    int inited;           /* mutex and condvars exist */
    /* step scratch (engine thread only) */
    float *logits;
    size_t logits_cap;
    samp_ws *ws;          /* [n_ws] sampling scratch, one per sampling thread (ws[0]: the engine thread) */
    int n_ws;
    /* greedy ids from the runner (forward_ids) instead of logits, issue 7 */
    int ids_on;           /* runner has forward_ids and DSV4_DEVICE_ARGMAX is not "0" */
    int32_t *ids;         /* [ids_cap] */
    size_t ids_cap;
    int step_log;         /* DSV4_STEP_LOG=1: one INFO line per step (rows, forward and step ms) */
};

const char *dsv4_finish_name(dsv4_finish f) {
    switch (f) {
    case DSV4_FINISH_STOP: return "stop";
    case DSV4_FINISH_LENGTH: return "length";
    case DSV4_FINISH_ABORT: return "abort";
    case DSV4_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void dsv4_gen_params_default(dsv4_gen_params *p) {
    memset(p, 0, sizeof *p);
    dsv4_sampling_default(&p->sampling);
    p->max_tokens = 16;
    p->use_spec = 1;
}

int dsv4_engine_create(const dsv4_engine_opts *opts, const dsv4_runner *runner, const dsv4_drafter *drafter,
                       dsv4_engine **out, dsv4_err *err) {
    *out = NULL;
    if (opts->max_num_seqs < 1 || opts->max_num_seqs > runner->n_slots)
        return dsv4_err_set(err, DSV4_EINVAL, "max_num_seqs %d must be in [1, %d] (the runner's slots)",
                            opts->max_num_seqs, runner->n_slots);
    if (opts->max_num_batched_tokens < opts->max_num_seqs)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "max_num_batched_tokens %d must be at least max_num_seqs %d (one decode row each)",
                            opts->max_num_batched_tokens, opts->max_num_seqs);
    if (opts->max_model_len < 2)
        return dsv4_err_set(err, DSV4_EINVAL, "max_model_len %lld is too small", (long long)opts->max_model_len);
    if (opts->spec_k < 0 || opts->spec_k > DSV4_MAX_SPEC_K)
        return dsv4_err_set(err, DSV4_EINVAL, "num_speculative_tokens %d must be in [0, %d]", opts->spec_k,
                            DSV4_MAX_SPEC_K);
    if (opts->spec_k > 0 && !drafter)
        return dsv4_err_set(err, DSV4_EINVAL, "num_speculative_tokens %d needs a draft model", opts->spec_k);
    for (int i = 0; i < opts->n_k_schedule; i++)
        if (opts->n_k_schedule > 8 || opts->k_schedule[i][0] < 1 || opts->k_schedule[i][1] < opts->k_schedule[i][0] ||
            opts->k_schedule[i][2] < 0 || opts->k_schedule[i][2] > opts->spec_k)
            return dsv4_err_set(err, DSV4_EINVAL,
                                "num_speculative_tokens_per_batch_size entry %d [%d, %d, %d]: need 1 <= lo <= hi and "
                                "0 <= k <= num_speculative_tokens (%d)",
                                i, opts->k_schedule[i][0], opts->k_schedule[i][1], opts->k_schedule[i][2], opts->spec_k);
    if (drafter && opts->spec_k > drafter->max_k)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "num_speculative_tokens %d exceeds the draft model's block size %d", opts->spec_k,
                            drafter->max_k);
    dsv4_engine *e = calloc(1, sizeof *e);
    if (!e) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory creating the engine");
    e->o = *opts;
    e->run = *runner;
    if (drafter && opts->spec_k > 0) {
        e->dr = *drafter;
        e->has_drafter = 1;
    }
    size_t V = (size_t)runner->vocab;
    e->free_slots = malloc(sizeof(int) * (size_t)runner->n_slots);
    e->cache = calloc((size_t)runner->n_slots, sizeof *e->cache);
    e->caching = opts->enable_prefix_caching && runner->reusable && runner->resume;
    /* one sampling scratch (~(k+2)·vocab·4 + vocab·16 bytes, 5.7 MB at k = 5) per sampling thread: the
     * OpenMP threads (OMP_NUM_THREADS; 1 without OpenMP), at most max_num_seqs (one decode segment per
     * request) and at most 32 (a step's rows split 32 ways already take well under a GPU step) */
    e->n_ws = 1;
#ifdef _OPENMP
    e->n_ws = omp_get_max_threads();
#endif
    if (e->n_ws > opts->max_num_seqs) e->n_ws = opts->max_num_seqs;
    if (e->n_ws > 32) e->n_ws = 32;
    if (e->n_ws < 1) e->n_ws = 1;
    e->ws = calloc((size_t)e->n_ws, sizeof *e->ws);
    int ws_ok = e->ws != NULL;
    for (int i = 0; ws_ok && i < e->n_ws; i++) {
        samp_ws *w = &e->ws[i];
        w->probs = malloc(sizeof(float) * V * (size_t)(opts->spec_k + 1));
        w->vscratch = malloc(sizeof(float) * V);
        w->mlogits = malloc(sizeof(float) * V);
        w->sscratch = malloc(dsv4_sampling_scratch_bytes(runner->vocab));
        ws_ok = w->probs && w->vscratch && w->mlogits && w->sscratch;
    }
    if (!e->free_slots || !e->cache || !ws_ok) {
        dsv4_engine_free(e);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory creating the engine");
    }
    for (int i = runner->n_slots - 1; i >= 0; i--) e->free_slots[e->n_free++] = i;
    if (runner->page_tokens > 0 && runner->n_pages > 0 && runner->set_pages) {
        e->paged = 1;
        e->slot_max_pages = (int)((opts->max_model_len + runner->page_tokens - 1) / runner->page_tokens);
        e->page_free = malloc(sizeof(int32_t) * (size_t)runner->n_pages);
        e->spages = malloc(sizeof(int32_t) * (size_t)runner->n_slots * (size_t)e->slot_max_pages);
        e->snp = calloc((size_t)runner->n_slots, sizeof(int));
        if (!e->page_free || !e->spages || !e->snp) {
            dsv4_engine_free(e);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory creating the engine");
        }
        for (int i = runner->n_pages - 1; i >= 0; i--) e->page_free[e->n_page_free++] = i;
        int64_t tokens = (int64_t)runner->n_pages * runner->page_tokens;
        /* vLLM's get_max_concurrency_for_kv_cache_config: whole pages per request (a 100-token
         * request holds a 256-token page), not tokens / max_model_len */
        double conc = (double)runner->n_pages / (double)e->slot_max_pages;
        dsv4_log(DSV4_LOG_INFO,
                 "KV cache pool: %lld tokens (%d pages of %d, %.1f MiB), maximum concurrency for %lld-token "
                 "requests: %.2fx",
                 (long long)tokens, runner->n_pages, runner->page_tokens,
                 (double)runner->page_bytes * runner->n_pages / (1024.0 * 1024.0), (long long)opts->max_model_len,
                 conc);
        if (tokens < opts->max_model_len)
            dsv4_log(DSV4_LOG_WARN,
                     "the KV cache pool (%lld tokens) is smaller than max_model_len %lld: requests whose prompt + "
                     "max_tokens exceed the pool are refused",
                     (long long)tokens, (long long)opts->max_model_len);
    }
    const char *dev_argmax = getenv("DSV4_DEVICE_ARGMAX");
    e->ids_on = e->run.forward_ids && !(dev_argmax && !strcmp(dev_argmax, "0"));
    const char *step_log = getenv("DSV4_STEP_LOG");
    e->step_log = step_log && !strcmp(step_log, "1");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_work, NULL);
    pthread_cond_init(&e->cv_out, NULL);
    e->inited = 1;
    *out = e;
    return DSV4_OK;
}

static void req_free(dsv4_request *r) {
    free(r->tok);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->q);
    free(r->lp);
    free(r->plp);
    free(r->prank);
    free(r);
}


/* Monotonic wall clock in seconds (speculation timing, DSPARK.md §5.7). */
static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Drop one reference; the caller holds e->mu. */
static void req_unref_locked(dsv4_request *r) {
    if (--r->refs == 0) req_free(r);
}

int dsv4_engine_submit(dsv4_engine *e, const int32_t *prompt, int n, const dsv4_gen_params *params,
                       dsv4_request **out, dsv4_err *err) {
    *out = NULL;
    if (n < 1) return dsv4_err_set(err, DSV4_EINVAL, "the prompt is empty");
    if (n >= e->o.max_model_len)
        return dsv4_err_set(err, DSV4_ERANGE,
                            "This model's maximum context length is %lld tokens. However, you requested %d "
                            "tokens in the prompt. Please reduce the length of the messages.",
                            (long long)e->o.max_model_len, n);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->run.vocab)
            return dsv4_err_set(err, DSV4_EINVAL, "prompt token %d at index %d is outside the vocabulary (0..%d)",
                                prompt[i], i, e->run.vocab - 1);
    if (params->max_tokens < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "max_tokens must be at least 1, got %d", params->max_tokens);
    if (dsv4_sampling_validate(&params->sampling, e->run.vocab, err)) return err ? err->code : DSV4_EINVAL;
    if (params->prompt_top_logprobs < 0 || params->prompt_top_logprobs > DSV4_MAX_TOP_LOGPROBS)
        return dsv4_err_set(err, DSV4_EINVAL, "prompt_logprobs must be in [0, %d], got %d", DSV4_MAX_TOP_LOGPROBS,
                            params->prompt_top_logprobs);
    if (params->top_logprobs < 0 || params->top_logprobs > DSV4_MAX_TOP_LOGPROBS)
        return dsv4_err_set(err, DSV4_EINVAL, "top_logprobs must be in [0, %d], got %d", DSV4_MAX_TOP_LOGPROBS,
                            params->top_logprobs);
    if (e->paged) { /* a request that cannot fit even alone in the pool would never finish */
        int64_t need = (int64_t)n + params->max_tokens;
        if (need > e->o.max_model_len) need = e->o.max_model_len;
        int64_t pages = (need + e->run.page_tokens - 1) / e->run.page_tokens;
        if (pages > e->run.n_pages)
            return dsv4_err_set(err, DSV4_ERANGE,
                                "This request needs up to %lld tokens of KV cache (%d prompt + %d max_tokens), "
                                "more than the whole KV cache pool holds (%lld tokens in %d pages of %d). "
                                "Please reduce the prompt or max_tokens.",
                                (long long)need, n, params->max_tokens,
                                (long long)e->run.n_pages * e->run.page_tokens, e->run.n_pages, e->run.page_tokens);
    }
    dsv4_request *r = calloc(1, sizeof *r);
    if (!r) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    r->e = e;
    r->p = *params;
    int64_t room = e->o.max_model_len - n; /* clamp to the remaining context (SERVING.md §3.3) */
    if (r->p.max_tokens > room) r->p.max_tokens = (int)room;
    r->cap = n + r->p.max_tokens + DSV4_MAX_SPEC_K + 1;
    r->tok = malloc(sizeof(int32_t) * (size_t)r->cap);
    if (r->p.n_stop_ids) r->stop_ids = malloc(sizeof(int32_t) * (size_t)r->p.n_stop_ids);
    if (r->p.sampling.n_bias) {
        r->bias_ids = malloc(sizeof(int32_t) * (size_t)r->p.sampling.n_bias);
        r->bias_vals = malloc(sizeof(float) * (size_t)r->p.sampling.n_bias);
    }
    if (e->has_drafter) r->q = malloc(sizeof(float) * (size_t)e->run.vocab * (size_t)e->o.spec_k);
    if (r->p.logprobs) r->lp = malloc(sizeof(dsv4_token_logprob) * (size_t)(r->cap - n));
    if (r->p.prompt_logprobs && (!(r->plp = calloc((size_t)n, sizeof(dsv4_token_logprob))) ||
                                 !(r->prank = calloc((size_t)n, sizeof(int32_t))))) {
        req_free(r);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the prompt logprobs of %d tokens", n);
    }
    if (!r->tok || (r->p.logprobs && !r->lp) || (r->p.n_stop_ids && !r->stop_ids) || (r->p.sampling.n_bias && (!r->bias_ids || !r->bias_vals)) ||
        (e->has_drafter && !r->q)) {
        req_free(r);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    memcpy(r->tok, prompt, sizeof(int32_t) * (size_t)n);
    r->n_prompt = r->n_tok = r->n_prefill = n;
    if (r->stop_ids) memcpy(r->stop_ids, params->stop_ids, sizeof(int32_t) * (size_t)r->p.n_stop_ids);
    if (r->bias_ids) {
        memcpy(r->bias_ids, params->sampling.bias_ids, sizeof(int32_t) * (size_t)r->p.sampling.n_bias);
        memcpy(r->bias_vals, params->sampling.bias_vals, sizeof(float) * (size_t)r->p.sampling.n_bias);
    }
    r->p.stop_ids = r->stop_ids;
    r->p.sampling.bias_ids = r->bias_ids;
    r->p.sampling.bias_vals = r->bias_vals;
    r->slot = -1;
    r->st = RQ_WAITING;
    r->refs = 2;
    pthread_mutex_lock(&e->mu);
    if (e->tail) e->tail->next = r;
    else e->head = r;
    e->tail = r;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return DSV4_OK;
}

int dsv4_request_poll(dsv4_request *r, int32_t *buf, int cap, dsv4_finish *finish, int timeout_ms) {
    dsv4_engine *e = r->e;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&e->mu);
    for (;;) {
        int avail = r->n_tok - r->n_prompt - r->n_read;
        if (avail > 0 || r->st == RQ_DONE || timeout_ms == 0) break;
        if (timeout_ms < 0) pthread_cond_wait(&e->cv_out, &e->mu);
        else if (pthread_cond_timedwait(&e->cv_out, &e->mu, &dl) == ETIMEDOUT) break;
    }
    int avail = r->n_tok - r->n_prompt - r->n_read, n = avail < cap ? avail : cap;
    if (n > 0) memcpy(buf, r->tok + r->n_prompt + r->n_read, sizeof(int32_t) * (size_t)n);
    r->n_read += n;
    *finish = (r->st == RQ_DONE && r->n_read == r->n_tok - r->n_prompt) ? r->finish : DSV4_FINISH_NONE;
    pthread_mutex_unlock(&e->mu);
    return n;
}

int dsv4_request_logprobs(dsv4_request *r, int first, int n, dsv4_token_logprob *out) {
    pthread_mutex_lock(&r->e->mu);
    int have = r->lp ? r->n_tok - r->n_prompt : 0;
    if (first < 0) first = 0;
    if (n > have - first) n = have - first;
    if (n > 0) memcpy(out, r->lp + first, sizeof *out * (size_t)n);
    pthread_mutex_unlock(&r->e->mu);
    return n > 0 ? n : 0;
}

int dsv4_request_prompt_logprobs(dsv4_request *r, dsv4_token_logprob *out, int32_t *rank, int cap) {
    pthread_mutex_lock(&r->e->mu);
    int n = r->plp && r->plp_ready && cap >= r->n_prompt ? r->n_prompt : 0;
    if (n) memcpy(out, r->plp, sizeof *out * (size_t)n);
    if (n && rank) memcpy(rank, r->prank, sizeof *rank * (size_t)n);
    pthread_mutex_unlock(&r->e->mu);
    return n;
}

void dsv4_request_cancel(dsv4_request *r) {
    pthread_mutex_lock(&r->e->mu);
    r->cancel = 1;
    pthread_cond_signal(&r->e->cv_work);
    pthread_mutex_unlock(&r->e->mu);
}

void dsv4_request_release(dsv4_request *r) {
    if (!r) return;
    dsv4_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    if (r->st != RQ_DONE) r->cancel = 1; /* nobody will read it: stop generating */
    req_unref_locked(r);
    pthread_mutex_unlock(&e->mu);
}

void dsv4_request_counts(dsv4_request *r, int *prompt_tokens, int *generated_tokens) {
    pthread_mutex_lock(&r->e->mu);
    *prompt_tokens = r->n_prompt;
    *generated_tokens = r->n_tok - r->n_prompt;
    pthread_mutex_unlock(&r->e->mu);
}

int dsv4_request_cached_tokens(dsv4_request *r) {
    pthread_mutex_lock(&r->e->mu);
    int n = r->n_cached;
    pthread_mutex_unlock(&r->e->mu);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Prefix cache (spec/SERVING.md §8.7): free slots that still hold a history */
/* ------------------------------------------------------------------------ */

/* Give every page of `slot` back to the pool and unmap them in the runner. */
static void pages_release(dsv4_engine *e, int slot) {
    if (!e->paged || !e->snp[slot]) return;
    for (int i = 0; i < e->snp[slot]; i++)
        e->page_free[e->n_page_free++] = e->spages[(size_t)slot * e->slot_max_pages + i];
    e->snp[slot] = 0;
    dsv4_err err = {0};
    if (e->run.set_pages(e->run.ctx, slot, 0, NULL, &err))
        dsv4_log(DSV4_LOG_ERROR, "unmapping the pages of slot %d: %s", slot, err.msg);
}

static void slot_drop(dsv4_engine *e, int slot) {
    e->run.release(e->run.ctx, slot);
    if (e->has_drafter && e->dr.release) e->dr.release(e->dr.ctx, slot);
    e->cache[slot].len = 0;
    pages_release(e, slot);
}

/*
 * Map pages so that `slot` covers positions [0, npos) (issue 5). Takes free
 * pages first, then evicts the least recently used cached history of a free
 * slot (its pages are only a cache). Returns 0, or -1 when the pool has no
 * page left for it (the caller preempts), -2 when the runner failed to map
 * them (a TP rank or its communicator failed: preempting would retry forever,
 * so the caller fails the request). Pages already mapped are kept.
 */
static int pages_ensure(dsv4_engine *e, int slot, int64_t npos) {
    if (!e->paged) return 0;
    int need = (int)((npos + e->run.page_tokens - 1) / e->run.page_tokens);
    if (need > e->slot_max_pages) need = e->slot_max_pages;
    if (e->snp[slot] >= need) return 0;
    while (e->snp[slot] < need) {
        if (!e->n_page_free) {
            int v = -1;
            for (int i = 0; i < e->n_free; i++) {
                int s2 = e->free_slots[i];
                if (s2 != slot && e->snp[s2] && (v < 0 || e->cache[s2].used < e->cache[v].used)) v = s2;
            }
            if (v < 0) break;
            slot_drop(e, v);
            continue;
        }
        e->spages[(size_t)slot * e->slot_max_pages + e->snp[slot]++] = e->page_free[--e->n_page_free];
    }
    dsv4_err err = {0};
    if (e->run.set_pages(e->run.ctx, slot, e->snp[slot], e->spages + (size_t)slot * e->slot_max_pages, &err)) {
        dsv4_log(DSV4_LOG_ERROR, "mapping the pages of slot %d: %s", slot, err.msg);
        return -2;
    }
    return e->snp[slot] >= need ? 0 : -1;
}

/* Pages a free slot could give back (free pages + cached histories'). */
static int pages_available(const dsv4_engine *e) {
    int n = e->n_page_free;
    for (int i = 0; i < e->n_free; i++) n += e->snp[e->free_slots[i]];
    return n;
}

/* Record that slot holds the state of tok[0..len); 0 on success. */
static int cache_store(dsv4_engine *e, int slot, const int32_t *tok, int64_t len) {
    struct slot_cache *c = &e->cache[slot];
    if (len > c->cap) {
        int32_t *t = realloc(c->tok, sizeof(int32_t) * (size_t)len);
        if (!t) return -1;
        c->tok = t;
        c->cap = len;
    }
    memcpy(c->tok, tok, sizeof(int32_t) * (size_t)len);
    c->len = len;
    c->used = ++e->clock;
    return 0;
}

/* Best reusable position of free slot `slot` for r's prompt (0 = none). */
static int64_t cache_match(dsv4_engine *e, int slot, const dsv4_request *r) {
    const struct slot_cache *c = &e->cache[slot];
    if (!c->len) return 0;
    int64_t lcp = 0, lim = c->len < r->n_prompt ? c->len : r->n_prompt;
    while (lcp < lim && c->tok[lcp] == r->tok[lcp]) lcp++;
    int64_t want = lcp < r->n_prompt - 1 ? lcp : r->n_prompt - 1; /* >= 1 row computed for the logits */
    if (want < 1) return 0;
    int64_t R = e->run.reusable(e->run.ctx, slot, c->len, want, r->n_prompt);
    return R > 0 && R <= want ? R : 0;
}

/* Index into free_slots of the slot to overwrite: an empty one, else the least recently used. */
static int victim_locked(dsv4_engine *e) {
    int best = e->n_free - 1;
    for (int i = e->n_free - 1; i >= 0; i--) { /* from the end: the lowest slot ids first */
        const struct slot_cache *c = &e->cache[e->free_slots[i]], *b = &e->cache[e->free_slots[best]];
        if (!c->len) return i;
        if (c->used < b->used) best = i;
    }
    return best;
}

static int take_free(dsv4_engine *e, int i) {
    int s = e->free_slots[i];
    e->free_slots[i] = e->free_slots[--e->n_free];
    return s;
}

/* Give a free slot to r (n_free > 0): the cached history it shares the longest
 * exact prefix with, else an empty or the least recently used slot (evicted). */
static void admit_locked(dsv4_engine *e, dsv4_request *r) {
    int best = -1;
    int64_t R = 0;
    if (e->caching && !r->plp && !r->p.no_prefix_cache) { /* prompt logprobs need every row computed */
        if (r->n_tok == r->n_prompt) e->st.prefix_queries += (uint64_t)r->n_prompt;
        for (int i = 0; i < e->n_free; i++) {
            int64_t x = cache_match(e, e->free_slots[i], r);
            if (x > R) {
                R = x;
                best = i;
            }
        }
    }
    if (best >= 0) {
        int s = e->free_slots[best];
        dsv4_err err = {0};
        if (e->run.resume(e->run.ctx, s, R, &err)) {
            dsv4_log(DSV4_LOG_WARN, "prefix cache: resuming slot %d at %lld failed, recomputing: %s", s,
                     (long long)R, err.msg);
            best = -1;
            R = 0;
        }
    }
    if (best < 0) {
        best = victim_locked(e);
        if (e->cache[e->free_slots[best]].len) slot_drop(e, e->free_slots[best]);
    }
    r->slot = take_free(e, best);
    e->cache[r->slot].len = 0; /* the slot's state now belongs to r */
    r->n_computed = R;
    if (r->n_tok == r->n_prompt) {
        r->n_cached = (int)R;
        e->st.prefix_hits += (uint64_t)R;
    }
}

/*
 * r just finished its prefill and keeps decoding in its slot, which will
 * overwrite the window rings: keep a copy of the prompt's state in a free
 * slot (LRU eviction) unless a free slot already serves this prompt.
 */
static void snapshot_locked(dsv4_engine *e, dsv4_request *r) {
    if (!e->caching || r->p.no_prefix_cache || !e->run.copy_slot || !e->n_free || r->slot < 0 ||
        r->n_computed != r->n_prompt)
        return;
    for (int i = 0; i < e->n_free; i++)
        if (cache_match(e, e->free_slots[i], r) == r->n_prompt - 1) return;
    int i = victim_locked(e), dst = e->free_slots[i];
    dsv4_err err = {0};
    e->cache[dst].len = 0;
    if (pages_ensure(e, dst, r->n_computed)) { /* no page to spare: no snapshot */
        slot_drop(e, dst);
        return;
    }
    if (e->run.copy_slot(e->run.ctx, r->slot, dst, &err) || cache_store(e, dst, r->tok, r->n_computed)) {
        dsv4_log(DSV4_LOG_WARN, "prefix cache: copying slot %d to %d failed: %s", r->slot, dst, err.msg);
        slot_drop(e, dst);
        return;
    }
    e->st.prefix_snapshots++;
}

/* Finish a request (engine thread, lock held): free its slot (its state stays
 * cached under prefix caching), mark done. */
static void finish_locked(dsv4_engine *e, dsv4_request *r, dsv4_finish why) {
    if (r->st == RQ_DONE) return;
    if (r->slot >= 0) {
        /* a failed forward may have left the slot half-written: never cache it */
        if (!e->caching || r->p.no_prefix_cache || why == DSV4_FINISH_ERROR || r->n_computed < 1 ||
            cache_store(e, r->slot, r->tok, r->n_computed))
            slot_drop(e, r->slot);
        e->free_slots[e->n_free++] = r->slot;
        r->slot = -1;
    }
    r->finish = why;
    r->st = RQ_DONE;
    r->n_drafts = 0;
}

/* Remove finished requests from the live list and drop the engine's reference. */
static void reap_locked(dsv4_engine *e) {
    dsv4_request **pp = &e->head, *prev = NULL;
    while (*pp) {
        dsv4_request *r = *pp;
        if (r->st == RQ_DONE) {
            *pp = r->next;
            if (e->tail == r) e->tail = prev;
            req_unref_locked(r);
        } else {
            prev = r;
            pp = &r->next;
        }
    }
}

static int is_stop_id(const dsv4_request *r, int32_t t, int32_t eos) {
    if (t == eos && !r->p.ignore_eos) return 1;
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (r->p.stop_ids[i] == t) return 1;
    return 0;
}

/*
 * Append emitted tokens with the stop rules of spec/DSPARK.md §4.4 and
 * SERVING.md §6: the run is cut right after EOS / a stop id (once min_tokens
 * is reached) or at max_tokens; then the text-level hook may cut it further.
 */
static void commit_tokens_locked(dsv4_engine *e, dsv4_request *r, const int32_t *em, int n) {
    int start = r->n_tok;
    dsv4_finish fin = DSV4_FINISH_NONE;
    for (int i = 0; i < n; i++) {
        r->tok[r->n_tok++] = em[i];
        int gen = r->n_tok - r->n_prompt;
        if (gen >= r->p.min_tokens && is_stop_id(r, em[i], e->o.eos_id)) { fin = DSV4_FINISH_STOP; break; }
        if (gen >= r->p.max_tokens || r->n_tok >= e->o.max_model_len) { fin = DSV4_FINISH_LENGTH; break; }
    }
    e->st.generation_tokens += (uint64_t)(r->n_tok - start);
    if (r->p.on_tokens) {
        int keep = r->n_tok - start;
        if (r->p.on_tokens(r->p.user, r->tok + start, r->n_tok - start, &keep)) {
            if (keep < 0) keep = 0;
            if (keep < r->n_tok - start) {
                e->st.generation_tokens -= (uint64_t)(r->n_tok - start - keep);
                r->n_tok = start + keep;
            }
            fin = DSV4_FINISH_STOP;
        }
    }
    if (fin != DSV4_FINISH_NONE) finish_locked(e, r, fin);
}

/*
 * Preemption by recomputation (vLLM's policy, issue 5): r loses its slot and
 * pages and goes back to waiting with everything it has generated; it keeps
 * its place in the arrival-ordered list, so it is the first waiting request
 * admitted again. On re-admission it prefills prompt + generated tokens but
 * the last (n_prefill), then decodes from the last one: greedy output is that
 * of an uninterrupted run, and tokens already handed out are not repeated.
 */
static void preempt_locked(dsv4_engine *e, dsv4_request *r) {
    if (r->slot >= 0) {
        slot_drop(e, r->slot);
        e->free_slots[e->n_free++] = r->slot;
        r->slot = -1;
    }
    r->st = RQ_WAITING;
    r->n_computed = 0;
    r->n_drafts = 0;
    r->q_valid = 0;
    r->n_prefill = r->n_tok > r->n_prompt ? r->n_tok - 1 : r->n_prompt;
    e->st.preemptions++;
}

/* One planned segment of the step. */
typedef struct seg {
    dsv4_request *r;
    int row0, nrows;
    int decode;        /* 1: decode/verify rows; 0: prefill chunk */
    int logit0;        /* first index into the logits rows, -1 if none */
    int k;             /* drafts verified in this segment */
    int plog0;         /* prefill with prompt logprobs: logits index of its first row (all rows kept), else -1 */
} seg;

/* The row a request samples from: the raw logits, or a copy masked by the
 * request's logits processor (constrained decoding, engine.h). */
static const float *sample_row(dsv4_engine *e, samp_ws *w, dsv4_request *r, const float *lg) {
    if (!r->p.logits_proc) return lg;
    memcpy(w->mlogits, lg, sizeof(float) * (size_t)e->run.vocab);
    r->p.logits_proc(r->p.proc_user, r->tok + r->n_prompt, r->n_tok - r->n_prompt, w->mlogits, e->run.vocab);
    return w->mlogits;
}

/* Prompt logprobs of a computed prefill chunk (lock held): row i (position
 * p0 + i) predicts prompt token p0 + i + 1 (gen_params.prompt_logprobs). */
static void prompt_logprobs_locked(dsv4_engine *e, const seg *sg, int64_t p0) {
    dsv4_request *r = sg->r;
    for (int i = 0; i < sg->nrows; i++) {
        int64_t t = p0 + i + 1;
        if (t >= r->n_prompt) break;
        const float *lg = e->logits + (size_t)(sg->plog0 + i) * (size_t)e->run.vocab;
        dsv4_token_logprob_compute(lg, e->run.vocab, r->tok[t], r->p.prompt_top_logprobs, &r->plp[t]);
        int32_t rank = 1;
        for (int v = 0; v < e->run.vocab; v++) rank += lg[v] > lg[r->tok[t]];
        r->prank[t] = rank;
    }
    if (p0 + sg->nrows >= r->n_prompt) r->plp_ready = 1;
}

/*
 * A row the runner may answer with its greedy id alone (runner forward_ids):
 * greedy, nothing the sampler applies before the argmax (logit_bias,
 * penalties: dsv4_sampling_probs), no logits processor (grammar masks need
 * the whole row) and no logprobs. Then the argmax of the raw row IS the
 * token the host path picks (ties: lowest id, both ways), and at
 * temperature 0 verification is exact match against those ids (DSPARK.md
 * §4.2), so the step's output is token-identical either way.
 */
static int greedy_plain(const dsv4_request *r) {
    const dsv4_sampling *sp = &r->p.sampling;
    return sp->temperature == 0 && sp->n_bias == 0 && sp->repetition_penalty == 1.0f &&
           sp->presence_penalty == 0 && sp->frequency_penalty == 0 && !r->p.logits_proc && !r->lp;
}

/* Speculation counters of one verified segment: k drafts, n tokens emitted (n - 1 drafts accepted). */
static void spec_stats_locked(dsv4_engine *e, int k, int n) {
    e->st.spec_drafts++;
    e->st.spec_draft_tokens += (uint64_t)k;
    e->st.spec_accepted_tokens += (uint64_t)(n - 1);
    for (int j = 0; j < n - 1; j++) e->st.spec_accepted_per_pos[j]++;
    for (int j = 0; j < k && j < DSV4_MAX_SPEC_K; j++) e->st.spec_draft_per_pos[j]++;
}

/* Greedy ids of a segment's logit rows (ids path): decode, or verify by exact match. */
static int decode_segment_ids(dsv4_engine *e, seg *s, const int32_t *ids, int32_t *em) {
    dsv4_request *r = s->r;
    int k = s->k;
    const int32_t *am = ids + s->logit0;
    if (k == 0) {
        em[0] = am[0];
        return 1;
    }
    int n = dsv4_verify_greedy(am, r->drafts, k, em);
    spec_stats_locked(e, k, n);
    return n;
}

/*
 * Sample or verify one decode segment; returns the number of emitted tokens
 * (the caller counts the speculation statistics). Reads the engine's logits
 * and writes only this request (its drafts' copy after the committed
 * tokens, its logprobs) and w, so the segments of a step can run on
 * different threads (dsv4_engine_step), each with its own w; the result does
 * not depend on which thread runs it.
 */
static int decode_segment(dsv4_engine *e, samp_ws *w, seg *s, int32_t *em) {
    dsv4_request *r = s->r;
    int V = e->run.vocab, k = s->k;
    const float *lg = e->logits + (size_t)s->logit0 * (size_t)V;
    int64_t P = r->n_tok - 1; /* anchor position */
    const dsv4_sampling *sp = &r->p.sampling;
    /* drafts are written after the committed tokens so that row j's penalty
     * history includes d_1..d_j (SERVING.md §7.2) */
    memcpy(r->tok + r->n_tok, s->r->drafts, sizeof(int32_t) * (size_t)k);
    int32_t am[DSV4_MAX_SPEC_K + 1];
    for (int j = 0; j <= k; j++)
        am[j] = dsv4_sampling_probs(sp, k == 0 ? sample_row(e, w, r, lg) : lg + (size_t)j * V, V, r->tok,
                                    r->n_prompt, r->tok + r->n_prompt, r->n_tok - r->n_prompt + j,
                                    w->probs + (size_t)j * V, w->sscratch);
    if (k == 0) {
        em[0] = sp->temperature == 0 ? am[0]
                                     : dsv4_sample_from(w->probs, V, dsv4_rng_u01(sp->seed, P + 1, DSV4_RNG_SAMPLE));
        if (r->lp) dsv4_token_logprob_compute(lg, V, em[0], r->p.top_logprobs, &r->lp[r->n_tok - r->n_prompt]);
        return 1;
    }
    int n = sp->temperature == 0
                ? dsv4_verify_greedy(am, r->drafts, k, em)
                : dsv4_verify_sampled(w->probs, r->q_valid ? r->q : NULL, r->drafts, k, V, sp->seed, P + 1,
                                      w->vscratch, em);
    if (r->lp) /* emitted token j came from verify row j (accepted drafts, then the correction / bonus) */
        for (int j = 0; j < n; j++)
            dsv4_token_logprob_compute(lg + (size_t)j * V, V, em[j], r->p.top_logprobs,
                                       &r->lp[r->n_tok - r->n_prompt + j]);
    return n;
}

/*
 * After a step: tell the drafter which positions became final, then ask it
 * for the next drafts of every request that will verify next step (one
 * batched call each). Lock held; the drafter reads the runner's state.
 */
static void drafts_for_next_step_locked(dsv4_engine *e, seg *segs, int nseg) {
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)nseg * 2), *anchor = slot + nseg;
    int64_t *len = malloc(sizeof(int64_t) * (size_t)nseg);
    dsv4_request **who = malloc(sizeof *who * (size_t)nseg);
    float *temp = malloc(sizeof(float) * (size_t)nseg);
    uint64_t *seed = malloc(sizeof(uint64_t) * (size_t)nseg);
    float **q = malloc(sizeof(float *) * (size_t)nseg);
    int *qv = malloc(sizeof(int) * (size_t)nseg);
    int32_t *drafts = malloc(sizeof(int32_t) * (size_t)nseg * (size_t)e->o.spec_k);
    if (!slot || !len || !who || !temp || !seed || !q || !qv || !drafts) goto out;
    int n = 0;
    for (int s = 0; s < nseg; s++) {
        dsv4_request *r = segs[s].r;
        if (r->st == RQ_DONE || r->slot < 0) continue;
        slot[n] = r->slot;
        len[n++] = r->n_computed;
    }
    dsv4_err derr = {0};
    if (n && e->dr.commit(e->dr.ctx, n, slot, len, &derr)) {
        dsv4_log(DSV4_LOG_WARN, "drafter context update failed, decoding without drafts: %s", derr.msg);
        e->st.spec_draft_failures++;
        goto out;
    }
    /* k for this batch size (DSPARK.md §5.3) */
    int k = e->o.spec_k, running = 0;
    for (dsv4_request *r = e->head; r; r = r->next) running += r->st == RQ_PREFILL || r->st == RQ_DECODE;
    for (int i = 0; i < e->o.n_k_schedule; i++)
        if (running >= e->o.k_schedule[i][0] && running <= e->o.k_schedule[i][1]) k = e->o.k_schedule[i][2];
    if (k <= 0) goto out;
    /* the drafts need room: positions anchor_pos .. anchor_pos + k < max_model_len */
    n = 0;
    for (int s = 0; s < nseg; s++) {
        dsv4_request *r = segs[s].r;
        if (!r->p.use_spec || r->p.logits_proc || r->st != RQ_DECODE || r->cancel ||
            r->n_tok - 1 + k >= e->o.max_model_len)
            continue; /* constrained requests decode one exact row per step (engine.h) */
        who[n] = r;
        slot[n] = r->slot;
        anchor[n] = r->tok[r->n_tok - 1];
        len[n] = r->n_tok - 1;
        temp[n] = r->p.sampling.temperature;
        seed[n] = r->p.sampling.seed;
        q[n] = r->p.sampling.temperature > 0 ? r->q : NULL;
        qv[n] = 0;
        n++;
    }
    double td = n ? mono_s() : 0;
    int drc = n ? e->dr.propose(e->dr.ctx, n, slot, anchor, len, k, temp, seed, drafts, q, qv, &derr) : 0;
    if (n) e->st.spec_draft_seconds += mono_s() - td;
    if (drc) {
        dsv4_log(DSV4_LOG_WARN, "drafter failed, decoding without drafts: %s", derr.msg);
        e->st.spec_draft_failures++;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        memcpy(who[i]->drafts, drafts + (size_t)i * k, sizeof(int32_t) * (size_t)k);
        who[i]->n_drafts = k;
        who[i]->q_valid = q[i] && qv[i];
    }
out:
    free(slot);
    free(len);
    free(who);
    free(temp);
    free(seed);
    free(q);
    free(qv);
    free(drafts);
}

int dsv4_engine_step(dsv4_engine *e, dsv4_err *err) {
    const double t_step = mono_s();
    pthread_mutex_lock(&e->mu);
    /* cancellations */
    for (dsv4_request *r = e->head; r; r = r->next)
        if (r->cancel && r->st != RQ_DONE) finish_locked(e, r, DSV4_FINISH_ABORT);
    /* admission, oldest first */
    int running = 0;
    for (dsv4_request *r = e->head; r; r = r->next) running += r->st == RQ_PREFILL || r->st == RQ_DECODE;
    for (dsv4_request *r = e->head; r && e->n_free > 0 && running < e->o.max_num_seqs; r = r->next)
        if (r->st == RQ_WAITING) {
            if (e->paged) { /* room for its whole prefill and first token now, else it (and the
                             * younger ones) wait: admitting it only to preempt it mid-prefill
                             * would waste the prefill */
                int64_t need = (r->n_prefill + 1 + e->run.page_tokens - 1) / e->run.page_tokens;
                if (need > pages_available(e)) break;
            }
            admit_locked(e, r);
            r->st = RQ_PREFILL;
            running++;
        }
    /* plan: decode rows first, then prefill chunks */
    int budget, nseg, nrows, nlog;
    int maxseg = running;
    seg *segs = calloc((size_t)(maxseg ? maxseg : 1), sizeof *segs);
    if (!segs) {
        pthread_mutex_unlock(&e->mu);
        return -dsv4_err_set(err, DSV4_ENOMEM, "out of memory planning a step");
    }
replan:
    budget = e->o.max_num_batched_tokens;
    nseg = nrows = nlog = 0;
    for (int pass = 0; pass < 2; pass++)
        for (dsv4_request *r = e->head; r && budget > 0; r = r->next) {
            if (pass == 0 && r->st == RQ_DECODE) {
                int k = r->n_drafts;
                if (1 + k > budget) k = 0; /* no room to verify: plain decode this step */
                segs[nseg++] = (seg){r, nrows, 1 + k, 1, nlog, k, -1};
                nrows += 1 + k;
                nlog += 1 + k;
                budget -= 1 + k;
            } else if (pass == 1 && r->st == RQ_PREFILL) {
                int left = (int)(r->n_prefill - r->n_computed), chunk = left < budget ? left : budget;
                int plp = r->plp && r->n_tok == r->n_prompt; /* a resumed request has its prompt records */
                if (plp && chunk > DSV4_PROMPT_LOGPROB_CHUNK) chunk = DSV4_PROMPT_LOGPROB_CHUNK;
                int last = chunk == left && r->n_tok == r->n_prompt; /* a resumed request already has its token */
                if (plp) { /* logits for every row; the last one also samples */
                    segs[nseg++] = (seg){r, nrows, chunk, 0, last ? nlog + chunk - 1 : -1, 0, nlog};
                    nlog += chunk;
                } else {
                    segs[nseg++] = (seg){r, nrows, chunk, 0, last ? nlog : -1, 0, -1};
                    nlog += last;
                }
                nrows += chunk;
                budget -= chunk;
            }
        }
    /* pages for every row of the step; when the pool runs dry, preempt the
     * most recently arrived running request and plan again */
    for (int s = 0; e->paged && s < nseg; s++) {
        dsv4_request *r = segs[s].r;
        int64_t end = segs[s].decode ? r->n_tok - 1 + segs[s].nrows : r->n_computed + segs[s].nrows;
        int pr = pages_ensure(e, r->slot, end);
        if (!pr) continue;
        if (pr == -1 && segs[s].decode && segs[s].k > 0) pr = pages_ensure(e, r->slot, r->n_tok);
        if (!pr) {
            r->n_drafts = 0; /* only the drafts lacked room: decode without them rather than preempt */
            goto replan;
        }
        if (pr == -2) { /* the runner could not map pages: fail this request, as a failed forward does */
            finish_locked(e, r, DSV4_FINISH_ERROR);
            goto replan;
        }
        dsv4_request *victim = NULL;
        for (dsv4_request *q = e->head; q; q = q->next)
            if (q->st == RQ_PREFILL || q->st == RQ_DECODE) victim = q;
        dsv4_log(DSV4_LOG_WARN, "KV cache pool full: preempting a request of %d tokens, %d generated (recomputed later)",
                 victim->n_tok, victim->n_tok - victim->n_prompt);
        preempt_locked(e, victim);
        goto replan;
    }
    int live = 0;
    for (dsv4_request *r = e->head; r; r = r->next) live += r->st != RQ_DONE;
    if (nseg == 0) {
        reap_locked(e);
        pthread_cond_broadcast(&e->cv_out);
        pthread_mutex_unlock(&e->mu);
        free(segs);
        return live;
    }
    /* batch metadata (host) */
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(5 * nrows + 3 * nseg + 1 + nlog));
    /* ids only when every row with logits is plain greedy (a mixed step takes the full logits) */
    int use_ids = e->ids_on && nlog > 0;
    for (int s = 0; s < nseg && use_ids; s++)
        if (segs[s].plog0 >= 0 || (segs[s].logit0 >= 0 && !greedy_plain(segs[s].r))) use_ids = 0;
    if (use_ids && (size_t)nlog > e->ids_cap) {
        int32_t *ni = realloc(e->ids, sizeof(int32_t) * (size_t)nlog);
        if (ni) {
            e->ids = ni;
            e->ids_cap = (size_t)nlog;
        } else {
            use_ids = 0;
        }
    }
    size_t need = use_ids ? 0 : (size_t)nlog * (size_t)e->run.vocab;
    if (need > e->logits_cap) {
        float *nl = realloc(e->logits, need * sizeof(float));
        if (nl) {
            e->logits = nl;
            e->logits_cap = need;
        }
    }
    if (!buf || need > e->logits_cap) {
        free(buf);
        free(segs);
        pthread_mutex_unlock(&e->mu);
        return -dsv4_err_set(err, DSV4_ENOMEM, "out of memory building a step of %d rows", nrows);
    }
    int32_t *tok = buf, *pos = tok + nrows, *slot = pos + nrows, *sidx = slot + nrows, *lrows = sidx + nrows;
    int32_t *cu = lrows + nlog, *sslot = cu + nseg + 1, *spos0 = sslot + nseg;
    cu[0] = 0;
    for (int s = 0; s < nseg; s++) {
        dsv4_request *r = segs[s].r;
        int64_t p0 = segs[s].decode ? r->n_tok - 1 : r->n_computed;
        for (int i = 0; i < segs[s].nrows; i++) {
            int row = segs[s].row0 + i;
            tok[row] = segs[s].decode ? (i == 0 ? r->tok[r->n_tok - 1] : r->drafts[i - 1]) : r->tok[p0 + i];
            pos[row] = (int32_t)(p0 + i);
            slot[row] = r->slot;
            sidx[row] = s;
        }
        if (segs[s].plog0 >= 0)
            for (int i = 0; i < segs[s].nrows; i++) lrows[segs[s].plog0 + i] = segs[s].row0 + i;
        if (segs[s].logit0 >= 0) {
            if (segs[s].decode)
                for (int i = 0; i < segs[s].nrows; i++) lrows[segs[s].logit0 + i] = segs[s].row0 + i;
            else
                lrows[segs[s].logit0] = segs[s].row0 + segs[s].nrows - 1;
        }
        cu[s + 1] = segs[s].row0 + segs[s].nrows;
        sslot[s] = r->slot;
        spos0[s] = (int32_t)p0;
    }
    dsv4_batch b = {nrows, nseg, tok, pos, slot, sidx, cu, sslot, spos0};
    pthread_mutex_unlock(&e->mu);

    dsv4_err ferr = {0};
    int has_verify = 0;
    for (int s = 0; s < nseg; s++) has_verify |= segs[s].k > 0;
    double tf = mono_s();
    int frc = use_ids ? e->run.forward_ids(e->run.ctx, &b, lrows, nlog, e->ids, &ferr)
                      : e->run.forward(e->run.ctx, &b, lrows, nlog, e->logits, &ferr);
    double fwd_s = mono_s() - tf;

    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.greedy_id_steps += (uint64_t)(use_ids && !frc);
    if (has_verify) e->st.spec_verify_seconds += fwd_s;
    int32_t em[DSV4_MAX_SPEC_K + 1];
    /* Host sampling of the decode segments first, on several threads when
     * there are several (each ~1-10 ms at a 129K vocabulary: penalties,
     * softmax, top-k/top-p, verification; a DSpark request has k+1 rows), then
     * the commits below in segment order. One segment per request, so this
     * is the order-independent part of the loop. */
    int32_t (*pem)[DSV4_MAX_SPEC_K + 1] = NULL;
    int *pn = NULL, npar = 0;
    for (int s = 0; !frc && !use_ids && s < nseg; s++) npar += segs[s].decode && segs[s].r->st != RQ_DONE;
    if (npar > 1 && e->n_ws > 1) {
        pem = malloc(sizeof *pem * (size_t)nseg);
        pn = malloc(sizeof *pn * (size_t)nseg);
    }
    if (pem && pn) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(npar < e->n_ws ? npar : e->n_ws)
        for (int s = 0; s < nseg; s++) {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            pn[s] = segs[s].decode && segs[s].r->st != RQ_DONE ? decode_segment(e, &e->ws[tid], &segs[s], pem[s]) : 0;
        }
    }
    for (int s = 0; s < nseg; s++) {
        seg *sg = &segs[s];
        dsv4_request *r = sg->r;
        if (frc) {
            dsv4_log(DSV4_LOG_ERROR, "forward failed: %s", ferr.msg);
            finish_locked(e, r, DSV4_FINISH_ERROR);
            continue;
        }
        if (r->st == RQ_DONE) continue;
        int n = 0;
        if (sg->decode) {
            int64_t P = r->n_tok - 1;
            if (use_ids) {
                n = decode_segment_ids(e, sg, e->ids, em);
            } else {
                if (pem && pn) {
                    n = pn[s];
                    memcpy(em, pem[s], sizeof(int32_t) * (size_t)n);
                } else {
                    n = decode_segment(e, &e->ws[0], sg, em);
                }
                if (sg->k > 0) spec_stats_locked(e, sg->k, n);
            }
            r->n_computed = P + n; /* anchor + accepted drafts are committed */
            r->n_drafts = 0;
        } else {
            if (sg->plog0 >= 0) prompt_logprobs_locked(e, sg, r->n_computed);
            r->n_computed += sg->nrows;
            if (r->n_tok == r->n_prompt) e->st.prompt_tokens += (uint64_t)sg->nrows;
            else if (r->n_computed == r->n_prefill) r->st = RQ_DECODE; /* resumed after a preemption */
            if (sg->logit0 >= 0 && use_ids) {
                em[0] = e->ids[sg->logit0];
                n = 1;
                r->st = RQ_DECODE;
            } else if (sg->logit0 >= 0) {
                const dsv4_sampling *sp = &r->p.sampling;
                const float *lg = e->logits + (size_t)sg->logit0 * (size_t)e->run.vocab;
                samp_ws *w = &e->ws[0];
                int32_t am = dsv4_sampling_probs(sp, sample_row(e, w, r, lg), e->run.vocab, r->tok, r->n_prompt, NULL,
                                                 0, w->probs, w->sscratch);
                em[0] = sp->temperature == 0
                            ? am
                            : dsv4_sample_from(w->probs, e->run.vocab,
                                               dsv4_rng_u01(sp->seed, r->n_prompt, DSV4_RNG_SAMPLE));
                if (r->lp) dsv4_token_logprob_compute(lg, e->run.vocab, em[0], r->p.top_logprobs, &r->lp[0]);
                n = 1;
                r->st = RQ_DECODE;
            }
        }
        if (n) commit_tokens_locked(e, r, em, n);
    }
    if (!frc && e->has_drafter) drafts_for_next_step_locked(e, segs, nseg);
    /* after the drafter took its context, so the copy has it too */
    for (int s = 0; !frc && s < nseg; s++)
        if (!segs[s].decode && segs[s].logit0 >= 0 && segs[s].r->st == RQ_DECODE) snapshot_locked(e, segs[s].r);
    reap_locked(e);
    live = 0;
    for (dsv4_request *r = e->head; r; r = r->next) live += r->st != RQ_DONE;
    pthread_cond_broadcast(&e->cv_out);
    pthread_mutex_unlock(&e->mu);
    if (e->step_log) { /* DSV4_STEP_LOG=1: where a step's time goes (first-use costs, stalls) */
        int prows = 0, drows = 0;
        for (int s = 0; s < nseg; s++) *(segs[s].decode ? &drows : &prows) += segs[s].nrows;
        dsv4_log(DSV4_LOG_INFO, "step %llu: %d rows (%d prefill, %d decode/verify) in %d segments, forward %.2f ms, "
                 "step %.2f ms", (unsigned long long)e->st.steps, nrows, prows, drows, nseg, fwd_s * 1e3,
                 (mono_s() - t_step) * 1e3);
    }
    free(pem);
    free(pn);
    free(buf);
    free(segs);
    return live;
}

static void *engine_main(void *arg) {
    dsv4_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !e->head) pthread_cond_wait(&e->cv_work, &e->mu);
        int stop = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        dsv4_err err = {0};
        if (dsv4_engine_step(e, &err) < 0) dsv4_log(DSV4_LOG_ERROR, "engine step failed: %s", err.msg);
    }
    return NULL;
}

int dsv4_engine_start(dsv4_engine *e, dsv4_err *err) {
    if (e->thread_on) return DSV4_OK;
    if (pthread_create(&e->thread, NULL, engine_main, e))
        return dsv4_err_set(err, DSV4_EBACKEND, "cannot start the engine thread");
    e->thread_on = 1;
    return DSV4_OK;
}

void dsv4_engine_stop(dsv4_engine *e) {
    if (!e->thread_on) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_on = 0;
    e->stopping = 0;
}

void dsv4_engine_stats_diff(const dsv4_engine_stats *now, const dsv4_engine_stats *base, dsv4_engine_stats *out) {
    dsv4_engine_stats d;
#define DIFF_C_(t, f) d.f = (t)(now->f - base->f);
#define DIFF_A_(t, f, n) \
    for (int i = 0; i < (n); i++) d.f[i] = (t)(now->f[i] - base->f[i]);
#define DIFF_G_(t, f) d.f = now->f;
    DSV4_ENGINE_STATS_FIELDS(DIFF_C_, DIFF_A_, DIFF_G_)
#undef DIFF_C_
#undef DIFF_A_
#undef DIFF_G_
    *out = d;
}

void dsv4_engine_get_stats(dsv4_engine *e, dsv4_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->st;
    s->running = s->waiting = 0;
    for (dsv4_request *r = e->head; r; r = r->next) {
        s->running += r->st == RQ_PREFILL || r->st == RQ_DECODE;
        s->waiting += r->st == RQ_WAITING;
    }
    if (e->paged) {
        s->kv_pages_total = e->run.n_pages;
        s->kv_page_tokens = e->run.page_tokens;
        s->kv_page_bytes = e->run.page_bytes;
        s->kv_pages_used = e->run.n_pages - pages_available(e); /* cached histories count as free (vLLM) */
    }
    pthread_mutex_unlock(&e->mu);
}

void dsv4_engine_free(dsv4_engine *e) {
    if (!e) return;
    dsv4_engine_stop(e);
    if (e->inited) {
        pthread_mutex_lock(&e->mu);
        for (dsv4_request *r = e->head; r; r = r->next) finish_locked(e, r, DSV4_FINISH_ABORT);
        reap_locked(e);
        pthread_cond_broadcast(&e->cv_out);
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv_work);
        pthread_cond_destroy(&e->cv_out);
    }
    free(e->free_slots);
    free(e->page_free);
    free(e->spages);
    free(e->snp);
    for (int i = 0; e->cache && i < e->run.n_slots; i++) free(e->cache[i].tok);
    free(e->cache);
    free(e->logits);
    free(e->ids);
    for (int i = 0; e->ws && i < e->n_ws; i++) {
        free(e->ws[i].probs);
        free(e->ws[i].vscratch);
        free(e->ws[i].mlogits);
        free(e->ws[i].sscratch);
    }
    free(e->ws);
    free(e);
}
