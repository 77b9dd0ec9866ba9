/* Checkpoint -> engine runner (src/engine/model_runner.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>
#include <time.h>

#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/dspark.h"
#include "model/dummy.h"
#include "model/mtp.h"
#include "model/forward.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "parallel/tp_shard.h"
#include "util/hostmem.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* rows from which a DSpark target forward keeps the draft context features on the backend (see open) */
#define DSV4_DEV_FEATS_MIN_ROWS 512

struct dsv4_model_runner {
    dsv4_config cfg;
    dsv4_ckpt *ckpt;
    dsv4_dummy *dummy;     /* --load-format dummy: the weights' source (ckpt is NULL) */
    dsv4_weights *w;
    dsv4_backend *be;
    dsv4_model *model;
    dsv4_tp_shard *shard;  /* tensor parallel: this rank's slice of w (model runs on it), else NULL */
    dsv4_model draft_target; /* tensor parallel: the model with the whole-vocabulary head, for the drafter */
    dsv4_state *state;
    /* DSpark drafter (spec/DSPARK.md §2), when the checkpoint has stages and
     * speculation was asked for. The last forward's context features stay
     * here until the engine says which of its rows were committed. */
    dsv4_dspark *dspark;
    float *feats;          /* [hfeat_cap rows][n_tap*d] of the last forward, when on the host */
    dsv4_buf dfeats;       /* the same in backend memory (rows = capacity), [n_tap*d] F32, for
                            * forwards of at least dev_feats rows: written by the forward
                            * (taps_dev), read by the context path, never through the host */
    int dev_feats;         /* rows from which a forward keeps them in dfeats (0: never; set at open) */
    int feat_dev;          /* where the last forward's are: 1 dfeats, 0 feats */
    int32_t *feat_slot, *feat_pos;
    int feat_rows, feat_cap, hfeat_cap;
    int64_t *ingested;     /* [n_slots] context positions already in the rings */
    /* MTP drafter (original Flash, spec/MODEL.md §3.9): row i pairs the
     * target's final streams H_i with token i+1 and predicts token i+2. The
     * last forward's streams and tokens are kept per row; the streams of each
     * slot's last committed position are kept across steps, because its
     * partner token is only known once the next token is emitted. */
    dsv4_mtp *mtp;
    float *streams;        /* [feat_cap][hc*d] of the last forward */
    int32_t *feat_tok;     /* [feat_cap] tokens of the last forward */
    float *last_h;         /* [n_slots][hc*d]: H of position mtp_next[slot] */
    int64_t *mtp_next;     /* [n_slots]: next MTP position to run (its H is last_h) */
    /* Prefix caching (spec/SERVING.md §8.7): the highest target position + 1
     * each slot's rings were written at, committed or not (rejected
     * speculative rows included) — what decides which ring rows still hold
     * which positions. */
    int64_t *hw;           /* [n_slots] */
    int draft_sampled;     /* opts.draft_sampled */
    int64_t page_bytes;    /* bytes of one state page (pool sizing, metrics) */
    /* Capture at start (issue 7): n_slots / n_pages are what the engine sees; with
     * capture sizes the state holds one more slot (model->pad_slot = n_slots) and
     * the pool one more page (mapped to that slot) for padding rows. */
    int n_slots, pad;
    int g_rows[16], g_rows_max[16], n_g_rows, warm_rows;
    /* the warm-up's decode / verify shapes: the capture sizes (= model->pad_sizes), or with
     * opts.warm_eager and no graphs the same list run eagerly, nothing padded */
    int warm_sizes[DSV4_MAX_GRAPH_SIZES], n_warm_sizes;
    int warm_steps; /* forwards the last warm-up ran (diagnostics, tests) */
};

void dsv4_model_runner_free(dsv4_model_runner *mr) {
    if (!mr) return;
    dsv4_dspark_free(mr->dspark);
    if (mr->be) mr->be->buf_free(mr->be, &mr->dfeats);
    free(mr->feats);
    free(mr->feat_slot);
    free(mr->feat_pos);
    free(mr->ingested);
    dsv4_mtp_free(mr->mtp);
    free(mr->streams);
    free(mr->feat_tok);
    free(mr->last_h);
    free(mr->mtp_next);
    free(mr->hw);
    dsv4_state_free(mr->state);
    dsv4_model_free(mr->model);
    dsv4_tp_shard_free(mr->shard);
    if (mr->be) mr->be->free(mr->be);
    dsv4_weights_free(mr->w);
    dsv4_ckpt_free(mr->ckpt);
    dsv4_dummy_free(mr->dummy);
    free(mr);
}

int dsv4_device_parse(const char *s, dsv4_device *out, dsv4_err *err) {
    if (s && !strcmp(s, "auto")) *out = DSV4_DEVICE_AUTO;
    else if (s && !strcmp(s, "cpu")) *out = DSV4_DEVICE_CPU;
    else if (s && (!strcmp(s, "cuda") || !strcmp(s, "cuda:0") || !strcmp(s, "gpu"))) *out = DSV4_DEVICE_CUDA;
    else return dsv4_err_set(err, DSV4_EINVAL, "--device: '%s' (expected auto, cpu or cuda)", s ? s : "");
    return DSV4_OK;
}

int dsv4_device_is_gpu(dsv4_device d) {
    if (d == DSV4_DEVICE_CUDA) return 1;
#ifdef DSV4_HAVE_CUDA
    if (d == DSV4_DEVICE_AUTO) return dsv4_cuda_device_count(NULL) > 0;
#endif
    return 0;
}

/*
 * The backend for o->device. AUTO tries CUDA first and says in the log which
 * one it took and why, so a server started without --device on a GPU-less
 * box is not silently 1000x slower than expected.
 */
static dsv4_backend *open_backend(const dsv4_model_runner_opts *o, dsv4_err *err) {
    if (o->device == DSV4_DEVICE_CPU) return dsv4_backend_cpu_create(o->numerics, err);
#ifdef DSV4_HAVE_CUDA
    dsv4_err ce = {0};
    dsv4_backend *be = dsv4_backend_cuda_create(o->numerics, o->device_index, &ce);
    if (be) {
        dsv4_log(DSV4_LOG_INFO, "device: %s (CUDA backend%s)", be->name,
                 o->device == DSV4_DEVICE_AUTO ? ", --device auto" : "");
        return be;
    }
    if (o->device == DSV4_DEVICE_CUDA) {
        dsv4_err_set(err, ce.code ? ce.code : DSV4_EBACKEND, "--device cuda: %s", ce.msg);
        return NULL;
    }
    dsv4_log(DSV4_LOG_INFO, "device: cpu (--device auto: no usable GPU: %s)", ce.msg);
#else
    if (o->device == DSV4_DEVICE_CUDA) {
        dsv4_err_set(err, DSV4_EUNSUPPORTED, "--device cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
        return NULL;
    }
    dsv4_log(DSV4_LOG_INFO, "device: cpu (--device auto: this build has no CUDA backend)");
#endif
    return dsv4_backend_cpu_create(o->numerics, err);
}

/* Config (with overrides), checkpoint or dummy source, draft stages, bound weights. */
static int open_weights(dsv4_model_runner *mr, const char *dir, const dsv4_load_opts *lo, dsv4_err *err) {
    const char *ov = lo ? lo->hf_overrides : NULL;
    int rc = dsv4_config_load_ex(dir, ov, &mr->cfg, err);
    if (rc) return rc;
    if (lo && lo->dummy) {
        if ((rc = dsv4_dummy_create(&mr->cfg, lo->seed, &mr->dummy, err))) return rc;
        return dsv4_weights_bind(&mr->cfg, dsv4_dummy_ckpt(mr->dummy), &mr->w, err);
    }
    if ((rc = dsv4_ckpt_open(dir, &mr->ckpt, err)) || (rc = dsv4_config_set_drafts(&mr->cfg, mr->ckpt, err)))
        return rc;
    return dsv4_weights_bind(&mr->cfg, mr->ckpt, &mr->w, err);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int dsv4_model_runner_open(const char *dir, const dsv4_model_runner_opts *o, dsv4_model_runner **out,
                           dsv4_err *err) {
    return dsv4_model_runner_open_ex(dir, o, NULL, out, err);
}

int dsv4_model_runner_open_ex(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                              dsv4_model_runner **out, dsv4_err *err) {
    return dsv4_model_runner_open_tp(dir, o, lo, 0, 1, NULL, out, err);
}

/* Capture sizes (issue 7): sorted, deduplicated, each in [1, n_slots]; rows per sequence kept for the warm-up.
 * pad = 0 (opts.warm_eager without graphs): the same list and the padding slot for the warm-up only; the
 * model pads nothing (its n_pad_sizes stays 0) and no shape is fixed. */
static int setup_capture_sizes(dsv4_model_runner *mr, const dsv4_model_runner_opts *o, int pad, dsv4_err *err) {
    dsv4_model *m = mr->model;
    if (o->n_graph_sizes <= 0 || !o->graph_sizes) return DSV4_OK;
    if (o->n_graph_sizes > DSV4_MAX_GRAPH_SIZES)
        return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph capture sizes: %d given, at most %d", o->n_graph_sizes,
                            DSV4_MAX_GRAPH_SIZES);
    if (o->n_graph_rows > 16)
        return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph rows per sequence: %d given, at most 16", o->n_graph_rows);
    int n = 0;
    for (int i = 0; i < o->n_graph_sizes; i++) {
        int v = o->graph_sizes[i], at = n;
        if (v < 1 || v > o->n_slots)
            return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph capture size %d outside [1, %d] (request slots)", v,
                                o->n_slots);
        while (at > 0 && mr->warm_sizes[at - 1] > v) at--;
        if (at > 0 && mr->warm_sizes[at - 1] == v) continue;
        memmove(mr->warm_sizes + at + 1, mr->warm_sizes + at, sizeof(int) * (size_t)(n - at));
        mr->warm_sizes[at] = v;
        n++;
    }
    int nr = 0;
    for (int i = 0; i < o->n_graph_rows; i++) {
        int r = o->graph_rows[i];
        if (r < 1 || r > DSV4_GRAPH_MAX_ROWS_PER_SEQ) {
            if (!pad) continue; /* warm-up only: a shape no graph could hold is just not warmed */
            return dsv4_err_set(err, DSV4_EINVAL, "CUDA graph rows per sequence %d outside [1, %d]", r,
                                DSV4_GRAPH_MAX_ROWS_PER_SEQ);
        }
        mr->g_rows[nr] = r;
        if (pad) m->pad_rows_mask |= 1u << r;
        mr->g_rows_max[nr++] = o->graph_rows_max_seqs ? o->graph_rows_max_seqs[i] : 0;
    }
    mr->n_g_rows = nr;
    mr->warm_rows = o->warm_rows;
    mr->n_warm_sizes = n;
    if (pad) {
        memcpy(m->pad_sizes, mr->warm_sizes, sizeof(int) * (size_t)n);
        m->n_pad_sizes = n;
        m->graphs_fixed = 1;
    }
    m->pad_slot = o->n_slots;
    mr->pad = 1;
    return DSV4_OK;
}

