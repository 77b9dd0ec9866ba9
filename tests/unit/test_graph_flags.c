/*
 * vLLM's CUDA-graph flags on `dsv4 serve` (issue 7; src/cli/serve_args.c):
 * --cuda-graph-sizes (a list, or one value = the default pattern up to it,
 * vLLM's SchedulerConfig rule), --compilation-config / -O JSON with
 * cudagraph_capture_sizes, max_cudagraph_capture_size, cudagraph_mode,
 * the dotted -O.KEY=VALUE form, -O3 (a torch.compile level: ignored), and
 * the refusals: both lists given, a max that is not the list's largest,
 * an unknown key, a bad mode or size.
 */
#include <stdarg.h>
#include <string.h>

#include "cli/serve_args.h"
#include "test.h"

static int parse(dsv4_serve_args *a, dsv4_err *err, int n, ...) {
    char *argv[16] = {"serve"};
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n && i < 15; i++) argv[i + 1] = va_arg(ap, char *);
    va_end(ap);
    memset(err, 0, sizeof *err);
    return dsv4_serve_args_parse(n + 1, argv, a, err);
}

int main(void) {
    dsv4_serve_args a;
    dsv4_err err;
    CHECK_EQ_INT(parse(&a, &err, 0), 0); /* defaults: vLLM's pattern, graphs on */
    CHECK_EQ_INT(a.n_graph_sizes, 0);
    CHECK_EQ_INT(a.max_graph_size, 0);
    CHECK_EQ_INT(a.cudagraph_mode_none, 0);

    CHECK_EQ_INT(parse(&a, &err, 7, "--cuda-graph-sizes", "1", "2", "4", "8", "--port", "9001"), 0);
    CHECK_EQ_INT(a.n_graph_sizes, 4);
    CHECK(a.graph_sizes[0] == 1 && a.graph_sizes[3] == 8);
    CHECK_EQ_INT(a.http.port, 9001);
    CHECK_EQ_INT(parse(&a, &err, 2, "--cuda-graph-sizes", "64"), 0); /* one value: the pattern up to 64 */
    CHECK_EQ_INT(a.n_graph_sizes, 0);
    CHECK_EQ_INT(a.max_graph_size, 64);
    CHECK_EQ_INT(parse(&a, &err, 1, "--cuda-graph-sizes=1,2,4"), 0);
    CHECK_EQ_INT(a.n_graph_sizes, 3);

    CHECK_EQ_INT(parse(&a, &err, 2, "--compilation-config",
                       "{\"cudagraph_capture_sizes\": [1, 2, 4], \"max_cudagraph_capture_size\": 4, "
                       "\"cudagraph_mode\": \"FULL_DECODE_ONLY\", \"level\": 3}"),
                 0);
    CHECK_EQ_INT(a.n_graph_sizes, 3);
    CHECK_EQ_INT(a.max_graph_size, 4);
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"max_cudagraph_capture_size\": 32}"), 0);
    CHECK_EQ_INT(a.n_graph_sizes, 0);
    CHECK_EQ_INT(a.max_graph_size, 32);
    CHECK_EQ_INT(parse(&a, &err, 1, "-O.max_cudagraph_capture_size=16"), 0);
    CHECK_EQ_INT(a.max_graph_size, 16);
    CHECK_EQ_INT(parse(&a, &err, 2, "-O.cudagraph_capture_sizes", "[1, 2]"), 0);
    CHECK_EQ_INT(a.n_graph_sizes, 2);
    CHECK_EQ_INT(parse(&a, &err, 1, "-O3"), 0);
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_mode\": \"NONE\"}"), 0);
    CHECK_EQ_INT(a.cudagraph_mode_none, 1);
    CHECK_EQ_INT(parse(&a, &err, 4, "--enforce-eager", "--cuda-graph-sizes", "1", "2"), 0); /* accepted, unused */
    CHECK_EQ_INT(a.enforce_eager, 1);

    CHECK_EQ_INT(parse(&a, &err, 4, "--cuda-graph-sizes", "1", "-O", "{\"cudagraph_capture_sizes\": [2]}"),
                 DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "both given");
    CHECK_EQ_INT(parse(&a, &err, 4, "-O", "{\"cudagraph_capture_sizes\": [2]}", "--cuda-graph-sizes", "1"),
                 DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "both given");
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_capture_sizes\": [1, 8], \"max_cudagraph_capture_size\": 16}"),
                 DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "must equal the largest");
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cuda_graph_sizez\": [1]}"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "unknown key 'cuda_graph_sizez'");
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_mode\": \"SOMETIMES\"}"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "cudagraph_mode \"SOMETIMES\" is not one of"); /* names the value given */
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_mode\": 3}"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "cudagraph_mode 3 is not one of");
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_capture_sizes\": [0, 1]}"), DSV4_EINVAL);
    CHECK_EQ_INT(parse(&a, &err, 2, "--cuda-graph-sizes", "0"), DSV4_EINVAL);
    CHECK_EQ_INT(parse(&a, &err, 1, "--cuda-graph-sizes"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "needs a value");
    /* the message names the bad size and the range: a negative size is not "a missing value",
     * and a too large one is not "not positive" */
    CHECK_EQ_INT(parse(&a, &err, 2, "--cuda-graph-sizes", "-3"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "'-3'");
    CHECK_CONTAINS(err.msg, "[1, 65536]");
    CHECK_EQ_INT(parse(&a, &err, 3, "--cuda-graph-sizes", "8", "1000000"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "'1000000'");
    CHECK_CONTAINS(err.msg, "[1, 65536]");
    CHECK_EQ_INT(parse(&a, &err, 2, "--cuda-graph-sizes", "1,2,x"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "'x'");
    CHECK_EQ_INT(parse(&a, &err, 2, "--compilation-config", "{not json"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "not a JSON object");
    /* text after the object is refused, not dropped (cJSON_Parse stops after the first value) */
    CHECK_EQ_INT(parse(&a, &err, 2, "-O", "{\"cudagraph_capture_sizes\": [1, 2]} {\"cudagraph_mode\": \"NONE\"}"),
                 DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "not a JSON object");
    CHECK_EQ_INT(parse(&a, &err, 2, "--hf-overrides", "{\"num_hidden_layers\": 4} x"), DSV4_EINVAL);
    CHECK_CONTAINS(err.msg, "--hf-overrides");
    return TEST_REPORT();
}
