/*
 * dsv4 serve — parse vLLM-named flags, start the HTTP front end, run until
 * SIGINT/SIGTERM. The engine is not attached yet (issue "Engine"): the
 * server answers every route, and generation routes and /health say 503
 * with the reason, so launchers and health probes see an honest state.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/serve_args.h"
#include "server/server.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = 1; }

int dsv4_cmd_serve(int argc, char **argv) {
    dsv4_serve_args a;
    dsv4_err err = {0};
    int rc = dsv4_serve_args_parse(argc, argv, &a, &err);
    if (rc) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 2;
    }
    if (a.help_shown) return 0;
    const char *dir = a.model_dir ? a.model_dir : dsv4_default_model_dir();
    struct stat st;
    if (strcmp(a.load_format, "dummy") != 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "dsv4 serve: model directory '%s' not found%s\n", dir,
                a.model_dir ? "" : " (the embedded default is made by ./scripts/setup.sh)");
        return 1;
    }
    a.http.model_root = dir;
    dsv4_router *rt = dsv4_router_create(&a.http);
    if (!rt) {
        fprintf(stderr, "dsv4 serve: out of memory\n");
        return 1;
    }
    dsv4_router_set_ready(rt, 0, "no inference engine in this build yet (generation is not implemented)");
    dsv4_server *srv;
    if (dsv4_server_start(rt, &a.http, &srv, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        dsv4_router_free(rt);
        return 1;
    }
    dsv4_log(DSV4_LOG_INFO, "serving %s as '%s' on http://%s:%d (%d API key%s)", dir, a.http.served_names[0],
             a.http.host, a.http.port, a.http.n_api_keys, a.http.n_api_keys == 1 ? "" : "s");
    dsv4_log(DSV4_LOG_WARN, "no inference engine yet: /health and generation routes answer 503");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!g_stop) pause();
    dsv4_log(DSV4_LOG_INFO, "shutting down");
    dsv4_server_stop(srv);
    dsv4_router_free(rt);
    return 0;
}
