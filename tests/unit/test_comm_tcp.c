/*
 * The TCP communicator (src/parallel/comm_tcp.c, issue 7 "Parallelism"),
 * ranks as separate processes on 127.0.0.1 (fork), as `dsv4 serve --nnodes`
 * runs them:
 *   - all_reduce_sum of irregular fp32 partials: every rank's result is
 *     bit-identical, and equal to the sum in rank order ((p0 + p1) + p2)
 *     (comm_test_util.h); BF16 sums round once; all_gather places rank r's block
 *     at columns [r*c, (r+1)*c); broadcast from root 0 and from root 2
 *     (relayed by rank 0); barrier;
 *   - a collective shape mismatch fails with both shapes named;
 *   - abort wakes a peer blocked in a collective (DSV4_EBACKEND, no hang), and a
 *     peer that exits makes rank 0 fail naming it; dsv4_comm_tcp_check sees a
 *     hung-up peer with no collective in flight.
 * Every child reports through its exit status and a pipe; alarm() turns a
 * hang into a failure instead of a stuck CI job (proc_test_util.h).
 */
#include <signal.h>
#include <stdlib.h>

#include "comm_test_util.h"
#include "parallel/comm.h"
#include "proc_test_util.h"
#include "test.h"

#define N 3
#define LEN 1000

typedef struct {
    int rc_reduce, rc_bf16, rc_gather, rc_b0, rc_b2, rc_barrier;
    float red[LEN];
    uint16_t bf16[4];
    float gat[2 * N * 2];
    char b0[8], b2[8];
} report;

/* One rank's run of every collective; fills *o. */
static void run_rank(int rank, int port, report *o) {
    dsv4_err err = {0};
    dsv4_comm *c = NULL;
    memset(o, 0, sizeof *o);
    if (dsv4_comm_tcp_create("127.0.0.1", port, rank, N, 10.0, &c, &err)) {
        o->rc_reduce = -1000 - err.code;
        return;
    }
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
    dsv4_buf b, g, go;
    o->rc_reduce = ct_reduce_partials(c, be, 10, LEN, o->red, &err);
    uint16_t hb[4];
    for (int j = 0; j < 4; j++) {
        float f = (float)((rank + 1) * (j + 1));
        uint32_t u;
        memcpy(&u, &f, 4);
        hb[j] = (uint16_t)(u >> 16);
    }
    be->buf_alloc(be, DSV4_DT_BF16, 1, 4, &b, &err);
    be->buf_write(be, &b, hb, &err);
    o->rc_bf16 = c->all_reduce_sum(c, be, &b, &err);
    be->buf_read(be, &b, o->bf16, &err);
    be->buf_free(be, &b);
    float gi[4] = {rank * 10.0f, rank * 10.0f + 1, rank * 10.0f + 2, rank * 10.0f + 3};
    be->buf_alloc(be, DSV4_DT_F32, 2, 2, &g, &err);
    be->buf_alloc(be, DSV4_DT_F32, 2, 2 * N, &go, &err);
    be->buf_write(be, &g, gi, &err);
    o->rc_gather = c->all_gather(c, be, &g, &go, &err);
    be->buf_read(be, &go, o->gat, &err);
    be->buf_free(be, &g);
    be->buf_free(be, &go);
    if (rank == 0) memcpy(o->b0, "root0ok", 8);
    o->rc_b0 = c->broadcast(c, o->b0, 8, 0, &err);
    if (rank == 2) memcpy(o->b2, "root2ok", 8);
    o->rc_b2 = c->broadcast(c, o->b2, 8, 2, &err);
    o->rc_barrier = c->barrier(c, &err);
    be->free(be);
    c->free(c);
}

typedef struct {
    int rank, port;
} rank_arg;

static void rank_child(void *arg, void *out) {
    const rank_arg *a = arg;
    run_rank(a->rank, a->port, out);
}

static void test_collectives(void) {
    int port = pt_free_port();
    int rd[N];
    pid_t pid[N];
    rank_arg args[N];
    for (int r = 1; r < N; r++) {
        args[r] = (rank_arg){r, port};
        pid[r] = pt_fork_result(rank_child, &args[r], sizeof(report), &rd[r]);
        if (pid[r] < 0) return;
    }
    report rep[N];
    run_rank(0, port, &rep[0]);
    for (int r = 1; r < N; r++) CHECK(pt_collect_result(pid[r], rd[r], &rep[r], sizeof rep[r]));
    for (int r = 0; r < N; r++) {
        CHECK_EQ_INT(rep[r].rc_reduce, 0);
        int same = 1, ordered = 1;
        for (int i = 0; i < LEN; i++) {
            float want = ct_rank_order_sum(N, i);
            ordered &= !memcmp(&rep[r].red[i], &want, 4);
            same &= !memcmp(&rep[r].red[i], &rep[0].red[i], 4);
        }
        CHECK(same);    /* bit-identical on every rank */
        CHECK(ordered); /* and equal to the rank-order sum */
        CHECK_EQ_INT(rep[r].rc_bf16, 0);
        for (int j = 0; j < 4; j++) {
            uint32_t u = (uint32_t)rep[r].bf16[j] << 16;
            float f;
            memcpy(&f, &u, 4);
            CHECK(f == (float)(6 * (j + 1)));
        }
        CHECK_EQ_INT(rep[r].rc_gather, 0);
        for (int row = 0; row < 2; row++)
            for (int k = 0; k < N; k++)
                for (int j = 0; j < 2; j++) CHECK(rep[r].gat[row * 2 * N + k * 2 + j] == k * 10.0f + row * 2 + j);
        CHECK_EQ_INT(rep[r].rc_b0, 0);
        CHECK_STR(rep[r].b0, "root0ok");
        CHECK_EQ_INT(rep[r].rc_b2, 0);
        CHECK_STR(rep[r].b2, "root2ok");
        CHECK_EQ_INT(rep[r].rc_barrier, 0);
    }
    /* rank-order sums are not the same bits as another order on these values (else the check above is weak) */
    int differs = 0;
    for (int i = 0; i < LEN; i++) {
        float a = ct_rank_order_sum(N, i), b = ct_part(0, i) + (ct_part(1, i) + ct_part(2, i));
        differs |= memcmp(&a, &b, 4) != 0;
    }
    CHECK(differs);
}

