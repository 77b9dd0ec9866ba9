/*
 * The CUDA backend through the whole runner against the CPU reference, on the
 * tiny checkpoints (issue 7): the same token sequence is fed to both — a
 * prefill of the prompt, then one decode step per token (teacher forcing, so
 * one early difference cannot hide or cause later ones) — and the logits of
 * every position are compared. Reports per model the largest logit
 * difference relative to the logits' RMS, and each position where the two
 * argmaxes differ with the CPU's top-1/top-2 margin there, which decides
 * whether a different greedy token is a near tie or a real disagreement.
 *
 * Asserts: every logit within REL_TOL·rms of the reference, and every argmax
 * disagreement at a position whose CPU top-1/top-2 margin is below 2x the
 * largest difference of that row (a near tie at fp32 rounding level), and at
 * least half the positions with the same argmax. Measured on H200
 * (bench/results/2026-11-30-cuda-cpu-equality-h200.md): with fp32 MoE
 * intermediates (like the CPU reference) the largest difference is 1.2e-5x
 * rms and every argmax agrees; with the official bf16 storage
 * (DSV4_CUDA_MOE_BF16=1) it was 0.43x rms, first visible after layer 0's
 * MoE and amplified by the E4M3 activation quantisation of every later
 * linear. REL_TOL = 1e-3 leaves ~100x room for fp32 summation-order noise
 * and still fails on the bf16 storage (or any wiring error, ~4x rms).
 *
 * Without CUDA in the build or without a GPU it prints why and checks only
 * that --device cuda is refused with a clear error, so it is a real test on
 * CPU CI as well (of the refusal), and the comparison on the GPU machine.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_runner.h"
#include "model/forward.h"
#include "model/kvcodec.h"
#include "test.h"

#define REL_TOL 1e-3
/* Coded KV rows (--kv-cache-dtype bf16 / fp8_ds_mla, both sides storing the same record): a value
 * the two backends compute a few ulps apart can round to neighbouring bf16 codes when stored (2^-8
 * relative apart), and these random-weight checkpoints amplify such a step enormously: on the CPU
 * alone, bf16 instead of f32 rows moves the logits by 0.3-0.5 x rms within a few positions
 * (bench/results/2026-12-01-kv-dtype-cuda-h200.md). So for coded rows the logit gap is reported,
 * not bounded; what is asserted is the near-tie rule for argmax differences and that at least
 * half the positions agree. The per-op check with equal inputs is the conformance harness
 * (dsv4-gpu-conformance: the coded rows CUDA writes are the CPU codec's bytes). */
#define N_PROMPT 10
#define N_TOK 34

/* The runner's state may be paged (the engine's pool): map slot 0's pages. */
static int map_pages(dsv4_model_runner *mr, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    if (run.page_tokens <= 0 || !run.set_pages) return DSV4_OK;
    int per = (N_TOK + 2 + run.page_tokens - 1) / run.page_tokens;
    int32_t ids[64];
    if (per > 64 || per > run.n_pages) return dsv4_err_set(err, DSV4_ERANGE, "pool too small");
    for (int j = 0; j < per; j++) ids[j] = j;
    return run.set_pages(run.ctx, 0, per, ids, err);
}

/* One segment of n rows at pos0: logits [n][V], or with ids != NULL the greedy ids [n] (forward_ids). */
static int forward_rows_ex(dsv4_runner *run, const int32_t *tok, int pos0, int n, float *logits, int32_t *ids,
                           dsv4_err *err) {
    int32_t pos[N_TOK], slot[N_TOK], sidx[N_TOK], rows[N_TOK], cu[2] = {0, n}, sslot = 0, spos0 = pos0;
    for (int i = 0; i < n; i++) {
        pos[i] = pos0 + i;
        slot[i] = 0;
        sidx[i] = 0;
        rows[i] = i;
    }
    dsv4_batch b = {n, 1, tok, pos, slot, sidx, cu, &sslot, &spos0};
    if (ids) return run->forward_ids(run->ctx, &b, rows, n, ids, err);
    return run->forward(run->ctx, &b, rows, n, logits, err);
}

static int forward_rows(dsv4_runner *run, const int32_t *tok, int pos0, int n, float *logits, dsv4_err *err) {
    return forward_rows_ex(run, tok, pos0, n, logits, NULL, err);
}

/* Logits [N_TOK][V] of a prefill of N_PROMPT tokens then one decode row per token. */
static int all_logits(dsv4_model_runner *mr, const int32_t *tok, float *lg, int V, dsv4_err *err) {
    dsv4_runner run = dsv4_model_runner_iface(mr);
    int rc = forward_rows(&run, tok, 0, N_PROMPT, lg, err);
    for (int p = N_PROMPT; p < N_TOK && !rc; p++) rc = forward_rows(&run, tok + p, p, 1, lg + (size_t)p * V, err);
    return rc;
}

