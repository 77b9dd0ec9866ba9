/* `dsv4 serve` flag parsing (src/cli/serve_args.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/serve_args.h"
#include "engine/model_runner.h"
#include "model/kvcodec.h"

/* vLLM flags that dsv4 accepts and ignores, because it always behaves the way
 * the seed launchers ask (spec/SERVING.md §0.2). has_value: takes an argument. */
static const struct { const char *name; int has_value; const char *why; } ignored_flags[] = {
    {"--tokenizer-mode", 1, "the DeepSeek-V4 encoder is built in"},
    {"--reasoning-parser", 1, "the deepseek_v4 reasoning parser is built in"},
    {"--reasoning-config", 1, "reasoning is delimited by <think>/</think>"},
    {"--tool-call-parser", 1, "the DSML tool-call parser is built in"},
    {"--enable-auto-tool-choice", 0, "tool calls are always parsed when tools are given"},
    {"--generation-config", 1, "client sampling parameters always win (SERVING.md §7.1)"},
    {"--enable-chunked-prefill", 0, "prefill is always chunked"},
    {"--async-scheduling", 0, "the scheduler is always asynchronous to HTTP"},
    {"--trust-remote-code", 0, "no remote code is ever run"},
    {"--dtype", 1, "activations are bf16 as in the reference"},
    {"--disable-log-requests", 0, "requests are not logged by default"},
    {"--disable-log-stats", 0, "stats are exported on /metrics"},
    {"--uvicorn-log-level", 1, "not a Python server"},
    {"--disable-uvicorn-access-log", 0, "not a Python server"},
    {"--max-log-len", 1, "requests are not logged by default"},
    {"--tokenizer", 1, "the checkpoint's tokenizer.json is used"},
    {"--seed", 1, "sampling is seeded per request (the `seed` field); unseeded requests get fresh seeds"},
    {"--quantization", 1, "the number formats are read from the checkpoint's config and tensors"},
    {"--max-logprobs", 1, "top_logprobs is capped at 20 (chat) and legacy logprobs at 5 (completions), OpenAI's limits"},
    {"--swap-space", 1, "preempted requests are recomputed, never swapped to host memory"},
    {"--enable-expert-parallel", 0, "experts are split by their intermediate width under tensor parallelism"},
};

static int parse_int(const char *flag, const char *v, long lo, long hi, int *out, dsv4_err *err) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not an integer in [%ld, %ld]", flag, v, lo, hi);
    *out = (int)x;
    return 0;
}

/*
 * --max-model-len as vLLM's human_readable_int: a whole number, or a number with a suffix
 * k/m/g (x 1000^n, decimals allowed: 25.6k = 25600) or K/M/G (x 1024^n, whole numbers only:
 * 128K = 131072), so a launcher's `--max-model-len 128k` works. auto / -1 are handled by the
 * caller. At least 2 tokens (one prompt token and one generated), at most 1048576.
 */
static int parse_model_len(const char *flag, const char *v, int *out, dsv4_err *err) {
    const char *p = v, *q;
    while (*p == ' ') p++;
    for (q = p; *q >= '0' && *q <= '9'; q++) {}
    const char *int_end = q; /* digits of the whole part */
    int frac = *q == '.';
    if (frac)
        for (q++; *q >= '0' && *q <= '9'; q++) {}
    const char *num_end = q;
    char suf = *q && strchr("kmgKMG", *q) ? *q++ : 0;
    while (*q == ' ') q++;
    double mult = suf == 'k' ? 1e3 : suf == 'm' ? 1e6 : suf == 'g' ? 1e9
                : suf == 'K' ? 1024.0 : suf == 'M' ? 1048576.0 : suf == 'G' ? 1073741824.0 : 1;
    int ok = int_end > p && !*q && (!frac || num_end > int_end + 1);
    if (ok && frac && (!suf || (suf >= 'A' && suf <= 'Z'))) {
        if (suf) /* vLLM: "Decimals are not allowed with binary suffixes" */
            return dsv4_err_set(err, DSV4_EINVAL,
                                "%s: '%s': decimals are not allowed with the binary suffix %c (as vLLM); did you "
                                "mean %.*s%c?",
                                flag, v, suf, (int)(num_end - p), p, suf + ('a' - 'A'));
        ok = 0; /* a plain number is whole (Python's int()) */
    }
    double x = ok ? strtod(p, NULL) * mult : 0;
    x = (double)(long long)(x < 4e9 ? x : 4e9); /* vLLM: int(float(number) * mult) */
    if (!ok || x < 2 || x > 1048576)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "%s: '%s' is not a length in [2, 1048576] tokens (e.g. 8192, 32k, 128K), nor auto / -1 "
                            "(the model's maximum, lowered to what the KV pool holds)",
                            flag, v);
    *out = (int)x;
    return 0;
}

