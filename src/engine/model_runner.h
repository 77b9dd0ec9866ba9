/*
 * A checkpoint made runnable: checkpoint -> config -> bound weights -> backend
 * -> target model + per-slot state, exposed as the engine's dsv4_runner
 * (src/engine/runner.h). The one place that knows the loading order, so the
 * CLI (`dsv4 run`, `dsv4 serve`) and tests open a model the same way.
 */
#ifndef DSV4_ENGINE_MODEL_RUNNER_H
#define DSV4_ENGINE_MODEL_RUNNER_H

#include "backend/backend.h"
#include "engine/runner.h"
#include "model/config.h"

typedef struct dsv4_model_runner dsv4_model_runner;
struct dsv4_comm; /* src/parallel/comm.h */

/* Where the model runs (`--device`): CPU reference backend, the CUDA backend
 * on GPU 0, or AUTO = CUDA when the build has it and a GPU answers, else CPU.
 * CPU is 0 so a zero-initialised opts keeps the reference backend. */
typedef enum dsv4_device { DSV4_DEVICE_CPU = 0, DSV4_DEVICE_AUTO = 1, DSV4_DEVICE_CUDA = 2 } dsv4_device;

/* dsv4_device_parse — "auto" | "cpu" | "cuda" (also "cuda:0") -> *out; DSV4_EINVAL naming the value. */
int dsv4_device_parse(const char *s, dsv4_device *out, dsv4_err *err);

/* dsv4_device_is_gpu — 1 when `--device d` will run on a GPU: CUDA, or AUTO in a
 * CUDA build where a GPU answers (cudaGetDeviceCount > 0); else 0. What picks the
 * KV rows of `--kv-cache-dtype auto` (fp8_ds_mla on the GPU, f32 on the CPU;
 * kvcodec.h): a CUDA build on a machine without a usable GPU falls back to the
 * CPU backend and must not get the GPU's default rows. No error cases. */
int dsv4_device_is_gpu(dsv4_device d);

