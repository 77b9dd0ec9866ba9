/*
 * dsv4 serve — parse vLLM-named flags, open the port (health answers 503
 * while loading), load the model and warm the engine up, then serve until
 * SIGINT/SIGTERM (spec/SERVING.md §3.1, §8.5).
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/serve_args.h"
#include "cli/serve_multinode.h"
#include "engine/model_runner.h"
#include "server/server.h"
#include "server/service.h"

static volatile sig_atomic_t g_stop, g_loading;
/* While the model loads (or the nodes join) nothing polls g_stop, and a real
 * checkpoint takes minutes: a Ctrl-C then ends the process at once, as it
 * would a `vllm serve` still loading. Once serving, it asks for a clean stop. */
static void on_signal(int sig) {
    if (g_loading) {
        static const char m[] = "\ndsv4 serve: interrupted while loading\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        _exit(128 + sig);
    }
    g_stop = 1;
}

/* 1 when dir holds at least one *.safetensors file (the weights a real load needs). */
static int has_safetensors(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        found = n > 12 && !strcmp(e->d_name + n - 12, ".safetensors");
    }
    closedir(d);
    return found;
}

/*
 * --speculative-config with vLLM's keys (spec/DSPARK.md §5): method,
 * num_speculative_tokens, draft_sample_method, num_speculative_tokens_per_batch_size
 * ([[lo, hi, k], ...]). Unknown keys and bad values are refused at start with the
 * reason, never discovered at request time.
 */
static int parse_spec(const char *json, dsv4_service_opts *so, char *method, size_t mlen, dsv4_err *err) {
    so->spec_k = 0;
    so->n_k_schedule = 0;
    so->draft_sampled = 0;
    if (!json) return 0;
    cJSON *j = cJSON_ParseWithOpts(json, NULL, 1); /* text after the object is an error, not ignored */
    int rc = 0;
    if (!cJSON_IsObject(j)) {
        rc = dsv4_err_set(err, DSV4_EINVAL, "--speculative-config must be a JSON object, got '%s'", json);
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        const char *k = it->string;
        if (!strcmp(k, "method") && cJSON_IsString(it)) {
            snprintf(method, mlen, "%s", it->valuestring);
        } else if (!strcmp(k, "num_speculative_tokens") && cJSON_IsNumber(it) && it->valuedouble >= 0 &&
                   it->valuedouble <= 16 && it->valuedouble == (int)it->valuedouble) {
            so->spec_k = (int)it->valuedouble;
        } else if (!strcmp(k, "draft_sample_method") && cJSON_IsString(it) &&
                   (!strcmp(it->valuestring, "greedy") || !strcmp(it->valuestring, "probabilistic"))) {
            /* probabilistic: DSpark drafts sampled from softmax(z/T) for T > 0 requests, q handed
             * to the verifier; greedy: argmax drafts. Lossless either way (DSPARK.md §4.3). */
            so->draft_sampled = !strcmp(it->valuestring, "probabilistic");
        } else if (!strcmp(k, "num_speculative_tokens_per_batch_size") && cJSON_IsArray(it) &&
                   cJSON_GetArraySize(it) <= 8) {
            const cJSON *e;
            cJSON_ArrayForEach(e, it) {
                if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3) {
                    rc = dsv4_err_set(err, DSV4_EINVAL,
                                      "--speculative-config: num_speculative_tokens_per_batch_size entries are "
                                      "[min_batch, max_batch, k]");
                    goto out;
                }
                for (int x = 0; x < 3; x++)
                    so->k_schedule[so->n_k_schedule][x] = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(e, x));
                so->n_k_schedule++;
            }
        } else if (!strcmp(k, "model") && (cJSON_IsString(it) || cJSON_IsNull(it))) {
            /* vLLM launchers name the draft checkpoint; DSpark stages and the MTP block live in the target */
            dsv4_log(DSV4_LOG_INFO, "--speculative-config: \"model\" ignored (the drafter is read from the "
                                    "checkpoint being served)");
        } else {
            static const struct { const char *key, *want; } known[] = {
                {"method", "a string: \"dspark\", \"mtp\" or \"deepseek_mtp\""},
                {"num_speculative_tokens", "an integer in [0, 16] (0 = off; DSpark allows up to its block size 5)"},
                {"draft_sample_method", "\"greedy\" or \"probabilistic\""},
                {"num_speculative_tokens_per_batch_size", "a list of at most 8 [min_batch, max_batch, k] triples"},
            };
            for (size_t q = 0; q < sizeof known / sizeof known[0]; q++)
                if (!strcmp(k, known[q].key)) {
                    rc = dsv4_err_set(err, DSV4_EINVAL, "--speculative-config: \"%s\" must be %s", k, known[q].want);
                    goto out;
                }
            rc = dsv4_err_set(err, DSV4_EINVAL,
                              "--speculative-config: unsupported key \"%s\" (known: method, num_speculative_tokens, "
                              "draft_sample_method, num_speculative_tokens_per_batch_size, model)", k);
            goto out;
        }
    }
    if (!method[0]) {
        rc = dsv4_err_set(err, DSV4_EINVAL, "--speculative-config: \"method\" is required (e.g. \"dspark\")");
        goto out;
    }
    if (so->spec_k == 0 && cJSON_GetObjectItemCaseSensitive(j, "num_speculative_tokens") == NULL) so->spec_k = 5;
