/* dsv4 serve — placeholder until its issue lands: prints help, refuses to run. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int dsv4_cmd_serve(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4 serve [options]\nServe MODEL_DIR (default: the embedded tiny model) over an OpenAI-compatible HTTP API.\n");
            return 0;
        }
    fprintf(stderr, "dsv4 serve: not implemented yet\n");
    return 1;
}
