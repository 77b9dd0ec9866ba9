/* dsv4 — entry point: dispatch to a subcommand (src/cli/cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *what;
} cmds[] = {
    {"serve", dsv4_cmd_serve, "serve a model over an OpenAI-compatible HTTP API"},
    {"run", dsv4_cmd_run, "generate text for one prompt (greedy by default)"},
    {"bench", dsv4_cmd_bench, "measure a running OpenAI-compatible server"},
    {"check", dsv4_cmd_check, "validate a checkpoint directory before a long start"},
    {"tokenize", dsv4_cmd_tokenize, "print token ids for text, or text for ids"},
    {"perf", dsv4_cmd_perf, "time forward steps (decode, verify, prefill) against the HBM roofline"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dsv4 <command> [options]   (dsv4 <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].what);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
