/*
 * libFuzzer target: dsv4_config_parse on arbitrary bytes (config.json is
 * outside input). Build as described in fuzz_safetensors_header.c; seed with
 * tests/fuzz/corpus_config. Checks: no crash / sanitizer report, every error
 * carries a message, and an accepted config satisfies the invariants the
 * binder relies on (positive dims, ratios in {0,4,128}, ids in range).
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_config c;
    dsv4_err err = {0};
    if (dsv4_config_parse((const char *)data, size, "fuzz config.json", &c, &err) != 0) {
        if (err.msg[0] == '\0') abort();
        return 0;
    }
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.n_compress_ratios < c.num_hidden_layers ||
        c.n_compress_ratios > DSV4_MAX_LAYERS || c.num_attention_heads % c.o_groups != 0)
        abort();
    for (int i = 0; i < c.n_compress_ratios; i++)
        if (c.compress_ratios[i] != 0 && c.compress_ratios[i] != 4 && c.compress_ratios[i] != 128) abort();
    for (int i = 0; i < c.n_dspark_target_layer_ids; i++)
        if (c.dspark_target_layer_ids[i] < 0 || c.dspark_target_layer_ids[i] >= c.num_hidden_layers) abort();
    return 0;
}
