/* Helpers shared by the subcommands (src/cli/cli.h). */
#include <stdlib.h>

#include "cli/cli.h"

const char *dsv4_default_model_dir(void) {
    const char *env = getenv("DSV4_DEFAULT_MODEL");
    if (env && *env) return env;
    return DSV4_SOURCE_DIR "/models/default";
}