/*
 * Where the gap first appears: the prompt's prefill on both backends with a
 * tap (mean of the hc streams) after every layer, printed per layer as the
 * largest |cpu - cuda| over the rows relative to the CPU taps' RMS. Then
 * slot 0 is released, so the logit comparison below starts from scratch.
 */
static void layer_gap(const char *dir, dsv4_model_runner *cpu, dsv4_model_runner *gpu, const int32_t *tok) {
    dsv4_model *m[2];
    dsv4_state *st[2];
    dsv4_model_runner_target(cpu, &m[0], &st[0]);
    dsv4_model_runner_target(gpu, &m[1], &st[1]);
    const dsv4_config *cfg = dsv4_model_runner_config(cpu);
    int L = m[0]->n_layers, d = cfg->hidden_size, n = N_PROMPT, V = cfg->vocab_size;
    CHECK_EQ_INT(m[1]->n_layers, L);
    int *layers = malloc(sizeof(int) * (size_t)L);
    float *tp[2], *lg[2];
    int32_t pos[N_PROMPT], slot[N_PROMPT], sidx[N_PROMPT], rows[N_PROMPT], cu[2] = {0, n}, sslot = 0, spos0 = 0;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        slot[i] = sidx[i] = 0;
        rows[i] = i;
    }
    for (int l = 0; l < L; l++) layers[l] = l;
    dsv4_batch b = {n, 1, tok, pos, slot, sidx, cu, &sslot, &spos0};
    for (int k = 0; k < 2; k++) {
        dsv4_err err = {0};
        tp[k] = malloc(sizeof(float) * (size_t)n * L * d);
        lg[k] = malloc(sizeof(float) * (size_t)n * V);
        dsv4_fwd_out fo = {rows, n, lg[k], NULL, layers, L, tp[k], NULL, 0, NULL};
        int rc = dsv4_forward_ex(m[k], st[k], &b, &fo, &err);
        CHECK_MSG(rc == 0, "%s: tapped prefill on %s: %s", dir, k ? "cuda" : "cpu", err.msg);
        dsv4_runner run = dsv4_model_runner_iface(k ? gpu : cpu);
        run.release(run.ctx, 0);
    }
    printf("%s: prefill of %d rows, per layer max|cpu-cuda|/rms of the hc-mean taps:", dir, n);
    for (int l = 0; l < L; l++) {
        double ss = 0, md = 0, md0 = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < d; j++) {
                size_t i = ((size_t)t * L + l) * d + j;
                ss += (double)tp[0][i] * tp[0][i];
                double df = fabs((double)tp[0][i] - tp[1][i]);
                if (df > md) md = df;
                if (t == 0 && df > md0) md0 = df;
            }
        double rms = sqrt(ss / ((double)n * d));
        printf(" L%d %.3g (row0 %.3g)", l, md / (rms > 0 ? rms : 1), md0 / (rms > 0 ? rms : 1));
    }
    double ss = 0, md = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        ss += (double)lg[0][i] * lg[0][i];
        double df = fabs((double)lg[0][i] - lg[1][i]);
        if (df > md) md = df;
    }
    printf("; logits %.3g\n", md / sqrt(ss / ((double)n * V)));
    for (int k = 0; k < 2; k++) {
        free(tp[k]);
        free(lg[k]);
    }
    free(layers);
}

static int argmax(const float *x, int V, float *margin);

/*
 * The greedy-ids path (runner forward_ids: backend logit_top where the logits
 * are, issue 7) over the same teacher-forced sequence: every id must be the
 * host argmax (ties: lowest id, the sampler's rule) of the logits the same
 * backend produced for that position in `lg` [N_TOK][V] — exactly.
 */
static void check_ids(const char *dir, const char *dev, dsv4_model_runner *mr, const int32_t *tok, const float *lg,
                      int V) {
    dsv4_err err = {0};
    dsv4_runner run = dsv4_model_runner_iface(mr);
    CHECK_MSG(run.forward_ids != NULL, "%s: the %s runner has no forward_ids", dir, dev);
    if (!run.forward_ids) return;
    int32_t ids[N_TOK];
    int rc = forward_rows_ex(&run, tok, 0, N_PROMPT, NULL, ids, &err);
    for (int p = N_PROMPT; p < N_TOK && !rc; p++) rc = forward_rows_ex(&run, tok + p, p, 1, NULL, ids + p, &err);
    CHECK_MSG(rc == 0, "%s: forward_ids on %s: %s", dir, dev, err.msg);
    int same = 0;
    for (int p = 0; p < N_TOK && !rc; p++) {
        float m;
        int want = argmax(lg + (size_t)p * V, V, &m);
        same += ids[p] == want;
        CHECK_MSG(ids[p] == want, "%s: %s position %d: device greedy id %d, host argmax %d", dir, dev, p, ids[p], want);
    }
    printf("%s: greedy ids on %s: %d of %d positions equal the host argmax of its logits\n", dir, dev, same, N_TOK);
    run.release(run.ctx, 0);
}

