/*
 * libFuzzer target for the tokenizer (text/tokenizer.h). The first input byte
 * picks what to fuzz:
 *   even: the rest is a tokenizer.json for dsv4_tokenizer_load_json — any
 *         bytes must give a tokenizer or an error, never a crash or leak
 *   odd:  the rest is text for dsv4_tokenizer_encode (allow_special = bit 1)
 *         with the real tokenizer ($DSV4_TOKENIZER_JSON, else
 *         models/default/tokenizer.json, else a built-in tiny one); decode
 *         must give back the input with ill-formed UTF-8 replaced by U+FFFD.
 * Build: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDSV4_FUZZ=ON
 *        cmake --build build-fuzz --target fuzz_tokenizer
 * Run:   DSV4_TOKENIZER_JSON=... build-fuzz/fuzz_tokenizer -max_total_time=60
 */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

static const char TINY[] =
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"Ġ\":3},\"merges\":[\"a b\"]},"
    "\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
    "\"\\\\s+|\\\\p{L}+\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
    "\"add_prefix_space\":false,\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"}}";

static dsv4_tokenizer *g_tok;
static int g_full; /* 1 when the real tokenizer (all 256 bytes) is loaded */

static void load_once(void) {
    if (g_tok) return;
    const char *env = getenv("DSV4_TOKENIZER_JSON");
    if (env && !dsv4_tokenizer_load(env, &g_tok, NULL)) { g_full = 1; return; }
    if (!dsv4_tokenizer_load(DSV4_SOURCE_DIR "/models/default/tokenizer.json", &g_tok, NULL)) { g_full = 1; return; }
    if (dsv4_tokenizer_load_json(TINY, sizeof TINY - 1, "tiny", &g_tok, NULL)) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        dsv4_tokenizer *t = NULL;
        dsv4_err err = {0};
        if (!dsv4_tokenizer_load_json(s, n, "fuzz.json", &t, &err)) {
            dsv4_tokvec v = {0};
            dsv4_tokenizer_encode(t, "ab <s> ba\xff", 10, 1, &v, NULL);
            dsv4_tokvec_free(&v);
            dsv4_tokenizer_free(t);
        } else if (!strstr(err.msg, "fuzz.json")) {
            __builtin_trap(); /* every load error names the file */
        }
        return 0;
    }
    load_once();
    dsv4_tokvec v = {0};
    if (dsv4_tokenizer_encode(g_tok, s, n, (data[0] >> 1) & 1, &v, NULL)) __builtin_trap();
    char *out = NULL, *fixed = NULL;
    size_t ol = 0, fl = 0;
    if (dsv4_tokenizer_decode(g_tok, v.ids, v.n, 0, &out, &ol, NULL)) __builtin_trap();
    if (g_full) {
        if (tk_utf8_sanitize(s, n, &fixed, &fl)) __builtin_trap();
        const char *want = fixed ? fixed : s;
        size_t wl = fixed ? fl : n;
        if (ol != wl || memcmp(out, want, wl)) __builtin_trap();
    }
    free(out);
    free(fixed);
    dsv4_tokvec_free(&v);
    return 0;
}