#define GIB(x) ((double)(x) / 1073741824.0)

/* "to serve one request ..." (vLLM's check_enough_kv_cache_memory): the part every refusal below shares. */
static int one_request_refusal(dsv4_err *err, const dsv4_model_runner_opts *o, int bs, int64_t pb, int64_t per_slot,
                               int64_t fit, const char *held_by, const char *what_to_do) {
    return dsv4_err_set(err, DSV4_ENOMEM,
                        "KV cache: to serve at least one request of max_model_len %d, the KV pool needs %lld pages of "
                        "%d tokens (%.2f GiB), but %s holds %lld (%.2f GiB). Based on the available memory, the "
                        "estimated maximum model length is %lld. %s",
                        o->max_len, (long long)per_slot, bs, GIB(per_slot * pb), held_by, (long long)(fit > 0 ? fit : 0),
                        GIB((fit > 0 ? fit : 0) * pb), (long long)(fit > 0 ? fit : 0) * bs, what_to_do);
}

/*
 * Pages in the KV pool (model_runner.h opts: block_size .. gpu_mem_util). Host memory
 * (a backend without mem_info: the CPU) follows vLLM's CPU backend: VLLM_CPU_KVCACHE_SPACE
 * GiB when set (after --num-gpu-blocks-override / --kv-cache-memory-bytes), else, with
 * gpu_mem_util > 0, gpu_mem_util of the host memory available after the weights. Why a
 * bound: the CPU touches its pool lazily, so a pool larger than RAM starts and is only
 * found out by the OOM killer once requests fill it.
 *
 * size_pool runs the steps below in order; each refuses with a message naming the flag
 * to change:
 *   pool_kv_space_env     VLLM_CPU_KVCACHE_SPACE as the byte size (host, no size flag);
 *   pool_check_override   --num-gpu-blocks-override against host memory;
 *   pool_check_kv_bytes   an explicit host byte size against host memory;
 *   pool_check_per_slot   a per-slot pool (no memory bound: --nnodes) against host memory;
 *   pool_cap_by_memory    the --gpu-memory-utilization budget (device: pool_fit_device,
 *                         host: pool_fit_host) caps the pages.
 */
typedef struct pool_sizing {
    dsv4_model_runner *mr;
    const dsv4_model_runner_opts *o;
    const int *ratios;
    int L, bs, tp_size;
    int host;         /* no mem_info: the pool is host memory */
    int hr;           /* ranks sharing this host's memory */
    int say;          /* this rank logs the sizing lines (once per process) */
    int64_t pb;       /* bytes of one page */
    int64_t per_slot; /* pages of one request at max_model_len */
    int64_t kv_bytes; /* the byte size asked for (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE), 0 none */
    const char *src;  /* which of the two gave kv_bytes */
    const char *env;  /* VLLM_CPU_KVCACHE_SPACE as set, or NULL */
} pool_sizing;

/* VLLM_CPU_KVCACHE_SPACE (GiB) becomes the byte size of a host pool that no flag sizes. */
static int pool_kv_space_env(pool_sizing *p, dsv4_err *err) {
    if (p->o->n_pages != 0 || p->kv_bytes > 0 || !p->host) return DSV4_OK;
    int64_t eb = 0;
    int rc = dsv4_hostmem_kvcache_space(p->env, &eb, err);
    if (rc) return rc;
    if (eb > 0) {
        p->kv_bytes = eb;
        p->src = "VLLM_CPU_KVCACHE_SPACE";
    }
    return DSV4_OK;
}

/* --num-gpu-blocks-override on the CPU: else malloc fails ("buf_alloc") or, lazily, the OOM killer. */
static int pool_check_override(const pool_sizing *p, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    if (!p->host || o->n_pages <= 0 || p->pb <= 0) return DSV4_OK;
    int64_t avail = 0, total = 0;
    int rc = dsv4_hostmem_info(&avail, &total, err);
    if (rc) return rc;
    if (o->n_pages > avail / p->pb / p->hr)
        return dsv4_err_set(err, DSV4_ENOMEM,
                            "KV cache: --num-gpu-blocks-override %lld pages of %d tokens need %.2f GiB of host "
                            "memory for the CPU KV pool, but %.2f of %.2f GiB are available now; give at most %lld "
                            "pages, or leave the flag out (the pool is then sized from memory)",
                            (long long)o->n_pages, p->bs, GIB((double)o->n_pages * p->pb * p->hr), GIB(avail),
                            GIB(total), (long long)(avail / p->pb / p->hr));
    return DSV4_OK;
}

/* A host byte size (flag or environment): vLLM refuses one above the memory available. */
static int pool_check_kv_bytes(const pool_sizing *p, int64_t np, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    if (!p->host || o->n_pages != 0 || p->kv_bytes <= 0) return DSV4_OK;
    int64_t avail = 0, total = 0;
    int rc = dsv4_hostmem_info(&avail, &total, err);
    if (rc) return rc;
    if (p->kv_bytes > avail)
        return dsv4_err_set(err, DSV4_ENOMEM,
                            "KV cache: %s asks for %.2f GiB of host memory for the CPU KV pool, but %.2f of %.2f GiB "
                            "are available now; lower %s, or free host memory",
                            p->src, GIB(p->kv_bytes), GIB(avail), GIB(total), p->src);
    if (p->kv_bytes != o->kv_cache_bytes) {
        /* the parsed value: " 2" (Python's int() allows blanks) is logged as 2 */
        if (p->say)
            dsv4_log(DSV4_LOG_INFO, "KV cache: VLLM_CPU_KVCACHE_SPACE=%lld GiB on the CPU: %lld pages of %d tokens",
                     (long long)(p->kv_bytes >> 30), (long long)np, p->bs);
        if (np < p->per_slot && !o->fit_len) {
            char held[96];
            snprintf(held, sizeof held, "VLLM_CPU_KVCACHE_SPACE=%lld", (long long)(p->kv_bytes >> 30));
            return one_request_refusal(err, o, p->bs, p->pb, p->per_slot, np, held,
                                       "Raise VLLM_CPU_KVCACHE_SPACE (GiB) or lower --max-model-len (or give "
                                       "--max-model-len auto).");
        }
    }
    return DSV4_OK;
}

/* Sized per slot with no memory bound (several nodes must hold the same pages, so none caps its
 * pool by its own memory): refuse what this host cannot hold. */
