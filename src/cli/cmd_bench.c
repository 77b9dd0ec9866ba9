/* dsv4 bench — placeholder until its issue lands: prints help, refuses to run. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int dsv4_cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4 bench [options]\nMeasure an OpenAI-compatible server (decode, concurrency, prefill, spec, soak).\n");
            return 0;
        }
    fprintf(stderr, "dsv4 bench: not implemented yet\n");
    return 1;
}
