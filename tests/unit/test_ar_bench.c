/*
 * The all-reduce check of `dsv4 perf --all-reduce-bench` (src/parallel/ar_bench.c,
 * issue 7), on CPU ranks joined by the local communicator (threads):
 *   - 3 ranks (so the summation order matters), F32 and BF16, an odd length:
 *     the local communicator's rank-order sums match the bench's host
 *     reference exactly (0 wrong of every element checked), and every rank's
 *     result hashes the same; no graphs on CPU (us_graph -1);
 *   - the check can fail: a communicator that perturbs one element on rank 1
 *     only is reported as 1 wrong element there and a different hash;
 *   - bad shapes and dtypes are refused with DSV4_EINVAL.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/ar_bench.h"
#include "test.h"

#define N 3

typedef struct {
    dsv4_comm *c;
    dsv4_ar_bench b;
    int rc;
    dsv4_err err;
} job;

/* a communicator that sums correctly, then flips the lowest bit of element 5 on rank 1 */
typedef struct {
    dsv4_comm c;
    dsv4_comm *in;
} skewed;

static int skew_reduce(dsv4_comm *c, dsv4_backend *be, dsv4_buf *b, dsv4_err *err) {
    skewed *s = (skewed *)c;
    int rc = s->in->all_reduce_sum(s->in, be, b, err);
    if (rc || c->rank != 1) return rc;
    size_t esz = b->dtype == DSV4_DT_BF16 ? 2 : 4, n = (size_t)(b->rows * b->cols) * esz;
    unsigned char *h = malloc(n);
    if (!h) return DSV4_ENOMEM;
    rc = be->buf_read(be, b, h, err);
    h[5 * esz] ^= 1;
    if (!rc) rc = be->buf_write(be, b, h, err);
    free(h);
    return rc;
}

static void *run(void *p) {
    job *j = p;
    dsv4_backend *be = dsv4_backend_cpu_create(DSV4_NUMERICS_REFERENCE, &j->err);
    j->rc = be ? dsv4_ar_bench_rank(j->c, be, &j->b, &j->err) : DSV4_EBACKEND;
    if (be) be->free(be);
    return NULL;
}

/* all N ranks run the bench on comms[0..N) with the given shape; fills jobs */
static void bench_all(dsv4_comm **comms, int64_t rows, int64_t cols, dsv4_dtype dt, job *jobs) {
    pthread_t th[N];
    for (int r = 0; r < N; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].c = comms[r];
        jobs[r].b = (dsv4_ar_bench){.rows = rows, .cols = cols, .dtype = dt, .iters = 3};
        pthread_create(&th[r], NULL, run, &jobs[r]);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
}

int main(void) {
    dsv4_err err = {0};
    dsv4_comm *comms[N];
    CHECK_EQ_INT(dsv4_comm_local_create(N, comms, &err), 0);
    job jobs[N];
    const struct {
        int64_t rows, cols;
        dsv4_dtype dt;
    } cases[] = {{2, 301, DSV4_DT_F32}, {3, 301, DSV4_DT_BF16}};
    for (int ci = 0; ci < 2; ci++) {
        bench_all(comms, cases[ci].rows, cases[ci].cols, cases[ci].dt, jobs);
        for (int r = 0; r < N; r++) {
            CHECK_MSG(jobs[r].rc == 0, "case %d rank %d: %s", ci, r, jobs[r].err.msg);
            CHECK_EQ_INT(jobs[r].b.bad, 0);
            CHECK_EQ_INT(jobs[r].b.checked, cases[ci].rows * cases[ci].cols); /* first call only: no graphs */
            CHECK(jobs[r].b.us_graph == -1);
            CHECK(jobs[r].b.us_eager > 0);
            CHECK(jobs[r].b.hash == jobs[0].b.hash);
        }
    }
    /* a perturbed rank is caught */
    skewed sk[N];
    dsv4_comm *sc[N];
    for (int r = 0; r < N; r++) {
        sk[r].c = *comms[r];
        sk[r].c.all_reduce_sum = skew_reduce;
        sk[r].in = comms[r];
        sc[r] = &sk[r].c;
    }
    bench_all(sc, 1, 64, DSV4_DT_F32, jobs);
    CHECK_EQ_INT(jobs[0].rc, 0);
    CHECK_EQ_INT(jobs[1].rc, 0);
    CHECK_EQ_INT(jobs[0].b.bad, 0);
    CHECK_EQ_INT(jobs[1].b.bad, 1);
    CHECK(jobs[1].b.hash != jobs[0].b.hash);
    CHECK(jobs[2].b.hash == jobs[0].b.hash);
    /* refused inputs */
    dsv4_ar_bench bad = {.rows = 1, .cols = 8, .dtype = DSV4_DT_I32, .iters = 1};
    CHECK_EQ_INT(dsv4_ar_bench_rank(comms[0], NULL, &bad, &err), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "all-reduce bench");
    bad.dtype = DSV4_DT_F32;
    bad.rows = 0;
    CHECK_EQ_INT(dsv4_ar_bench_rank(comms[0], NULL, &bad, &err), DSV4_EINVAL);
    for (int r = 0; r < N; r++) comms[r]->free(comms[r]);
    return TEST_REPORT();
}