static int pool_check_per_slot(const pool_sizing *p, int64_t np, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    if (!p->host || o->n_pages != 0 || p->kv_bytes > 0 || o->gpu_mem_util > 0 || p->pb <= 0) return DSV4_OK;
    int64_t avail = 0, total = 0;
    int rc = dsv4_hostmem_info(&avail, &total, err);
    if (rc) return rc;
    if (np > avail / p->pb / p->hr)
        return dsv4_err_set(err, DSV4_ENOMEM,
                            "KV cache: every slot at max_model_len %d takes %lld pages of %d tokens, %.2f GiB of "
                            "host memory for %d rank(s) here, but %.2f of %.2f GiB are available now (this pool "
                            "is sized per slot, not by memory, as with --nnodes). Set VLLM_CPU_KVCACHE_SPACE "
                            "(GiB) or --kv-cache-memory-bytes, or lower --max-model-len / --max-num-seqs (the "
                            "same on every node)",
                            o->max_len, (long long)np, p->bs, GIB((double)np * p->pb * p->hr), p->hr, GIB(avail),
                            GIB(total));
    return DSV4_OK;
}

/* What a memory budget holds, for the refusals: where it comes from (held) and what to change
 * when one request does not fit (todo) or no page does (todo0). */
typedef struct pool_fit {
    int64_t pages; /* pages the budget holds, the padding page taken out */
    char held[320];
    const char *todo, *todo0;
} pool_fit;

/* The device's budget (vLLM --gpu-memory-utilization): never more pages than fit. */
static int pool_fit_device(const pool_sizing *p, int64_t fixed, pool_fit *f, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    dsv4_backend *be = p->mr->be;
    int64_t fb = 0, tb = 0;
    const char *rs = getenv("DSV4_ACT_RESERVE_MB");
    int64_t reserve = (rs && atoll(rs) >= 0 ? atoll(rs) : 4096) << 20;
    int rc = be->mem_info(be, &fb, &tb, err);
    if (rc) return rc;
    reserve += fixed;
    f->pages = dsv4_pool_pages_for_memory(fb, tb, o->gpu_mem_util, reserve, p->pb) - p->mr->pad;
    snprintf(f->held, sizeof f->held,
             "--gpu-memory-utilization %.2f of %.1f GiB on %s (%.1f GiB in use after the weights, %.1f GiB "
             "kept for activations (DSV4_ACT_RESERVE_MB) and the slots' rings)",
             o->gpu_mem_util, GIB(tb), be->name, GIB(tb - fb), GIB(reserve));
    f->todo = "Lower --max-model-len (or give --max-model-len auto), raise --gpu-memory-utilization, use more "
              "GPUs (-tp), or give --kv-cache-memory-bytes.";
    f->todo0 = "Raise --gpu-memory-utilization, lower DSV4_ACT_RESERVE_MB, use more GPUs (-tp), or give "
               "--kv-cache-memory-bytes.";
    return DSV4_OK;
}

/* Host memory: gpu_mem_util of what is available after the weights (vLLM's CPU backend). */
static int pool_fit_host(const pool_sizing *p, int64_t fixed, pool_fit *f, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    int64_t avail = 0, total = 0;
    int rc = dsv4_hostmem_info(&avail, &total, err);
    if (rc) return rc;
    /* checkpoint weights are mapped files: MemAvailable counts their pages as reclaimable,
     * yet every step reads them (dummy weights are filled already, so counted as used) */
    int64_t pending = p->mr->ckpt ? (int64_t)dsv4_ckpt_total_bytes(p->mr->ckpt) : 0;
    int64_t budget = dsv4_hostmem_kv_budget(avail, pending, o->gpu_mem_util, p->tp_size);
    f->pages = budget < fixed ? 0 : (budget - fixed) / p->pb - p->mr->pad;
    char wts[64] = "", rks[32] = "";
    if (pending) snprintf(wts, sizeof wts, " less %.2f GiB of mapped weights", GIB(pending));
    if (p->tp_size > 1) snprintf(rks, sizeof rks, ", shared by %d ranks", p->tp_size);
    snprintf(f->held, sizeof f->held,
             "the CPU bound (%.3g of %.2f GiB available host memory%s%s, less %.2f GiB of the slots' rings)",
             o->gpu_mem_util, GIB(avail), wts, rks, GIB(fixed));
    f->todo = "Lower --max-model-len (or give --max-model-len auto), set VLLM_CPU_KVCACHE_SPACE (GiB) or "
              "--kv-cache-memory-bytes, raise --gpu-memory-utilization (the fraction of host memory on the CPU), "
              "or free host memory.";
    f->todo0 = "Set VLLM_CPU_KVCACHE_SPACE (GiB) or --kv-cache-memory-bytes, raise --gpu-memory-utilization "
               "(the fraction of host memory on the CPU), or free host memory.";
    /* vLLM reads VLLM_CPU_KVCACHE_SPACE=0 as unset (envs.py: int(...) or None): say so, not "unset" */
    if (p->say)
        dsv4_log(DSV4_LOG_INFO,
                 "KV cache: VLLM_CPU_KVCACHE_SPACE%s: the CPU pool may use %.2f GiB = %.3g "
                 "(--gpu-memory-utilization) x (%.2f GiB available host memory - %.2f GiB mapped weights) / %d "
                 "rank(s), less %.2f GiB of per-slot rings: %lld pages of %d tokens",
                 p->env && *p->env ? "=0 (as unset, vLLM)" : " unset", GIB(budget), o->gpu_mem_util, GIB(avail),
                 GIB(pending), p->tp_size, GIB(fixed), (long long)(f->pages > 0 ? f->pages : 0), p->bs);
    return DSV4_OK;
}

/* With no size flag and gpu_mem_util > 0, *np is capped by the memory budget (device or host). */
static int pool_cap_by_memory(const pool_sizing *p, int64_t *np, dsv4_err *err) {
    const dsv4_model_runner_opts *o = p->o;
    if (o->n_pages != 0 || p->kv_bytes > 0 || !(o->gpu_mem_util > 0) || p->pb <= 0) return DSV4_OK;
    /* The state's per-slot rings (window, compressor / indexer kv + score, block table) are
     * allocated with the pool but are not in pb: counted here, or they come out of the
     * activation reserve (~4 GiB of 43-layer Flash rings at 256 slots + the padding slot
     * is the whole default reserve; review 2026-12-01 item 6). */
    int64_t fixed = dsv4_state_fixed_bytes(&p->mr->cfg, p->ratios, p->L, o->n_slots + p->mr->pad, o->max_len,
                                           o->max_spec, p->bs, (dsv4_kv_dtype)o->kv_dtype);
    if (fixed < 0) fixed = 0;
    pool_fit f;
    int rc = p->host ? pool_fit_host(p, fixed, &f, err) : pool_fit_device(p, fixed, &f, err);
    if (rc) return rc;
    if (f.pages < 1) /* vLLM: "No available memory for the cache blocks"; a shorter max_model_len cannot help */
        return dsv4_err_set(err, DSV4_ENOMEM,
                            "KV cache: no available memory for the cache blocks: %s holds no page of %d tokens "
                            "(%.2f MiB), whatever --max-model-len. %s",
                            f.held, p->bs, p->pb / 1048576.0, f.todo0);
    if (f.pages < p->per_slot && !o->fit_len)
        return one_request_refusal(err, o, p->bs, p->pb, p->per_slot, f.pages, f.held, f.todo);
    if (f.pages < *np) {
        if (p->say)
            dsv4_log(DSV4_LOG_INFO,
                     "KV cache: %lld pages of %d tokens fit in %s; %lld would hold every slot at max_model_len",
                     (long long)f.pages, p->bs, f.held, (long long)*np);
        *np = f.pages;
    }
    return DSV4_OK;
}

static int size_pool(dsv4_model_runner *mr, const dsv4_model_runner_opts *o, const int *ratios, int L, int bs,
                     int64_t pb, int tp_rank, int tp_size, int64_t *np_out, dsv4_err *err) {
    pool_sizing p = {.mr = mr, .o = o, .ratios = ratios, .L = L, .bs = bs, .tp_size = tp_size,
                     .host = !mr->be->mem_info, .pb = pb, .per_slot = (o->max_len + bs - 1) / bs,
                     .kv_bytes = o->kv_cache_bytes, .src = "--kv-cache-memory-bytes",
                     .env = getenv("VLLM_CPU_KVCACHE_SPACE")};
    int rc = pool_kv_space_env(&p, err);
    if (rc) return rc;
    int64_t np = o->n_pages > 0 ? o->n_pages
                 : p.kv_bytes > 0 ? (pb > 0 ? p.kv_bytes / pb : p.per_slot * o->n_slots)
                                  : p.per_slot * o->n_slots;
    if (np < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "KV cache memory %lld bytes (%s) holds no page of %d tokens (%lld bytes each)",
                            (long long)p.kv_bytes, p.src, bs, (long long)pb);
    p.hr = o->host_ranks > 0 ? o->host_ranks : tp_size > 0 ? tp_size : 1;
    p.say = tp_rank % p.hr == 0; /* the sizing lines once per process, not once per rank (all size alike) */
    if ((rc = pool_check_override(&p, err)) || (rc = pool_check_kv_bytes(&p, np, err))) return rc;
    if (np > INT32_MAX / 2) np = INT32_MAX / 2;
    if ((rc = pool_check_per_slot(&p, np, err)) || (rc = pool_cap_by_memory(&p, &np, err))) return rc;
    *np_out = np;
    return DSV4_OK;
}