out:
    cJSON_Delete(j);
    return rc;
}

/* The service options the flags give (also what a multi-node follower sizes its rank from). */
static void service_opts_from_args(dsv4_serve_args *a, const char *dir, dsv4_effort_profile prof,
                                   const dsv4_service_opts *spec, const char *spec_method, dsv4_service_opts *so) {
    memset(so, 0, sizeof *so);
    so->model_dir = dir;
    so->load_dummy = strcmp(a->load_format, "dummy") == 0;
    so->hf_overrides = a->hf_overrides;
    dsv4_cli_text_dirs(dir, so->load_dummy, &so->tokenizer_dir, &so->encoding_dir);
    so->model_name = a->http.served_names[0];
    so->max_num_seqs = a->max_num_seqs > 64 ? 64 : a->max_num_seqs; /* CPU backend: state per slot */
    so->max_num_batched_tokens = a->max_num_batched_tokens;
    so->max_model_len = a->max_model_len_auto ? -1 : a->max_model_len_given ? a->http.max_model_len : 0;
    so->profile_override = prof;
    so->default_thinking = a->default_thinking;
    so->default_reasoning_effort = a->default_reasoning_effort;
    so->stop_in_reasoning = strcmp(a->stop_in_reasoning, "active") == 0;
    so->default_chat_template_kwargs = a->default_chat_template_kwargs;
    so->spec_method = spec_method;
    so->enable_prefix_caching = a->enable_prefix_caching;
    so->tensor_parallel_size = a->tensor_parallel_size;
    dsv4_device dev = DSV4_DEVICE_AUTO;
    dsv4_device_parse(a->device, &dev, NULL); /* validated by the parser */
    so->device = (int)dev;
    so->cuda_graphs = !a->enforce_eager && !a->cudagraph_mode_none;
    so->graph_sizes = a->graph_sizes;
    so->n_graph_sizes = a->n_graph_sizes;
    so->max_graph_size = a->max_graph_size;
    so->draft_sampled = spec->draft_sampled;
    so->block_size = a->block_size;
    so->num_gpu_blocks_override = a->num_gpu_blocks_override;
    so->kv_cache_memory_bytes = a->kv_cache_memory_bytes;
    so->gpu_memory_utilization = a->gpu_memory_utilization;
    so->kv_cache_dtype = a->kv_cache_dtype;
    so->spec_k = spec->spec_k;
    so->n_k_schedule = spec->n_k_schedule;
    memcpy(so->k_schedule, spec->k_schedule, sizeof so->k_schedule);
    if (so->max_num_seqs > so->max_num_batched_tokens) so->max_num_seqs = so->max_num_batched_tokens;
}

