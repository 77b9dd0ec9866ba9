/*
 * The multi-node rendezvous (src/parallel/rendezvous.h) between real
 * processes on 127.0.0.1: node 0 in this process, the other nodes forked.
 * Covers the NCCL id reaching the peer, each mismatch naming its field on
 * both sides, the timeouts on both sides (short timeouts), and a port in use.
 */
#include <stdlib.h>

#include "parallel/rendezvous.h"
#include "proc_test_util.h"
#include "test.h"

typedef struct {
    int rc;
    char msg[DSV4_ERR_MSG_MAX];
    uint8_t id[DSV4_RDV_ID_BYTES];
} result;

static dsv4_rdv_opts base(int port, int nnodes, int rank) {
    dsv4_rdv_opts o = {"127.0.0.1", port, nnodes, rank, 2, 0x1234abcdull, "build-a", 5.0};
    return o;
}

/* A forked node: the rendezvous with opts arg, its result in out. */
static void node_child(void *arg, void *out) {
    result *r = out;
    dsv4_err err = {0};
    r->rc = dsv4_rendezvous(arg, r->id, &err);
    snprintf(r->msg, sizeof r->msg, "%s", err.msg);
}

/* Node 0 here with o0, one forked peer with o1 (r1->rc = -1 when its result did not come back). */
static void pair(const dsv4_rdv_opts *o0, const dsv4_rdv_opts *o1, result *r0, result *r1) {
    int rd = -1;
    pid_t pid = pt_fork_result(node_child, (void *)o1, sizeof *r1, &rd);
    dsv4_err err = {0};
    memset(r0, 0, sizeof *r0);
    for (int i = 0; i < DSV4_RDV_ID_BYTES; i++) r0->id[i] = (uint8_t)(i * 7 + 3);
    r0->rc = dsv4_rendezvous(o0, r0->id, &err);
    snprintf(r0->msg, sizeof r0->msg, "%s", err.msg);
    if (pid < 0 || !pt_collect_result(pid, rd, r1, sizeof *r1)) {
        memset(r1, 0, sizeof *r1);
        r1->rc = -1;
    }
}

int main(void) {
    result r0, r1;
    /* success: the id reaches node 1 */
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 2, 0), b = base(port, 2, 1);
        pair(&a, &b, &r0, &r1);
        CHECK_EQ_INT(r0.rc, 0);
        CHECK_EQ_INT(r1.rc, 0);
        CHECK(!memcmp(r0.id, r1.id, DSV4_RDV_ID_BYTES));
        CHECK_EQ_INT(r1.id[5], 5 * 7 + 3);
    }
    /* mismatches: both sides name the field */
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 2, 0), b = base(port, 2, 1);
        b.tp_size = 4;
        pair(&a, &b, &r0, &r1);
        CHECK_EQ_INT(r0.rc, DSV4_EINVAL);
        CHECK_CONTAINS(r0.msg, "node 1 has --tensor-parallel-size 4, node 0 has 2");
        CHECK_EQ_INT(r1.rc, DSV4_EINVAL);
        CHECK_CONTAINS(r1.msg, "--tensor-parallel-size 4, node 0 has 2");
    }
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 2, 0), b = base(port, 2, 1);
        b.config_hash = 99;
        pair(&a, &b, &r0, &r1);
        CHECK_EQ_INT(r0.rc, DSV4_EINVAL);
        CHECK_CONTAINS(r0.msg, "different model config.json");
        CHECK_CONTAINS(r1.msg, "different model config.json");
    }
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 2, 0), b = base(port, 2, 1);
        b.build_id = "build-b";
        pair(&a, &b, &r0, &r1);
        CHECK_CONTAINS(r0.msg, "node 1 runs dsv4 build 'build-b', node 0 runs 'build-a'");
        CHECK_EQ_INT(r1.rc, DSV4_EINVAL);
    }
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 2, 0), b = base(port, 3, 1);
        pair(&a, &b, &r0, &r1);
        CHECK_CONTAINS(r0.msg, "node 1 has --nnodes 3, node 0 has 2");
        CHECK_CONTAINS(r1.msg, "--nnodes 3");
    }
    /* timeout on node 0: 3 nodes, only node 1 comes; node 2 is named */
    {
        int port = pt_free_port();
        dsv4_rdv_opts a = base(port, 3, 0), b = base(port, 3, 1);
        a.timeout_s = 0.5;
        pair(&a, &b, &r0, &r1);
        CHECK_EQ_INT(r0.rc, DSV4_EIO);
        CHECK_CONTAINS(r0.msg, "for node 2 of 3 (1 joined)");
        /* and says what to do (before: only the wait; fresh3 review 2026-12-01) */
        CHECK_CONTAINS(r0.msg, "start it with --nnodes 3 --node-rank R --master-addr 127.0.0.1");
        CHECK_CONTAINS(r0.msg, "DSV4_RDV_TIMEOUT_S");
        CHECK(r1.rc != 0);
        CHECK_CONTAINS(r1.msg, "waited");
    }
    /* timeout on a peer: nobody listens */
    {
        int port = pt_free_port();
        dsv4_rdv_opts b = base(port, 2, 1);
        b.timeout_s = 0.3;
        dsv4_err err = {0};
        uint8_t id[DSV4_RDV_ID_BYTES];
        CHECK_EQ_INT(dsv4_rendezvous(&b, id, &err), DSV4_EIO);
        CHECK_CONTAINS(err.msg, "could not reach node 0 at 127.0.0.1:");
    }
    /* port in use */
    {
        int port;
        int s = pt_loopback_socket(&port);
        listen(s, 1);
        dsv4_rdv_opts a = base(port, 2, 0);
        a.timeout_s = 0.3;
        dsv4_err err = {0};
        uint8_t id[DSV4_RDV_ID_BYTES] = {0};
        CHECK_EQ_INT(dsv4_rendezvous(&a, id, &err), DSV4_EIO);
        CHECK_CONTAINS(err.msg, "already in use");
        close(s);
    }
    /* bad arguments */
    {
        dsv4_rdv_opts a = base(1, 2, 2);
        dsv4_err err = {0};
        uint8_t id[DSV4_RDV_ID_BYTES];
        CHECK_EQ_INT(dsv4_rendezvous(&a, id, &err), DSV4_EINVAL);
        CHECK_CONTAINS(err.msg, "--node-rank 2");
        dsv4_rdv_opts one = base(1, 1, 0);
        CHECK_EQ_INT(dsv4_rendezvous(&one, id, &err), 0);
    }
    CHECK(dsv4_rdv_hash("abc", 3) != dsv4_rdv_hash("abd", 3));
    return TEST_REPORT();
}