int dsv4_model_runner_open_tp(const char *dir, const dsv4_model_runner_opts *o, const dsv4_load_opts *lo,
                              int tp_rank, int tp_size, struct dsv4_comm *comm, dsv4_model_runner **out,
                              dsv4_err *err) {
    *out = NULL;
    if (o->n_slots < 1 || o->max_len < 2 || o->max_spec < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "model runner: bad sizes (slots %d, max_len %d, max_spec %d)",
                            o->n_slots, o->max_len, o->max_spec);
    dsv4_model_runner *mr = calloc(1, sizeof *mr);
    if (!mr) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    mr->draft_sampled = o->draft_sampled;
    int rc;
    double t0 = now_s();
    if ((rc = open_weights(mr, dir, lo, err))) goto fail;
    mr->be = open_backend(o, err);
    if (mr->be && mr->dummy) mr->be = dsv4_dummy_backend(mr->dummy, mr->be, err);
    if (!mr->be) {
        rc = err ? err->code : DSV4_EBACKEND;
        goto fail;
    }
    if (tp_size > 1 &&
        (rc = dsv4_tp_shard_create_ex(&mr->cfg, mr->w, tp_rank, tp_size, mr->dummy, &mr->shard, err)))
        goto fail;
    if ((rc = dsv4_model_create(mr->shard ? &mr->shard->cfg : &mr->cfg, mr->shard ? &mr->shard->w : mr->w, mr->be,
                                &mr->model, err)))
        goto fail;
    for (int l = 0; l < mr->model->n_layers; l++) mr->model->layers[l].comm = comm;
    /* issue 7: per-shape graph replay; under TP only when the collectives are queued on the
     * backend's stream (NCCL on CUDA: comm.h capturable), each rank capturing its own graphs */
    mr->n_slots = o->n_slots;
    int graphs_ok = mr->be->graph_launch && (!comm || (comm->capturable && mr->be->stream));
    if (o->cuda_graphs == 2 || (o->cuda_graphs == 1 && graphs_ok)) {
        /* 2: shape-static launches and padding to the capture sizes, no graphs (tests; any backend) */
        mr->model->graphs_on = o->cuda_graphs == 1;
        mr->be->static_shapes = 1;
        if ((rc = setup_capture_sizes(mr, o, 1, err))) goto fail;
    } else if (o->warm_eager && (rc = setup_capture_sizes(mr, o, 0, err))) {
        goto fail;
    }
    dsv4_model *draft_target = mr->model; /* the drafters read the target's embedding and whole LM head */
    if (mr->shard && mr->shard->head_split) {
        mr->model->head_comm = comm;
        mr->draft_target = *mr->model;
        mr->draft_target.head = mr->w->head;
        mr->draft_target.head_comm = NULL;
        if (tp_rank == 0 && o->max_spec > 0 && (rc = dsv4_upload_linear(mr->be, &mr->draft_target.head, err)))
            goto fail;
        draft_target = &mr->draft_target;
    }
    /* The drafter's weights (and its blocks' expert sets, backend.h experts_ready) before the pool
     * is sized from the memory left, as the target's: else they come out of the activation reserve
     * (review 2026-12-01 S1). TP: the drafter runs replicated on rank 0 only, whose pool is then
     * the smallest (the TP runner takes the smallest). */
    int drafts = o->max_spec > 0 && tp_rank == 0;
    if (drafts && mr->cfg.draft_kind == DSV4_DRAFT_DSPARK) {
        if ((rc = dsv4_dspark_create(&mr->cfg, mr->w, draft_target, o->n_slots, &mr->dspark, err))) goto fail;
        /* The context features of a prefill-sized forward stay in backend memory when the backend
         * takes the taps' stream mean itself (hc_mean: CUDA and the CPU reference): no read back, no
         * upload (dsv4_fwd_out.taps_dev; an 8192-row chunk's step 717 ms instead of 781-812 on an
         * H200, bench/results/2026-12-02-dspark-dev-feats-h200.md). Decode / verify steps keep the
         * host copy, the cautious choice: with 8 requests x 6 rows the device path once measured
         * ~3.4 ms slower a step, within the ~2.5 ms run-to-run spread seen later (same report).
         * DSV4_DSPARK_DEV_FEATS: unset 512 rows and up, 0 never, N >= 1 from N rows (tests: 1). */
        const char *df = getenv("DSV4_DSPARK_DEV_FEATS");
        long dn = df && *df ? strtol(df, NULL, 10) : DSV4_DEV_FEATS_MIN_ROWS;
        mr->dev_feats = mr->be->hc_mean && mr->be->act_dtype == DSV4_DT_F32 && dn > 0 ? (int)(dn < 1 << 30 ? dn : 1 << 30) : 0;
        if (!(mr->ingested = calloc((size_t)o->n_slots, sizeof(int64_t)))) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            goto fail;
        }
    } else if (drafts && mr->cfg.draft_kind == DSV4_DRAFT_MTP) {
        if ((rc = dsv4_mtp_create(&mr->cfg, mr->w, draft_target, o->n_slots, o->max_len, o->max_spec + 1, &mr->mtp,
                                  err)))
            goto fail;
        size_t HD = (size_t)mr->cfg.hc_mult * (size_t)mr->cfg.hidden_size;
        mr->last_h = calloc((size_t)o->n_slots * HD, sizeof(float));
        mr->mtp_next = calloc((size_t)o->n_slots, sizeof(int64_t));
        if (!mr->last_h || !mr->mtp_next) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (!(mr->hw = calloc((size_t)o->n_slots + 1, sizeof(int64_t)))) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail;
    }
    int L = mr->cfg.num_hidden_layers;
    int *ratios = malloc(sizeof(int) * (size_t)L);
    if (!ratios) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < L; l++) ratios[l] = dsv4_config_layer_ratio(&mr->cfg, l);
    int bs = o->block_size > 0 ? o->block_size : 256;
    if (o->kv_dtype < 0 || o->kv_dtype >= DSV4_KV_COUNT) {
        free(ratios);
        rc = dsv4_err_set(err, DSV4_EINVAL, "model runner: kv dtype %d", o->kv_dtype);
        goto fail;
    }
    int64_t pb = dsv4_state_page_bytes(&mr->cfg, ratios, L, bs, (dsv4_kv_dtype)o->kv_dtype), np = 0;
    /* TP: every rank sizes the pool from the same whole-model config and options, so all hold the
     * same page ids and the engine's one set_pages (forwarded by the TP runner) maps them all */
    if (o->n_pages >= 0 && (rc = size_pool(mr, o, ratios, L, bs, pb, tp_rank, tp_size, &np, err))) {
        free(ratios);
        goto fail;
    }
    mr->page_bytes = pb;
    rc = dsv4_state_create_paged(mr->be, &mr->cfg, ratios, L, o->n_slots + mr->pad, o->max_len, o->max_spec, bs,
                                 (int)(np ? np + mr->pad : 0), (dsv4_kv_dtype)o->kv_dtype, &mr->state, err);
    free(ratios);
    if (rc) goto fail;
    if (mr->pad && np) { /* the padding slot's page 0 is the pool's extra last page (rows < 16 < page) */
        int32_t pid = (int32_t)np;
        if ((rc = dsv4_state_set_pages(mr->state, o->n_slots, 1, &pid, err))) goto fail;
    }
    if (mr->dummy) { /* fills may be asynchronous (CUDA): time them to completion */
        if ((rc = mr->be->sync(mr->be, err))) goto fail;
        uint64_t nt, nb;
        dsv4_dummy_stats(mr->dummy, &nt, &nb);
        dsv4_log(DSV4_LOG_INFO, "dummy weights: %llu tensors, %.2f GB in backend memory, %.1f s (%s backend)",
                 (unsigned long long)nt, (double)nb * 1e-9, now_s() - t0, mr->be->name);
    }
    *out = mr;
    return DSV4_OK;
fail:
    dsv4_err_prefix(err, "%s: ", dir);
    dsv4_model_runner_free(mr);
    return rc;
}

