/*
 * `dsv4 serve` flags, with vLLM's names (DESIGN.md "Flags use vLLM's names";
 * spec/SERVING.md §0.2-0.3) so a launcher's `vllm serve ...` line works with
 * `dsv4 serve ...`. Flags whose behaviour dsv4 always has (chunked prefill,
 * the deepseek_v4 parsers, ...) are accepted and reported as ignored.
 */
#ifndef DSV4_SERVE_ARGS_H
#define DSV4_SERVE_ARGS_H

#include <stdint.h>

#include "dsv4/common.h"
#include "server/server.h"

typedef struct dsv4_serve_args {
    const char *model_dir;            /* positional or --model; NULL = embedded default */
    dsv4_server_opts http;            /* host, port, keys, served names, max_model_len */
    int max_num_seqs;                 /* --max-num-seqs, default 256 */
    int max_num_batched_tokens;       /* --max-num-batched-tokens, default 8192 */
    double gpu_memory_utilization;    /* --gpu-memory-utilization, default 0.9 */
    const char *kv_cache_dtype;       /* --kv-cache-dtype: auto | f32 | bf16 | fp8_ds_mla (kvcodec.h names) */
    int block_size;                   /* --block-size: tokens per state-pool page (default 256) */
    int num_gpu_blocks_override;      /* --num-gpu-blocks-override: pages in the pool (0 = sized) */
    int64_t kv_cache_memory_bytes;    /* --kv-cache-memory-bytes: pool budget (0 = default sizing) */
    int tensor_parallel_size;         /* --tensor-parallel-size / -tp, default 1 */
    const char *device;               /* --device: auto | cpu | cuda (default auto) */
    const char *speculative_config;   /* --speculative-config JSON (validated by the engine) */
    const char *load_format;          /* --load-format: auto | safetensors | dummy */
    const char *hf_overrides;         /* --hf-overrides JSON object merged over config.json */
    int enable_prefix_caching;        /* default on; --no-enable-prefix-caching turns it off */
    int enforce_eager;                /* --enforce-eager: no CUDA graphs (default: graphs on CUDA) */
    /* CUDA graphs captured at start (issue 7), vLLM's knobs: --cuda-graph-sizes N [N ...] or
     * --compilation-config / -O '{"cudagraph_capture_sizes": [...], "max_cudagraph_capture_size": N,
     * "cudagraph_mode": "..."}' (also -O.KEY=VALUE). Sizes count sequences (src/engine/graph_sizes.h). */
    int graph_sizes[96];
    int n_graph_sizes;                /* 0 = vLLM's default pattern */
    int max_graph_size;               /* max_cudagraph_capture_size, 0 = default */
    int cudagraph_mode_none;          /* cudagraph_mode "NONE": eager, as --enforce-eager */
    int cudagraph_mode_graphs;        /* a cudagraph_mode other than NONE was given (warned about under --enforce-eager) */
    const char *default_chat_template_kwargs; /* JSON object */
    const char *reasoning_effort_profile;     /* auto | preview | 0731 */
    const char *default_thinking;     /* off | low | high | max */
    const char *default_reasoning_effort; /* default "high" */
    const char *stop_in_reasoning;    /* dormant | active */
    int nnodes, node_rank, master_port;
    const char *master_addr;
    int max_model_len_given;          /* --max-model-len was on the command line */
    int max_model_len_auto;           /* --max-model-len auto (or -1): fit to the KV pool (http.max_model_len unset) */
    int help_shown;                   /* --help was printed: exit 0 without serving */
    int n_ignored;                    /* vLLM flags accepted without effect */
    const char *ignored[32];
} dsv4_serve_args;

/*
 * dsv4_serve_args_parse — parse argv (argv[0] = "serve") into a.
 * Both `--flag value` and `--flag=value`; `--served-model-name` and `--api-key`
 * take one or more values. Keys may also come from $DSV4_API_KEYS (comma
 * separated) or `--api-key-file PATH` (one per line). Returns 0 (a->help_shown set
 * when --help was printed), or DSV4_EINVAL with a message naming the flag (unknown flag,
 * missing value, value out of range). Strings point into argv or static data,
 * except keys read from a file/env (kept until process exit).
 */
int dsv4_serve_args_parse(int argc, char **argv, dsv4_serve_args *a, dsv4_err *err);

#endif
