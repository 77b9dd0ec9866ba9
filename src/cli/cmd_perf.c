/*
 * dsv4 perf — step times of the model runner, next to their HBM roofline
 * (issue 7; spec/PERFORMANCE.md §2-§4).
 *
 * Why a tool apart from `dsv4 bench`: bench measures a server end to end
 * (HTTP, scheduling, sampling); this times only the forward the engine would
 * issue — the runner's `forward` with the batch shapes the engine builds —
 * so a kernel change shows up as milliseconds per step without the noise of
 * the rest, and each line says how far it is from reading the step's bytes
 * at the GPU's streaming read rate, measured at start on the device it runs
 * on (PERFORMANCE.md §1: 4.58 TB/s on an H200; an H100 streams less, so the
 * H200 figure would flatter it), or given with --hbm-tbps.
 *
 * The state is not prefilled: every piece of per-request state is
 * position-addressed (spec/MODEL.md §4.1), so a segment starting at position
 * N reads N positions of window / compressed / indexer rows whatever they
 * hold — the kernels move exactly the bytes of a real context of N tokens,
 * while filling it would cost a prefill per slot. Rows of one step are
 * written at positions N..N+rows-1 and rewritten by the next step (as a
 * rejected verify would be). Timing is wall clock around the forward, which
 * ends with the logits read (a synchronisation), after --warmup untimed steps.
 * What is timed is the bare target forward (dsv4_forward: logits of every
 * row, no drafter features or streams copied out), so MTP / DSpark
 * checkpoints time the same work as target-only ones. Each shape is timed
 * with the two outputs the engine can ask for (--logits): every row's
 * logits back to the host ("full", what sampled / constrained / logprob
 * steps need) and only each row's greedy id ("ids": the backend's
 * logit_top where the logits are, what an all-greedy step needs, issue 7);
 * D2H_MB says what each reads back per step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/kvcodec.h"
#include "cli/cli.h"
#include "engine/model_runner.h"
#include "engine/step_bytes.h"
#include "model/forward.h"
#include "parallel/tp_runner.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/dsv4_cuda.h"
#endif

#define PERF_MAX_LIST 16
#define PERF_HBM_BPS 4.58e12 /* bytes/s, PERFORMANCE.md §1: the H200's; CPU runs and failed measurements */