int64_t dsv4_pool_pages_for_memory(int64_t free_bytes, int64_t total_bytes, double util, int64_t reserve_bytes,
                                   int64_t page_bytes) {
    if (page_bytes <= 0 || !(util > 0 && util <= 1) || free_bytes < 0 || total_bytes < free_bytes ||
        reserve_bytes < 0)
        return -1;
    double budget = util * (double)total_bytes - (double)(total_bytes - free_bytes) - (double)reserve_bytes;
    return budget < (double)page_bytes ? 0 : (int64_t)(budget / (double)page_bytes);
}

/* Target forward that keeps each row's final streams and token for the MTP drafter. */
static int mtp_forward_keep(dsv4_model_runner *mr, const dsv4_batch *b, const int32_t *logit_rows, int n_logits,
                            float *logits, int32_t *ids, dsv4_err *err) {
    size_t HD = (size_t)mr->cfg.hc_mult * (size_t)mr->cfg.hidden_size;
    if (b->n_rows > mr->feat_cap) {
        float *h = realloc(mr->streams, sizeof(float) * (size_t)b->n_rows * HD);
        if (h) mr->streams = h;
        int32_t *s = realloc(mr->feat_slot, sizeof(int32_t) * (size_t)b->n_rows);
        if (s) mr->feat_slot = s;
        int32_t *p = realloc(mr->feat_pos, sizeof(int32_t) * (size_t)b->n_rows);
        if (p) mr->feat_pos = p;
        int32_t *t = realloc(mr->feat_tok, sizeof(int32_t) * (size_t)b->n_rows);
        if (t) mr->feat_tok = t;
        if (!h || !s || !p || !t) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for MTP inputs");
        mr->feat_cap = b->n_rows;
    }
    mr->feat_rows = 0;
    dsv4_fwd_out fo = {.logit_rows = logit_rows, .n_logits = n_logits, .logits = ids ? NULL : logits,
                       .streams = mr->streams, .ids = ids};
    int rc = dsv4_forward_ex(mr->model, mr->state, b, &fo, err);
    if (rc) return rc;
    memcpy(mr->feat_slot, b->slot, sizeof(int32_t) * (size_t)b->n_rows);
    memcpy(mr->feat_pos, b->pos, sizeof(int32_t) * (size_t)b->n_rows);
    memcpy(mr->feat_tok, b->token, sizeof(int32_t) * (size_t)b->n_rows);
    mr->feat_rows = b->n_rows;
    return 0;
}

/* The runner's forward: logits of the wanted rows, or (ids != NULL) their greedy ids only. */
static int runner_forward_out(dsv4_model_runner *mr, const dsv4_batch *b, const int32_t *logit_rows, int n_logits,
                              float *logits, int32_t *ids, dsv4_err *err) {
    for (int t = 0; t < b->n_rows; t++) /* rings are written even when the forward fails later */
        if (b->slot[t] >= 0 && b->slot[t] < mr->state->n_slots && b->pos[t] + 1 > mr->hw[b->slot[t]])
            mr->hw[b->slot[t]] = b->pos[t] + 1;
    if (ids) logits = NULL;
    if (mr->mtp) return mtp_forward_keep(mr, b, logit_rows, n_logits, logits, ids, err);
    if (!mr->dspark) {
        dsv4_fwd_out fo = {.logit_rows = logit_rows, .n_logits = n_logits, .logits = logits, .ids = ids};
        return dsv4_forward_ex(mr->model, mr->state, b, &fo, err);
    }
    int F = mr->cfg.n_dspark_target_layer_ids * mr->cfg.hidden_size;
    const int dev = mr->dev_feats > 0 && b->n_rows >= mr->dev_feats;
    mr->feat_rows = 0;
    if (b->n_rows > mr->feat_cap) {
        int32_t *s = realloc(mr->feat_slot, sizeof(int32_t) * (size_t)b->n_rows);
        if (s) mr->feat_slot = s;
        int32_t *p = realloc(mr->feat_pos, sizeof(int32_t) * (size_t)b->n_rows);
        if (p) mr->feat_pos = p;
        if (!s || !p) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for draft context features");
        mr->feat_cap = b->n_rows;
    }
    if (!dev && b->n_rows > mr->hfeat_cap) {
        float *f = realloc(mr->feats, sizeof(float) * (size_t)b->n_rows * (size_t)F);
        if (!f) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for draft context features");
        mr->feats = f;
        mr->hfeat_cap = b->n_rows;
    }
    if (dev && b->n_rows > mr->dfeats.rows) { /* stream-ordered free: a context path may still read it */
        mr->be->buf_free(mr->be, &mr->dfeats);
        mr->dfeats = (dsv4_buf){0};
        int rc = mr->be->buf_alloc(mr->be, DSV4_DT_F32, b->n_rows, F, &mr->dfeats, err);
        if (rc) return dsv4_err_prefix(err, "draft context features (%d rows): ", b->n_rows), rc;
    }
    mr->feat_dev = dev;
    dsv4_fwd_out fo = {logit_rows, n_logits, logits, NULL, mr->cfg.dspark_target_layer_ids,
                       mr->cfg.n_dspark_target_layer_ids, dev ? NULL : mr->feats, ids, 0, dev ? &mr->dfeats : NULL};
    int rc = dsv4_forward_ex(mr->model, mr->state, b, &fo, err);
    if (rc) return rc;
    memcpy(mr->feat_slot, b->slot, sizeof(int32_t) * (size_t)b->n_rows);
    memcpy(mr->feat_pos, b->pos, sizeof(int32_t) * (size_t)b->n_rows);
    mr->feat_rows = b->n_rows;
    return 0;
}

static int runner_forward(void *ctx, const dsv4_batch *b, const int32_t *logit_rows, int n_logits, float *logits,
                          dsv4_err *err) {
    return runner_forward_out(ctx, b, logit_rows, n_logits, logits, NULL, err);
}

static int runner_forward_ids(void *ctx, const dsv4_batch *b, const int32_t *logit_rows, int n_logits, int32_t *ids,
                              dsv4_err *err) {
    return runner_forward_out(ctx, b, logit_rows, n_logits, NULL, ids, err);
}

/*
 * Engine: positions < len[i] of slot[i] are committed. Feed the rows of the
 * last forward in [ingested, len) of each slot to the drafter's context path
 * (spec/DSPARK.md §2.3, §4.6): prefill rows always, verify rows only up to
 * the accepted ones. Rows of one slot are consecutive in a batch.
 */
static int drafter_commit(void *ctx, int n, const int32_t *slot, const int64_t *len, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    int F = mr->cfg.n_dspark_target_layer_ids * mr->cfg.hidden_size, T = 0;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(4 * mr->feat_rows + 3 * n + 1));
    if (!tok) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the draft context");
    /* The features are passed in place while the chosen rows are one contiguous run of the last
     * forward's rows (a prefill chunk, or every row of a batch whose verify rows were all accepted):
     * a copy of a 8192-row chunk's features is 400 MB. From the first gap on, rows are gathered into f. */
    float *f = NULL;
    int contig = 1, base = -1;
    int32_t *pos = tok + mr->feat_rows, *sl = pos + mr->feat_rows, *sidx = sl + mr->feat_rows;
    int32_t *cu = sidx + mr->feat_rows, *sslot = cu + n + 1, *spos0 = sslot + n;
    int32_t *src = mr->feat_dev ? malloc(sizeof(int32_t) * (size_t)(mr->feat_rows + 1)) : NULL; /* row of the last forward, per context row */
    if (mr->feat_dev && !src) {
        free(tok);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the draft context");
    }
    int ns = 0, rc = 0;
    cu[0] = 0;
    for (int i = 0; i < n && !rc; i++) {
        int s = slot[i], first = -1, cnt = 0;
        for (int r = 0; r < mr->feat_rows; r++)
            if (mr->feat_slot[r] == s && mr->feat_pos[r] >= mr->ingested[s] && mr->feat_pos[r] < len[i]) {
                if (first < 0) first = r;
                cnt++;
            }
        if (!cnt) continue;
        if (mr->feat_pos[first] != mr->ingested[s]) {
            rc = dsv4_err_set(err, DSV4_EINTERNAL, "draft context of slot %d: have %lld positions, next row is %d",
                              s, (long long)mr->ingested[s], mr->feat_pos[first]);
            break;
        }
        if (base < 0) base = first;
        if (contig && first != base + T) { /* a gap: gather from here on (on the backend: below) */
            contig = 0;
            if (!mr->feat_dev && !(f = malloc(sizeof(float) * (size_t)mr->feat_rows * (size_t)F))) {
                rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the draft context");
                break;
            }
            if (f) memcpy(f, mr->feats + (size_t)base * F, sizeof(float) * (size_t)T * (size_t)F);
        }
        for (int j = 0; j < cnt; j++) {
            tok[T] = 0; /* the context path reads features, not tokens */
            pos[T] = mr->feat_pos[first + j];
            sl[T] = s;
            sidx[T] = ns;
            if (src) src[T] = first + j;
            else if (!contig) memcpy(f + (size_t)T * F, mr->feats + (size_t)(first + j) * F, sizeof(float) * (size_t)F);
            T++;
        }
        sslot[ns] = s;
        spos0[ns] = mr->feat_pos[first];
        cu[++ns] = T;
        mr->ingested[s] = len[i];
    }
    if (!rc && T > 0 && mr->feat_dev) {
        /* in place while the rows are one run of the last forward's (a prefill chunk, an all-accepted
         * verify batch), else gathered on the backend */
        dsv4_batch b = {T, ns, tok, pos, sl, sidx, cu, sslot, spos0};
        dsv4_buf v = {(char *)mr->dfeats.data + (size_t)base * F * sizeof(float), DSV4_DT_F32, T, F}, g = {0};
        if (!contig) {
            rc = mr->be->buf_alloc(mr->be, DSV4_DT_F32, T, F, &g, err);
            if (!rc) rc = mr->be->buf_gather_rows(mr->be, &mr->dfeats, src, T, &g, err);
        }
        if (!rc) rc = dsv4_dspark_context_buf(mr->dspark, &b, contig ? &v : &g, err);
        mr->be->buf_free(mr->be, &g); /* stream-ordered on the GPU: after the context path read it */
    } else if (!rc && T > 0) {
        dsv4_batch b = {T, ns, tok, pos, sl, sidx, cu, sslot, spos0};
        rc = dsv4_dspark_context(mr->dspark, &b, contig ? mr->feats + (size_t)base * F : f, err);
    }
    free(tok);
    free(src);
    free(f);
    return rc;
}