typedef struct dsv4_model_runner_opts {
    int n_slots;            /* concurrent requests (state is allocated per slot) */
    int max_len;            /* positions per request (prompt + output) */
    int max_spec;           /* speculative rows per request per step that may be rejected (k), 0 = none;
                             * > 0 on a DSpark checkpoint also loads the drafter */
    dsv4_numerics numerics; /* DSV4_NUMERICS_REFERENCE for serving */
    dsv4_device device;     /* backend choice (0 = CPU) */
    int device_index;       /* CUDA: the GPU ordinal (0 = the first visible GPU; the TP runner gives
                             * rank r GPU r) */
    int draft_sampled;      /* 1: DSpark drafts are sampled from softmax(z/T) for requests with
                             * temperature > 0 (vLLM draft_sample_method "probabilistic",
                             * spec/DSPARK.md §4.3); 0: argmax drafts ("greedy") */
    /* State pool (issue 5): pages of block_size positions (0 = 256, vLLM's
     * block size here; a multiple of every compress ratio). Pool size, first
     * that applies: n_pages > 0 (--num-gpu-blocks-override); kv_cache_bytes > 0
     * (--kv-cache-memory-bytes: floor(bytes / page bytes) pages); on host memory
     * (the CPU backend) the environment's VLLM_CPU_KVCACHE_SPACE, whole GiB, read
     * as kv_cache_bytes (src/util/hostmem.h; vLLM's CPU KV cache size; a bad value
     * is DSV4_EINVAL naming it); else every slot at max_len
     * (n_slots * ceil(max_len / block_size)), capped by gpu_mem_util below.
     * On the CPU, an explicit size above the host memory available, or an
     * environment size that holds no max_len request (unless fit_len), is
     * DSV4_ENOMEM with a message naming the setting to change. n_pages < 0:
     * no pool, per-slot state as before (for tests comparing the two). */
    int block_size;
    int n_pages;
    int64_t kv_cache_bytes;
    /* gpu_mem_util in (0, 1] (--gpu-memory-utilization; 0 = off): with neither n_pages
     * nor kv_cache_bytes (nor, on the CPU, VLLM_CPU_KVCACHE_SPACE) given, the pool is also
     * capped at what fits in memory: on a backend with mem_info (a GPU) gpu_mem_util of the
     * device after the weights, less an activation reserve (dsv4_pool_pages_for_memory;
     * DSV4_ACT_RESERVE_MB, default 4096); on host memory (the CPU) gpu_mem_util of the host
     * memory available after the weights, less the checkpoint's mapped bytes, divided among
     * the tensor-parallel ranks of the process (dsv4_hostmem_kv_budget); both less the
     * state's per-slot rings (dsv4_state_fixed_bytes, allocated with the pool): a long
     * max_len no longer asks for n_slots full-length requests' worth of pages. When that
     * cap holds fewer pages than one max_len request (ceil(max_len / block_size)), open
     * fails with DSV4_ENOMEM (vLLM's "to serve at least one request ...", with the
     * estimated maximum model length) unless fit_len. */
    double gpu_mem_util;
    /* host_ranks: the ranks of this process that share its host memory (0 = the tp_size
     * given to open). Without gpu_mem_util (several nodes, dsv4 run / perf) the CPU pool is
     * sized per slot, unbounded; one larger than the host memory available for host_ranks
     * such pools is DSV4_ENOMEM naming VLLM_CPU_KVCACHE_SPACE (before: it started, touched
     * lazily, and the OOM killer found it out under load). */
    int host_ranks;
    /* fit_len (--max-model-len auto): a memory-capped pool smaller than one max_len
     * request is kept (at least one page) instead of refused; the caller then serves
     * requests of at most the pool's tokens (vLLM's auto-fit of max_model_len). */
    int fit_len;
    int kv_dtype;           /* dsv4_kv_dtype (src/model/kvcodec.h): storage of window and
                             * compressed rows; 0 = F32. The CLIs resolve --kv-cache-dtype auto
                             * by device (dsv4_kv_dtype_parse_for: fp8_ds_mla on the GPU, F32 on
                             * the CPU) */
    int cuda_graphs;        /* 1: target forwards of up to 512 rows replay CUDA graphs captured per
                             * batch shape (src/model/forward_graph.c; --cuda-graphs); 0: eager
                             * (0 here; the CLIs default to 1, --enforce-eager gives 0: bit-identical
                             * logits either way, bench/results/2026-11-30-cuda-graphs-h200.md);
                             * 2: eager with the graphs' shape-static launch sizes (backend.h
                             * static_shapes), to compare replay with eager at equal numerics */
    /* Capture at start (issue 7; vLLM cudagraph_capture_sizes). With cuda_graphs 1 or 2 and
     * n_graph_sizes > 0: one more state slot (and one more pool page) is reserved for
     * padding rows, decode / verify batches are padded up to the next of graph_sizes
     * (sequence counts, ascending, <= DSV4_MAX_GRAPH_SIZES of them; src/model/forward_pad.c)
     * and only shapes captured by dsv4_model_runner_warmup are replayed (no capture at
     * request time). graph_rows: rows per sequence to capture (1 = decode, k+1 = verify),
     * graph_rows_max_seqs[i]: the largest size captured for graph_rows[i] (0 = all).
     * warm_rows: the most rows a step may have (max_num_batched_tokens): the warm-up
     * sizes the backend's batch mirror for it so later steps never move it.
     * warm_eager = 1 and no graphs (cuda_graphs 0, or a backend without graph ops):
     * the same shapes are still run once each by dsv4_model_runner_warmup, eagerly,
     * on a reserved padding slot, and nothing is padded afterwards. Why: without it
     * --enforce-eager had no warm-up at all, so every first step of a row bucket paid
     * the GPU's first-use costs (lazy kernel loading, GEMM algorithm choice: 15-20 ms
     * a bucket, bench/results/2026-12-01-warmup-prefill-h200.md) inside a request. */
    const int *graph_sizes;
    int n_graph_sizes;
    const int *graph_rows;
    const int *graph_rows_max_seqs;
    int n_graph_rows;
    int warm_rows;
    int warm_eager;
} dsv4_model_runner_opts;