typedef struct perf_opts {
    const char *dir, *load_format, *hf_overrides;
    dsv4_device device;
    const char *kv_cache_dtype; /* --kv-cache-dtype; NULL = auto (fp8_ds_mla on the GPU, f32 on the CPU) */
    int batch[PERF_MAX_LIST], n_batch;
    int rows[PERF_MAX_LIST], n_rows;
    int64_t context;
    int64_t max_model_len; /* --max-model-len: state sized for this many positions (0 = what the shapes need) */
    int steps, warmup;
    int prefill[PERF_MAX_LIST], n_prefill, prefill_chunk;
    int cuda_graphs;
    int tp;
    int ar_bench;
    int out_full, out_ids; /* --logits full | ids | both */
    double hbm_tbps;       /* --hbm-tbps: the roofline's bandwidth; 0 = measure (CUDA) or 4.58 */
} perf_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 perf [MODEL_DIR] [options]\n"
            "Time forward steps of the model runner and compare them with the HBM roofline\n"
            "(dense weights once + routed experts selected + state read, at the GPU's\n"
            "streaming read rate, measured at start).\n"
            "  --device D            auto (default) | cpu | cuda\n"
            "  --kv-cache-dtype T    auto (fp8_ds_mla on the GPU, f32 on the CPU) | f32 | bf16 | fp8_ds_mla\n"
            "  --enforce-eager       no CUDA graphs (default: decode / verify steps replay graphs\n"
            "                        captured per shape on CUDA; the first two steps of a shape\n"
            "                        run eagerly, so give --warmup 2 to time replays)\n"
            "  --batch LIST          requests per step, e.g. 1,2,4,8,16,32,64 (default 1)\n"
            "  --rows-per-seq LIST   rows per request: 1 = decode, 6 = verify with k=5 (default 1,6)\n"
            "  --context N           positions already in each request's state (default 64)\n"
            "  --max-model-len N     size the state (and the graphs' shape-static bounds) for N\n"
            "                        positions per request, as serve's flag (default: what the\n"
            "                        context, rows and prefills need)\n"
            "  --static-shapes       eager, with the graphs' shape-static launch sizes (profilers)\n"
            "  --steps S             timed steps per shape (default 5)\n"
            "  --warmup W            untimed steps per shape first (default 1)\n"
            "  --prefill LIST        also time prefills of these prompt lengths, e.g. 8192,32768,102400\n"
            "                        (default off), one request from position 0 in chunks of\n"
            "  --prefill-chunk C     tokens (default 8192, serve's --max-num-batched-tokens); each\n"
            "                        chunk attends to the chunks before it, as chunked prefill does\n"
            "  --load-format F       auto (the checkpoint's weights) | dummy\n"
            "  --hf-overrides JSON   config overrides (with --load-format dummy)\n"
            "  --tensor-parallel-size N, -tp N\n"
            "                        N ranks in this process (GPUs 0..N-1 with --device cuda, NCCL); the\n"
            "                        roofline is then per GPU (each reads its 1/N of the split weights)\n"
            "  --all-reduce-bench    with -tp: first check and time the all-reduce of 1, 6, 8, 48, 64, 384 rows\n"
            "                        of hidden_size F32 and 1, 8, 64 rows of BF16, NCCL against the NVLink\n"
            "                        one-shot kernel (DSV4_TP_ONESHOT=0 turns it off), eager and in graphs\n"
            "  --hbm-tbps X          the roofline's bandwidth in TB/s (default: a streaming read of 1 GiB\n"
            "                        measured on GPU 0 before loading; 4.58, an H200's, on the CPU)\n"
            "  --logits M            full | ids | both (default): time each shape with every row's logits\n"
            "                        read back, with only its greedy id (argmax on the device), or both\n"
            "MODEL_DIR defaults to the embedded default model (%s).\n",
            dsv4_default_model_dir());
}

static int parse_list(const char *s, int *out, int *n, const char *flag) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20 || *n == PERF_MAX_LIST) {
            fprintf(stderr, "dsv4 perf: %s: '%s' is not a list of positive counts (at most %d)\n", flag, s,
                    PERF_MAX_LIST);
            return 2;
        }
        out[(*n)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "dsv4 perf: %s: unexpected '%s'\n", flag, end);
            return 2;
        }
    }
    return *n ? 0 : 2;
}

static int parse_count(const char *flag, const char *s, long lo, long hi, long *v) {
    char *end;
    *v = strtol(s, &end, 10);
    if (*end || end == s || *v < lo || *v > hi) {
        fprintf(stderr, "dsv4 perf: %s: '%s' is not a count in [%ld, %ld]\n", flag, s, lo, hi);
        return 2;
    }
    return 0;
}