/*
 * Sampling inputs for a DSpark draft when the runner drafts probabilistically
 * and some request samples (temperature > 0 and a q buffer from the engine).
 * Uniforms are keyed by (seed, draft position, DRAFT) like every random of a
 * request (sampler.h), so a replay drafts the same tokens. Returns 0 with
 * *use = 0 when every request drafts greedily.
 */
static int draft_sampling_make(const dsv4_model_runner *mr, int n, int g, const int64_t *apos, const float *temperature,
                               const uint64_t *seed, float *const *q, dsv4_draft_sampling *smp, int *use,
                               dsv4_err *err) {
    *use = 0;
    memset(smp, 0, sizeof *smp);
    if (!mr->draft_sampled || !temperature || !q) return DSV4_OK;
    for (int i = 0; i < n; i++) *use |= temperature[i] > 0 && q[i];
    if (!*use) return DSV4_OK;
    int64_t V = mr->cfg.vocab_size;
    float *t = malloc(sizeof(float) * (size_t)n);
    double *u = malloc(sizeof(double) * (size_t)n * (size_t)g);
    float *qq = malloc(sizeof(float) * (size_t)n * (size_t)g * (size_t)V);
    int *sampled = calloc((size_t)n, sizeof(int));
    if (!t || !u || !qq || !sampled) {
        free(t), free(u), free(qq), free(sampled);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for sampled drafts (%d requests)", n);
    }
    for (int i = 0; i < n; i++) {
        t[i] = q[i] ? temperature[i] : 0.0f;
        for (int j = 0; j < g; j++) u[i * g + j] = dsv4_rng_u01(seed ? seed[i] : 0, apos[i] + 1 + j, DSV4_RNG_DRAFT);
    }
    *smp = (dsv4_draft_sampling){t, u, qq, sampled};
    return DSV4_OK;
}

static void draft_sampling_free(dsv4_draft_sampling *smp) {
    free((void *)smp->temperature);
    free((void *)smp->u);
    free(smp->q);
    free(smp->sampled);
}

/* Drafts for n requests: argmax (the deterministic-draft case of DSPARK.md
 * §4.3, q treated as one-hot by the verifier) or, with draft_sampled, drawn
 * from softmax(z/T) with q handed to the verifier. Lossless either way. */
static int drafter_propose(void *ctx, int n, const int32_t *slot, const int32_t *anchor, const int64_t *apos, int k,
                           const float *temperature, const uint64_t *seed, int32_t *drafts, float *const *q,
                           int *q_valid, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    int g = mr->dspark->gamma;
    int64_t V = mr->cfg.vocab_size;
    int32_t *pos = calloc((size_t)(n > 0 ? n : 1), sizeof(int32_t));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1) * (size_t)g);
    if (!pos || !tok) {
        free(pos);
        free(tok);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for drafts");
    }
    for (int i = 0; i < n; i++) pos[i] = (int32_t)apos[i];
    dsv4_draft_sampling smp;
    int use = 0;
    int rc = draft_sampling_make(mr, n, g, apos, temperature, seed, q, &smp, &use, err);
    if (!rc) rc = dsv4_dspark_draft_sampled(mr->dspark, n, slot, anchor, pos, use ? &smp : NULL, tok, NULL, NULL, err);
    for (int i = 0; i < n && !rc; i++) {
        memcpy(drafts + (size_t)i * k, tok + (size_t)i * g, sizeof(int32_t) * (size_t)k);
        q_valid[i] = use && smp.sampled[i];
        if (q_valid[i]) memcpy(q[i], smp.q + (size_t)i * g * V, sizeof(float) * (size_t)k * (size_t)V);
    }
    if (use) draft_sampling_free(&smp);
    free(pos);
    free(tok);
    return rc;
}

static void drafter_release(void *ctx, int slot) {
    dsv4_model_runner *mr = ctx;
    dsv4_err err = {0};
    if (dsv4_dspark_reset_slot(mr->dspark, slot, &err)) dsv4_log(DSV4_LOG_ERROR, "draft slot %d: %s", slot, err.msg);
    mr->ingested[slot] = 0;
}

/* Row of the last forward holding (slot, pos), or -1. */
static int last_row(const dsv4_model_runner *mr, int slot, int64_t pos) {
    for (int r = 0; r < mr->feat_rows; r++)
        if (mr->feat_slot[r] == slot && mr->feat_pos[r] == pos) return r;
    return -1;
}

/*
 * MTP context (MODEL.md §3.9): once positions < len are committed, MTP rows
 * i in [mtp_next, len-1) can run (H_i with the committed token i+1), so the
 * block's window ring holds every committed position before the draft row.
 * H_{len-1} waits in last_h for its partner, the next emitted token.
 */
static int mtp_commit(void *ctx, int n, const int32_t *slot, const int64_t *len, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    size_t HD = (size_t)mr->cfg.hc_mult * (size_t)mr->cfg.hidden_size;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int s = slot[i];
        int64_t from = mr->mtp_next[s], to = len[i] - 1; /* MTP rows [from, to) */
        if (to < from) continue;
        int cnt = (int)(to - from);
        float *H = malloc(sizeof(float) * HD * (size_t)(cnt + 1));
        int32_t *meta = malloc(sizeof(int32_t) * (size_t)(4 * cnt + 5));
        if (!H || !meta) {
            free(H);
            free(meta);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the MTP context");
        }
        int32_t *tok = meta, *pos = tok + cnt, *sl = pos + cnt, *sidx = sl + cnt, *cu = sidx + cnt;
        for (int j = 0; j < cnt && !rc; j++) {
            int64_t p = from + j;
            int rh = last_row(mr, s, p), rt = last_row(mr, s, p + 1);
            if (rt < 0 || (rh < 0 && p != from)) {
                rc = dsv4_err_set(err, DSV4_EINTERNAL, "MTP context of slot %d: position %lld not in the last step", s,
                                  (long long)p);
                break;
            }
            memcpy(H + (size_t)j * HD, rh >= 0 ? mr->streams + (size_t)rh * HD : mr->last_h + (size_t)s * HD,
                   sizeof(float) * HD);
            tok[j] = mr->feat_tok[rt];
            pos[j] = (int32_t)p;
            sl[j] = s;
            sidx[j] = 0;
        }
        if (!rc && cnt > 0) {
            cu[0] = 0;
            cu[1] = cnt;
            int32_t sslot = s, spos0 = (int32_t)from;
            dsv4_batch b = {cnt, 1, tok, pos, sl, sidx, cu, &sslot, &spos0};
            rc = dsv4_mtp_forward(mr->mtp, &b, H, NULL, NULL, err);
        }
        if (!rc) { /* keep H_{len-1} for the draft row */
            int rl = last_row(mr, s, to);
            if (rl >= 0) memcpy(mr->last_h + (size_t)s * HD, mr->streams + (size_t)rl * HD, sizeof(float) * HD);
            else if (to != from) rc = dsv4_err_set(err, DSV4_EINTERNAL, "MTP: no streams for slot %d position %lld", s,
                                                   (long long)to);
            mr->mtp_next[s] = to;
        }
        free(H);
        free(meta);
    }
    return rc;
}

