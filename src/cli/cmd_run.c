/*
 * dsv4 run — greedy generation for one prompt (CPU reference backend, or the
 * CUDA backend with --device cuda / auto).
 *
 * The whole path a request takes, without the server: checkpoint (strict
 * binder) → prompt encoder (chat template, thinking resolved once) →
 * tokenizer → the engine (the same step loop the server uses, with DSpark or
 * MTP speculation when asked) → incremental byte output, then timing and
 * speculative statistics (accepted length, per-position acceptance) on
 * stderr. It exists to run the reference model by hand and as the end-to-end
 * smoke test of issues 4 and 5; it is not fast.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>
#include <unistd.h>

#include "model/kvcodec.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "parallel/multinode.h"
#include "parallel/tp_runner.h"
#include "text/encoder.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 run [MODEL_DIR] --prompt TEXT [options]\n"
            "Generate text greedily for one prompt.\n"
            "MODEL_DIR defaults to the embedded default model (%s).\n"
            "  --prompt TEXT        user message (rendered with the checkpoint's chat encoder)\n"
            "  --raw                tokenize TEXT as is (no chat template, no BOS)\n"
            "  --prompt-ids LIST    the prompt as token ids (e.g. 0,17,42) instead of --prompt; works\n"
            "                       without a tokenizer.json (generated ids are then printed as [id])\n"
            "  --max-tokens N       tokens to generate (default 32)\n"
            "  --thinking           render with thinking mode on (default off)\n"
            "  --numerics MODE      reference (official QAT numerics, default) or hf (transformers)\n"
            "  --spec K             speculate K tokens per step with the checkpoint's drafter\n"
            "                       (DSpark stages: K <= dspark_block_size; MTP block: K = 1)\n"
            "  --show-ids           print the prompt and generated token ids to stderr\n"
            "  --kv-cache-dtype T   auto (fp8_ds_mla on the GPU, f32 on the CPU) | f32 | bf16 | fp8_ds_mla (fp8):\n"
            "                       how window and compressed KV rows are stored (vLLM's flag)\n"
            "  --device D           auto (default: CUDA when built with it and a GPU answers, else cpu),\n"
            "                       cpu (the reference backend) or cuda\n"
            "  --enforce-eager      no CUDA graphs (default: decode / verify steps replay CUDA graphs\n"
            "                       captured per batch shape)\n"
            "  --load-format F      auto | safetensors | dummy (random weights, real shapes: MODEL_DIR\n"
            "                       needs only config.json; no tokenizer.json -> the default model's)\n"
            "  --hf-overrides JSON  merged over config.json, e.g. '{\"num_hidden_layers\": 8}'\n"
            "  --tensor-parallel-size N, -tp N\n"
            "                       split the model over N ranks in this process: GPUs 0..N-1 with\n"
            "                       --device cuda (NCCL), CPU threads with --device cpu\n"
            "                       (DSV4_TP_CHECK_RANKS=1: every step checks the ranks' logits agree)\n"
            "  --nnodes N --node-rank R --master-addr A --master-port P\n"
            "                       -tp is the total: -tp/N ranks per node (GPUs 0.. with --device cuda,\n"
            "                       else CPU threads); start every node with the same arguments\n"
            "                       but --node-rank; node 0 prints the generation, the others follow it\n",
            dsv4_default_model_dir());
}

typedef struct run_opts {
    const char *dir, *prompt, *prompt_ids;
    const char *hf_overrides, *tok_dir, *enc_dir;
    int dummy;
    int raw, max_tokens, thinking, show_ids, spec_k, cuda_graphs, tp;
    int nnodes, node_rank, master_port; /* multi-node (src/parallel/multinode.h) */
    const char *master_addr;
    const char *kv_cache_dtype; /* --kv-cache-dtype (kvcodec.h); NULL = auto: fp8_ds_mla on the GPU, f32 on the CPU */
    dsv4_numerics numerics;
    dsv4_device device;
} run_opts;

