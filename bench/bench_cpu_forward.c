/*
 * Per-op timings of the CPU reference forward (issue 4): one prefill of N
 * tokens and D single-token decode steps on a checkpoint (default: the tiny
 * Flash model), in both numerics, through the timing backend
 * (src/backend/timing.h). Prints tables; asserts nothing.
 *
 *   build/dsv4-bench-cpu-forward [MODEL_DIR] [--prefill N] [--decode D]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/timing.h"
#include "model/forward.h"
#include "model/safetensors.h"

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int forward_rows(dsv4_model *m, dsv4_state *st, const int32_t *toks, int p0, int n, float *logits,
                        dsv4_err *err) {
    int32_t *pos = malloc(sizeof(int32_t) * n * 3), *slot = pos + n, *seq = slot + n;
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        slot[i] = 0;
        seq[i] = 0;
    }
    int32_t cu[2] = {0, n}, ss = 0, sp = p0, last = n - 1;
    dsv4_batch b = {.n_rows = n, .n_seqs = 1, .token = toks + p0, .pos = pos, .slot = slot, .seq_idx = seq,
                    .cu_seqlens = cu, .seq_slot = &ss, .seq_pos0 = &sp};
    int rc = dsv4_forward(m, st, &b, &last, 1, logits, NULL, err);
    free(pos);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = DSV4_SOURCE_DIR "/models/tiny-flash";
    int n_prefill = 256, n_decode = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prefill") && i + 1 < argc) n_prefill = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) n_decode = atoi(argv[++i]);
        else if (argv[i][0] != '-') dir = argv[i];
        else {
            fprintf(stderr, "usage: %s [MODEL_DIR] [--prefill N] [--decode D]\n", argv[0]);
            return 2;
        }
    }
    if (n_prefill < 1 || n_decode < 0) return 2;
    dsv4_err err = {0};
    dsv4_config cfg;
    dsv4_ckpt *ck = NULL;
    dsv4_weights *w = NULL;
    int rc = dsv4_config_load(dir, &cfg, &err);
    if (!rc) rc = dsv4_ckpt_open(dir, &ck, &err);
    if (!rc) rc = dsv4_config_set_drafts(&cfg, ck, &err);
    if (!rc) rc = dsv4_weights_bind(&cfg, ck, &w, &err);
    if (rc) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        return 1;
    }
    int n = n_prefill + n_decode;
    int32_t *toks = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) toks[i] = 2 + (i * 7919) % (cfg.vocab_size - 2);
    float *logits = malloc(sizeof(float) * cfg.vocab_size);
    int ratios[DSV4_MAX_LAYERS];
    for (int l = 0; l < cfg.num_hidden_layers; l++) ratios[l] = dsv4_config_layer_ratio(&cfg, l);
    printf("# CPU reference forward, %s: %d layers, d=%d, prefill %d tokens, %d decode steps\n", dir,
           cfg.num_hidden_layers, cfg.hidden_size, n_prefill, n_decode);
    for (int mode = 0; mode < 2 && !rc; mode++) {
        dsv4_numerics num = mode ? DSV4_NUMERICS_HF : DSV4_NUMERICS_REFERENCE;
        dsv4_backend *cpu = dsv4_backend_cpu_create(num, &err);
        dsv4_backend *be = dsv4_backend_timing_wrap(cpu, 0, &err);
        dsv4_model *m = NULL;
        dsv4_state *st = NULL;
        rc = dsv4_model_create(&cfg, w, be, &m, &err);
        if (!rc) rc = dsv4_state_create(be, &cfg, ratios, cfg.num_hidden_layers, 1, n + 1, 0, &st, &err);
        double t0 = now_sec();
        if (!rc) rc = forward_rows(m, st, toks, 0, n_prefill, logits, &err);
        double t1 = now_sec();
        if (!rc) {
            printf("\n## %s numerics: prefill %d tokens, %.1f ms (%.1f tok/s)\n",
                   mode ? "HF" : "reference", n_prefill, (t1 - t0) * 1e3, n_prefill / (t1 - t0));
            dsv4_backend_timing_report(be, stdout);
            dsv4_backend_timing_reset(be);
        }
        t0 = now_sec();
        for (int i = 0; i < n_decode && !rc; i++) rc = forward_rows(m, st, toks, n_prefill + i, 1, logits, &err);
        t1 = now_sec();
        if (!rc && n_decode) {
            printf("\n## %s numerics: %d decode steps, %.2f ms/step\n", mode ? "HF" : "reference", n_decode,
                   (t1 - t0) * 1e3 / n_decode);
            dsv4_backend_timing_report(be, stdout);
        }
        dsv4_state_free(st);
        dsv4_model_free(m);
        if (be) be->free(be);
        if (cpu) cpu->free(cpu);
    }
    if (rc) fprintf(stderr, "bench: %s\n", err.msg);
    free(toks);
    free(logits);
    dsv4_weights_free(w);
    dsv4_ckpt_free(ck);
    return rc ? 1 : 0;
}
