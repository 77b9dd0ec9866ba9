/*
 * safetensors reader (src/model/safetensors.c): valid files and directories
 * open; every malformed, truncated or inconsistent input gives an error that
 * names the file and tensor; a few thousand mutated headers never crash (this
 * test runs under ASan/UBSan in CI; tests/fuzz/fuzz_safetensors_header.c is
 * the coverage-guided version).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "st_write.h"
#include "test.h"

static char tmpdir[256];

static const stw_tensor T3[] = {
    {"a.weight", "BF16", 2, {4, 3}, 24, 1},
    {"b.scale", "F8_E8M0", 2, {1, 1}, 1, 9},
    {"c", "F32", 1, {5}, 20, 50},
};

/* Expect parse of a raw header to fail with code and a message containing needle. */
static void expect_bad_header(const char *json, size_t data_len, const char *needle) {
    size_t sz;
    uint8_t *b = stw_raw(json, data_len, &sz);
    dsv4_st_file *f = NULL;
    dsv4_err err = {0};
    int rc = dsv4_st_parse(b, sz, "x.safetensors", &f, &err);
    CHECK_MSG(rc != 0 && f == NULL, "header accepted: %s", json);
    CHECK_CONTAINS(err.msg, "x.safetensors");
    if (needle) CHECK_CONTAINS(err.msg, needle);
    free(b);
}

static void test_parse(void) {
    size_t sz;
    uint8_t *b = stw_build(T3, 3, &sz);
    dsv4_st_file *f = NULL;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_st_parse(b, sz, "ok.safetensors", &f, &err), 0);
    CHECK_EQ_INT(dsv4_st_count(f), 3);
    const dsv4_tview *v = dsv4_st_at(f, 0);
    CHECK_STR(v->name, "a.weight");
    CHECK(v->dtype == DSV4_DT_BF16 && v->ndim == 2 && v->shape[0] == 4 && v->shape[1] == 3);
    CHECK(v->nbytes == 24 && ((const uint8_t *)v->data)[0] == 1 && ((const uint8_t *)v->data)[23] == 24);
    v = dsv4_st_at(f, 2);
    CHECK(v->nbytes == 20 && ((const uint8_t *)v->data)[0] == 50);
    CHECK(((const uint8_t *)v->data) + 20 == b + sz);
    dsv4_st_free(f);

    /* every truncation of a valid file is an error, never a crash */
    int accepted = 0;
    for (size_t cut = 0; cut < sz; cut++) {
        f = NULL;
        if (dsv4_st_parse(b, cut, "t.safetensors", &f, &err) == 0) accepted++;
        dsv4_st_free(f);
    }
    CHECK_EQ_INT(accepted, 0);
    CHECK(dsv4_st_parse(b, sz - 1, "t.safetensors", &f, &err) != 0);
    CHECK_CONTAINS(err.msg, "truncated");
    CHECK_CONTAINS(err.msg, "'c'");
    free(b);

    /* scalars and zero-size tensors are legal */
    expect_bad_header("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 5,
                      "trailing");
    size_t s2;
    uint8_t *b2 = stw_raw("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                          "\"z\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[4,4]}}", 4, &s2);
    CHECK_EQ_INT(dsv4_st_parse(b2, s2, "s.safetensors", &f, &err), 0);
    CHECK_EQ_INT(dsv4_st_count(f), 2);
    dsv4_st_free(f);
    free(b2);

    /* malformed headers */
    expect_bad_header("[1,2]", 0, "not a JSON object");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "JSON");
    expect_bad_header("{\"a\":3}", 0, "'a'");
    expect_bad_header("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "bad shape");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "bad shape");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "bad shape");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                      "\"data_offsets\":[0,4]}}", 4, "'a'");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dims");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "begin");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, "data_offsets");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "needs 8");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 3, "truncated");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6, "overlaps");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "twice");
    expect_bad_header("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad_header("{\"__metadata__\":7}", 0, "__metadata__");
    expect_bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}", 4, "data_offsets");
    /* header length larger than the file */
    uint8_t hb[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    CHECK(dsv4_st_parse(hb, sizeof hb, "h.safetensors", &f, &err) != 0);
    CHECK_CONTAINS(err.msg, "header length");
}

