/*
 * ar_bench.c — one rank's all-reduce benchmark and exact check (ar_bench.h).
 *
 * The check is against a host reference, not against another transport:
 * every communicator promises the rank-order F32 sum rounded once (comm.h),
 * and for 2 ranks NCCL's r0 + r1 is the same single addition, so NCCL and the
 * one-shot kernel must both match it bit for bit. Inside a captured CUDA
 * graph the same buffer is reduced 3 times per replay; after the first call
 * every rank holds the same values s, so each later call yields the rank-order
 * sum of N copies of s — again computed on the host. Two replays check that
 * a graph stays correct when replayed (the one-shot kernel's epoch must
 * advance on the device, not be a captured constant).
 */
#include "parallel/ar_bench.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/formats.h"

enum { GRAPH_CHECK_CALLS = 3, GRAPH_TIME_CALLS = 50, GRAPH_TIME_REPLAYS = 4 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank r's input element i: mantissa of 15 bits, sign, exponent in [-8, 7] (exact in F32; BF16 rounds it once). */
static float pattern(int r, int64_t i) {
    uint32_t u = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 977u);
    u ^= u >> 15;
    u *= 2246822519u;
    u ^= u >> 13;
    float m = (float)((int)(u & 0xffffu) - 32768) / 32768.0f;
    int ex = (int)((u >> 16) % 16u) - 8;
    float v = m;
    for (; ex > 0; ex--) v *= 2.0f;
    for (; ex < 0; ex++) v *= 0.5f;
    return v;
}

static float round_dt(dsv4_dtype dt, float v) { return dt == DSV4_DT_BF16 ? dsv4_round_bf16(v) : v; }

/* host values (already exact in dt) -> the buffer's bytes */
static void pack(dsv4_dtype dt, const float *v, int64_t n, void *out) {
    if (dt == DSV4_DT_BF16) dsv4_f32_to_bf16_n(v, (uint16_t *)out, n);
    else memcpy(out, v, (size_t)n * sizeof(float));
}