static int argmax(const float *x, int V, float *margin) {
    int b = 0, s = -1;
    for (int v = 1; v < V; v++)
        if (x[v] > x[b]) b = v;
    for (int v = 0; v < V; v++)
        if (v != b && (s < 0 || x[v] > x[s])) s = v;
    *margin = x[b] - x[s];
    return b;
}

/*
 * Coded rows, a diagnostic (printed, not asserted): the stored window rows of slot 0 (the last
 * ring-capacity positions), CPU vs CUDA, decoded — how many values differ and by how much. After
 * the first value that rounded to a neighbouring code the hidden states drift apart (see above),
 * so later rows differ widely; the number says how early that happened.
 */
static void stored_rows_gap(const char *dir, dsv4_kv_dtype kt, dsv4_model_runner *cpu, dsv4_model_runner *gpu) {
    struct dsv4_model *m;
    struct dsv4_state *st[2];
    dsv4_model_runner_target(cpu, &m, &st[0]);
    dsv4_model_runner_target(gpu, &m, &st[1]);
    dsv4_backend *be[2] = {dsv4_model_runner_backend(cpu), dsv4_model_runner_backend(gpu)};
    const dsv4_config *cfg = dsv4_model_runner_config(cpu);
    int hd = cfg->head_dim, rope = cfg->qk_rope_head_dim;
    int64_t rb = dsv4_kvcodec_row_bytes(kt, hd, rope), nval = 0, ndiff = 0;
    double worst = 0;
    for (int l = 0; l < st[0]->n_layers; l++) {
        const dsv4_win_state *w0 = &st[0]->layers[l].win, *w1 = &st[1]->layers[l].win;
        int64_t n = (int64_t)w0->cap; /* slot 0's ring rows */
        uint8_t *r[2] = {malloc((size_t)(w0->rows.rows * rb)), malloc((size_t)(w1->rows.rows * rb))};
        float *x = malloc(sizeof(float) * (size_t)hd), *y = malloc(sizeof(float) * (size_t)hd);
        dsv4_err e = {0};
        CHECK(r[0] && r[1] && x && y);
        CHECK_EQ_INT(be[0]->buf_read(be[0], &w0->rows, r[0], &e), 0);
        CHECK_EQ_INT(be[1]->buf_read(be[1], &w1->rows, r[1], &e), 0);
        for (int64_t i = 0; i < n && i < N_TOK; i++) {
            dsv4_kvcodec_decode(kt, hd, rope, r[0] + i * rb, x);
            dsv4_kvcodec_decode(kt, hd, rope, r[1] + i * rb, y);
            for (int j = 0; j < hd; j++, nval++) {
                if (x[j] == y[j]) continue;
                ndiff++;
                double rel = fabs((double)x[j] - y[j]) / fmax(fabs((double)x[j]), fabs((double)y[j]));
                if (rel > worst) worst = rel;
            }
        }
        free(r[0]);
        free(r[1]);
        free(x);
        free(y);
    }
    printf("%s (kv %s): stored window rows: %lld of %lld values differ, largest relative difference %.3g\n", dir,
           dsv4_kv_dtype_name(kt), (long long)ndiff, (long long)nval, worst);
}