/* Deterministic mutations of a valid image: byte flips, JSON-significant
 * characters, header-length edits. Every outcome is fine except a crash or a
 * view outside the buffer. */
static void test_mutations(void) {
    size_t sz;
    uint8_t *orig = stw_build(T3, 3, &sz);
    uint8_t *b = malloc(sz);
    uint32_t seed = 7;
    int ok = 0, bad_views = 0;
    static const char sig[] = "{}[],:\"0123456789-.e ";
    for (int it = 0; it < 20000; it++) {
        memcpy(b, orig, sz);
        int nm = 1 + (int)((seed >> 7) % 4);
        for (int m = 0; m < nm; m++) {
            seed = seed * 1103515245u + 12345u;
            size_t pos = (seed >> 8) % sz;
            switch ((seed >> 4) % 4) {
            case 0: b[pos] ^= (uint8_t)(1u << ((seed >> 20) % 8)); break;
            case 1: b[pos] = (uint8_t)sig[(seed >> 16) % (sizeof sig - 1)]; break;
            case 2: b[(seed >> 12) % 8] = (uint8_t)(seed >> 24); break;
            default: b[pos] = (uint8_t)(seed >> 16); break;
            }
        }
        seed = seed * 1103515245u + 12345u;
        size_t len = (seed % 5 == 0) ? (seed >> 8) % (sz + 1) : sz;
        dsv4_st_file *f = NULL;
        dsv4_err err = {0};
        if (dsv4_st_parse(b, len, "m.safetensors", &f, &err) == 0) {
            ok++;
            for (size_t i = 0; i < dsv4_st_count(f); i++) {
                const dsv4_tview *v = dsv4_st_at(f, i);
                const uint8_t *p = v->data;
                if (p < b || p + v->nbytes > b + len) bad_views++;
            }
        } else {
            CHECK(err.msg[0] != '\0');
        }
        dsv4_st_free(f);
    }
    CHECK_EQ_INT(bad_views, 0);
    printf("mutations: %d of 20000 still valid\n", ok);
    free(b);
    free(orig);
}

/* ---- directories ---- */

static void path_of(char *out, const char *d, const char *f) {
    if (snprintf(out, 512, "%s/%s", d, f) >= 512) abort();
}

static void make_dir(const char *name, char *dir) {
    if (snprintf(dir, 512, "%s/%s", tmpdir, name) >= 512) abort();
    char cmd[1200];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir) >= (int)sizeof cmd) abort();
    CHECK(system(cmd) == 0);
}

static const stw_tensor S1[] = {{"x.weight", "BF16", 1, {4}, 8, 3}, {"y", "F32", 1, {2}, 8, 7}};
static const stw_tensor S2[] = {{"z.weight", "I64", 2, {2, 1}, 16, 11}};

static void write_sharded(const char *dir, const char *index) {
    char p[512];
    size_t sz;
    uint8_t *b = stw_build(S1, 2, &sz);
    path_of(p, dir, "model-00001-of-00002.safetensors");
    CHECK(stw_save(p, b, sz) == 0);
    free(b);
    b = stw_build(S2, 1, &sz);
    path_of(p, dir, "model-00002-of-00002.safetensors");
    CHECK(stw_save(p, b, sz) == 0);
    free(b);
    path_of(p, dir, "model.safetensors.index.json");
    CHECK(stw_save_text(p, index) == 0);
}

static const char *GOOD_INDEX =
    "{\"metadata\":{\"total_size\":32},\"weight_map\":{"
    "\"x.weight\":\"model-00001-of-00002.safetensors\","
    "\"y\":\"model-00001-of-00002.safetensors\","
    "\"z.weight\":\"model-00002-of-00002.safetensors\"}}";