/* One draft per request: the MTP row at P-1 pairs H_{P-1} with the anchor and
 * predicts position P+1 (argmax, verification treating q as one-hot; or sampled
 * with q when the runner drafts probabilistically). */
static int mtp_propose(void *ctx, int n, const int32_t *slot, const int32_t *anchor, const int64_t *apos, int k,
                       const float *temperature, const uint64_t *seed, int32_t *drafts, float *const *q, int *q_valid,
                       dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    size_t HD = (size_t)mr->cfg.hc_mult * (size_t)mr->cfg.hidden_size, V = (size_t)mr->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * V);
    if (!lg) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for MTP logits");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int s = slot[i];
        if (apos[i] < 1 || mr->mtp_next[s] != apos[i] - 1) {
            rc = dsv4_err_set(err, DSV4_EINTERNAL, "MTP draft for slot %d at %lld: context at %lld", s,
                              (long long)apos[i], (long long)mr->mtp_next[s]);
            break;
        }
        int32_t tok = anchor[i], pos = (int32_t)(apos[i] - 1), sl = s, sidx = 0, cu[2] = {0, 1};
        dsv4_batch b = {1, 1, &tok, &pos, &sl, &sidx, cu, &sl, &pos};
        rc = dsv4_mtp_forward(mr->mtp, &b, mr->last_h + (size_t)s * HD, lg, NULL, err);
        if (rc) break;
        /* sampled drafting as for DSpark: draw from softmax(z/T), q to the verifier */
        int sampled = mr->draft_sampled && temperature && q && q[i] && temperature[i] > 0;
        double u = sampled ? dsv4_rng_u01(seed ? seed[i] : 0, apos[i] + 1, DSV4_RNG_DRAFT) : 0.0;
        drafts[(size_t)i * k] = dsv4_draft_pick(lg, (int64_t)V, sampled ? temperature[i] : 0.0f, u,
                                                sampled ? q[i] : NULL);
        q_valid[i] = sampled;
    }
    free(lg);
    return rc;
}

static void mtp_release(void *ctx, int slot) {
    dsv4_model_runner *mr = ctx;
    dsv4_err err = {0};
    if (dsv4_mtp_reset_slot(mr->mtp, slot, &err)) dsv4_log(DSV4_LOG_ERROR, "MTP slot %d: %s", slot, err.msg);
    mr->mtp_next[slot] = 0;
}

int dsv4_model_runner_drafter(dsv4_model_runner *mr, dsv4_drafter *out) {
    if (mr->dspark) {
        *out = (dsv4_drafter){mr, mr->dspark->gamma, drafter_commit, drafter_propose, drafter_release};
        return 1;
    }
    if (mr->mtp) {
        *out = (dsv4_drafter){mr, 1, mtp_commit, mtp_propose, mtp_release};
        return 1;
    }
    return 0;
}

static void runner_release(void *ctx, int slot) {
    dsv4_model_runner *mr = ctx;
    dsv4_err err = {0};
    mr->hw[slot] = 0;
    if (dsv4_state_reset_slot(mr->state, slot, &err))
        dsv4_log(DSV4_LOG_ERROR, "resetting slot %d: %s", slot, err.msg);
}

/*
 * Prefix caching (spec/SERVING.md §8.7, spec/MODEL.md §4.1). Every piece of
 * per-slot state is position-addressed, so resuming a slot at position R
 * recomputes and overwrites positions >= R exactly as a cold prefill would —
 * provided the rows the resumed rows READ below R are still the cached
 * history's. Those reads, and the ring rows that may have been overwritten
 * since (a ring of cap rows written up to hw holds positions >= hw - cap):
 *  - target window ring (cap W + max_spec): a row at p reads p-W+1 .. p-1;
 *  - compressor token rings (cap m(1+overlap) + max_spec): the window being
 *    filled at R reads its own earlier slots and, for ratio 4, the previous
 *    window's (overlap); emitted compressed / indexer rows are addressed by
 *    window index, never overwritten by later positions, and a window that
 *    ends at or after R is emitted again before any row reads it;
 *  - DSpark context rings (cap W + γ): a draft at anchor P' reads context
 *    P'-W .. P'-1; the old draft block overwrote positions below P-W, so a
 *    resume is exact when the new prompt reaches the old context length P
 *    (or P <= W); the context rows themselves depend only on their position's
 *    target features, so rows >= R are re-ingested from the resumed forward;
 *  - MTP window ring (cap W + max_spec + 1, written up to mtp_next; the
 *    streams of row mtp_next are kept in last_h, so R <= mtp_next + 1).
 * Each condition is "the first position read >= the first position held",
 * monotone in R, so the answer is the largest upper bound or nothing.
 */
static int ring_holds(int64_t need_from, int64_t hw, int64_t cap) {
    if (need_from < 0) need_from = 0;
    return hw - cap <= 0 || need_from >= hw - cap;
}

static int64_t runner_reusable(void *ctx, int slot, int64_t committed, int64_t want, int64_t n_new) {
    dsv4_model_runner *mr = ctx;
    const dsv4_state *st = mr->state;
    int W = mr->cfg.sliding_window;
    int64_t R = want < committed ? want : committed;
    if (mr->dspark) {
        int64_t P = mr->ingested[slot];
        if (R > P) R = P;
        if (!(n_new >= P || P <= W)) return 0;
    }
    if (mr->mtp) { /* MTP rows < nx are in its ring; row nx waits in last_h for token nx+1 */
        int64_t nx = mr->mtp_next[slot];
        const dsv4_win_state *mw = &mr->mtp->st->layers[0].win;
        if (R > nx + 1) R = nx + 1;
        if (!ring_holds(R - W + 1, nx + 1, mw->cap)) return 0;
    }
    if (R < 1) return 0;
    int64_t hw = mr->hw[slot];
    for (int l = 0; l < st->n_layers; l++) {
        const dsv4_layer_state *ls = &st->layers[l];
        if (!ring_holds(R - W + 1, hw, ls->win.cap)) return 0;
        const dsv4_cmp_state *cs[2] = {&ls->cmp, &ls->idx};
        for (int i = 0; i < 2; i++) {
            if (!cs[i]->rows.data) continue;
            int64_t m = cs[i]->ratio, ws = R / m * m;
            if (!ring_holds(ws - m * cs[i]->overlap, hw, cs[i]->cap)) return 0;
        }
    }
    return R;
}

static int runner_resume(void *ctx, int slot, int64_t pos, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    if (slot < 0 || slot >= mr->state->n_slots || pos < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "resume slot %d at %lld", slot, (long long)pos);
    if (mr->dspark) mr->ingested[slot] = pos;
    /* MTP: rows from pos on are re-run; at pos = mtp_next + 1 the row at
     * mtp_next runs from last_h with the new prompt's token pos */
    if (mr->mtp && mr->mtp_next[slot] > pos) mr->mtp_next[slot] = pos;
    return DSV4_OK;
}

static int runner_copy_slot(void *ctx, int src, int dst, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    int rc = dsv4_state_copy_slot(mr->state, src, dst, mr->hw[src], err);
    if (!rc && mr->dspark) {
        rc = dsv4_dspark_copy_slot(mr->dspark, src, dst, err);
        mr->ingested[dst] = mr->ingested[src];
    }
    if (!rc && mr->mtp) {
        size_t HD = (size_t)mr->cfg.hc_mult * (size_t)mr->cfg.hidden_size;
        rc = dsv4_state_copy_slot(mr->mtp->st, src, dst, mr->mtp_next[src] + 1, err);
        memcpy(mr->last_h + (size_t)dst * HD, mr->last_h + (size_t)src * HD, sizeof(float) * HD);
        mr->mtp_next[dst] = mr->mtp_next[src];
    }
    mr->hw[dst] = mr->hw[src];
    return rc;
}

static int runner_set_pages(void *ctx, int slot, int n, const int32_t *ids, dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    return dsv4_state_set_pages(mr->state, slot, n, ids, err);
}

/* A batch of n_seqs sequences of r rows each, all in the padding slot at positions 0..r-1. */
static void pad_batch(int pad_slot, int S, int r, int32_t *buf, dsv4_batch *b) {
    int P = S * r;
    int32_t *tok = buf, *pos = tok + P, *slot = pos + P, *sidx = slot + P, *cu = sidx + P, *sslot = cu + S + 1,
            *spos0 = sslot + S;
    for (int q = 0; q < S; q++) {
        for (int j = 0; j < r; j++) {
            tok[q * r + j] = 0;
            pos[q * r + j] = j;
            slot[q * r + j] = pad_slot;
            sidx[q * r + j] = q;
        }
        cu[q] = q * r;
        sslot[q] = pad_slot;
        spos0[q] = 0;
    }
    cu[S] = P;
    *b = (dsv4_batch){P, S, tok, pos, slot, sidx, cu, sslot, spos0};
}