/* A list of sizes: "1,2,4", "[1, 2, 4]" or "1 2 4" (separators: comma, space, brackets). */
static int parse_size_list(const char *flag, const char *v, dsv4_serve_args *a, int *given, dsv4_err *err) {
    const char *p = v;
    while (*p) {
        if (*p == ',' || *p == ' ' || *p == '[' || *p == ']') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 65536) {
            /* name the item at fault: the word up to the next separator */
            size_t n = strcspn(p, ", []");
            return dsv4_err_set(err, DSV4_EINVAL, "%s: '%.*s' is not a batch size in [1, 65536] (sequences per step)",
                                flag, (int)(n > 40 ? 40 : n), p);
        }
        if (a->n_graph_sizes >= (int)(sizeof a->graph_sizes / sizeof a->graph_sizes[0]))
            return dsv4_err_set(err, DSV4_EINVAL, "%s: more than %d sizes", flag,
                                (int)(sizeof a->graph_sizes / sizeof a->graph_sizes[0]));
        a->graph_sizes[a->n_graph_sizes++] = (int)x;
        p = end;
    }
    *given = 1;
    return 0;
}

/* compilation_config keys that only concern vLLM's torch.compile: accepted, no effect here */
static const char *const cc_ignored[] = {"level", "mode", "backend", "use_inductor", "custom_ops", "splitting_ops",
                                         "compile_sizes", "inductor_compile_config", "inductor_passes", "pass_config",
                                         "cudagraph_num_of_warmups", "cudagraph_copy_inputs", "full_cuda_graph",
                                         "debug_dump_path", "cache_dir", "use_cudagraph", "compile_mm_encoder",
                                         "cudagraph_specialize_lora", "use_inductor_graph_partition"};

/* One compilation_config key (from the JSON object or -O.KEY=VALUE). */
static int cc_key(const char *key, const cJSON *v, dsv4_serve_args *a, int *sizes_cc, int *max_cc, dsv4_err *err) {
    if (!strcmp(key, "cudagraph_capture_sizes")) {
        if (!cJSON_IsArray(v))
            return dsv4_err_set(err, DSV4_EINVAL, "--compilation-config: cudagraph_capture_sizes must be a list of "
                                                  "batch sizes, e.g. [1, 2, 4, 8]");
        a->n_graph_sizes = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int)e->valuedouble || e->valuedouble < 1 ||
                e->valuedouble > 65536)
                return dsv4_err_set(err, DSV4_EINVAL,
                                    "--compilation-config: cudagraph_capture_sizes holds a value that is not a "
                                    "positive batch size");
            if (a->n_graph_sizes >= (int)(sizeof a->graph_sizes / sizeof a->graph_sizes[0]))
                return dsv4_err_set(err, DSV4_EINVAL, "--compilation-config: cudagraph_capture_sizes: more than %d",
                                    (int)(sizeof a->graph_sizes / sizeof a->graph_sizes[0]));
            a->graph_sizes[a->n_graph_sizes++] = (int)e->valuedouble;
        }
        *sizes_cc = 1;
        return 0;
    }
    if (!strcmp(key, "max_cudagraph_capture_size")) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < 1 ||
            v->valuedouble > 65536)
            return dsv4_err_set(err, DSV4_EINVAL,
                                "--compilation-config: max_cudagraph_capture_size must be a positive integer");
        a->max_graph_size = (int)v->valuedouble;
        *max_cc = 1;
        return 0;
    }
    if (!strcmp(key, "cudagraph_mode")) {
        static const char *const modes[] = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"};
        const char *m = cJSON_IsString(v) ? v->valuestring : NULL;
        int ok = 0;
        for (size_t i = 0; m && i < sizeof modes / sizeof modes[0]; i++) ok |= !strcmp(m, modes[i]);
        if (!ok) {
            char *got = cJSON_PrintUnformatted(v); /* name the value given, whatever its JSON type */
            int rc = dsv4_err_set(err, DSV4_EINVAL,
                                  "--compilation-config: cudagraph_mode %.40s is not one of NONE, PIECEWISE, FULL, "
                                  "FULL_DECODE_ONLY, FULL_AND_PIECEWISE", got ? got : "?");
            cJSON_free(got);
            return rc;
        }
        a->cudagraph_mode_none = !strcmp(m, "NONE");
        a->cudagraph_mode_graphs = !a->cudagraph_mode_none;
        if (!a->cudagraph_mode_none && strcmp(m, "FULL_DECODE_ONLY"))
            dsv4_log(DSV4_LOG_INFO, "--compilation-config: cudagraph_mode %s: dsv4 captures whole decode / verify "
                                    "steps (FULL_DECODE_ONLY); mixed prefill steps run eagerly", m);
        return 0;
    }
    for (size_t i = 0; i < sizeof cc_ignored / sizeof cc_ignored[0]; i++)
        if (!strcmp(key, cc_ignored[i])) {
            dsv4_log(DSV4_LOG_INFO, "--compilation-config: %s ignored: kernels are compiled ahead of time", key);
            return 0;
        }
    return dsv4_err_set(err, DSV4_EINVAL,
                        "--compilation-config: unknown key '%s' (dsv4 reads cudagraph_capture_sizes, "
                        "max_cudagraph_capture_size and cudagraph_mode)", key);
}