/* dir's logits, CPU vs CUDA, with the window / compressed rows of both stored as kt. */
static void compare(const char *dir, dsv4_kv_dtype kt) {
    dsv4_err err = {0};
    dsv4_model_runner *cpu = NULL, *gpu = NULL;
    dsv4_model_runner_opts o = {.n_slots = 1, .max_len = N_TOK + 2, .numerics = DSV4_NUMERICS_REFERENCE,
                                .device = DSV4_DEVICE_CPU, .kv_dtype = (int)kt};
    printf("%s: kv cache dtype %s\n", dir, dsv4_kv_dtype_name(kt));
    CHECK_EQ_INT(dsv4_model_runner_open(dir, &o, &cpu, &err), 0);
    o.device = DSV4_DEVICE_CUDA;
    int grc = dsv4_model_runner_open(dir, &o, &gpu, &err);
    if (grc) {
        printf("%s: no CUDA comparison: %s\n", dir, err.msg);
        CHECK(grc == DSV4_EUNSUPPORTED || grc == DSV4_EBACKEND);
        CHECK_CONTAINS(err.msg, "--device cuda");
        dsv4_model_runner_free(cpu);
        return;
    }
    CHECK_EQ_INT(map_pages(cpu, &err), 0);
    CHECK_EQ_INT(map_pages(gpu, &err), 0);
    int V = dsv4_model_runner_config(cpu)->vocab_size;
    float *a = malloc(sizeof(float) * N_TOK * V), *b = malloc(sizeof(float) * N_TOK * V);
    /* prompt, then the CPU's own greedy continuation (what `dsv4 run` would emit) */
    int32_t tok[N_TOK + 1] = {5, 17, 42, 7, 99, 3, 250, 11, 64, 8};
    if (kt == DSV4_KV_F32) layer_gap(dir, cpu, gpu, tok);
    {
        dsv4_runner run = dsv4_model_runner_iface(cpu);
        float m;
        CHECK_EQ_INT(forward_rows(&run, tok, 0, N_PROMPT, a, &err), 0);
        tok[N_PROMPT] = argmax(a + (size_t)(N_PROMPT - 1) * V, V, &m);
        for (int p = N_PROMPT; p < N_TOK - 1; p++) {
            CHECK_EQ_INT(forward_rows(&run, tok + p, p, 1, a, &err), 0);
            tok[p + 1] = argmax(a, V, &m);
        }
        run.release(run.ctx, 0);
    }
    CHECK_EQ_INT(all_logits(cpu, tok, a, V, &err), 0);
    CHECK_EQ_INT(all_logits(gpu, tok, b, V, &err), 0);
    if (kt != DSV4_KV_F32) stored_rows_gap(dir, kt, cpu, gpu);
    {
        dsv4_runner rc_ = dsv4_model_runner_iface(cpu), rg_ = dsv4_model_runner_iface(gpu);
        rc_.release(rc_.ctx, 0);
        rg_.release(rg_.ctx, 0);
    }
    check_ids(dir, "cpu", cpu, tok, a, V);
    check_ids(dir, "cuda", gpu, tok, b, V);
    double worst = 0, rels[N_TOK];
    int n_diff = 0;
    for (int p = 0; p < N_TOK; p++) {
        const float *x = a + (size_t)p * V, *y = b + (size_t)p * V;
        double ss = 0, md = 0;
        for (int v = 0; v < V; v++) {
            ss += (double)x[v] * x[v];
            double d = fabs((double)x[v] - y[v]);
            if (d > md) md = d;
        }
        double rms = sqrt(ss / V), rel = md / (rms > 0 ? rms : 1);
        if (rel > worst) worst = rel;
        float mc, mg;
        int ac = argmax(x, V, &mc), ag = argmax(y, V, &mg);
        rels[p] = rel;
        if (ac != ag) {
            n_diff++;
            printf("%s: position %d: argmax cpu %d cuda %d, cpu margin %.3g, largest |diff| %.3g (rms %.3g)\n", dir, p,
                   ac, ag, (double)mc, md, rms);
            CHECK_MSG(mc <= 2 * md, "%s position %d: argmax differs beyond a near tie", dir, p);
        }
        if (kt == DSV4_KV_F32) CHECK_MSG(rel <= REL_TOL, "%s position %d: logits differ by %.3g x rms", dir, p, rel);
    }
    printf("%s: per-position max|diff|/rms:", dir);
    for (int p = 0; p < N_TOK; p++) printf(" %.2g", rels[p]);
    printf("\n");
    printf("%s (kv %s): %d positions, largest |logit diff| / rms = %.3g, argmax differs at %d\n", dir,
           dsv4_kv_dtype_name(kt), N_TOK, worst, n_diff);
    CHECK_MSG(2 * n_diff <= N_TOK, "%s: argmax differs at %d of %d positions", dir, n_diff, N_TOK);
    free(a);
    free(b);
    dsv4_model_runner_free(gpu);
    dsv4_model_runner_free(cpu);
}

int main(int argc, char **argv) {
    for (int kv = 0; kv < DSV4_KV_COUNT; kv++) { /* f32, bf16, fp8_ds_mla rows */
        if (argc > 1) {
            for (int i = 1; i < argc; i++) compare(argv[i], (dsv4_kv_dtype)kv);
        } else {
            compare("models/tiny-flash", (dsv4_kv_dtype)kv);
            compare("models/tiny-dspark", (dsv4_kv_dtype)kv);
        }
    }
    return TEST_REPORT();
}
