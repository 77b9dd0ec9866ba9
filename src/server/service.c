/*
 * Generation service: model + engine + text layer behind the routes
 * (src/server/service.h). Request parsing is in service_params.c, the
 * per-request job (engine hook, response/SSE building) in service_job.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/graph_sizes.h"
#include "model/forward.h"
#include "engine/model_runner.h"
#include "model/kvcodec.h"
#include "parallel/multinode.h"
#include "parallel/tp_runner.h"
#include "server/service_internal.h"
#include "text/tokenizer.h"


static int warm_up(dsv4_service *s, dsv4_err *err) {
    /* One short greedy generation through the whole path, so nothing is
     * first-touched by a client's request (SERVING.md §8.5). */
    int32_t p[4] = {0, 2, 3, 4};
    for (int i = 1; i < 4; i++)
        if (p[i] >= s->vocab) p[i] = s->vocab - 1;
    dsv4_gen_params gp;
    dsv4_gen_params_default(&gp);
    gp.sampling.temperature = 0;
    gp.max_tokens = 2;
    gp.ignore_eos = 1;
    gp.no_prefix_cache = 1; /* a client's first request starts with 0 cached tokens */
    dsv4_request *r;
    if (dsv4_engine_submit(s->engine, p, 4, &gp, &r, err)) return err ? err->code : DSV4_EINTERNAL;
    int32_t out[4];
    dsv4_finish f = DSV4_FINISH_NONE;
    while (f == DSV4_FINISH_NONE) dsv4_request_poll(r, out, 4, &f, 1000);
    dsv4_request_release(r);
    if (f == DSV4_FINISH_ERROR) return dsv4_err_set(err, DSV4_EBACKEND, "warm-up generation failed (see log)");
    return DSV4_OK;
}

/* Capture sizes and rows per sequence (issue 7), storage for the runner options' pointers. */
typedef struct graph_plan {
    int sizes[DSV4_MAX_GRAPH_SIZES], n_sizes;
    int rows[16], rows_max[16], n_rows;
    int eager; /* --enforce-eager on a GPU: the shapes are warmed, not captured */
    int warm;  /* run the start-up warm-up (DSV4_WARMUP; default on a GPU) */
} graph_plan;

/*
 * Capture the decode / verify CUDA graphs before the server is ready (issue 7):
 * the log says how many, for which shapes and how long it took, so a client
 * request never waits for a capture. Steps that are not one of these shapes
 * (mixed prefill + decode chunks, verify steps whose requests draft different
 * numbers of tokens, more sequences than the largest size) run eagerly.
 */