/* --compilation-config / -O: a JSON object, an optimisation level (-O3: ignored), or KEY=VALUE after "-O." */
static int parse_compilation_config(const char *flag, const char *val, const char *dotted_key, dsv4_serve_args *a,
                                    int *sizes_cc, int *max_cc, dsv4_err *err) {
    /* require_null_terminated: '{...} trailing' is an error, not the first object alone */
    cJSON *j = cJSON_ParseWithOpts(val, NULL, 1);
    int rc = 0;
    if (dotted_key) { /* -O.max_cudagraph_capture_size=64, -O.cudagraph_capture_sizes=[1,2,4], -O.cudagraph_mode=NONE */
        if (!j) j = cJSON_CreateString(val);
        rc = cc_key(dotted_key, j, a, sizes_cc, max_cc, err);
    } else if (cJSON_IsObject(j)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if ((rc = cc_key(e->string, e, a, sizes_cc, max_cc, err))) break;
        }
    } else if (cJSON_IsNumber(j)) {
        dsv4_log(DSV4_LOG_INFO, "%s %s ignored: kernels are compiled ahead of time", flag, val);
    } else {
        rc = dsv4_err_set(err, DSV4_EINVAL,
                          "%s: '%s' is not a JSON object (e.g. '{\"cudagraph_capture_sizes\": [1, 2, 4, 8]}')", flag,
                          val);
    }
    cJSON_Delete(j);
    return rc;
}

/* Add one API key; keys read from files/env are strdup'd and live until exit. */
static int add_key(dsv4_serve_args *a, const char *k, dsv4_err *err) {
    if (!*k) return 0;
    if (a->http.n_api_keys >= DSV4_SERVER_MAX_KEYS)
        return dsv4_err_set(err, DSV4_EINVAL, "--api-key: at most %d keys", DSV4_SERVER_MAX_KEYS);
    a->http.api_keys[a->http.n_api_keys++] = k;
    return 0;
}

static int keys_from_list(dsv4_serve_args *a, const char *list, const char *seps, dsv4_err *err) {
    char *copy = strdup(list), *save = NULL;
    if (!copy) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (char *t = strtok_r(copy, seps, &save); t; t = strtok_r(NULL, seps, &save)) {
        while (*t == ' ' || *t == '\t' || *t == '\r') t++;
        size_t n = strlen(t);
        while (n && (t[n - 1] == ' ' || t[n - 1] == '\t' || t[n - 1] == '\r')) t[--n] = 0;
        if (add_key(a, t, err)) return err ? err->code : DSV4_EINVAL; /* copy intentionally kept */
    }
    return 0; /* copy owns the key strings; kept for the process lifetime */
}

