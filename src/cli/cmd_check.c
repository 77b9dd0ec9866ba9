/* dsv4 check — placeholder until its issue lands: prints help, refuses to run. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int dsv4_cmd_check(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4 check [options]\nValidate a checkpoint directory: config, index, shards, every tensor bound.\n");
            return 0;
        }
    fprintf(stderr, "dsv4 check: not implemented yet\n");
    return 1;
}
