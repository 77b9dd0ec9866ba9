/*
 * `dsv4 serve --max-model-len` as vLLM's (src/cli/serve_args.c parse_model_len): whole
 * numbers, vLLM's human-readable suffixes (k/m/g = 1000^n, decimals allowed; K/M/G = 1024^n,
 * whole numbers only: vllm/utils human_readable_int), auto / -1 (fit to the pool), and one
 * actionable refusal for the rest. Before: "32k" was refused, and "1" passed the parser and
 * failed later with "model runner: bad sizes (slots 72, max_len 1, max_spec 0)".
 */
#include <string.h>

#include "cli/serve_args.h"
#include "test.h"

static int parse(dsv4_serve_args *a, dsv4_err *err, const char *v) {
    char *argv[3] = {"serve", "--max-model-len", (char *)v};
    memset(err, 0, sizeof *err);
    return dsv4_serve_args_parse(3, argv, a, err);
}

static int len_of(const char *v) {
    dsv4_serve_args a;
    dsv4_err err;
    if (parse(&a, &err, v)) return -100;
    return a.max_model_len_auto ? -1 : (int)a.http.max_model_len;
}

int main(void) {
    dsv4_serve_args a;
    dsv4_err err;
    CHECK_EQ_INT(len_of("8192"), 8192);
    CHECK_EQ_INT(len_of("2"), 2);
    CHECK_EQ_INT(len_of("1048576"), 1048576);
    CHECK_EQ_INT(len_of("32k"), 32000);    /* 10^3 */
    CHECK_EQ_INT(len_of("128K"), 131072);  /* 2^10 */
    CHECK_EQ_INT(len_of("25.6k"), 25600);  /* vLLM's own example */
    CHECK_EQ_INT(len_of("1M"), 1048576);
    CHECK_EQ_INT(len_of("1m"), 1000000);
    CHECK_EQ_INT(len_of("auto"), -1);
    CHECK_EQ_INT(len_of("-1"), -1);

    const char *bad[] = {"1", "0", "-2", "abc", "", "8192.5", "2000000", "2M", "12x", "k", "1.k", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(parse(&a, &err, bad[i]) != 0);
        CHECK_CONTAINS(err.msg, "auto / -1");
        CHECK_CONTAINS(err.msg, "[2, 1048576]");
    }
    CHECK(parse(&a, &err, "1.5K") != 0);
    CHECK_CONTAINS(err.msg, "did you mean 1.5k?");
    return TEST_REPORT();
}