/* Rank 1 of 2 in a child: mode 0 = abort while rank 0 is blocked in an all-reduce; 1 = exit at once;
 * 2 = all-reduce a different shape. */
static void child(int port, int mode) {
    alarm(30);
    dsv4_err err = {0};
    dsv4_comm *c;
    if (dsv4_comm_tcp_create("127.0.0.1", port, 1, 2, 10.0, &c, &err)) _exit(2);
    if (mode == 0) {
        usleep(200 * 1000); /* rank 0 is in its all-reduce by now, waiting for us */
        c->abort(c);
        sleep(5); /* the abort alone must wake rank 0: stay alive so no exit closes the socket for us */
    } else if (mode == 2) {
        dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
        dsv4_buf b;
        be->buf_alloc(be, DSV4_DT_F32, 3, 4, &b, &err);
        int rc = c->all_reduce_sum(c, be, &b, &err);
        _exit(rc == DSV4_EINVAL || rc == DSV4_EBACKEND ? 0 : 4);
    }
    c->free(c);
    _exit(0);
}

static void test_failures(void) {
    for (int mode = 0; mode < 3; mode++) {
        int port = pt_free_port();
        pid_t p = fork();
        if (p == 0) child(port, mode);
        dsv4_err err = {0};
        dsv4_comm *c;
        CHECK_EQ_INT(dsv4_comm_tcp_create("127.0.0.1", port, 0, 2, 10.0, &c, &err), 0);
        dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &err);
        dsv4_buf b;
        be->buf_alloc(be, DSV4_DT_F32, 2, 4, &b, &err);
        if (mode == 1) {
            usleep(300 * 1000); /* the child has exited: the check sees it with nothing in flight */
            dsv4_err e2 = {0};
            CHECK_EQ_INT(dsv4_comm_tcp_check(c, &e2), DSV4_EBACKEND);
            CHECK_CONTAINS(e2.msg, "rank 1 (node 1 at 127.0.0.1:");
        }
        alarm(20); /* a hang is a failure */
        int rc = c->all_reduce_sum(c, be, &b, &err);
        alarm(0);
        if (mode == 2) {
            CHECK_EQ_INT(rc, DSV4_EINVAL);
            CHECK_CONTAINS(err.msg, "rank 1 is in all_reduce_sum [3,4] (48 bytes), rank 0 in all_reduce_sum [2,4]");
        } else {
            CHECK_EQ_INT(rc, DSV4_EBACKEND);
            CHECK_CONTAINS(err.msg, "tcp comm rank 0:");
            CHECK_CONTAINS(err.msg, "rank 1 (node 1 at 127.0.0.1:");
        }
        /* the group stays dead: the next call fails at once with the first reason */
        dsv4_err e3 = {0};
        CHECK_EQ_INT(c->barrier(c, &e3), DSV4_EBACKEND);
        CHECK_CONTAINS(e3.msg, "the group is down");
        be->buf_free(be, &b);
        be->free(be);
        c->free(c);
        kill(p, SIGKILL);
        int st;
        waitpid(p, &st, 0);
    }
}

static void test_setup_errors(void) {
    dsv4_err err = {0};
    dsv4_comm *c;
    int port = pt_free_port();
    /* nobody listens: a clear timeout */
    CHECK_EQ_INT(dsv4_comm_tcp_create("127.0.0.1", port, 1, 2, 0.3, &c, &err), DSV4_EIO);
    CHECK_CONTAINS(err.msg, "could not reach rank 0 at 127.0.0.1:");
    /* nobody joins */
    CHECK_EQ_INT(dsv4_comm_tcp_create("127.0.0.1", port, 0, 3, 0.3, &c, &err), DSV4_EIO);
    CHECK_CONTAINS(err.msg, "rank(s) 1, 2 did not connect in time");
    CHECK_EQ_INT(dsv4_comm_tcp_create("127.0.0.1", port, 2, 2, 1, &c, &err), DSV4_EINVAL);
    /* size 1 needs no network */
    CHECK_EQ_INT(dsv4_comm_tcp_create(NULL, 0, 0, 1, 1, &c, &err), 0);
    CHECK_EQ_INT(c->barrier(c, &err), 0);
    c->free(c);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_collectives();
    test_failures();
    test_setup_errors();
    return TEST_REPORT();
}
