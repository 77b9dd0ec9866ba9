/*
 * CUDA-graph replay of the target forward (issue 7) against eager execution,
 * on the tiny checkpoints, over a multi-step decode whose batch composition
 * changes every step (1, 2, 4, 3 sequences, then 2 sequences x 3 verify rows),
 * each shape recurring so that it is run eagerly (warm-up), captured, then
 * replayed several times with new positions and tokens.
 *
 * Three runners see the same steps: eager (--enforce-eager), graphs
 * (--cuda-graphs) and eager with the graphs' shape-static launch sizes
 * (cuda_graphs = 2). Asserts: graph replay gives bit-identical logits to the
 * eager forward with the same launch sizes (a replay that read a stale
 * position, token, slot or buffer would differ by whole logits). Reports the
 * largest difference between graphs and the default eager launch sizes,
 * which differ only in attention's split-K summation order.
 *
 * Without CUDA (CPU CI): the CPU backend has no graph ops, so --cuda-graphs
 * must change nothing: asserts bit-identical logits to eager there too.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_runner.h"
#include "test.h"

#define N_SLOTS 4
#define N_PROMPT 10
#define N_STEPS 24
#define MAX_LEN 80 /* DSV4_TEST_MAX_LEN overrides (state capacity: the static launch sizes grow with it) */
static int max_len = MAX_LEN;

/* step s: which slots take part and how many rows each (1 = decode, 3 = verify) */
static int step_slots(int s, int *slots, int *rows_per) {
    static const int comp[5][N_SLOTS + 1] = {{1, 0}, {2, 0, 1}, {4, 0, 1, 2, 3}, {3, 1, 2, 3}, {2, 0, 2}};
    const int *c = comp[s % 5];
    for (int i = 0; i < c[0]; i++) slots[i] = c[i + 1];
    *rows_per = s % 5 == 4 ? 3 : 1;
    return c[0];
}

static uint32_t tok_of(int slot, int pos) { return (uint32_t)(slot * 7919 + pos * 104729 + 13) % 200 + 3; }

/* All logits of the run (prefill of every slot, then N_STEPS steps) into lg, in order; returns rows written. */
static int run_all(dsv4_model_runner *mr, float *lg, int V, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    if (run.page_tokens > 0 && run.set_pages) {
        int per = (max_len + run.page_tokens - 1) / run.page_tokens;
        int32_t ids[1024];
        if (per > 1024 || per * N_SLOTS > run.n_pages) return -dsv4_err_set(err, DSV4_ERANGE, "pool too small");
        for (int s = 0; s < N_SLOTS; s++) {
            for (int j = 0; j < per; j++) ids[j] = s * per + j;
            int rc = run.set_pages(run.ctx, s, per, ids, err);
            if (rc) return -rc;
        }
    }
    int len[N_SLOTS] = {0}, out = 0;
    int32_t tok[64], pos[64], slot[64], sidx[64], rows[64], cu[N_SLOTS + 1], sslot[N_SLOTS], spos0[N_SLOTS];
    for (int s = 0; s < N_SLOTS; s++) { /* prefills: one shape, four times */
        for (int i = 0; i < N_PROMPT; i++) {
            tok[i] = (int32_t)tok_of(s, i);
            pos[i] = i;
            slot[i] = s;
            sidx[i] = 0;
            rows[i] = i;
        }
        cu[0] = 0;
        cu[1] = N_PROMPT;
        sslot[0] = s;
        spos0[0] = 0;
        dsv4_batch b = {N_PROMPT, 1, tok, pos, slot, sidx, cu, sslot, spos0};
        int rc = run.forward(run.ctx, &b, rows, N_PROMPT, lg + (size_t)out * V, err);
        if (rc) return -rc;
        out += N_PROMPT;
        len[s] = N_PROMPT;
    }
    for (int st = 0; st < N_STEPS; st++) {
        int sl[N_SLOTS], rp, ns = step_slots(st, sl, &rp), T = 0;
        cu[0] = 0;
        for (int i = 0; i < ns; i++) {
            int s = sl[i];
            sslot[i] = s;
            spos0[i] = len[s];
            for (int r = 0; r < rp; r++, T++) {
                pos[T] = len[s] + r;
                tok[T] = (int32_t)tok_of(s, pos[T]);
                slot[T] = s;
                sidx[T] = i;
                rows[T] = T;
            }
            cu[i + 1] = T;
            len[s] += 1; /* a verify step commits one row: the others are written again later */
        }
        dsv4_batch b = {T, ns, tok, pos, slot, sidx, cu, sslot, spos0};
        int rc = run.forward(run.ctx, &b, rows, T, lg + (size_t)out * V, err);
        if (rc) return -rc;
        out += T;
    }
    return out;
}

