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

/*
 * dsv4_cli_text_dirs — where tokenizer.json and encoding/encoding_dsv4.py are
 * read for model_dir. A real checkpoint: model_dir for both. With
 * --load-format dummy (dummy != 0) the directory may hold only config.json:
 * each file missing there is taken from the embedded default model, and the
 * log says so.
 */
void dsv4_cli_text_dirs(const char *model_dir, int dummy, const char **tok_dir, const char **enc_dir);

#endif
