/* dsv4 run — placeholder until its issue lands: prints help, refuses to run. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int dsv4_cmd_run(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4 run [options]\nGenerate text for one prompt with MODEL_DIR on the CPU reference backend.\n");
            return 0;
        }
    fprintf(stderr, "dsv4 run: not implemented yet\n");
    return 1;
}
