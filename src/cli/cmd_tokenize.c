/* dsv4 tokenize — placeholder until its issue lands: prints help, refuses to run. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int dsv4_cmd_tokenize(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: dsv4 tokenize [options]\nPrint token ids for text, or text for ids, with the model's tokenizer.\n");
            return 0;
        }
    fprintf(stderr, "dsv4 tokenize: not implemented yet\n");
    return 1;
}