static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 32;
    o->numerics = DSV4_NUMERICS_REFERENCE;
    o->device = DSV4_DEVICE_AUTO;
    o->cuda_graphs = 1;
    o->tp = 1;
    o->nnodes = 1;
    o->master_addr = "127.0.0.1";
    o->master_port = 29500;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            o->prompt = argv[++i];
        } else if (!strcmp(a, "--max-tokens") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1000000) {
                fprintf(stderr, "dsv4 run: --max-tokens: '%s' is not a count\n", argv[i]);
                return 2;
            }
            o->max_tokens = (int)v;
        } else if (!strcmp(a, "--numerics") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "reference")) o->numerics = DSV4_NUMERICS_REFERENCE;
            else if (!strcmp(m, "hf")) o->numerics = DSV4_NUMERICS_HF;
            else {
                fprintf(stderr, "dsv4 run: --numerics: '%s' (expected reference or hf)\n", m);
                return 2;
            }
        } else if (!strcmp(a, "--spec") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > DSV4_MAX_SPEC_K) {
                fprintf(stderr, "dsv4 run: --spec: '%s' is not a draft count in [0, %d]\n", argv[i], DSV4_MAX_SPEC_K);
                return 2;
            }
            o->spec_k = (int)v;
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            dsv4_err e = {0};
            if (dsv4_device_parse(argv[++i], &o->device, &e)) {
                fprintf(stderr, "dsv4 run: %s\n", e.msg);
                return 2;
            }
        } else if (!strcmp(a, "--kv-cache-dtype") && i + 1 < argc) {
            dsv4_err e = {0};
            dsv4_kv_dtype t;
            if (dsv4_kv_dtype_parse(argv[++i], &t, &e)) {
                fprintf(stderr, "dsv4 run: --kv-cache-dtype: %s\n", e.msg);
                return 2;
            }
            o->kv_cache_dtype = argv[i];
        } else if ((!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 64) {
                fprintf(stderr, "dsv4 run: %s: '%s' is not a rank count in [1, 64]\n", a, argv[i]);
                return 2;
            }
            o->tp = (int)v;
        } else if ((!strcmp(a, "--nnodes") || !strcmp(a, "--node-rank") || !strcmp(a, "--master-port")) &&
                   i + 1 < argc) {
            int is_nn = !strcmp(a, "--nnodes"), is_port = !strcmp(a, "--master-port");
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < (is_nn || is_port ? 1 : 0) || v > (is_port ? 65535 : 1023)) {
                fprintf(stderr, "dsv4 run: %s: '%s' is out of range\n", a, argv[i]);
                return 2;
            }
            *(is_nn ? &o->nnodes : is_port ? &o->master_port : &o->node_rank) = (int)v;
        } else if (!strcmp(a, "--master-addr") && i + 1 < argc) {
            o->master_addr = argv[++i];
        } else if (!strcmp(a, "--prompt-ids") && i + 1 < argc) {
            o->prompt_ids = argv[++i];
        } else if (!strcmp(a, "--load-format") && i + 1 < argc) {
            const char *f = argv[++i];
            if (strcmp(f, "auto") && strcmp(f, "safetensors") && strcmp(f, "dummy")) {
                fprintf(stderr, "dsv4 run: --load-format: '%s' (expected auto, safetensors or dummy)\n", f);
                return 2;
            }
            o->dummy = !strcmp(f, "dummy");
        } else if (!strcmp(a, "--hf-overrides") && i + 1 < argc) {
            o->hf_overrides = argv[++i];
        } else if (!strcmp(a, "--raw")) {
            o->raw = 1;
        } else if (!strcmp(a, "--thinking")) {
            o->thinking = 1;
        } else if (!strcmp(a, "--show-ids")) {
            o->show_ids = 1;
        } else if (!strcmp(a, "--cuda-graphs") || !strcmp(a, "--enforce-eager")) {
            o->cuda_graphs = a[2] == 'c';
        } else if (a[0] != '-' && !o->dir) {
            o->dir = a;
        } else {
            fprintf(stderr, "dsv4 run: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->prompt == !o->prompt_ids) {
        fprintf(stderr, "dsv4 run: --prompt is required (or --prompt-ids, not both; see --help)\n");
        return 2;
    }
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "dsv4 run: --node-rank %d must be less than --nnodes %d\n", o->node_rank, o->nnodes);
        return 2;
    }
    if (o->nnodes > 1 && o->tp % o->nnodes) { /* every node, before the rendezvous: a follower would wait */
        fprintf(stderr, "dsv4 run: --tensor-parallel-size %d with --nnodes %d: -tp is the total over the nodes, "
                        "-tp / --nnodes ranks on each, so give a multiple of %d (e.g. -tp %d)\n",
                o->tp, o->nnodes, o->nnodes, o->nnodes);
        return 2;
    }
    if (!o->dir) o->dir = dsv4_default_model_dir();
    dsv4_cli_text_dirs(o->dir, o->dummy, &o->tok_dir, &o->enc_dir);
    return 0;
}