int dsv4_warmup_prefill_rows(int max_rows, const char *spec, int *rows, int *n, dsv4_err *err) {
    *n = 0;
    if (max_rows < 1) return DSV4_OK;
    if (!spec || !*spec || !strcmp(spec, "1")) { /* unset, empty or 1: the default */
        rows[(*n)++] = max_rows;
        int p2 = 128;
        while (p2 * 2 < max_rows) p2 *= 2;
        for (; p2 >= 128 && *n < DSV4_WARMUP_PREFILL_MAX; p2 /= 2)
            if (p2 < max_rows) rows[(*n)++] = p2;
        return DSV4_OK;
    }
    if (!strcmp(spec, "0")) return DSV4_OK;
    for (const char *c = spec; *c;) {
        char *e;
        long v = strtol(c, &e, 10);
        if (e == c || v < 1 || (*e && *e != ',') || (*e == ',' && !e[1]) || *n == DSV4_WARMUP_PREFILL_MAX) {
            *n = 0;
            return dsv4_err_set(err, DSV4_EINVAL,
                                "DSV4_WARMUP_PREFILL='%s': want 0, 1 or a comma list of at most %d row counts >= 1",
                                spec, DSV4_WARMUP_PREFILL_MAX);
        }
        rows[(*n)++] = v < max_rows ? (int)v : max_rows;
        c = *e ? e + 1 : e;
    }
    return DSV4_OK;
}

int dsv4_model_runner_warmup(dsv4_model_runner *mr, int *n_graphs, dsv4_err *err) {
    *n_graphs = 0;
    dsv4_model *m = mr->model;
    mr->warm_steps = 0;
    if (!mr->pad || !mr->n_warm_sizes) return DSV4_OK;
    int Smax = mr->warm_sizes[mr->n_warm_sizes - 1], Rmax = 1;
    for (int i = 0; i < mr->n_g_rows; i++)
        if (mr->g_rows[i] > Rmax) Rmax = mr->g_rows[i];
    int Pmax = Smax * Rmax, W = mr->warm_rows > Pmax ? mr->warm_rows : Pmax;
    int32_t *buf = malloc(sizeof(int32_t) * ((size_t)5 * W + 3 * (size_t)W + 1 + (size_t)Pmax));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)Pmax);
    float *lg = malloc(sizeof(float) * (size_t)Pmax * (size_t)mr->cfg.vocab_size);
    int rc = 0;
    if (!buf || !ids || !lg) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "start-up warm-up: out of memory for %d rows", Pmax);
        goto out;
    }
    int32_t *lrows = buf + (size_t)8 * W + 1;
    for (int t = 0; t < Pmax; t++) lrows[t] = t;
    dsv4_batch b;
    /* the backend's batch mirror sized for the largest step now: a later prefill never moves it
     * (which would make every graph stale and recapture it at request time) */
    pad_batch(m->pad_slot, W, 1, buf, &b);
    if ((rc = mr->be->batch_begin(mr->be, &b, err))) goto out;
    m->graphs_warming = 1;
    int variants = mr->be->logit_top && !mr->shard ? 2 : 1; /* full logits, and greedy ids (forward_ids) */
    int reps = m->graphs_on ? 2 : 1;                          /* warm, then capture */
    for (int ri = 0; ri < mr->n_g_rows && !rc; ri++)
        for (int si = 0; si < mr->n_warm_sizes && !rc; si++) {
            int S = mr->warm_sizes[si], r = mr->g_rows[ri];
            if (mr->g_rows_max[ri] > 0 && S > mr->g_rows_max[ri]) continue;
            pad_batch(m->pad_slot, S, r, buf, &b);
            for (int v = 0; v < variants && !rc; v++)
                for (int k = 0; k < reps && !rc; k++, mr->warm_steps++)
                    rc = runner_forward_out(mr, &b, lrows, S * r, v ? NULL : lg, v ? ids : NULL, err);
        }
    /* Prefill-sized steps too (positions 0.. of the padding slot; in a paged pool the slot borrows
     * the engine's pages 0.. for them: nothing is mapped before serving, and every request writes
     * the positions it reads, so what the warm-up leaves there is never seen). Why: a step whose
     * row count (more exactly, whose power-of-two row bucket: the GEMM library's algorithms are chosen and prepared per bucket,
     * backend/cuda cu_lt_algo) was never run cost 15-20 ms more than the next one of that count on a
     * 24-layer H200 prefill, and the first long prompt after start 8-12 % more
     * (bench/results/2026-12-01-warmup-prefill-h200.md). Eager, as every prefill step. By default
     * one step of the largest size (max_num_batched_tokens rows, cut to the context) and one of each
     * power of two from 128 below it (the smaller buckets are the graph sizes' steps, run above);
     * DSV4_WARMUP_PREFILL=0 turns them off, a comma list of row counts replaces them. */
    int Wp = W < mr->state->max_len - 1 ? W : mr->state->max_len - 1;
    int wrows[DSV4_WARMUP_PREFILL_MAX], n_wrows = 0;
    if (!rc) rc = dsv4_warmup_prefill_rows(Wp, getenv("DSV4_WARMUP_PREFILL"), wrows, &n_wrows, err);
    const int paged = mr->state->n_pages > 0, own = mr->state->n_pages - 1; /* the padding page: the last */
    int32_t *pids = paged && n_wrows ? malloc(sizeof(int32_t) * (size_t)mr->state->max_pages) : NULL;
    if (paged && n_wrows && !pids) rc = dsv4_err_set(err, DSV4_ENOMEM, "start-up warm-up: out of memory");
    for (int i = 0; i < n_wrows && !rc; i++) {
        int rows = wrows[i];
        if (paged) {
            const int pt = mr->state->page_tokens;
            int need = (rows + pt - 1) / pt;
            if (need - 1 > own) { /* a pool smaller than the step: as many rows as it holds */
                need = own + 1;
                rows = need * pt;
            }
            pids[0] = own;
            for (int j = 1; j < need; j++) pids[j] = j - 1;
            if ((rc = dsv4_state_set_pages(mr->state, m->pad_slot, need, pids, err))) break;
        }
        const int32_t last = rows - 1;
        pad_batch(m->pad_slot, 1, rows, buf, &b);
        rc = runner_forward_out(mr, &b, &last, 1, lg, NULL, err);
        mr->warm_steps++;
    }
    if (pids) { /* the padding slot keeps its own page only */
        int32_t p0 = own;
        int rc2 = dsv4_state_set_pages(mr->state, m->pad_slot, 1, &p0, err);
        if (!rc) rc = rc2;
    }
    free(pids);
    m->graphs_warming = 0;
    mr->feat_rows = 0; /* the drafters never see the padding slot's rows */
    mr->hw[m->pad_slot] = 0;
    if (!rc) rc = mr->be->sync(mr->be, err);
    *n_graphs = dsv4_forward_graphs_count(m);
out:
    if (rc) dsv4_err_prefix(err, "start-up warm-up: ");
    free(buf);
    free(ids);
    free(lg);
    return rc;
}

static int runner_warmup(void *ctx, int *n_graphs, dsv4_err *err) {
    return dsv4_model_runner_warmup(ctx, n_graphs, err);
}

dsv4_runner dsv4_model_runner_iface(dsv4_model_runner *mr) {
    dsv4_runner r = {mr, mr->cfg.vocab_size, mr->n_slots, runner_forward, runner_release,
                     runner_reusable, runner_resume, runner_copy_slot, 0, 0, 0, NULL, NULL, NULL};
    if (mr->state->n_pages > 0) {
        r.page_tokens = mr->state->page_tokens;
        r.n_pages = mr->state->n_pages - mr->pad; /* the padding slot's page is not the engine's */
        r.page_bytes = mr->page_bytes;
        r.set_pages = runner_set_pages;
    }
    /* greedy ids where the logits are (issue 7); tensor parallel keeps the full-logits path */
    if (mr->be->logit_top && !mr->shard) r.forward_ids = runner_forward_ids;
    if (mr->pad) r.warmup = runner_warmup;
    return r;
}

const dsv4_config *dsv4_model_runner_config(const dsv4_model_runner *mr) { return &mr->cfg; }

int dsv4_model_runner_warm_steps(const dsv4_model_runner *mr) { return mr->warm_steps; }

dsv4_backend *dsv4_model_runner_backend(dsv4_model_runner *mr) { return mr->be; }

void dsv4_model_runner_target(dsv4_model_runner *mr, struct dsv4_model **model, struct dsv4_state **state) {
    *model = mr->model;
    *state = mr->state;
}
