/*
 * `dsv4 serve --nnodes N` (serve_multinode.h): joining the group from the
 * flags, and the follower nodes' whole run (no HTTP server there: node 0
 * serves, the others run its step plans).
 */
#include "cli/serve_multinode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dsv4_serve_join(const dsv4_serve_args *a, const char *dir, dsv4_multinode **out, dsv4_err *err) {
    const char *t = getenv("DSV4_RDV_TIMEOUT_S");
    dsv4_multinode_opts mo = {.master_addr = a->master_addr,
                              .master_port = a->master_port,
                              .nnodes = a->nnodes,
                              .node_rank = a->node_rank,
                              .tp_size = a->tensor_parallel_size,
                              .model_dir = dir,
                              .hf_overrides = a->hf_overrides,
                              .use_nccl = strcmp(a->device, "cuda") == 0,
                              .timeout_s = t ? atof(t) : 0};
    return dsv4_multinode_join(&mo, out, err);
}

/* "dsv4 serve: node R: MSG", unless MSG names the node already (dsv4_multinode_follow's prefix) */
static void say_failed(int node, const char *msg) {
    char pre[32];
    int n = snprintf(pre, sizeof pre, "node %d: ", node);
    fprintf(stderr, "dsv4 serve: %s%s\n", strncmp(msg, pre, (size_t)n) ? pre : "", msg);
}

int dsv4_serve_follower(const dsv4_serve_args *a, dsv4_service_opts *so) {
    dsv4_err err = {0};
    dsv4_multinode *mn = NULL;
    if (dsv4_serve_join(a, so->model_dir, &mn, &err)) {
        say_failed(a->node_rank, err.msg);
        return 1;
    }
    so->multinode = mn;
    int rc = dsv4_service_follow(so, &err);
    dsv4_multinode_free(mn);
    if (rc) {
        say_failed(a->node_rank, err.msg);
        return 1;
    }
    return 0;
}