static void compare(const char *dir) {
    dsv4_err err = {0};
    dsv4_model_runner_opts o = {.n_slots = N_SLOTS, .max_len = max_len, .max_spec = 2,
                                .numerics = DSV4_NUMERICS_REFERENCE, .device = DSV4_DEVICE_CUDA};
    dsv4_model_runner *mr[3] = {NULL, NULL, NULL};
    /* DSV4_TEST_DUMMY_LAYERS=N: `dir` is a config folder, dummy weights of its real shapes, N layers */
    const char *dl = getenv("DSV4_TEST_DUMMY_LAYERS");
    char ov[64];
    snprintf(ov, sizeof ov, "{\"num_hidden_layers\": %d}", dl ? atoi(dl) : 0);
    dsv4_load_opts lo = {.dummy = dl != NULL, .hf_overrides = dl ? ov : NULL};
    int rc = dsv4_model_runner_open_ex(dir, &o, &lo, &mr[0], &err);
    if (rc) {
        printf("%s: no CUDA (%s): comparing on the CPU backend\n", dir, err.msg);
        o.device = DSV4_DEVICE_CPU;
        CHECK_EQ_INT(dsv4_model_runner_open_ex(dir, &o, &lo, &mr[0], &err), 0);
    }
    o.cuda_graphs = 1;
    CHECK_EQ_INT(dsv4_model_runner_open_ex(dir, &o, &lo, &mr[1], &err), 0);
    o.cuda_graphs = 2;
    CHECK_EQ_INT(dsv4_model_runner_open_ex(dir, &o, &lo, &mr[2], &err), 0);
    if (!mr[0] || !mr[1] || !mr[2]) return;
    int V = dsv4_model_runner_config(mr[0])->vocab_size;
    size_t cap = (size_t)(N_SLOTS * N_PROMPT + N_STEPS * 8) * V;
    float *lg[3];
    int n[3];
    for (int k = 0; k < 3; k++) {
        lg[k] = calloc(cap, sizeof(float));
        n[k] = run_all(mr[k], lg[k], V, &err);
        CHECK_MSG(n[k] > 0, "%s runner %d: %s", dir, k, err.msg);
    }
    if (n[0] > 0 && n[0] == n[1] && n[1] == n[2]) {
        size_t N = (size_t)n[0] * V, same_static = 0, same_eager = 0;
        double md = 0, ss = 0;
        for (size_t i = 0; i < N; i++) {
            same_static += memcmp(&lg[1][i], &lg[2][i], 4) == 0;
            same_eager += memcmp(&lg[1][i], &lg[0][i], 4) == 0;
            double d = fabs((double)lg[1][i] - lg[0][i]);
            if (d > md) md = d;
            ss += (double)lg[0][i] * lg[0][i];
        }
        printf("%s (max_len %d): %d logit rows; graphs vs eager (static shapes): %zu/%zu bit-identical; graphs vs eager "
               "(default): %zu/%zu bit-identical, largest |diff| %.3g (rms %.3g)\n",
               dir, max_len, n[0], same_static, N, same_eager, N, md, sqrt(ss / (double)N));
        CHECK_MSG(same_static == N, "%s: graph replay differs from eager at equal launch sizes", dir);
        if (o.device == DSV4_DEVICE_CPU) CHECK_MSG(same_eager == N, "%s: --cuda-graphs changed the CPU backend", dir);
    }
    for (int k = 0; k < 3; k++) {
        free(lg[k]);
        dsv4_model_runner_free(mr[k]);
    }
}

int main(int argc, char **argv) {
    const char *ml = getenv("DSV4_TEST_MAX_LEN");
    if (ml && atoi(ml) >= MAX_LEN) max_len = atoi(ml);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) compare(argv[i]);
    } else {
        compare("models/tiny-flash");
        compare("models/tiny-dspark");
    }
    return TEST_REPORT();
}