static void unpack(dsv4_dtype dt, const void *in, int64_t n, float *v) {
    if (dt == DSV4_DT_BF16) dsv4_bf16_to_f32_n((const uint16_t *)in, v, n);
    else memcpy(v, in, (size_t)n * sizeof(float));
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* bit-exact compare of got against want (both as floats exact in the dtype); returns mismatches */
static int64_t count_bad(const float *got, const float *want, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    return bad;
}

/* want := rank-order sum over N ranks whose inputs are rank_val(k, i), rounded once */
static void ref_first(dsv4_dtype dt, int N, int64_t n, float *want) {
    for (int64_t i = 0; i < n; i++) {
        float acc = round_dt(dt, pattern(0, i));
        for (int k = 1; k < N; k++) acc += round_dt(dt, pattern(k, i));
        want[i] = round_dt(dt, acc);
    }
}

/* s := rank-order sum of N copies of s, rounded once */
static void ref_again(dsv4_dtype dt, int N, int64_t n, float *s) {
    for (int64_t i = 0; i < n; i++) {
        float acc = s[i];
        for (int k = 1; k < N; k++) acc += s[i];
        s[i] = round_dt(dt, acc);
    }
}

static int write_pattern(dsv4_backend *be, dsv4_buf *b, int r, float *v, void *bytes, dsv4_err *err) {
    int64_t n = b->rows * b->cols;
    for (int64_t i = 0; i < n; i++) v[i] = round_dt(b->dtype, pattern(r, i));
    pack(b->dtype, v, n, bytes);
    int rc = be->sync(be, err);
    return rc ? rc : be->buf_write(be, b, bytes, err);
}

static int read_back(dsv4_backend *be, dsv4_buf *b, float *v, void *bytes, dsv4_err *err) {
    int rc = be->sync(be, err);
    if (!rc) rc = be->buf_read(be, b, bytes, err);
    if (!rc) unpack(b->dtype, bytes, b->rows * b->cols, v);
    return rc;
}

/* *graph := a captured graph of `calls` all-reduces of x (the capture always ends, even after a failed call) */
static int capture(dsv4_comm *c, dsv4_backend *be, dsv4_buf *x, int calls, void **graph, dsv4_err *err) {
    *graph = NULL;
    int rc = be->graph_begin(be, err);
    if (rc) return rc;
    for (int k = 0; k < calls && !rc; k++) rc = c->all_reduce_sum(c, be, x, err);
    int rc2 = be->graph_end(be, graph, rc ? NULL : err);
    if (rc && *graph) {
        be->graph_free(be, *graph);
        *graph = NULL;
    }
    return rc ? rc : rc2;
}

int dsv4_ar_bench_rank(dsv4_comm *c, dsv4_backend *be, dsv4_ar_bench *b, dsv4_err *err) {
    if (b->rows < 1 || b->cols < 1 || b->iters < 1 || (b->dtype != DSV4_DT_F32 && b->dtype != DSV4_DT_BF16))
        return dsv4_err_set(err, DSV4_EINVAL, "all-reduce bench: %lld x %lld %s, %d iterations", (long long)b->rows,
                            (long long)b->cols, dsv4_dtype_name(b->dtype), b->iters);
    int64_t n = b->rows * b->cols;
    size_t esz = b->dtype == DSV4_DT_BF16 ? 2 : 4;
    b->us_eager = b->us_graph = -1;
    b->bad = b->checked = 0;
    b->hash = 0;
    dsv4_buf x = {0};
    float *v = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
    void *bytes = malloc((size_t)n * esz);
    void *graph = NULL;
    int rc = v && want && bytes ? be->buf_alloc(be, b->dtype, b->rows, b->cols, &x, err)
                                : dsv4_err_set(err, DSV4_ENOMEM, "all-reduce bench: out of memory");
    /* 1. one eager call, checked */
    if (!rc) rc = write_pattern(be, &x, c->rank, v, bytes, err);
    if (!rc) rc = c->all_reduce_sum(c, be, &x, err);
    if (!rc) rc = read_back(be, &x, v, bytes, err);
    if (!rc) {
        b->hash = fnv(bytes, (size_t)n * esz);
        ref_first(b->dtype, c->size, n, want);
        b->bad += count_bad(v, want, n);
        b->checked += n;
    }
    /* 2. a captured graph of 3 calls, replayed twice from fresh inputs, checked after each replay */
    int graphs = be->graph_begin && be->graph_end && be->graph_launch && be->graph_free && c->capturable;
    if (!rc && graphs) {
        rc = capture(c, be, &x, GRAPH_CHECK_CALLS, &graph, err);
        for (int rep = 0; rep < 2 && !rc; rep++) {
            rc = write_pattern(be, &x, c->rank, v, bytes, err);
            if (!rc) rc = be->graph_launch(be, graph, err);
            if (!rc) rc = read_back(be, &x, v, bytes, err);
            if (!rc) {
                ref_first(b->dtype, c->size, n, want);
                for (int k = 1; k < GRAPH_CHECK_CALLS; k++) ref_again(b->dtype, c->size, n, want);
                b->bad += count_bad(v, want, n);
                b->checked += n;
            }
        }
        if (graph) be->graph_free(be, graph);
        graph = NULL;
    }
    /* 3. timing on zeros (sums stay zero): eager back-to-back, then graph replays */
    if (!rc) {
        memset(bytes, 0, (size_t)n * esz);
        rc = be->sync(be, err);
        if (!rc) rc = be->buf_write(be, &x, bytes, err);
    }
    for (int i = 0; i < 10 && !rc; i++) rc = c->all_reduce_sum(c, be, &x, err);
    if (!rc) rc = be->sync(be, err);
    double t0 = now_s();
    for (int i = 0; i < b->iters && !rc; i++) rc = c->all_reduce_sum(c, be, &x, err);
    if (!rc) rc = be->sync(be, err);
    if (!rc) b->us_eager = (now_s() - t0) * 1e6 / b->iters;
    if (!rc && graphs) {
        int calls = b->iters < GRAPH_TIME_CALLS ? b->iters : GRAPH_TIME_CALLS;
        rc = capture(c, be, &x, calls, &graph, err);
        if (!rc) rc = be->graph_launch(be, graph, err); /* warm-up replay */
        if (!rc) rc = be->sync(be, err);
        t0 = now_s();
        for (int k = 0; k < GRAPH_TIME_REPLAYS && !rc; k++) rc = be->graph_launch(be, graph, err);
        if (!rc) rc = be->sync(be, err);
        if (!rc) b->us_graph = (now_s() - t0) * 1e6 / (GRAPH_TIME_REPLAYS * calls);
        if (graph) be->graph_free(be, graph);
    }
    be->buf_free(be, &x);
    free(v);
    free(want);
    free(bytes);
    return rc;
}