static int graphs_at_start(dsv4_runner *run, const graph_plan *gp, dsv4_err *err) {
    char sz[512] = "", rw[256] = "";
    size_t n = 0;
    for (int i = 0; i < gp->n_sizes && n + 16 < sizeof sz; i++) n += (size_t)snprintf(sz + n, sizeof sz - n, "%s%d", i ? "," : "", gp->sizes[i]);
    n = 0;
    for (int i = 0; i < gp->n_rows && n + 48 < sizeof rw; i++) {
        if (gp->rows_max[i] > 0)
            n += (size_t)snprintf(rw + n, sizeof rw - n, "%s%d (sizes <= %d)", i ? ", " : "", gp->rows[i], gp->rows_max[i]);
        else
            n += (size_t)snprintf(rw + n, sizeof rw - n, "%s%d", i ? ", " : "", gp->rows[i]);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int ng = 0, rc = run->warmup(run->ctx, &ng, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc) return rc;
    if (gp->eager || !ng) {
        dsv4_log(DSV4_LOG_INFO,
                 "warm-up at start: decode / verify steps of %s sequences (rows per sequence %s) and prefill-sized "
                 "steps run once each, eagerly, in %.1f s (no CUDA graphs%s)",
                 sz, rw, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
                 gp->eager ? ": --enforce-eager" : "");
        return DSV4_OK;
    }
    dsv4_log(DSV4_LOG_INFO,
             "CUDA graphs: captured %d graphs at start in %.1f s (batch sizes %s sequences; rows per sequence %s); "
             "steps pad up to the next size; mixed prefill+decode steps and uneven verify steps run eagerly",
             ng, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, sz, rw);
    return DSV4_OK;
}

/*
 * The model runner options the serving flags give. Every node of a multi-node
 * launch derives them the same way (dsv4_service_follow), so the KV pools match.
 */
static int runner_opts(const dsv4_service_opts *o, dsv4_model_runner_opts *mo, dsv4_load_opts *lo, int *cache_slots_out,
                       dsv4_kv_dtype *kvt_out, graph_plan *gp, dsv4_err *err) {
    /* max_model_len as vLLM: given; else (0) the model's max_position_embeddings, refused at
     * open when the memory-capped pool cannot hold one such request; auto (-1): the same
     * length, but a smaller pool is kept and max_model_len becomes what it holds (fit_len).
     * Several nodes (--nnodes) size their pools per slot, not by memory (every node must hold
     * the same pages), so a length that grew the pool unbounded is not their default: 8192. */
    int64_t max_model_len = o->max_model_len;
    if (max_model_len <= 0) {
        dsv4_config cfg;
        int rc = dsv4_config_load_ex(o->model_dir, o->hf_overrides, &cfg, err);
        if (rc) return rc;
        max_model_len = cfg.max_position_embeddings;
        if (o->multinode && max_model_len > 8192) max_model_len = 8192;
        if (max_model_len > (1 << 30)) max_model_len = 1 << 30; /* positions are int32 */
    }
    /* prefix caching: a few slots beyond max_num_seqs keep the state of recent
     * prompts while their requests decode on (SERVING.md §8.7) */
    int cache_slots = !o->enable_prefix_caching ? 0 : o->max_num_seqs < 8 ? o->max_num_seqs : 8;
    dsv4_kv_dtype kvt;
    /* "auto": fp8_ds_mla on the GPU (vLLM's default for this model), f32 on the CPU (kvcodec.h) */
    int gpu = dsv4_device_is_gpu((dsv4_device)o->device);
    int rc = dsv4_kv_dtype_parse_for(o->kv_cache_dtype, gpu, &kvt, err);
    if (rc) return rc;
    *mo = (dsv4_model_runner_opts){.n_slots = o->max_num_seqs + cache_slots,
                                   .max_len = (int)max_model_len,
                                   .max_spec = o->spec_k,
                                   .numerics = DSV4_NUMERICS_REFERENCE,
                                   .draft_sampled = o->draft_sampled,
                                   .device = (dsv4_device)o->device,
                                   .cuda_graphs = o->cuda_graphs,
                                   .block_size = o->block_size,
                                   .n_pages = o->num_gpu_blocks_override,
                                   .kv_cache_bytes = o->kv_cache_memory_bytes,
                                   /* several nodes compare their pools at the handshake: sized per slot */
                                   .gpu_mem_util = o->multinode ? 0 : o->gpu_memory_utilization,
                                   .fit_len = o->max_model_len < 0 && !o->multinode,
                                   .kv_dtype = (int)kvt};
    *lo = (dsv4_load_opts){.dummy = o->load_dummy, .hf_overrides = o->hf_overrides};
    *cache_slots_out = cache_slots;
    *kvt_out = kvt;
    memset(gp, 0, sizeof *gp);
    /* decode / verify graphs captured at start, for max_num_seqs sequences at most; several nodes
     * derive the same plan here and run the warm-up together (node 0 sends it as a step plan,
     * tp_plan.c lead_warmup). --enforce-eager on a GPU: the same shapes run once each at start,
     * uncaptured (warm_eager), so the first requests do not pay the first-use costs either (issue 7:
     * no first-request penalty). DSV4_WARMUP=0: no start-up warm-up (graphs are then captured at
     * first use); =1: the eager warm-up on the CPU too (tests: the several-node plan runs there) */
    const char *ew = getenv("DSV4_WARMUP");
    int warm = ew && *ew ? strcmp(ew, "0") != 0 : gpu;
    if (o->cuda_graphs || warm) {
        gp->eager = !o->cuda_graphs;
        gp->warm = ew && *ew ? warm : 1;
        mo->warm_eager = warm;
        gp->n_sizes = dsv4_graph_sizes_resolve(o->graph_sizes, o->n_graph_sizes, o->max_graph_size, o->max_num_seqs,
                                               gp->sizes, DSV4_MAX_GRAPH_SIZES, err);
        if (gp->n_sizes < 0) return err ? err->code : DSV4_EINVAL;
        gp->n_rows = dsv4_graph_rows_plan(o->spec_k, (const int(*)[3])o->k_schedule, o->n_k_schedule, o->max_num_seqs,
                                          gp->sizes, gp->n_sizes, gp->rows, gp->rows_max, 16);
        mo->graph_sizes = gp->sizes;
        mo->n_graph_sizes = gp->n_sizes;
        mo->graph_rows = gp->rows;
        mo->graph_rows_max_seqs = gp->rows_max;
        mo->n_graph_rows = gp->n_rows;
        mo->warm_rows = o->max_num_batched_tokens;
    }
    return 0;
}

int dsv4_service_follow(const dsv4_service_opts *o, dsv4_err *err) {
    dsv4_model_runner_opts mo;
    dsv4_load_opts lo;
    int cache_slots;
    dsv4_kv_dtype kvt;
    graph_plan gp;
    int rc = runner_opts(o, &mo, &lo, &cache_slots, &kvt, &gp, err);
    if (rc) return dsv4_err_prefix(err, "server flag: "), rc;
    return dsv4_multinode_follow(o->multinode, o->model_dir, &mo, &lo, err);
}

int dsv4_service_open(const dsv4_service_opts *o, dsv4_service **out, dsv4_err *err) {
    *out = NULL;
    dsv4_service *s = calloc(1, sizeof *s);
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    snprintf(s->model_name, sizeof s->model_name, "%s", o->model_name);
    s->stop_in_reasoning = o->stop_in_reasoning;
    int rc;
    dsv4_effort_profile profile;
    const char *tok_dir = o->tokenizer_dir ? o->tokenizer_dir : o->model_dir;
    const char *enc_dir = o->encoding_dir ? o->encoding_dir : o->model_dir;
    if ((rc = dsv4_encoder_detect_profile(enc_dir, o->profile_override, &profile, err))) goto fail;
    dsv4_encoder_config_init(&s->enc, profile);
    if (o->default_thinking && (rc = dsv4_effort_parse(o->default_thinking, 1, &s->enc.thinking.default_thinking, err)))
        goto fail_flag;
    if (o->default_reasoning_effort &&
        (rc = dsv4_effort_parse(o->default_reasoning_effort, 0, &s->enc.thinking.default_reasoning_effort, err)))
        goto fail_flag;
    if (o->default_chat_template_kwargs) {
        s->default_kwargs = cJSON_ParseWithOpts(o->default_chat_template_kwargs, NULL, 1); /* no trailing text */
        if (!cJSON_IsObject(s->default_kwargs)) {
            rc = dsv4_err_set(err, DSV4_EINVAL, "--default-chat-template-kwargs must be a JSON object, got '%s'",
                              o->default_chat_template_kwargs);
            goto fail;
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_dir);
    if ((rc = dsv4_tokenizer_load(path, &s->tok, err))) goto fail;
    s->eos_id = dsv4_tokenizer_special_id(s->tok, DSV4_TOK_EOS);
    if (s->eos_id < 0) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: the end-of-sentence token is missing", path);
        goto fail;
    }
    s->vocab_view = dsv4_detok_vocab_from_tokenizer(s->tok);

    int want_mtp = o->spec_method && (!strcmp(o->spec_method, "mtp") || !strcmp(o->spec_method, "deepseek_mtp"));
    if (o->spec_k > 0 && !want_mtp && !(o->spec_method && !strcmp(o->spec_method, "dspark"))) {
        rc = dsv4_err_set(err, DSV4_EUNSUPPORTED,
                          "--speculative-config: method \"%s\" is not supported (use \"dspark\" for DSpark "
                          "checkpoints or \"mtp\" for the original Flash MTP block)",
                          o->spec_method ? o->spec_method : "");
        goto fail;
    }
    int cache_slots;
    dsv4_kv_dtype kvt;
    dsv4_model_runner_opts mo;
    dsv4_load_opts lo;
    graph_plan gp;
    if ((rc = runner_opts(o, &mo, &lo, &cache_slots, &kvt, &gp, err))) goto fail_flag;
    /* not given: the model's maximum (vLLM); the KV pool is bounded by memory on every device */
    s->max_model_len = mo.max_len;
    dsv4_runner mn_run = {0};
    if (o->multinode) { /* node 0 of several: rank 0's slice here, the other nodes follow its step plans */
        if ((rc = dsv4_multinode_open_leader(o->multinode, o->model_dir, &mo, &lo, &s->mr, &mn_run, err))) goto fail;
        s->mn = o->multinode;
    } else if (o->tensor_parallel_size > 1) { /* ranks as threads of this process (src/parallel/tp_runner.h) */
        dsv4_tp_runner_opts to = {.tp_size = o->tensor_parallel_size};
        if ((rc = dsv4_tp_runner_open(o->model_dir, &mo, &lo, &to, &s->tp, err))) goto fail;
    } else if ((rc = dsv4_model_runner_open_ex(o->model_dir, &mo, &lo, &s->mr, err))) {
        goto fail;
    }
    const dsv4_config *cfg = s->tp   ? dsv4_tp_runner_config(s->tp)
                             : s->mr ? dsv4_model_runner_config(s->mr)
                                     : dsv4_multinode_config(s->mn); /* several ranks per node */
    if (s->max_model_len > cfg->max_position_embeddings) {
        if (o->max_model_len > 0)
            rc = dsv4_err_set(err, DSV4_EINVAL, "--max-model-len %lld exceeds the model's max_position_embeddings %lld",
                              (long long)s->max_model_len, (long long)cfg->max_position_embeddings);
        else /* not given (the 8192 default of --nnodes): say so, rather than name a flag the user did not pass */
            rc = dsv4_err_set(err, DSV4_EINVAL,
                              "the default max_model_len %lld exceeds the model's max_position_embeddings %lld; "
                              "give --max-model-len %lld or less",
                              (long long)s->max_model_len, (long long)cfg->max_position_embeddings,
                              (long long)cfg->max_position_embeddings);
        goto fail;
    }
    s->vocab = cfg->vocab_size;
    if (dsv4_tokenizer_vocab_size(s->tok) < s->vocab)
        dsv4_log(DSV4_LOG_WARN, "tokenizer has %d ids, the model %d", dsv4_tokenizer_vocab_size(s->tok), s->vocab);
    else if (dsv4_tokenizer_vocab_size(s->tok) > s->vocab)
        dsv4_log(DSV4_LOG_WARN,
                 "the tokenizer has %d ids but the model's vocab_size is %d: text prompts whose tokens fall outside "
                 "the model's vocabulary are refused (400); token-id prompts below %d work",
                 dsv4_tokenizer_vocab_size(s->tok), s->vocab, s->vocab);
    /* constrained decoding: the vocabulary's byte trie, built once (SERVING.md §4.6) */
    s->think_end = dsv4_tokenizer_special_id(s->tok, DSV4_TOK_END_THINK);
    int32_t dsml = dsv4_tokenizer_special_id(s->tok, DSV4_TOK_DSML);
    if ((rc = dsv4_gvocab_create(s->tok, s->vocab, s->eos_id, &dsml, dsml >= 0, &s->gvocab, err))) goto fail;
    dsv4_runner run = s->mn ? mn_run : s->tp ? dsv4_tp_runner_iface(s->tp) : dsv4_model_runner_iface(s->mr);
    if (o->max_model_len < 0 && run.page_tokens > 0 && (int64_t)run.n_pages * run.page_tokens < s->max_model_len) {
        /* --max-model-len auto: the longest request the memory-capped pool holds (vLLM's auto-fit) */
        dsv4_log(DSV4_LOG_INFO,
                 "--max-model-len auto: the KV pool holds %lld tokens, less than the model's maximum %lld: "
                 "max_model_len %lld",
                 (long long)run.n_pages * run.page_tokens, (long long)s->max_model_len,
                 (long long)run.n_pages * run.page_tokens);
        s->max_model_len = (int64_t)run.n_pages * run.page_tokens;
    }
    if (run.page_tokens > 0 && (int64_t)run.n_pages * run.page_tokens < s->max_model_len) {
        /* vLLM refuses to start when one max_model_len request cannot fit the KV cache */
        rc = dsv4_err_set(err, DSV4_EINVAL,
                          "KV cache: to serve at least one request of max_model_len %lld, the KV cache pool needs "
                          "%lld pages of %d tokens (%.1f MiB), but it holds %d (%lld tokens). Based on the available "
                          "memory, the estimated maximum model length is %lld. Raise --kv-cache-memory-bytes / "
                          "--num-gpu-blocks-override (or the memory that bounds the pool), lower --max-model-len to "
                          "at most %lld, or give --max-model-len auto.",
                          (long long)s->max_model_len,
                          (long long)((s->max_model_len + run.page_tokens - 1) / run.page_tokens), run.page_tokens,
                          (double)run.page_bytes * (double)((s->max_model_len + run.page_tokens - 1) / run.page_tokens) /
                              1048576.0,
                          run.n_pages, (long long)run.n_pages * run.page_tokens,
                          (long long)run.n_pages * run.page_tokens, (long long)run.n_pages * run.page_tokens);
        goto fail;
    }
    dsv4_drafter dr;
    int has_drafter =
        o->spec_k > 0 && (s->tp   ? dsv4_tp_runner_drafter(s->tp, &dr)
                          : s->mr ? dsv4_model_runner_drafter(s->mr, &dr)
                                  : dsv4_multinode_drafter(s->mn, &dr));
    dsv4_draft_kind want = want_mtp ? DSV4_DRAFT_MTP : DSV4_DRAFT_DSPARK;
    if (o->spec_k > 0 && (!has_drafter || cfg->draft_kind != want)) {
        rc = dsv4_err_set(err, DSV4_EINVAL,
                          "--speculative-config method %s: %s has no %s; drop --speculative-config to serve "
                          "without speculation",
                          o->spec_method, o->model_dir,
                          want_mtp ? "MTP block (mtp.0 with e_proj/h_proj)"
                                   : "DSpark draft stages (mtp.0..S-1 with main_proj)");
        goto fail;
    }
    if (run.warmup && gp.warm && (rc = graphs_at_start(&run, &gp, err))) goto fail;
    dsv4_engine_opts eo = {o->max_num_seqs, o->max_num_batched_tokens, s->max_model_len, o->spec_k, s->eos_id,
                           {{0}}, o->n_k_schedule, o->enable_prefix_caching};
    memcpy(eo.k_schedule, o->k_schedule, sizeof eo.k_schedule);
    if ((rc = dsv4_engine_create(&eo, &run, has_drafter ? &dr : NULL, &s->engine, err))) {
        dsv4_err_prefix(err, "--speculative-config: ");
        goto fail;
    }
    if ((rc = dsv4_engine_start(s->engine, err))) goto fail;
    s->metrics = dsv4_metrics_create(s->model_name, o->spec_k);
    if (!s->metrics) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail;
    }
    dsv4_metrics_set_cache_config(s->metrics, o->kv_cache_dtype ? o->kv_cache_dtype : "auto", o->enable_prefix_caching);
    dsv4_log(DSV4_LOG_INFO,
             "model %s: %s, %d layers, vocab %d, profile %s; %s backend, tensor parallel %d; max_model_len %lld, "
             "max_num_seqs %d (%d request slots; KV pool %d pages of %d, kv dtype %s); speculation %s k=%d; "
             "prefix caching %s",
             o->model_dir, dsv4_config_kind_name(cfg), cfg->num_hidden_layers, cfg->vocab_size,
             dsv4_profile_name(profile),
             s->mr   ? dsv4_model_runner_backend(s->mr)->name
             : s->tp ? (dsv4_tp_runner_backend(s->tp, 0) ? dsv4_tp_runner_backend(s->tp, 0)->name : "cpu")
                     : (dsv4_multinode_backend(s->mn) ? dsv4_multinode_backend(s->mn)->name : "cpu"),
             o->tensor_parallel_size > 1 ? o->tensor_parallel_size : 1,
             (long long)s->max_model_len, o->max_num_seqs, o->max_num_seqs + cache_slots,
             run.n_pages, run.page_tokens, dsv4_kv_dtype_name(kvt), o->spec_k ? "dspark" : "off", o->spec_k,
             o->enable_prefix_caching ? "on" : "off");
    if ((rc = warm_up(s, err))) goto fail;
    dsv4_engine_get_stats(s->engine, &s->warm_base);
    *out = s;
    return DSV4_OK;
fail_flag:
    dsv4_err_prefix(err, "server flag: ");
fail:
    if (s->mn) /* the followers must not take this for a clean stop (dsv4_service_free sends quit) */
        dsv4_multinode_comm(s->mn)->abort(dsv4_multinode_comm(s->mn));
    dsv4_service_free(s);
    return rc;
}

void dsv4_service_free(dsv4_service *s) {
    if (!s) return;
    dsv4_engine_free(s->engine);
    dsv4_multinode_stop(s->mn); /* followers quit (their runners go first: they use ours' plans) */
    dsv4_model_runner_free(s->mr);
    dsv4_gvocab_free(s->gvocab);
    dsv4_tp_runner_free(s->tp);
    dsv4_tokenizer_free(s->tok);
    dsv4_metrics_free(s->metrics);
    cJSON_Delete(s->default_kwargs);
    free(s);
}

int64_t dsv4_service_max_model_len(const dsv4_service *s) { return s->max_model_len; }

const char *dsv4_service_profile_name(const dsv4_service *s) {
    return dsv4_profile_name(s->enc.thinking.profile);
}

char *dsv4_service_metrics(dsv4_service *s) {
    dsv4_engine_stats st;
    dsv4_engine_get_stats(s->engine, &st);
    /* counters since warm-up ended (gauges running/waiting/pages are live values) */
    dsv4_engine_stats_diff(&st, &s->warm_base, &st);
    return dsv4_metrics_render(s->metrics, &st);
}
