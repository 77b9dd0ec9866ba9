/*
 * Host sampling cost per logit row at the real vocabulary (129,280 ids):
 * dsv4_sampling_probs (penalties, softmax, min_p / top_k / top_p; spec/SERVING.md
 * §7.2) for the settings clients send, on synthetic logits. Printed, never
 * asserted, not in ctest. Why it matters: every sampled decode row goes
 * through it on the host, k+1 rows per DSpark request per step
 * (engine.c decode_segment), so at batch 32 with k = 5 a step samples 192
 * rows. Usage: dsv4-bench-sampler [vocab] [rows]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/sampler.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double uni(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return ((double)(rs >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

int main(int argc, char **argv) {
    const int V = argc > 1 ? atoi(argv[1]) : 129280, rows = argc > 2 ? atoi(argv[2]) : 20;
    if (V < 2 || rows < 1) {
        fprintf(stderr, "usage: %s [vocab >= 2] [rows >= 1]\n", argv[0]);
        return 2;
    }
    float *lg = malloc(sizeof *lg * (size_t)V), *pr = malloc(sizeof *pr * (size_t)V);
    void *sc = malloc(dsv4_sampling_scratch_bytes(V));
    if (!lg || !pr || !sc) return 1;
    struct {
        const char *name;
        float temp, top_p, min_p;
        int top_k;
        double sigma; /* logit spread: 3 = a flat-ish row, 8 = a peaked one */
    } cs[] = {
        {"greedy", 0, 1, 0, 0, 3},
        {"temperature 1", 1, 1, 0, 0, 3},
        {"temperature 0.6, top_p 0.95 (peaked row)", 0.6f, 0.95f, 0, 0, 8},
        {"temperature 0.6, top_p 0.95 (flat row)", 0.6f, 0.95f, 0, 0, 3},
        {"temperature 0.7, top_k 50", 0.7f, 1, 0, 50, 3},
        {"top_k 50, top_p 0.9, min_p 0.05", 1, 0.9f, 0.05f, 50, 3},
    };
    printf("vocab %d, %d rows per setting, one thread\n", V, rows);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        for (int v = 0; v < V; v++)
            lg[v] = (float)(cs[c].sigma * sqrt(-2 * log(uni())) * cos(6.283185307179586 * uni()));
        dsv4_sampling s;
        dsv4_sampling_default(&s);
        s.temperature = cs[c].temp;
        s.top_p = cs[c].top_p;
        s.top_k = cs[c].top_k;
        s.min_p = cs[c].min_p;
        int kept = 0;
        double t0 = now_s();
        for (int r = 0; r < rows; r++) dsv4_sampling_probs(&s, lg, V, NULL, 0, NULL, 0, pr, sc);
        double ms = (now_s() - t0) / rows * 1e3;
        for (int v = 0; v < V; v++) kept += pr[v] > 0;
        printf("%-44s %8.3f ms/row  (%d ids kept)\n", cs[c].name, ms, kept);
    }
    free(sc);
    free(pr);
    free(lg);
    return 0;
}