static int parse_args(int argc, char **argv, perf_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = DSV4_DEVICE_AUTO;
    o->load_format = "auto";
    o->batch[0] = 1;
    o->n_batch = 1;
    o->rows[0] = 1;
    o->rows[1] = 6;
    o->n_rows = 2;
    o->context = 64;
    o->steps = 5;
    o->warmup = 1;
    o->cuda_graphs = 1;
    o->prefill_chunk = 8192;
    o->tp = 1;
    o->out_full = o->out_ids = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        } else if (a[0] != '-') {
            if (o->dir) {
                fprintf(stderr, "dsv4 perf: more than one model directory ('%s')\n", a);
                return 2;
            }
            o->dir = a;
            continue;
        } else if (!strcmp(a, "--cuda-graphs") || !strcmp(a, "--enforce-eager")) {
            o->cuda_graphs = a[2] == 'c';
            continue;
        } else if (!strcmp(a, "--static-shapes")) {
            o->cuda_graphs = 2;
            continue;
        } else if (!strcmp(a, "--all-reduce-bench")) {
            o->ar_bench = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "dsv4 perf: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--device")) {
            dsv4_err e = {0};
            if (dsv4_device_parse(v, &o->device, &e)) {
                fprintf(stderr, "dsv4 perf: %s\n", e.msg);
                return 2;
            }
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            dsv4_err e = {0};
            dsv4_kv_dtype t;
            if (dsv4_kv_dtype_parse(v, &t, &e)) {
                fprintf(stderr, "dsv4 perf: --kv-cache-dtype: %s\n", e.msg);
                return 2;
            }
            o->kv_cache_dtype = v;
        } else if (!strcmp(a, "--batch")) {
            if (parse_list(v, o->batch, &o->n_batch, a)) return 2;
        } else if (!strcmp(a, "--rows-per-seq")) {
            if (parse_list(v, o->rows, &o->n_rows, a)) return 2;
        } else if (!strcmp(a, "--context")) {
            if (parse_count(a, v, 0, 1 << 24, &n)) return 2;
            o->context = n;
        } else if (!strcmp(a, "--max-model-len")) {
            if (parse_count(a, v, 1, 1 << 24, &n)) return 2;
            o->max_model_len = n;
        } else if (!strcmp(a, "--steps")) {
            if (parse_count(a, v, 1, 100000, &n)) return 2;
            o->steps = (int)n;
        } else if (!strcmp(a, "--warmup")) {
            if (parse_count(a, v, 0, 1000, &n)) return 2;
            o->warmup = (int)n;
        } else if (!strcmp(a, "--prefill")) {
            if (!strcmp(v, "0")) o->n_prefill = 0;
            else if (parse_list(v, o->prefill, &o->n_prefill, a)) return 2;
        } else if (!strcmp(a, "--hbm-tbps")) {
            char *end = NULL;
            double x = strtod(v, &end);
            if (!end || *end || !(x > 0.01 && x < 1000)) {
                fprintf(stderr, "dsv4 perf: --hbm-tbps: '%s' (expected TB/s between 0.01 and 1000, e.g. 4.58)\n", v);
                return 2;
            }
            o->hbm_tbps = x;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (parse_count(a, v, 1, 1 << 20, &n)) return 2;
            o->prefill_chunk = (int)n;
        } else if (!strcmp(a, "--load-format")) {
            if (strcmp(v, "auto") && strcmp(v, "dummy") && strcmp(v, "safetensors")) {
                fprintf(stderr, "dsv4 perf: --load-format: '%s' (expected auto or dummy)\n", v);
                return 2;
            }
            o->load_format = v;
        } else if (!strcmp(a, "--logits")) {
            if (strcmp(v, "full") && strcmp(v, "ids") && strcmp(v, "both")) {
                fprintf(stderr, "dsv4 perf: --logits: '%s' (expected full, ids or both)\n", v);
                return 2;
            }
            o->out_full = strcmp(v, "ids") != 0;
            o->out_ids = strcmp(v, "full") != 0;
        } else if (!strcmp(a, "--hf-overrides")) {
            o->hf_overrides = v;
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            if (parse_count(a, v, 1, 64, &n)) return 2;
            o->tp = (int)n;
        } else {
            fprintf(stderr, "dsv4 perf: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->dir) o->dir = dsv4_default_model_dir();
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Host metadata of one step: n_seqs requests (slots 0..n-1) of `rows` rows at positions pos0.. */
typedef struct perf_batch {
    int32_t *token, *pos, *slot, *seq_idx, *cu, *seq_slot, *seq_pos0, *logit_rows;
    dsv4_batch b;
    int n_logits;
} perf_batch;

static void batch_free(perf_batch *p) {
    free(p->token);
    memset(p, 0, sizeof *p);
}

/* logits for every row (verify needs all; decode has one row per request). */
static int batch_make(perf_batch *p, int n_seqs, int rows, int64_t pos0, int vocab, int last_only) {
    int T = n_seqs * rows;
    memset(p, 0, sizeof *p);
    int32_t *m = malloc(sizeof(int32_t) * (size_t)(5 * T + 3 * n_seqs + 1));
    if (!m) return DSV4_ENOMEM;
    p->token = m;
    p->pos = m + T;
    p->slot = m + 2 * T;
    p->seq_idx = m + 3 * T;
    p->logit_rows = m + 4 * T;
    p->cu = m + 5 * T;
    p->seq_slot = p->cu + n_seqs + 1;
    p->seq_pos0 = p->seq_slot + n_seqs;
    uint32_t x = 12345;
    for (int s = 0; s < n_seqs; s++) {
        p->cu[s] = s * rows;
        p->seq_slot[s] = s;
        p->seq_pos0[s] = (int32_t)pos0;
        for (int r = 0; r < rows; r++) {
            int t = s * rows + r;
            x = x * 1664525u + 1013904223u;
            p->token[t] = (int32_t)((x >> 8) % (uint32_t)vocab);
            p->pos[t] = (int32_t)(pos0 + r);
            p->slot[t] = s;
            p->seq_idx[t] = s;
        }
    }
    p->cu[n_seqs] = T;
    if (last_only) {
        p->logit_rows[0] = T - 1;
        p->n_logits = 1;
    } else {
        for (int t = 0; t < T; t++) p->logit_rows[t] = t;
        p->n_logits = T;
    }
    p->b = (dsv4_batch){T, n_seqs, p->token, p->pos, p->slot, p->seq_idx, p->cu, p->seq_slot, p->seq_pos0};
    return DSV4_OK;
}

typedef struct perf_target {
    dsv4_model *m;
    dsv4_state *st;
    dsv4_tp_runner *tp;
} perf_target;

/* One target forward: every logit row back, or (ids != NULL) only its greedy id (not under TP). */
static int target_forward(perf_target *t, perf_batch *pb, float *logits, int32_t *ids, dsv4_err *err) {
    if (t->tp) {
        if (ids) return dsv4_err_set(err, DSV4_EUNSUPPORTED, "--logits ids: tensor parallelism returns full logits only");
        return dsv4_tp_runner_forward_target(t->tp, &pb->b, pb->logit_rows, pb->n_logits, logits, err);
    }
    dsv4_fwd_out fo = {.logit_rows = pb->logit_rows, .n_logits = pb->n_logits, .logits = ids ? NULL : logits,
                       .ids = ids};
    return dsv4_forward_ex(t->m, t->st, &pb->b, &fo, err);
}

/* Mean ms of `steps` target forwards (after `warmup`): logits back, or (ids != NULL) greedy ids only. */
static int time_steps(perf_target *t, perf_batch *pb, int warmup, int steps, float *logits, int32_t *ids, double *ms,
                      dsv4_err *err) {
    for (int i = 0; i < warmup; i++) {
        int rc = target_forward(t, pb, logits, ids, err);
        if (rc) return rc;
    }
    /* DSV4_PERF_PROFILE=1: only the timed steps inside the profiler's range
     * (ncu / nsys --profile-from-start off), not the load and the warm-up */
    const char *pe = getenv("DSV4_PERF_PROFILE");
    const int prof = pe && pe[0] == '1';
#ifdef DSV4_HAVE_CUDA
    if (prof) dsv4_cuda_profiler(1);
#endif
    double t0 = now_s();
    int rc = DSV4_OK;
    for (int i = 0; i < steps && !rc; i++) rc = target_forward(t, pb, logits, ids, err);
    *ms = (now_s() - t0) * 1e3 / steps;
#ifdef DSV4_HAVE_CUDA
    if (prof) dsv4_cuda_profiler(0);
#endif
    (void)prof;
    return rc;
}

/*
 * Chunked prefill of one request of `total` tokens from position 0, chunks of
 * o->prefill_chunk (the engine's --max-num-batched-tokens): chunk i runs rows
 * at positions i*C.. and attends to everything before it, so late chunks of a
 * long prompt cost more than early ones. One untimed chunk first (shape
 * warm-up), then one timed pass; prints the total rate and the first / last
 * chunk times. Logits of the last row of each chunk only (as the engine asks).
 */
static int time_prefill(perf_target *t, const perf_opts *o, int total, const dsv4_config *cfg,
                        float *logits, dsv4_err *err) {
    int C = o->prefill_chunk < total ? o->prefill_chunk : total, n_chunks = (total + C - 1) / C;
    perf_batch pb;
    if (batch_make(&pb, 1, C, 0, cfg->vocab_size, 1)) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the batch");
    int rc = target_forward(t, &pb, logits, NULL, err);
    batch_free(&pb);
    double first = 0, last = 0, t_all = 0;
    for (int c = 0; c < n_chunks && !rc; c++) {
        int rows = c == n_chunks - 1 ? total - c * C : C;
        if (batch_make(&pb, 1, rows, (int64_t)c * C, cfg->vocab_size, 1))
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the batch");
        double t0 = now_s();
        rc = target_forward(t, &pb, logits, NULL, err);
        double ms = (now_s() - t0) * 1e3;
        batch_free(&pb);
        t_all += ms;
        if (c == 0) first = ms;
        last = ms;
    }
    if (!rc)
        printf("prefill %d tokens in %d chunk%s of <= %d: %.1f ms, %.1f tokens/s (first chunk %.1f ms, last %.1f ms; "
               "compute-bound: no HBM roofline)\n",
               total, n_chunks, n_chunks == 1 ? "" : "s", C, t_all, total / (t_all * 1e-3), first, last);
    fflush(stdout);
    return rc;
}

int dsv4_cmd_perf(int argc, char **argv) {
    perf_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc < 0 ? 0 : prc;
    int max_b = 0, max_r = 0;
    for (int i = 0; i < o.n_batch; i++) max_b = o.batch[i] > max_b ? o.batch[i] : max_b;
    for (int i = 0; i < o.n_rows; i++) max_r = o.rows[i] > max_r ? o.rows[i] : max_r;
    int64_t max_len = o.context + max_r + 1;
    for (int i = 0; i < o.n_prefill; i++)
        if (o.prefill[i] + 1 > max_len) max_len = o.prefill[i] + 1;
    if (o.max_model_len > max_len) max_len = o.max_model_len;
    if (max_len > (1 << 30)) {
        fprintf(stderr, "dsv4 perf: context too long\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_model_runner *mr = NULL;
    dsv4_tp_runner *tp = NULL;
    /* max_spec = rows-1: the state's rings are sized for verify rows that may be rejected */
    dsv4_kv_dtype kvt = DSV4_KV_F32;
    int gpu = dsv4_device_is_gpu((dsv4_device)o.device);
    dsv4_kv_dtype_parse_for(o.kv_cache_dtype, gpu, &kvt, NULL); /* validated by the parser */
    dsv4_model_runner_opts mo = {.n_slots = max_b, .max_len = (int)max_len, .max_spec = max_r - 1,
                                 .numerics = DSV4_NUMERICS_REFERENCE, .device = o.device,
                                 .cuda_graphs = o.cuda_graphs, .kv_dtype = (int)kvt};
    /* the roofline's bandwidth: what this GPU streams (measured before the weights take its memory) */
    double hbm_bps = o.hbm_tbps > 0 ? o.hbm_tbps * 1e12 : PERF_HBM_BPS;
    char hbm_src[320];
    snprintf(hbm_src, sizeof hbm_src, "%s", o.hbm_tbps > 0 ? "--hbm-tbps" : "an H200's measured streaming read");
#ifdef DSV4_HAVE_CUDA
    if (gpu && o.hbm_tbps <= 0) {
        dsv4_cuda_ctx *cx = NULL;
        double rd = 0, cp = 0;
        dsv4_err me = {0};
        if (!dsv4_cuda_ctx_create(0, &cx, &me) && !dsv4_cuda_measure_hbm(cx, (size_t)1 << 30, &rd, &cp, &me) &&
            rd > 0) {
            hbm_bps = rd * 1e9;
            snprintf(hbm_src, sizeof hbm_src, "streaming read of 1 GiB measured now on %s",
                     dsv4_cuda_device_name(cx));
        } else {
            snprintf(hbm_src, sizeof hbm_src, "an H200's; measuring this GPU failed: %.200s", me.msg);
        }
        dsv4_cuda_ctx_free(cx);
    }
#endif
    double t0 = now_s();
    const dsv4_config *cfg = NULL;
    dsv4_load_opts lo = {.dummy = strcmp(o.load_format, "dummy") == 0, .hf_overrides = o.hf_overrides};
    int rc;
    if (o.tp > 1) {
        dsv4_tp_runner_opts to = {.tp_size = o.tp};
        rc = dsv4_tp_runner_open(o.dir, &mo, &lo, &to, &tp, &err);
    } else {
        rc = dsv4_model_runner_open_ex(o.dir, &mo, &lo, &mr, &err);
    }
    if (rc) {
        fprintf(stderr, "dsv4 perf: %s: %s\n", dsv4_status_name(rc), err.msg);
        return 1;
    }
    cfg = tp ? dsv4_tp_runner_config(tp) : dsv4_model_runner_config(mr);
    perf_target tgt = {.tp = tp};
    if (!tp) dsv4_model_runner_target(mr, &tgt.m, &tgt.st);
    /* paged state (the engine's pool): map every slot's pages, as the engine
     * would for requests of max_len positions (the pool is sized for that) */
    dsv4_runner run = tp ? dsv4_tp_runner_iface(tp) : dsv4_model_runner_iface(mr);
    if (run.page_tokens > 0 && run.set_pages) {
        int per = (int)((max_len + run.page_tokens - 1) / run.page_tokens);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(per > 0 ? per : 1));
        if (!ids) rc = dsv4_err_set(&err, DSV4_ENOMEM, "out of memory");
        for (int s = 0; s < max_b && !rc; s++) {
            for (int j = 0; j < per; j++) ids[j] = s * per + j;
            if ((int64_t)(s + 1) * per > run.n_pages)
                rc = dsv4_err_set(&err, DSV4_ERANGE, "state pool of %d pages < %d slots x %d", run.n_pages, max_b, per);
            else rc = run.set_pages(run.ctx, s, per, ids, &err);
        }
        free(ids);
    }
    dsv4_backend *be0 = tp ? dsv4_tp_runner_backend(tp, 0) : dsv4_model_runner_backend(mr);
    printf("# dsv4 perf: %s%s on %s%s, %d layers, context %lld, %d steps (+%d warmup), load %.1f s\n", o.dir,
           lo.dummy ? " (dummy weights)" : "", be0 ? be0->name : "?", tp ? " (rank 0 of a tensor-parallel group)" : "",
           cfg->num_hidden_layers, (long long)o.context, o.steps, o.warmup, now_s() - t0);
    if (tp)
        printf("# tensor parallel %d: every step runs on all ranks (2 all-reduces per layer + the logit all-gather);"
               " roofline_ms is one GPU's share (split weights / %d, replicated weights and state whole)\n",
               o.tp, o.tp);
    /* state bytes per element for the roofline: 4 / 2 / ~1 (fp8_ds_mla: 584 bytes per 512 values; index keys
     * are F32 but counted at the same width, a small undercount) */
    const int state_eb = kvt == DSV4_KV_F32 ? 4 : kvt == DSV4_KV_BF16 ? 2 : 1;
    printf("# kv cache dtype %s: %lld bytes per stored row of %d values; state pool %d pages of %d tokens "
           "(%lld bytes each)\n", dsv4_kv_dtype_name(kvt),
           (long long)dsv4_kvcodec_row_bytes(kvt, cfg->head_dim, cfg->qk_rope_head_dim), cfg->head_dim, run.n_pages,
           run.page_tokens, (long long)run.page_bytes);
    printf("# roofline = (dense weights once + expected distinct routed experts + gathered rows + state read at %d "
           "bytes / value) / %.2f TB/s (%s)\n", state_eb, hbm_bps / 1e12, hbm_src);
    if (tp && o.out_ids) { /* the TP runner returns full logits only */
        if (!o.out_full) {
            fprintf(stderr, "dsv4 perf: --logits ids: tensor parallelism returns full logits only\n");
            dsv4_tp_runner_free(tp);
            return 2;
        }
        o.out_ids = 0;
    }
    printf("# D2H_MB per step: out=full reads every row's logits back (sampled / constrained / logprob steps),\n"
           "# out=ids only each row's greedy id (all-greedy steps: argmax on the %s backend)\n",
           be0 ? be0->name : "?");
    printf("%-6s %-5s %-6s %10s %12s %10s %12s %8s %10s %s\n", "batch", "rows", "T", "ms/step", "rows/s", "GB/step",
           "roofline_ms", "ratio", "D2H_MB", "out");
    /* one GPU's bytes under TP: the split dims (heads, output groups, expert widths, the
     * vocabulary-parallel head) divided as src/parallel/tp_shard.c splits them */
    dsv4_config lc = *cfg;
    if (tp) {
        lc.num_attention_heads /= o.tp;
        lc.o_groups /= o.tp;
        lc.moe_intermediate_size /= o.tp;
        if (lc.vocab_size % o.tp == 0) lc.vocab_size /= o.tp;
    }
    if (tp && o.ar_bench) { /* the collective alone, both paths, one row = hidden_size elements */
        static const struct {
            int rows;
            dsv4_dtype dt;
        } ar[] = {{1, DSV4_DT_F32},  {6, DSV4_DT_F32},  {8, DSV4_DT_F32},   {48, DSV4_DT_F32}, {64, DSV4_DT_F32},
                  {384, DSV4_DT_F32}, {1, DSV4_DT_BF16}, {8, DSV4_DT_BF16}, {64, DSV4_DT_BF16}};
        printf("# all-reduce of [rows][%d] over %d ranks: mean us per call of the slowest rank, 200 back-to-back "
               "host launches (eager) and replays of a CUDA graph of 50 calls (graph); check: both paths' results "
               "bit-identical to the host rank-order sum (1 eager call + 2 graph replays) and across ranks\n",
               cfg->hidden_size, o.tp);
        printf("%-5s %-6s %9s %10s %11s %10s %11s %s\n", "dtype", "rows", "KB", "nccl_us", "oneshot_us",
               "nccl_graph", "os_graph", "check");
        int all_pass = 1;
        for (size_t i = 0; i < sizeof ar / sizeof ar[0] && !rc; i++) {
            dsv4_tp_ar_result rn, ro;
            double kb = ar[i].rows * cfg->hidden_size * (ar[i].dt == DSV4_DT_BF16 ? 2 : 4) / 1024.0;
            rc = dsv4_tp_runner_bench_all_reduce(tp, ar[i].rows, cfg->hidden_size, ar[i].dt, 200, 0, &rn, &err);
            if (!rc) rc = dsv4_tp_runner_bench_all_reduce(tp, ar[i].rows, cfg->hidden_size, ar[i].dt, 200, 1, &ro, &err);
            if (rc) break;
            int pass = !rn.bad && !ro.bad && rn.ranks_equal && ro.ranks_equal && rn.hash == ro.hash;
            all_pass &= pass;
            char os_e[32] = "-", os_g[32] = "-";
            if (ro.used_oneshot) {
                snprintf(os_e, sizeof os_e, "%.2f", ro.us_eager);
                snprintf(os_g, sizeof os_g, "%.2f", ro.us_graph);
            }
            printf("%-5s %-6d %9.1f %10.2f %11s %10.2f %11s %s (%lld/%lld wrong, ranks %s)\n", dsv4_dtype_name(ar[i].dt),
                   ar[i].rows, kb, rn.us_eager, os_e, rn.us_graph, os_g, pass ? "PASS" : "FAIL",
                   (long long)(rn.bad + ro.bad), (long long)(rn.checked + ro.checked),
                   rn.ranks_equal && ro.ranks_equal ? "equal" : "DIFFER");
        }
        if (!rc) printf("all-reduce check: %s\n", all_pass ? "PASS" : "FAIL");
        if (!rc && !all_pass) rc = dsv4_err_set(&err, DSV4_EINTERNAL, "all-reduce check failed");
        fflush(stdout);
    }
    size_t logit_cap = (size_t)max_b * (size_t)max_r;
    float *logits = malloc(sizeof(float) * logit_cap * (size_t)cfg->vocab_size);
    int32_t *ids = malloc(sizeof(int32_t) * logit_cap);
    if (!logits || !ids) rc = dsv4_err_set(&err, DSV4_ENOMEM, "out of memory for logits");
    if (!rc && o.out_ids && !(be0 && be0->logit_top))
        rc = dsv4_err_set(&err, DSV4_EUNSUPPORTED, "--logits ids: the %s backend has no logit_top",
                          be0 ? be0->name : "?");
    for (int ri = 0; ri < o.n_rows && !rc; ri++)
        for (int bi = 0; bi < o.n_batch && !rc; bi++)
            for (int mode = 0; mode < 2 && !rc; mode++) {
                if (!(mode ? o.out_ids : o.out_full)) continue;
                int B = o.batch[bi], R = o.rows[ri];
                perf_batch pb;
                if (batch_make(&pb, B, R, o.context, cfg->vocab_size, 0)) {
                    rc = dsv4_err_set(&err, DSV4_ENOMEM, "out of memory for the batch");
                    break;
                }
                double ms = 0;
                rc = time_steps(&tgt, &pb, o.warmup, o.steps, logits, mode ? ids : NULL, &ms, &err);
                dsv4_step_bytes sb;
                if (!rc) rc = dsv4_step_bytes_compute(&lc, B, R, o.context, state_eb, &sb, &err);
                if (!rc) {
                    double roof = sb.total / hbm_bps * 1e3;
                    double d2h = (double)B * R * (mode ? 4.0 : 4.0 * cfg->vocab_size) / 1e6;
                    printf("%-6d %-5d %-6d %10.3f %12.1f %10.4g %12.6g %8.2f %10.6g %s\n", B, R, B * R, ms,
                           B * R / (ms * 1e-3), sb.total / 1e9, roof, ms / roof, d2h, mode ? "ids" : "full");
                    fflush(stdout);
                }
                batch_free(&pb);
            }
    for (int pi = 0; pi < o.n_prefill && !rc; pi++) rc = time_prefill(&tgt, &o, o.prefill[pi], cfg, logits, &err);
    if (rc) fprintf(stderr, "dsv4 perf: %s: %s\n", dsv4_status_name(rc), err.msg);
    free(logits);
    free(ids);
    dsv4_model_runner_free(mr);
    dsv4_tp_runner_free(tp);
    return rc ? 1 : 0;
}