static int keys_from_file(dsv4_serve_args *a, const char *path, dsv4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_err_set(err, DSV4_EIO, "--api-key-file: cannot open '%s': %s", path, strerror(errno));
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return keys_from_list(a, buf, "\n", err);
}

static void usage(void) {
    printf("usage: dsv4 serve [MODEL_DIR] [flags]\n"
           "Serve MODEL_DIR (default: the embedded tiny model) over an OpenAI-compatible HTTP API.\n"
           "Flags use vLLM's names:\n"
           "  --host ADDR                   bind address (default 127.0.0.1)\n"
           "  --port N                      port (default 8888)\n"
           "  --api-key KEY [KEY...]        require Bearer keys (also --api-key-file, $DSV4_API_KEYS)\n"
           "  --served-model-name NAME...   model names (default deepseek-v4-flash-dspark)\n"
           "  --max-model-len N|auto        context length in tokens (default: the model's maximum, as vLLM:\n"
           "                                max_position_embeddings, 1048576 for V4-Flash; refused at start with\n"
           "                                the length that would fit when the KV pool cannot hold one such\n"
           "                                request; auto or -1: that maximum lowered to what the pool holds;\n"
           "                                with --nnodes, whose pools are sized per slot: 8192, auto too;\n"
           "                                vLLM's forms: 8192, 32k = 32000, 128K = 131072, 25.6k)\n"
           "  --max-num-seqs N              concurrent sequences (default 256; the CPU backend caps it at 64)\n"
           "  --max-num-batched-tokens N    tokens per engine step (default 8192)\n"
           "  --gpu-memory-utilization F    fraction of memory to use (default 0.9): caps the KV pool at F of\n"
           "                                the GPU after the weights; on the CPU (as vLLM) at F of the host\n"
           "                                memory available after the weights (MemAvailable, cgroup limit)\n"
           "  --kv-cache-dtype T            auto (fp8_ds_mla on the GPU, f32 on the CPU) | f32 | bf16 |\n"
           "                                fp8_ds_mla (= fp8, fp8_e4m3: the 584-byte record)\n"
           "  --block-size N                tokens per KV state page (default 256; a multiple of 128)\n"
           "  --num-gpu-blocks-override N   pages in the KV state pool (overrides the sizing below)\n"
           "  --kv-cache-memory-bytes B     KV state pool budget in bytes (suffix K/M/G = 2^10/2^20/2^30)\n"
           "                                The KV pool holds every sequence at max_model_len, capped by memory:\n"
           "                                these two flags set it outright; else on the CPU the environment's\n"
           "                                VLLM_CPU_KVCACHE_SPACE (whole GiB, vLLM's CPU KV cache size); else\n"
           "                                the --gpu-memory-utilization bound above\n"
           "  --tensor-parallel-size N      GPUs per model (-tp)\n"
           "  --speculative-config JSON     e.g. '{\"method\":\"dspark\",\"num_speculative_tokens\":5}'\n"
           "  --load-format F               auto | safetensors | dummy (dummy: random weights, real shapes;\n"
           "                                MODEL_DIR needs only config.json; no tokenizer.json -> the default's)\n"
           "  --hf-overrides JSON           merged over config.json, e.g. '{\"num_hidden_layers\": 8}' (with\n"
           "                                --load-format dummy: a real checkpoint has the tensors it has)\n"
           "  --enforce-eager               no CUDA-graph replay of decode/verify steps (default: graphs on CUDA);\n"
           "                                the same shapes still run once at start (warm-up, no capture)\n"
           "  --cuda-graph-sizes N [N ...]  decode/verify batch sizes (sequences) captured at start; one N = 1,2,4,8,..\n"
           "                                up to N (default: 1,2,4,8,16,.. up to --max-num-seqs)\n"
           "  --compilation-config, -O JSON vLLM's cudagraph_capture_sizes, max_cudagraph_capture_size, cudagraph_mode\n"
           "  --device D                    auto | cpu | cuda (default auto: CUDA when built with it and a\n"
           "                                GPU answers, else the CPU reference backend; the log says which)\n"
           "  --[no-]enable-prefix-caching  automatic prefix caching (default on)\n"
           "  --default-chat-template-kwargs JSON   e.g. '{\"thinking\":false}'\n"
           "  --reasoning-effort-profile P  auto | preview | 0731\n"
           "  --default-thinking M          off | low | high | max (default off)\n"
           "  --default-reasoning-effort E  effort when thinking is on (default high)\n"
           "  --stop-in-reasoning M         dormant | active (default dormant)\n"
           "  --nnodes N --node-rank R --master-addr A --master-port P   -tp is the total, -tp/N ranks per\n"
           "                                node; node 0 serves HTTP, the others follow it; node 0 listens on\n"
           "                                P and P+1 (P+2 too with several CPU ranks per node)\n"
           "Accepted and ignored (dsv4 always behaves this way): --tokenizer-mode, --reasoning-parser,\n"
           "  --tool-call-parser, --enable-auto-tool-choice, --enable-chunked-prefill, --async-scheduling, ...\n");
}