/* --prompt-ids "a,b,c" -> ids. */
static int parse_ids(const char *s, dsv4_tokvec *ids, dsv4_err *err) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    if (!(ids->ids = malloc(sizeof(int32_t) * cap))) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    ids->cap = cap;
    ids->n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end && *end != ','))
            return dsv4_err_set(err, DSV4_EINVAL, "--prompt-ids: '%s' is not a list of token ids", s);
        ids->ids[ids->n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return DSV4_OK;
}

/* Prompt ids: given, chat-encoded (the server's path) or the raw text. */
static int prompt_ids(const run_opts *o, const dsv4_tokenizer *tok, dsv4_tokvec *ids, dsv4_err *err) {
    if (o->prompt_ids) return parse_ids(o->prompt_ids, ids, err);
    if (o->raw) return dsv4_tokenizer_encode(tok, o->prompt, strlen(o->prompt), 0, ids, err);
    dsv4_effort_profile prof;
    int rc = dsv4_encoder_detect_profile(o->enc_dir, DSV4_PROFILE_AUTO, &prof, err);
    if (rc) return rc;
    cJSON *body = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(body, "messages"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", o->prompt);
    cJSON_AddItemToArray(msgs, m);
    if (o->thinking) {
        cJSON *kw = cJSON_AddObjectToObject(body, "chat_template_kwargs");
        cJSON_AddTrueToObject(kw, "thinking");
    }
    dsv4_encoder_config ec;
    dsv4_encoder_config_init(&ec, prof);
    dsv4_thinking th;
    dsv4_prompt pr = {0};
    rc = dsv4_encoder_build_chat(body, NULL, 0, &ec, tok, &th, &pr, ids, err);
    dsv4_prompt_free(&pr);
    cJSON_Delete(body);
    return rc;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Timing and, with speculation, the acceptance statistics of spec/DSPARK.md §5.7. */
static void print_stats(const dsv4_engine_stats *st, int n_prompt, int n_gen, double secs, int k) {
    fprintf(stderr, "\nprompt %d tokens, generated %d tokens in %.2f s (%.2f tok/s), %llu engine steps\n", n_prompt,
            n_gen, secs, secs > 0 ? n_gen / secs : 0.0, (unsigned long long)st->steps);
    if (!k) return;
    double drafts = (double)st->spec_drafts;
    fprintf(stderr, "speculative: %llu verify steps, %llu drafted, %llu accepted (acceptance %.1f%%), "
                    "mean accepted length %.2f tokens/step\n",
            (unsigned long long)st->spec_drafts, (unsigned long long)st->spec_draft_tokens,
            (unsigned long long)st->spec_accepted_tokens,
            st->spec_draft_tokens ? 100.0 * (double)st->spec_accepted_tokens / (double)st->spec_draft_tokens : 0.0,
            drafts ? 1.0 + (double)st->spec_accepted_tokens / drafts : 0.0);
    fprintf(stderr, "per-position acceptance:");
    for (int i = 0; i < k; i++)
        fprintf(stderr, " %.3f", drafts ? (double)st->spec_accepted_per_pos[i] / drafts : 0.0);
    fputc('\n', stderr);
    fprintf(stderr, "drafting %.1f ms, verify steps %.1f ms (%.2f ms per draft, %.2f ms per verify step)\n",
            1e3 * st->spec_draft_seconds, 1e3 * st->spec_verify_seconds,
            drafts ? 1e3 * st->spec_draft_seconds / drafts : 0.0, drafts ? 1e3 * st->spec_verify_seconds / drafts : 0.0);
}

int dsv4_cmd_run(int argc, char **argv) {
    run_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc < 0 ? 0 : prc;
    dsv4_err err = {0};
    dsv4_tokenizer *tok = NULL;
    dsv4_tokvec ids = {0};
    dsv4_model_runner *mr = NULL;
    dsv4_tp_runner *tp = NULL;
    dsv4_multinode *mn = NULL;
    dsv4_runner mn_run = {0};
    int follower = 0;
    dsv4_engine *e = NULL;
    dsv4_request *r = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", o.tok_dir);
    int rc = 0;
    /* with --prompt-ids the tokenizer only renders the output: optional */
    if (!o.prompt_ids || access(path, R_OK) == 0) rc = dsv4_tokenizer_load(path, &tok, &err);
    if (!rc) rc = prompt_ids(&o, tok, &ids, &err);
    if (!rc && ids.n == 0) rc = dsv4_err_set(&err, DSV4_EINVAL, "run: the prompt has no tokens");
    int max_len = (int)ids.n + o.max_tokens + o.spec_k + 2;
    if (!rc) {
        dsv4_kv_dtype kvt = DSV4_KV_F32;
        int gpu = dsv4_device_is_gpu((dsv4_device)o.device);
        dsv4_kv_dtype_parse_for(o.kv_cache_dtype, gpu, &kvt, NULL); /* validated by parse_args */
        dsv4_model_runner_opts mo = {.n_slots = 1, .max_len = max_len, .max_spec = o.spec_k, .numerics = o.numerics,
                                     .device = o.device, .cuda_graphs = o.cuda_graphs, .kv_dtype = (int)kvt};
        dsv4_load_opts lo = {.dummy = o.dummy, .hf_overrides = o.hf_overrides};
        if (o.nnodes > 1) { /* -tp / --nnodes ranks per node (src/parallel/multinode.h) */
            dsv4_multinode_opts mno = {.master_addr = o.master_addr, .master_port = o.master_port,
                                       .nnodes = o.nnodes, .node_rank = o.node_rank, .tp_size = o.tp,
                                       .model_dir = o.dir, .hf_overrides = o.hf_overrides,
                                       .use_nccl = o.device == DSV4_DEVICE_CUDA,
                                       .timeout_s = getenv("DSV4_RDV_TIMEOUT_S") ? atof(getenv("DSV4_RDV_TIMEOUT_S")) : 0};
            rc = dsv4_multinode_join(&mno, &mn, &err);
            if (!rc && o.node_rank > 0) { /* a follower: node 0 prints the generation */
                rc = dsv4_multinode_follow(mn, o.dir, &mo, &lo, &err);
                follower = 1;
            } else if (!rc) {
                rc = dsv4_multinode_open_leader(mn, o.dir, &mo, &lo, &mr, &mn_run, &err);
            }
        } else if (o.tp > 1) { /* ranks as threads of this process (src/parallel/tp_runner.h) */
            dsv4_tp_runner_opts to = {.tp_size = o.tp};
            rc = dsv4_tp_runner_open(o.dir, &mo, &lo, &to, &tp, &err);
        } else {
            rc = dsv4_model_runner_open_ex(o.dir, &mo, &lo, &mr, &err);
        }
    }
    if (follower) rc = rc ? rc : -1; /* done: skip the generation */
    dsv4_drafter dr;
    int has_drafter = 0;
    if (!rc && o.spec_k > 0 &&
        !(has_drafter = tp ? dsv4_tp_runner_drafter(tp, &dr)
                           : mr ? dsv4_model_runner_drafter(mr, &dr) : dsv4_multinode_drafter(mn, &dr)))
        rc = dsv4_err_set(&err, DSV4_EINVAL, "--spec: %s has neither DSpark draft stages nor an MTP block", o.dir);
    if (!rc) {
        dsv4_runner run = mn ? mn_run : tp ? dsv4_tp_runner_iface(tp) : dsv4_model_runner_iface(mr);
        const dsv4_config *cfg = tp ? dsv4_tp_runner_config(tp) : mr ? dsv4_model_runner_config(mr) : dsv4_multinode_config(mn);
        dsv4_engine_opts eo = {1, max_len, max_len, o.spec_k, cfg->eos_token_id, {{0}}, 0, 0}; /* one prompt per run: nothing to cache */
        rc = dsv4_engine_create(&eo, &run, has_drafter ? &dr : NULL, &e, &err);
    }
    if (!rc && o.show_ids) {
        fprintf(stderr, "prompt ids (%zu):", ids.n);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
        fputc('\n', stderr);
    }
    int n_gen = 0;
    double t0 = now_s();
    if (!rc && o.max_tokens > 0) {
        dsv4_gen_params gp;
        dsv4_gen_params_default(&gp);
        gp.sampling.temperature = 0;
        gp.max_tokens = o.max_tokens;
        rc = dsv4_engine_submit(e, ids.ids, (int)ids.n, &gp, &r, &err);
    }
    dsv4_finish fin = r ? DSV4_FINISH_NONE : DSV4_FINISH_STOP;
    while (!rc && fin == DSV4_FINISH_NONE) {
        if (dsv4_engine_step(e, &err) < 0) {
            rc = err.code ? err.code : DSV4_EINTERNAL;
            break;
        }
        int32_t got[DSV4_MAX_SPEC_K + 1];
        int n;
        while ((n = dsv4_request_poll(r, got, DSV4_MAX_SPEC_K + 1, &fin, 0)) > 0)
            for (int i = 0; i < n; i++) {
                size_t len = 0;
                const char *bytes = tok ? dsv4_tokenizer_token_bytes(tok, got[i], &len) : NULL;
                if (bytes) fwrite(bytes, 1, len, stdout);
                else if (!tok) printf("[%d]", got[i]);
                if (o.show_ids) fprintf(stderr, "[%d]", got[i]);
                n_gen++;
            }
        fflush(stdout);
        if (fin == DSV4_FINISH_ERROR) rc = dsv4_err_set(&err, DSV4_EBACKEND, "run: the forward failed (see above)");
    }
    if (!rc) {
        putchar('\n');
        dsv4_engine_stats st;
        dsv4_engine_get_stats(e, &st);
        print_stats(&st, (int)ids.n, n_gen, now_s() - t0, o.spec_k);
    }
    if (rc == -1) rc = 0; /* a follower whose leader quit */
    if (rc) fprintf(stderr, "dsv4 run: %s: %s\n", dsv4_status_name(rc), err.msg);
    dsv4_request_release(r);
    dsv4_engine_free(e);
    dsv4_multinode_stop(mn); /* the followers exit */
    dsv4_model_runner_free(mr);
    dsv4_tp_runner_free(tp);
    dsv4_tokvec_free(&ids);
    dsv4_tokenizer_free(tok);
    dsv4_multinode_free(mn);
    return rc ? 1 : 0;
}
