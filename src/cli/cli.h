/*
 * Subcommands of the one `dsv4` binary (DESIGN.md "The shape of the code").
 * Each lives in its own src/cli/cmd_<name>.c, takes argv without the
 * subcommand name's predecessor (argv[0] is the subcommand), prints its own
 * --help, and returns a process exit status (0 ok, 1 failure, 2 usage error).
 */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

int dsv4_cmd_serve(int argc, char **argv);
int dsv4_cmd_run(int argc, char **argv);
int dsv4_cmd_bench(int argc, char **argv);
int dsv4_cmd_check(int argc, char **argv);
int dsv4_cmd_tokenize(int argc, char **argv);
int dsv4_cmd_perf(int argc, char **argv);

/* Path of the embedded default model directory (prepared by scripts/setup.sh):
 * $DSV4_DEFAULT_MODEL if set, else <source dir>/models/default. */
const char *dsv4_default_model_dir(void);

#endif
