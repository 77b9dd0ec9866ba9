/*
 * The generation service behind the HTTP routes: it owns the tokenizer, the
 * encoder settings, the model and the engine, and turns an OpenAI request
 * into an engine request and the engine's tokens into an OpenAI response or
 * SSE stream (spec/SERVING.md §1-§6).
 *
 * Per request (DESIGN.md "Data flow"): validate fields (400 naming the field)
 * -> resolve thinking once -> render + tokenize -> context check -> submit
 * with the output parser as the engine's token hook (stop strings cut the
 * engine's run at the right token) -> deltas to the client.
 */
#ifndef DSV4_SERVER_SERVICE_H
#define DSV4_SERVER_SERVICE_H

#include <cjson/cJSON.h>

#include "server/metrics.h"
#include "server/server.h"
#include "text/encoder.h"

typedef struct dsv4_service dsv4_service;

typedef struct dsv4_service_opts {
    const char *model_dir;
    const char *model_name;      /* canonical served name, used in responses */
    int max_num_seqs;
    int max_num_batched_tokens;
    int64_t max_model_len;       /* tokens; 0: the model's max_position_embeddings (vLLM's default; refused
                                  * when the memory-capped KV pool cannot hold one such request); -1
                                  * (--max-model-len auto): that, lowered to what the pool holds; with
                                  * multinode (pools sized per slot) both mean min(8192, that) */
    /* --speculative-config (vLLM keys): method "dspark" (k = num_speculative_tokens,
     * 0 = speculation off) and num_speculative_tokens_per_batch_size entries. */
    const char *spec_method;
    int spec_k;
    int k_schedule[8][3];
    int n_k_schedule;
    dsv4_effort_profile profile_override; /* AUTO = from encoding/encoding_dsv4.py */
    const char *default_thinking;          /* off | low | high | max */
    const char *default_reasoning_effort;  /* low | high | max */
    int stop_in_reasoning;       /* --stop-in-reasoning active */
    const char *default_chat_template_kwargs; /* JSON object text or NULL */
    int enable_prefix_caching;   /* --enable-prefix-caching (spec/SERVING.md §8.7) */
    int device;                  /* dsv4_device (engine/model_runner.h); 0 = CPU */
    int cuda_graphs;             /* model_runner_opts.cuda_graphs (--enforce-eager: 0) */
    /* CUDA graphs captured at start (issue 7; src/engine/graph_sizes.h): the explicit sizes
     * (cudagraph_capture_sizes, NULL/0 = vLLM's default pattern) and max_cudagraph_capture_size
     * (0 = default), resolved against max_num_seqs */
    const int *graph_sizes;
    int n_graph_sizes;
    int max_graph_size;
    int draft_sampled;           /* --speculative-config draft_sample_method "probabilistic" */
    /* Weights source (engine/model_runner.h dsv4_load_opts): --load-format dummy,
     * --hf-overrides; and where tokenizer.json / encoding/ are read (NULL = model_dir;
     * a dummy model dir may hold only config.json). */
    int load_dummy;
    const char *hf_overrides;
    const char *tokenizer_dir;
    const char *encoding_dir;
    /* state pool (issue 5): --block-size (0 = 256), --num-gpu-blocks-override,
     * --kv-cache-memory-bytes (0 = unset), --kv-cache-dtype (NULL = auto) */
    int block_size;
    int num_gpu_blocks_override;
    int64_t kv_cache_memory_bytes;
    double gpu_memory_utilization; /* --gpu-memory-utilization (0 = off): caps the pool on a GPU */
    const char *kv_cache_dtype;
    int tensor_parallel_size;    /* --tensor-parallel-size; > 1: ranks as threads (src/parallel/tp_runner.h) */
    /* --nnodes > 1: this node's group (src/parallel/multinode.h, joined by the caller, who frees it after
     * dsv4_service_free); NULL = one node */
    struct dsv4_multinode *multinode;
} dsv4_service_opts;

/*
 * dsv4_service_open — load the checkpoint and tokenizer, start the engine
 * thread and warm it up (one short generation) so the first request runs at
 * full speed (SERVING.md §8.5). Errors name the file, tensor or flag at fault.
 */
int dsv4_service_open(const dsv4_service_opts *o, dsv4_service **out, dsv4_err *err);
void dsv4_service_free(dsv4_service *s);

/*
 * dsv4_service_follow — nodes 1..N-1 of a multi-node launch (o->multinode
 * set): open this node's rank with the model runner options o gives (the same
 * as node 0's service, so the KV pools match) and run node 0's step plans
 * until node 0 quits (0). No tokenizer, engine or HTTP here. Errors: a bad
 * flag ("server flag: "), dsv4_multinode_follow's.
 */
int dsv4_service_follow(const dsv4_service_opts *o, dsv4_err *err);

/* The effective max_model_len in tokens (the given one; else the model's maximum, or with
 * --max-model-len auto what the KV pool holds), for /v1/models. */
int64_t dsv4_service_max_model_len(const dsv4_service *s);

/* The reasoning-effort profile in use ("preview" or "0731", SERVING.md §1.10), for /version. */
const char *dsv4_service_profile_name(const dsv4_service *s);

/* Route ids the router hands over. */
typedef enum { DSV4_SVC_CHAT, DSV4_SVC_COMPLETIONS, DSV4_SVC_TOKENIZE, DSV4_SVC_DETOKENIZE } dsv4_svc_route;

/*
 * dsv4_service_handle — answer a validated request body (a JSON object;
 * raw/len its exact text). Fills *out with a JSON reply, an error reply, or a
 * streaming reply (stream.read set). Never fails.
 */
void dsv4_service_handle(dsv4_service *s, dsv4_svc_route route, const cJSON *req, const char *raw, size_t len,
                         dsv4_reply *out);

/* Prometheus text for /metrics (malloc'd), or NULL on allocation failure. */
char *dsv4_service_metrics(dsv4_service *s);

#endif
