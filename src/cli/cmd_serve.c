/*
 * dsv4 serve — parse vLLM-named flags, open the port (health answers 503
 * while loading), load the model and warm the engine up, then serve until
 * SIGINT/SIGTERM (spec/SERVING.md §3.1, §8.5).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/serve_args.h"
#include "server/server.h"
#include "server/service.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = 1; }

/* num_speculative_tokens from --speculative-config (vLLM's JSON keys); 0 when absent. */
static int spec_tokens(const char *json, dsv4_err *err) {
    if (!json) return 0;
    cJSON *j = cJSON_Parse(json);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return -dsv4_err_set(err, DSV4_EINVAL, "--speculative-config must be a JSON object, got '%s'", json);
    }
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "num_speculative_tokens");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "method");
    int n = cJSON_IsNumber(k) ? (int)k->valuedouble : (m ? 1 : 0);
    cJSON_Delete(j);
    return n;
}

int dsv4_cmd_serve(int argc, char **argv) {
    dsv4_serve_args a;
    dsv4_err err = {0};
    if (dsv4_serve_args_parse(argc, argv, &a, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 2;
    }
    if (a.help_shown) return 0;
    if (strcmp(a.load_format, "dummy") == 0) {
        fprintf(stderr, "dsv4 serve: --load-format dummy needs the CUDA backend, which is not in this build yet\n");
        return 1;
    }
    if (a.tensor_parallel_size != 1 || a.nnodes != 1) {
        fprintf(stderr, "dsv4 serve: tensor parallelism needs the CUDA backend, which is not in this build yet\n");
        return 1;
    }
    const char *dir = a.model_dir ? a.model_dir : dsv4_default_model_dir();
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dsv4 serve: model directory '%s' not found%s\n", dir,
                a.model_dir ? "" : " (the embedded default is made by ./scripts/setup.sh)");
        return 1;
    }
    int k = spec_tokens(a.speculative_config, &err);
    if (k < 0) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 2;
    }
    dsv4_effort_profile prof;
    if (dsv4_profile_parse(a.reasoning_effort_profile, &prof, &err)) {
        fprintf(stderr, "dsv4 serve: --reasoning-effort-profile: %s\n", err.msg);
        return 2;
    }
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
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    dsv4_service_opts so = {dir,
                            a.http.served_names[0],
                            a.max_num_seqs > 64 ? 64 : a.max_num_seqs, /* CPU backend: state per slot */
                            a.max_num_batched_tokens,
                            a.max_model_len_given ? a.http.max_model_len : 0,
                            k,
                            prof,
                            a.default_thinking,
                            a.default_reasoning_effort,
                            strcmp(a.stop_in_reasoning, "active") == 0,
                            a.default_chat_template_kwargs};
    if (so.max_num_seqs > so.max_num_batched_tokens) so.max_num_seqs = so.max_num_batched_tokens;
    dsv4_service *svc = NULL;
    int rc = dsv4_service_open(&so, &svc, &err);
    if (rc) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        dsv4_server_stop(srv);
        dsv4_router_free(rt);
        return 1;
    }
    dsv4_router_set_max_model_len(rt, dsv4_service_max_model_len(svc));
    dsv4_router_set_service(rt, svc);
    dsv4_router_set_ready(rt, 1, "");
    dsv4_log(DSV4_LOG_INFO, "ready: serving '%s' on http://%s:%d", a.http.served_names[0], a.http.host,
             a.http.port);
    while (!g_stop) pause();
    dsv4_log(DSV4_LOG_INFO, "shutting down");
    dsv4_router_set_ready(rt, 0, "shutting down");
    dsv4_server_stop(srv);
    dsv4_router_set_service(rt, NULL);
    dsv4_service_free(svc);
    dsv4_router_free(rt);
    return 0;
}
