/*
 * dsv4 bench — runs the Python benchmark package bench/dsv4bench.
 *
 * Why Python: the benchmark is a client of any OpenAI-compatible server
 * (dsv4, vLLM, SGLang, llama.cpp); measuring, classifying outputs and
 * plotting PNGs are client-side jobs with no need for the engine, and the
 * same tool must run on machines that only have the other servers. This
 * command only locates the package and hands over its arguments:
 *   exec $DSV4_PYTHON (default python3) -m dsv4bench <args...>
 * with PYTHONPATH = $DSV4_BENCH_DIR (default <source dir>/bench), prepended
 * to any existing PYTHONPATH. Modes and options: `dsv4 bench --help`.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static void short_help(FILE *f) {
    fprintf(f,
            "usage: dsv4 bench MODE [options]\n"
            "Measure an OpenAI-compatible server. MODE: decode | concurrency | prefill | spec | soak.\n"
            "Runs `python3 -m dsv4bench` from %s/bench (set DSV4_PYTHON, DSV4_BENCH_DIR to override).\n",
            DSV4_SOURCE_DIR);
}

int dsv4_cmd_bench(int argc, char **argv) {
    const char *py = getenv("DSV4_PYTHON");
    if (!py || !*py) py = "python3";
    const char *dir = getenv("DSV4_BENCH_DIR");
    if (!dir || !*dir) dir = DSV4_SOURCE_DIR "/bench";

    const char *old = getenv("PYTHONPATH");
    size_t n = strlen(dir) + (old && *old ? strlen(old) + 1 : 0) + 1;
    char *pp = malloc(n);
    if (!pp) {
        fprintf(stderr, "dsv4 bench: out of memory\n");
        return 1;
    }
    if (old && *old)
        snprintf(pp, n, "%s:%s", dir, old);
    else
        snprintf(pp, n, "%s", dir);
    if (setenv("PYTHONPATH", pp, 1) != 0) {
        fprintf(stderr, "dsv4 bench: cannot set PYTHONPATH: %s\n", strerror(errno));
        free(pp);
        return 1;
    }
    free(pp);

    /* argv[0] is "bench"; the new vector is py -m dsv4bench argv[1..] NULL. */
    char **av = calloc((size_t)argc + 3, sizeof *av);
    if (!av) {
        fprintf(stderr, "dsv4 bench: out of memory\n");
        return 1;
    }
    av[0] = (char *)py;
    av[1] = "-m";
    av[2] = "dsv4bench";
    for (int i = 1; i < argc; i++) av[i + 2] = argv[i];
    av[argc + 2] = NULL;
    fflush(stdout);
    fflush(stderr);
    execvp(py, av);

    /* Only reached when the interpreter could not be started. */
    int e = errno;
    free(av);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            short_help(stdout);
            fprintf(stdout, "(the full help needs %s: %s)\n", py, strerror(e));
            return 0;
        }
    fprintf(stderr, "dsv4 bench: cannot run %s: %s\n", py, strerror(e));
    short_help(stderr);
    return 1;
}