static void expect_open_fails(const char *dir, const char *n1, const char *n2) {
    dsv4_ckpt *c = NULL;
    dsv4_err err = {0};
    int rc = dsv4_ckpt_open(dir, &c, &err);
    CHECK_MSG(rc != 0 && c == NULL, "opened %s", dir);
    if (n1) CHECK_CONTAINS(err.msg, n1);
    if (n2) CHECK_CONTAINS(err.msg, n2);
    dsv4_ckpt_free(c);
}

static void test_dirs(void) {
    char dir[512], p[512];
    dsv4_ckpt *c = NULL;
    dsv4_err err = {0};

    /* single file */
    make_dir("single", dir);
    size_t sz;
    uint8_t *b = stw_build(T3, 3, &sz);
    path_of(p, dir, "model.safetensors");
    CHECK(stw_save(p, b, sz) == 0);
    free(b);
    CHECK_EQ_INT(dsv4_ckpt_open(dir, &c, &err), 0);
    CHECK_EQ_INT(dsv4_ckpt_count(c), 3);
    const dsv4_tview *v = dsv4_ckpt_find(c, "c");
    CHECK(v && v->nbytes == 20);
    CHECK(dsv4_ckpt_find(c, "d") == NULL);
    CHECK_STR(dsv4_ckpt_file_of(c, v), "model.safetensors");
    CHECK_EQ_INT(dsv4_ckpt_total_bytes(c), 45);
    dsv4_ckpt_free(c);

    /* alignment: BF16[1] (2 bytes) puts the next F32 and I64 at odd offsets
     * in the file; the checkpoint's views are aligned copies, same bytes */
    make_dir("align", dir);
    {
        static const stw_tensor TA[] = {{"a", "BF16", 1, {1}, 2, 1},
                                        {"b", "F32", 1, {3}, 12, 20},
                                        {"c", "I64", 1, {2}, 16, 40}};
        b = stw_build(TA, 3, &sz);
        path_of(p, dir, "model.safetensors");
        CHECK(stw_save(p, b, sz) == 0);
        free(b);
        CHECK_EQ_INT(dsv4_ckpt_open(dir, &c, &err), 0);
        const dsv4_tview *vb = dsv4_ckpt_find(c, "b"), *vc = dsv4_ckpt_find(c, "c");
        CHECK(vb && (uintptr_t)vb->data % 4 == 0 && ((const uint8_t *)vb->data)[0] == 20 &&
              ((const uint8_t *)vb->data)[11] == 31);
        CHECK(vc && (uintptr_t)vc->data % 8 == 0 && ((const uint8_t *)vc->data)[15] == 55);
        CHECK_EQ_INT(dsv4_ckpt_total_bytes(c), 30);
        dsv4_ckpt_free(c);
    }

    /* sharded, good */
    make_dir("good", dir);
    write_sharded(dir, GOOD_INDEX);
    CHECK_EQ_INT(dsv4_ckpt_open(dir, &c, &err), 0);
    CHECK_EQ_INT(dsv4_ckpt_count(c), 3);
    CHECK_EQ_INT(dsv4_ckpt_num_files(c), 2);
    v = dsv4_ckpt_find(c, "z.weight");
    CHECK(v && v->dtype == DSV4_DT_I64 && ((const uint8_t *)v->data)[0] == 11);
    CHECK_STR(dsv4_ckpt_file_of(c, v), "model-00002-of-00002.safetensors");
    CHECK_EQ_INT(dsv4_ckpt_index_of(c, v), 2);
    for (size_t i = 0; i < dsv4_ckpt_count(c); i++)
        CHECK(dsv4_ckpt_find(c, dsv4_ckpt_at(c, i)->name) == dsv4_ckpt_at(c, i));
    dsv4_ckpt_free(c);

    /* missing shard */
    make_dir("missing", dir);
    write_sharded(dir, GOOD_INDEX);
    path_of(p, dir, "model-00002-of-00002.safetensors");
    unlink(p);
    expect_open_fails(dir, "model-00002-of-00002.safetensors", "z.weight");

    /* truncated shard */
    make_dir("trunc", dir);
    write_sharded(dir, GOOD_INDEX);
    path_of(p, dir, "model-00001-of-00002.safetensors");
    {
        FILE *f = fopen(p, "rb");
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fclose(f);
        CHECK(truncate(p, n - 3) == 0);
    }
    expect_open_fails(dir, "model-00001-of-00002.safetensors", "truncated");

    /* tensor in index but not in its shard */
    make_dir("ghost", dir);
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
                       "\"y\":\"model-00001-of-00002.safetensors\",\"w\":\"model-00002-of-00002.safetensors\","
                       "\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(dir, "'w'", "model-00002-of-00002.safetensors");

    /* tensor in a shard but not in the index */
    make_dir("unlisted", dir);
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
                       "\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(dir, "'y'", "not listed");

    /* index names the wrong shard */
    make_dir("wrongshard", dir);
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\","
                       "\"y\":\"model-00002-of-00002.safetensors\","
                       "\"z.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(dir, "'y'", "model-00002-of-00002.safetensors");

    /* bad index entries */
    make_dir("badentry", dir);
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":5}}");
    expect_open_fails(dir, "x.weight", "model.safetensors.index.json");
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":\"../evil.safetensors\"}}");
    expect_open_fails(dir, "x.weight", "shard file name");
    write_sharded(dir, "{\"weight_map\":[1]}");
    expect_open_fails(dir, "weight_map", NULL);
    write_sharded(dir, "{\"weight_map\":{\"x.weight\":\"model-00001-of-00002.safetensors\"");
    expect_open_fails(dir, "model.safetensors.index.json", NULL);

    /* corrupt header in a shard */
    make_dir("corrupt", dir);
    write_sharded(dir, GOOD_INDEX);
    path_of(p, dir, "model-00002-of-00002.safetensors");
    {
        FILE *f = fopen(p, "r+b");
        fseek(f, 8, SEEK_SET);
        fputs("#garbage", f);
        fclose(f);
    }
    expect_open_fails(dir, "model-00002-of-00002.safetensors", "corrupt header");

    /* a partial download */
    make_dir("incomplete", dir);
    write_sharded(dir, GOOD_INDEX);
    path_of(p, dir, "model-00003-of-00003.safetensors.incomplete");
    CHECK(stw_save_text(p, "x") == 0);
    expect_open_fails(dir, "model-00003-of-00003.safetensors.incomplete", "partial download");
    unlink(p);
    char cmd[1200];
    if (snprintf(cmd, sizeof cmd, "mkdir -p '%s/.cache/huggingface/download' && touch "
                 "'%s/.cache/huggingface/download/abc.incomplete'", dir, dir) >= (int)sizeof cmd)
        abort();
    CHECK(system(cmd) == 0);
    expect_open_fails(dir, "abc.incomplete", NULL);

    /* a shard file the index does not name (stale index / leftover download) */
    make_dir("stray", dir);
    write_sharded(dir, GOOD_INDEX);
    {
        size_t s3;
        uint8_t *b3 = stw_build(S2, 1, &s3);
        path_of(p, dir, "model-00003-of-00003.safetensors");
        CHECK(stw_save(p, b3, s3) == 0);
        free(b3);
    }
    expect_open_fails(dir, "model-00003-of-00003.safetensors", "maps no tensor");

    /* empty directory */
    make_dir("empty", dir);
    expect_open_fails(dir, "model.safetensors", NULL);
    expect_open_fails("/nonexistent/dir", "/nonexistent/dir", NULL);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dsv4_test_st_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_parse();
    test_mutations();
    test_dirs();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return TEST_REPORT();
}