/* Where the weights come from: vLLM's --load-format and --hf-overrides. */
typedef struct dsv4_load_opts {
    int dummy;                /* --load-format dummy: config.json only, random weights made in
                               * backend memory (src/model/dummy.h); no safetensors file is read */
    const char *hf_overrides; /* --hf-overrides: JSON object merged over config.json, or NULL
                               * (dsv4_config_load_ex) */
    uint64_t seed;            /* dummy weights' seed */
} dsv4_load_opts;

/*
 * dsv4_model_runner_open — open the checkpoint directory dir on the backend
 * o->device selects: weights are uploaded through the backend, the state and
 * the drafter (DSpark / MTP) live on it too; logits come back to the host, or
 * only each row's greedy id (runner forward_ids, when the backend has
 * logit_top and the runner is not tensor-parallel).
 * DSV4_DEVICE_AUTO falls back to the CPU backend (with a log line saying
 * why) when the build has no CUDA or no GPU answers; DSV4_DEVICE_CUDA fails
 * instead (DSV4_EUNSUPPORTED without CUDA in the build, DSV4_EBACKEND when
 * no device). Other errors are the loader's (file/tensor named: missing
 * shard, unknown tensor, wrong dtype, ...), the KV pool's sizing refusals
 * (opts: a bad VLLM_CPU_KVCACHE_SPACE, DSV4_EINVAL; a memory bound that holds
 * no max_len request, DSV4_ENOMEM) or allocation failures, prefixed with dir.
 */
int dsv4_model_runner_open(const char *dir, const dsv4_model_runner_opts *o, dsv4_model_runner **out,
                           dsv4_err *err);
/*
 * dsv4_warmup_prefill_rows — row counts of the start-up warm-up's eager prefill
 * steps (dsv4_model_runner_warmup; bench/results/2026-12-01-warmup-prefill-h200.md).
 * max_rows: the largest step (max_num_batched_tokens, cut to the context), >= 1
 * (< 1: none). spec: env DSV4_WARMUP_PREFILL — NULL, "" or "1": max_rows, then each
 * power of two from 128 below it, descending (the GEMMs' row buckets); "0": none;
 * else a comma list of row counts, each cut to max_rows. rows: room for
 * DSV4_WARMUP_PREFILL_MAX; *n = how many. Errors: DSV4_EINVAL naming the
 * variable for anything else (a non-number, a count < 1, a trailing comma, more
 * than DSV4_WARMUP_PREFILL_MAX entries); *n = 0 then.
 */
#define DSV4_WARMUP_PREFILL_MAX 32
int dsv4_warmup_prefill_rows(int max_rows, const char *spec, int *rows, int *n, dsv4_err *err);

/*
 * dsv4_pool_pages_for_memory — KV pool pages of page_bytes that fit a device's
 * budget, as vLLM's --gpu-memory-utilization: util * total_bytes, less what is in
 * use now (total_bytes - free_bytes: the weights and everything allocated so
 * far), less reserve_bytes (activations and workspaces of the largest step).
 * Bytes; util in (0, 1]. Returns the page count (0 when nothing fits) or -1 for
 * bad arguments (page_bytes <= 0, util outside (0, 1], free > total or negative).
 */
int64_t dsv4_pool_pages_for_memory(int64_t free_bytes, int64_t total_bytes, double util, int64_t reserve_bytes,
                                   int64_t page_bytes);

/*
 * dsv4_model_runner_open_ex — the same with load options (lo NULL = a real
 * checkpoint, no overrides). With lo->dummy, dir needs only config.json;
 * once the model (and drafter) are resident it logs "dummy weights: N
 * tensors, X GB in backend memory, Y s". Errors additionally: the
 * --hf-overrides refusals of dsv4_config_load_ex; with dummy weights, a
 * backend without fill_dummy (DSV4_EUNSUPPORTED).
 */
