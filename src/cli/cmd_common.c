/* Helpers shared by the subcommands (src/cli/cli.h). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "dsv4/common.h"

const char *dsv4_default_model_dir(void) {
    const char *env = getenv("DSV4_DEFAULT_MODEL");
    if (env && *env) return env;
    return DSV4_SOURCE_DIR "/models/default";
}

static int has_file(const char *dir, const char *name) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

void dsv4_cli_text_dirs(const char *model_dir, int dummy, const char **tok_dir, const char **enc_dir) {
    *tok_dir = *enc_dir = model_dir;
    if (!dummy) return;
    const char *def = dsv4_default_model_dir();
    if (!has_file(model_dir, "tokenizer.json")) {
        *tok_dir = def;
        dsv4_log(DSV4_LOG_INFO, "dummy weights: %s has no tokenizer.json; using the default model's (%s/tokenizer.json)",
                 model_dir, def);
    }
    if (!has_file(model_dir, "encoding/encoding_dsv4.py")) {
        *enc_dir = def;
        dsv4_log(DSV4_LOG_INFO,
                 "dummy weights: %s has no encoding/encoding_dsv4.py; using the default model's chat encoder profile",
                 model_dir);
    }
}