int dsv4_serve_args_parse(int argc, char **argv, dsv4_serve_args *a, dsv4_err *err) {
    memset(a, 0, sizeof *a);
    dsv4_server_opts_default(&a->http);
    a->max_num_seqs = 256;
    a->max_num_batched_tokens = 8192;
    a->gpu_memory_utilization = 0.9;
    a->kv_cache_dtype = "auto";
    a->tensor_parallel_size = 1;
    a->load_format = "auto";
    a->device = "auto";
    a->enable_prefix_caching = 1;
    a->reasoning_effort_profile = "auto";
    a->default_thinking = "off";
    a->default_reasoning_effort = "high";
    a->stop_in_reasoning = "dormant";
    a->nnodes = 1;
    a->master_addr = "127.0.0.1";
    a->master_port = 29500;
    int names_given = 0;
    int sizes_flag = 0, sizes_cc = 0, max_cc = 0; /* capture sizes from --cuda-graph-sizes / --compilation-config */

    const char *env = getenv("DSV4_API_KEYS");
    if (env && *env && keys_from_list(a, env, ",", err)) return DSV4_EINVAL;

    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage();
            a->help_shown = 1;
            return 0;
        }
        if (strncmp(arg, "-", 1) != 0) {
            if (a->model_dir) return dsv4_err_set(err, DSV4_EINVAL, "two model directories given: '%s' and '%s'",
                                                  a->model_dir, arg);
            a->model_dir = arg;
            continue;
        }
        /* split --flag=value */
        char flag[128];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        size_t fl = eq ? (size_t)(eq - arg) : strlen(arg);
        if (fl >= sizeof flag) return dsv4_err_set(err, DSV4_EINVAL, "unknown flag '%s'", arg);
        memcpy(flag, arg, fl);
        flag[fl] = 0;
        if (eq) val = eq + 1;
