/*
 * Helpers for tests that read the generated tiny checkpoints and the
 * reference fixtures: where the models are (generating them into /tmp when
 * scripts/setup.sh has not), and reading a whole file.
 */
#ifndef DSV4_TEST_MODELS_H
#define DSV4_TEST_MODELS_H
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * tm_find_models — fill out[n] with a folder holding every model in need[k]
 * (names as tools/gen_checkpoints.py --only takes them): <source>/models when
 * each has its manifest, else a per-process folder in /tmp generated now.
 */
static inline void tm_find_models(char *out, size_t n, const char *const *need, int k) {
    struct stat st;
    char p[1024];
    snprintf(out, n, "%s/models", DSV4_SOURCE_DIR);
    int have = 1;
    for (int i = 0; i < k; i++) {
        snprintf(p, sizeof p, "%s/%s/manifest.json", out, need[i]);
        have &= stat(p, &st) == 0;
    }
    if (have) return;
    snprintf(out, n, "/tmp/dsv4_test_models_%d", (int)getpid());
    char cmd[2048];
    int off = snprintf(cmd, sizeof cmd, "python3 %s/tools/gen_checkpoints.py --out %s", DSV4_SOURCE_DIR, out);
    for (int i = 0; i < k && off < (int)sizeof cmd; i++)
        off += snprintf(cmd + off, sizeof cmd - (size_t)off, " --only %s", need[i]);
    if (off < (int)sizeof cmd) snprintf(cmd + off, sizeof cmd - (size_t)off, " >/dev/null");
    if (system(cmd) != 0) fprintf(stderr, "generating the tiny checkpoints failed: %s\n", cmd);
}

/* tm_read_file — the whole file, NUL-terminated (malloc'd), size in *n; NULL if unreadable. */
static inline char *tm_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    if (b) b[sz] = 0;
    fclose(f);
    if (n && b) *n = (size_t)sz;
    return b;
}
#endif