int dsv4_cmd_serve(int argc, char **argv) {
    dsv4_serve_args a;
    dsv4_err err = {0};
    if (dsv4_serve_args_parse(argc, argv, &a, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 2;
    }
    if (a.help_shown) return 0;
    /* Tensor parallelism in one process: ranks are threads, each with its own
     * backend — CPU ranks joined by the local communicator, or rank r on GPU r
     * joined by NCCL (--device cuda / auto; src/parallel/tp_runner.h).
     * Several nodes (--nnodes): -tp / --nnodes ranks per node over TCP (CPU) or NCCL (cuda),
     * node 0 serves and the others follow its step plans (src/parallel/multinode.h). */
    const char *dir = a.model_dir ? a.model_dir : dsv4_default_model_dir();
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dsv4 serve: model directory '%s' not found%s\n", dir,
                a.model_dir ? "" : " (the embedded default is made by ./scripts/setup.sh)");
        return 1;
    }
    if (strcmp(a.load_format, "dummy") != 0 && !has_safetensors(dir)) {
        fprintf(stderr, "dsv4 serve: %s holds no weights (no *.safetensors file); for random weights with the "
                        "shapes of its config.json give --load-format dummy\n", dir);
        return 1;
    }
    if (a.nnodes > 1 && a.tensor_parallel_size % a.nnodes) { /* every node, before the rendezvous */
        fprintf(stderr, "dsv4 serve: --tensor-parallel-size %d with --nnodes %d: -tp is the total over the nodes, "
                        "-tp / --nnodes ranks on each, so give a multiple of %d (e.g. -tp %d)\n",
                a.tensor_parallel_size, a.nnodes, a.nnodes, a.nnodes);
        return 2;
    }
    dsv4_effort_profile prof;
    if (dsv4_profile_parse(a.reasoning_effort_profile, &prof, &err)) {
        fprintf(stderr, "dsv4 serve: --reasoning-effort-profile: %s\n", err.msg);
        return 2;
    }
    dsv4_service_opts spec;
    memset(&spec, 0, sizeof spec);
    char spec_method[64] = "";
    if (parse_spec(a.speculative_config, &spec, spec_method, sizeof spec_method, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 2;
    }
    dsv4_service_opts so;
    service_opts_from_args(&a, dir, prof, &spec, spec_method, &so);
    if (a.nnodes > 1 && a.node_rank > 0) return dsv4_serve_follower(&a, &so); /* no HTTP server here */
    /* One descriptor per client connection: lift the soft limit (often 1024) to the
     * hard limit so a burst of clients cannot exhaust it (SERVING.md §3.1). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) dsv4_log(DSV4_LOG_WARN, "could not raise the open-file limit");
    }
    g_loading = 1; /* from here until the service is up, Ctrl-C ends the process (on_signal) */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    a.http.model_root = dir;
    dsv4_router *rt = dsv4_router_create(&a.http);
    if (!rt) {
        fprintf(stderr, "dsv4 serve: out of memory\n");
        return 1;
    }
    dsv4_router_set_ready(rt, 0, "the model is loading");
    dsv4_server *srv;
    if (dsv4_server_start(rt, &a.http, &srv, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        dsv4_router_free(rt);
        return 1;
    }
    dsv4_log(DSV4_LOG_INFO, "listening on http://%s:%d (%d API key%s); loading %s", a.http.host, a.http.port,
             a.http.n_api_keys, a.http.n_api_keys == 1 ? "" : "s", dir);
    dsv4_multinode *mn = NULL;
    if (a.nnodes > 1) {
        dsv4_router_set_ready(rt, 0, "waiting for the other nodes");
        if (dsv4_serve_join(&a, dir, &mn, &err)) {
            fprintf(stderr, "dsv4 serve: node 0: %s\n", err.msg);
            dsv4_server_stop(srv);
            dsv4_router_free(rt);
            return 1;
        }
        dsv4_router_set_ready(rt, 0, "the model is loading");
        so.multinode = mn;
    }
    dsv4_service *svc = NULL;
    int rc = dsv4_service_open(&so, &svc, &err);
    g_loading = 0;
    if (rc) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        dsv4_server_stop(srv);
        dsv4_router_free(rt);
        dsv4_multinode_free(mn);
        return 1;
    }
    dsv4_router_set_max_model_len(rt, dsv4_service_max_model_len(svc));
    dsv4_router_set_service(rt, svc);
    dsv4_router_set_ready(rt, 1, "");
    dsv4_log(DSV4_LOG_INFO, "ready: serving '%s' on http://%s:%d", a.http.served_names[0], a.http.host,
             a.http.port);
    int status = 0;
    while (!g_stop && !mn) pause();
    while (!g_stop && mn) { /* a node that goes away ends the service, as vLLM's engine does when a worker dies */
        if (dsv4_multinode_check(mn, &err)) {
            dsv4_log(DSV4_LOG_ERROR, "%s; shutting down", err.msg);
            status = 1;
            break;
        }
        usleep(200 * 1000);
    }
    dsv4_log(DSV4_LOG_INFO, "shutting down");
    dsv4_router_set_ready(rt, 0, "shutting down");
    dsv4_server_stop(srv);
    dsv4_router_set_service(rt, NULL);
    dsv4_service_free(svc);
    dsv4_router_free(rt);
    dsv4_multinode_free(mn);
    return status;
}