int dsv4_model_runner_open_ex(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                              dsv4_model_runner **out, dsv4_err *err);
/*
 * dsv4_model_runner_open_tp — open_ex for one tensor-parallel rank (the TP
 * runner, src/parallel/tp_runner.h, opens one per rank): the target model is
 * rank tp_rank's slice of tp_size (src/parallel/tp_shard.h), its blocks
 * all-reduce and its LM head all-gathers through comm, and only rank 0 loads
 * the drafter (replicated, not sharded). tp_size 1 with comm NULL is open_ex.
 * Dummy weights are sliced by tag (tp_shard.h dsv4_tp_shard_create_ex): each
 * rank fills exactly its part of the unsharded dummy model in its backend.
 * With a capturable communicator (NCCL) on a backend with a stream, decode /
 * verify forwards replay CUDA graphs that contain the collectives.
 * Errors: as open_ex; dsv4_tp_check's refusal of a size that does not divide
 * the model.
 */
int dsv4_model_runner_open_tp(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                              int tp_rank, int tp_size, struct dsv4_comm *comm, dsv4_model_runner **out,
                              dsv4_err *err);
void dsv4_model_runner_free(dsv4_model_runner *mr);

/*
 * dsv4_model_runner_warmup — capture the decode / verify graphs of the
 * options' graph_sizes x graph_rows (issue 7): for each shape, a batch made
 * only of padding sequences (the reserved slot) runs through the runner's
 * own forward (so the graph has exactly the outputs serving asks for: logits,
 * and greedy ids when the runner offers forward_ids; DSpark taps or MTP
 * streams), once to warm and once to capture. Sizes the batch mirror for
 * opts.warm_rows first. *n_graphs = graphs held afterwards. Then, eagerly,
 * prefill-sized steps on the padding slot against the first long prompt's
 * first-use costs (bench/results/2026-12-01-warmup-prefill-h200.md): by
 * default warm_rows rows (cut to the context) and each power of two from 128
 * below it (the GEMMs' row buckets, backend/cuda cu_lt_algo);
 * env DSV4_WARMUP_PREFILL=0 skips them, a comma list of row counts ("8192,512")
 * replaces them. A no-op (n_graphs 0) without capture sizes; with cuda_graphs
 * 2 (no graphs) or opts.warm_eager the forwards still run, uncaptured.
 * dsv4_model_runner_warm_steps() tells how many ran. Errors: DSV4_EINVAL for a
 * malformed DSV4_WARMUP_PREFILL (named in the message); the forward's (a
 * failed capture is not an error: that shape runs eagerly, logged).
 */
int dsv4_model_runner_warmup(dsv4_model_runner *mr, int *n_graphs, dsv4_err *err);

/* The engine interface over this model (valid while mr lives). */
dsv4_runner dsv4_model_runner_iface(dsv4_model_runner *mr);
/*
 * dsv4_model_runner_drafter — the drafter over this model when the runner was
 * opened with max_spec > 0: the DSpark stages (spec/DSPARK.md §2, k up to
 * dspark_block_size) or the original Flash MTP block (spec/MODEL.md §3.9,
 * k = 1). Fills *out and returns 1; returns 0 for a checkpoint without
 * either. Valid while mr lives.
 */
int dsv4_model_runner_drafter(dsv4_model_runner *mr, dsv4_drafter *out);

/* The backend the runner built ("cpu", "cuda:0"), and the model / state on it
 * (for tools that drive the forward directly, e.g. `dsv4 perf`). */
dsv4_backend *dsv4_model_runner_backend(dsv4_model_runner *mr);
/* The target model and its per-slot state (src/model/forward.h), for tools
 * that time the bare target forward without the drafter's bookkeeping. */
struct dsv4_model;
struct dsv4_state;
void dsv4_model_runner_target(dsv4_model_runner *mr, struct dsv4_model **model, struct dsv4_state **state);

/* The parsed config (kind, vocab, eos, draft stages) — the whole model's, also under TP. */
const dsv4_config *dsv4_model_runner_config(const dsv4_model_runner *mr);
/* Forwards the last dsv4_model_runner_warmup ran (graph shapes x variants x reps, plus the
 * prefill-sized steps); 0 before any or when it had nothing to warm. */
int dsv4_model_runner_warm_steps(const dsv4_model_runner *mr);

#endif