#define NEED_VALUE()                                                                         \
    do {                                                                                     \
        if (!val) {                                                                          \
            if (i + 1 >= argc) return dsv4_err_set(err, DSV4_EINVAL, "%s needs a value", flag); \
            val = argv[++i];                                                                 \
        }                                                                                    \
    } while (0)
        int ign = -1;
        for (size_t k = 0; k < sizeof ignored_flags / sizeof ignored_flags[0]; k++)
            if (!strcmp(flag, ignored_flags[k].name)) ign = (int)k;
        if (ign >= 0) {
            if (ignored_flags[ign].has_value) NEED_VALUE();
            if (a->n_ignored < 32) a->ignored[a->n_ignored++] = ignored_flags[ign].name;
            dsv4_log(DSV4_LOG_INFO, "%s ignored: %s", ignored_flags[ign].name, ignored_flags[ign].why);
            continue;
        }
        if (!strcmp(flag, "--cuda-graph-sizes")) {
            /* vLLM: one value N = the default pattern up to N; several = the list itself */
            if (sizes_flag) return dsv4_err_set(err, DSV4_EINVAL, "--cuda-graph-sizes given twice");
            a->n_graph_sizes = 0;
            if (val) {
                if (parse_size_list(flag, val, a, &sizes_flag, err)) return DSV4_EINVAL;
            } else {
                /* values run to the next flag; "-3" is a (bad) value, not a flag */
                while (i + 1 < argc && (argv[i + 1][0] != '-' || (argv[i + 1][1] >= '0' && argv[i + 1][1] <= '9')))
                    if (parse_size_list(flag, argv[++i], a, &sizes_flag, err)) return DSV4_EINVAL;
                if (!sizes_flag) return dsv4_err_set(err, DSV4_EINVAL, "--cuda-graph-sizes needs a value");
            }
            if (sizes_cc)
                return dsv4_err_set(err, DSV4_EINVAL, "--cuda-graph-sizes and --compilation-config "
                                                      "cudagraph_capture_sizes both given; give one");
            continue;
        }
        if (!strcmp(flag, "--compilation-config") || !strcmp(flag, "-O") || !strcmp(flag, "-cc") ||
            !strncmp(flag, "--compilation-config.", 21) || !strncmp(flag, "-O.", 3) || !strncmp(flag, "-cc.", 4) ||
            (flag[0] == '-' && flag[1] == 'O' && flag[2] >= '0' && flag[2] <= '9' && !flag[3])) {
            const char *dot = strchr(flag, '.');
            if (flag[1] == 'O' && flag[2] >= '0' && flag[2] <= '9') {
                dsv4_log(DSV4_LOG_INFO, "%s ignored: kernels are compiled ahead of time", flag);
                continue;
            }
            NEED_VALUE();
            int had_sizes = sizes_cc;
            if (parse_compilation_config(flag, val, dot ? dot + 1 : NULL, a, &sizes_cc, &max_cc, err)) return DSV4_EINVAL;
            if (sizes_cc && !had_sizes && sizes_flag)
                return dsv4_err_set(err, DSV4_EINVAL, "--cuda-graph-sizes and --compilation-config "
                                                      "cudagraph_capture_sizes both given; give one");
            continue;
        }
        if (!strcmp(flag, "--model")) { NEED_VALUE(); a->model_dir = val; }
        else if (!strcmp(flag, "--host")) { NEED_VALUE(); a->http.host = val; }
        else if (!strcmp(flag, "--port")) { NEED_VALUE(); if (parse_int(flag, val, 1, 65535, &a->http.port, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--api-key") || !strcmp(flag, "--served-model-name")) {
            int is_key = flag[2] == 'a', n = 0;
            if (val) { n = 1; } else {
                while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                    i++;
                    n++;
                    if (is_key) { if (add_key(a, argv[i], err)) return DSV4_EINVAL; }
                    else {
                        if (!names_given) { a->http.n_served_names = 0; names_given = 1; }
                        if (a->http.n_served_names >= DSV4_SERVER_MAX_NAMES)
                            return dsv4_err_set(err, DSV4_EINVAL, "%s: at most %d names", flag, DSV4_SERVER_MAX_NAMES);
                        a->http.served_names[a->http.n_served_names++] = argv[i];
                    }
                }
                if (!n) return dsv4_err_set(err, DSV4_EINVAL, "%s needs a value", flag);
                continue;
            }
            if (is_key) { if (add_key(a, val, err)) return DSV4_EINVAL; }
            else {
                if (!names_given) { a->http.n_served_names = 0; names_given = 1; }
                if (a->http.n_served_names >= DSV4_SERVER_MAX_NAMES)
                    return dsv4_err_set(err, DSV4_EINVAL, "%s: at most %d names", flag, DSV4_SERVER_MAX_NAMES);
                a->http.served_names[a->http.n_served_names++] = val;
            }
        }
        else if (!strcmp(flag, "--api-key-file")) { NEED_VALUE(); if (keys_from_file(a, val, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--max-model-len")) {
            NEED_VALUE();
            a->max_model_len_given = 1;
            a->max_model_len_auto = !strcmp(val, "auto") || !strcmp(val, "-1"); /* vLLM: -1 / auto = fit */
            int v = 0;
            if (!a->max_model_len_auto) {
                if (parse_model_len(flag, val, &v, err)) return DSV4_EINVAL;
                a->http.max_model_len = v;
            }
        }
        else if (!strcmp(flag, "--max-num-seqs")) { NEED_VALUE(); if (parse_int(flag, val, 1, 65536, &a->max_num_seqs, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--max-num-batched-tokens")) { NEED_VALUE(); if (parse_int(flag, val, 1, 1 << 24, &a->max_num_batched_tokens, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--gpu-memory-utilization")) {
            NEED_VALUE();
            char *end;
            a->gpu_memory_utilization = strtod(val, &end);
            if (*end || end == val || !(a->gpu_memory_utilization > 0 && a->gpu_memory_utilization <= 1))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' must be a number in (0, 1]", flag, val);
        }
        else if (!strcmp(flag, "--kv-cache-dtype")) {
            NEED_VALUE();
            dsv4_kv_dtype kt; /* vLLM's names (src/model/kvcodec.h): auto, bfloat16, fp8, ... */
            if (dsv4_kv_dtype_parse(val, &kt, err)) return dsv4_err_prefix(err, "%s: ", flag), DSV4_EINVAL;
            a->kv_cache_dtype = val;
        }
        else if (!strcmp(flag, "--block-size")) {
            NEED_VALUE();
            if (parse_int(flag, val, 128, 1 << 20, &a->block_size, err)) return DSV4_EINVAL;
            if (a->block_size % 128)
                return dsv4_err_set(err, DSV4_EINVAL, "%s: %d must be a multiple of 128 (the largest compress ratio)",
                                    flag, a->block_size);
        }
        else if (!strcmp(flag, "--num-gpu-blocks-override")) { NEED_VALUE(); if (parse_int(flag, val, 1, 1 << 30, &a->num_gpu_blocks_override, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--kv-cache-memory-bytes")) {
            NEED_VALUE();
            char *end;
            double v = strtod(val, &end);
            double mul = !strcmp(end, "") ? 1 : (!strcmp(end, "K") || !strcmp(end, "k") || !strcmp(end, "KiB")) ? 1024.0
                       : (!strcmp(end, "M") || !strcmp(end, "MiB")) ? 1048576.0
                       : (!strcmp(end, "G") || !strcmp(end, "GiB")) ? 1073741824.0 : -1;
            if (end == val || mul < 0 || !(v >= 1) || v * mul > 9e18)
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' must be a positive byte count (suffix K, M or G)", flag,
                                    val);
            a->kv_cache_memory_bytes = (int64_t)(v * mul);
        }
        else if (!strcmp(flag, "--pipeline-parallel-size") || !strcmp(flag, "-pp") ||
                 !strcmp(flag, "--data-parallel-size") || !strcmp(flag, "-dp")) {
            NEED_VALUE();
            int v;
            if (parse_int(flag, val, 1, 64, &v, err)) return DSV4_EINVAL;
            if (v != 1)
                return dsv4_err_set(err, DSV4_EINVAL,
                                    "%s %d: only tensor parallelism is implemented (--tensor-parallel-size); "
                                    "run one server per data-parallel replica", flag, v);
        }
        else if (!strcmp(flag, "--tensor-parallel-size") || !strcmp(flag, "-tp")) { NEED_VALUE(); if (parse_int(flag, val, 1, 64, &a->tensor_parallel_size, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--speculative-config")) { NEED_VALUE(); a->speculative_config = val; }
        else if (!strcmp(flag, "--load-format")) {
            NEED_VALUE();
            if (strcmp(val, "auto") && strcmp(val, "dummy") && strcmp(val, "safetensors"))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not one of auto, safetensors, dummy", flag, val);
            a->load_format = val;
        }
        else if (!strcmp(flag, "--device")) {
            NEED_VALUE();
            dsv4_device dv;
            if (dsv4_device_parse(val, &dv, err)) return DSV4_EINVAL;
            a->device = val;
        }
        else if (!strcmp(flag, "--hf-overrides")) {
            NEED_VALUE();
            /* parsed here only to refuse bad JSON at once (with where it breaks), before any port or load */
            cJSON *j = cJSON_ParseWithOpts(val, NULL, 1); /* text after the object is an error */
            int obj = cJSON_IsObject(j);
            const char *at = j ? NULL : cJSON_GetErrorPtr();
            cJSON_Delete(j);
            if (!obj && at && at >= val && at <= val + strlen(val))
                return dsv4_err_set(err, DSV4_EINVAL,
                                    "--hf-overrides: not valid JSON at character %ld (%s%.20s%s); expected a JSON "
                                    "object such as '{\"num_hidden_layers\": 8}'",
                                    (long)(at - val), *at ? "'" : "the end of the text", at, *at ? "'" : "");
            if (!obj)
                return dsv4_err_set(err, DSV4_EINVAL,
                                    "--hf-overrides: not a JSON object; expected one such as '{\"num_hidden_layers\": 8}'");
            a->hf_overrides = val;
        }
        else if (!strcmp(flag, "--enable-prefix-caching")) a->enable_prefix_caching = 1;
        else if (!strcmp(flag, "--no-enable-prefix-caching")) a->enable_prefix_caching = 0;
        else if (!strcmp(flag, "--enforce-eager")) a->enforce_eager = 1;
        else if (!strcmp(flag, "--default-chat-template-kwargs")) { NEED_VALUE(); a->default_chat_template_kwargs = val; }
        else if (!strcmp(flag, "--reasoning-effort-profile")) {
            NEED_VALUE();
            if (strcmp(val, "auto") && strcmp(val, "preview") && strcmp(val, "0731"))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not one of auto, preview, 0731", flag, val);
            a->reasoning_effort_profile = val;
        }
        else if (!strcmp(flag, "--default-thinking")) {
            NEED_VALUE();
            if (strcmp(val, "off") && strcmp(val, "low") && strcmp(val, "high") && strcmp(val, "max"))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not one of off, low, high, max", flag, val);
            a->default_thinking = val;
        }
        else if (!strcmp(flag, "--default-reasoning-effort")) {
            NEED_VALUE();
            if (strcmp(val, "low") && strcmp(val, "high") && strcmp(val, "max"))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not one of low, high, max", flag, val);
            a->default_reasoning_effort = val;
        }
        else if (!strcmp(flag, "--stop-in-reasoning")) {
            NEED_VALUE();
            if (strcmp(val, "dormant") && strcmp(val, "active"))
                return dsv4_err_set(err, DSV4_EINVAL, "%s: '%s' is not one of dormant, active", flag, val);
            a->stop_in_reasoning = val;
        }
        else if (!strcmp(flag, "--nnodes")) { NEED_VALUE(); if (parse_int(flag, val, 1, 1024, &a->nnodes, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--node-rank")) { NEED_VALUE(); if (parse_int(flag, val, 0, 1023, &a->node_rank, err)) return DSV4_EINVAL; }
        else if (!strcmp(flag, "--master-addr")) { NEED_VALUE(); a->master_addr = val; }
        else if (!strcmp(flag, "--master-port")) { NEED_VALUE(); if (parse_int(flag, val, 1, 65535, &a->master_port, err)) return DSV4_EINVAL; }
        else return dsv4_err_set(err, DSV4_EINVAL, "unknown flag '%s' (see dsv4 serve --help)", flag);
#undef NEED_VALUE
    }
    if (sizes_flag && !sizes_cc && a->n_graph_sizes == 1 && !max_cc) { /* vLLM: --cuda-graph-sizes N = up to N */
        a->max_graph_size = a->graph_sizes[0];
        a->n_graph_sizes = 0;
    }
    if (a->n_graph_sizes > 0 && a->max_graph_size > 0) { /* vLLM's rule, refused before any loading */
        int largest = 0;
        for (int i = 0; i < a->n_graph_sizes; i++)
            if (a->graph_sizes[i] > largest) largest = a->graph_sizes[i];
        if (largest != a->max_graph_size)
            return dsv4_err_set(err, DSV4_EINVAL,
                                "max_cudagraph_capture_size %d must equal the largest capture size given (%d); give "
                                "one of the two", a->max_graph_size, largest);
    }
    if (a->enforce_eager && (sizes_flag || sizes_cc || max_cc))
        dsv4_log(DSV4_LOG_WARN, "--enforce-eager: no CUDA graphs; the capture sizes given only pick the shapes warmed at start (on a GPU)");
    if (a->enforce_eager && a->cudagraph_mode_graphs) /* vLLM: enforce_eager wins over cudagraph_mode */
        dsv4_log(DSV4_LOG_WARN, "--enforce-eager: the --compilation-config cudagraph_mode given is not used (no graphs)");
    if (a->node_rank >= a->nnodes)
        return dsv4_err_set(err, DSV4_EINVAL, "--node-rank %d must be less than --nnodes %d", a->node_rank, a->nnodes);
    return 0;
}
