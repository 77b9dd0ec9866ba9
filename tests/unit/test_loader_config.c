/*
 * config.json parsing (src/model/config.c; spec/MODEL.md §1, §5.2;
 * spec/DSPARK.md §2.1): the §5.2 tiny config parses to the values it states;
 * removing any required key, or giving it the wrong type, is an error that
 * names the key; unsupported values are refused; derived helpers follow the
 * schedule table of MODEL.md §1.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "test.h"

/* spec/MODEL.md §5.2 verbatim, plus the DSpark keys of a tiny 3-stage model
 * (DSPARK.md §2.1 key names) and compress_ratios extended by three 0s. */
static const char *TINY =
    "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\","
    "\"vocab_size\": 512, \"hidden_size\": 256, \"num_hidden_layers\": 4,"
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 128, \"qk_rope_head_dim\": 64,"
    "\"q_lora_rank\": 128, \"o_groups\": 2, \"o_lora_rank\": 64,"
    "\"moe_intermediate_size\": 128, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
    "\"n_shared_experts\": 1, \"num_hash_layers\": 2,"
    "\"scoring_func\": \"sqrtsoftplus\", \"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true,"
    "\"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"hidden_act\": \"silu\","
    "\"sliding_window\": 16, \"compress_ratios\": [0, 4, 128, 4, 0, 0, 0],"
    "\"rope_theta\": 10000, \"compress_rope_theta\": 160000,"
    "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,"
    "                 \"beta_fast\": 32, \"beta_slow\": 1},"
    "\"max_position_embeddings\": 1048576,"
    "\"index_n_heads\": 8, \"index_head_dim\": 128, \"index_topk\": 4,"
    "\"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06,"
    "\"num_nextn_predict_layers\": 1, \"expert_dtype\": \"fp4\","
    "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\","
    "                        \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]},"
    "\"bos_token_id\": 0, \"eos_token_id\": 1, \"tie_word_embeddings\": false,"
    "\"attention_bias\": false, \"torch_dtype\": \"bfloat16\","
    "\"dspark_block_size\": 5, \"dspark_target_layer_ids\": [1, 2, 3],"
    "\"dspark_noise_token_id\": 500, \"dspark_markov_rank\": 32}";

/* Keys that do not affect inference (ignored) or are optional by design. */
static int optional_key(const char *k) {
    static const char *opt[] = {"architectures", "model_type", "torch_dtype", "expert_dtype",
                                "quantization_config", NULL};
    for (int i = 0; opt[i]; i++)
        if (!strcmp(k, opt[i])) return 1;
    return 0;
}

static int parse_json(cJSON *j, dsv4_config *c, dsv4_err *err) {
    char *s = cJSON_PrintUnformatted(j);
    int rc = dsv4_config_parse(s, strlen(s), "config.json", c, err);
    free(s);
    return rc;
}

static void test_values(void) {
    dsv4_config c;
    dsv4_err err = {0};
    CHECK_EQ_INT(dsv4_config_parse(TINY, strlen(TINY), "config.json", &c, &err), 0);
    if (err.code) fprintf(stderr, "%s\n", err.msg);
    CHECK_EQ_INT(c.vocab_size, 512);
    CHECK_EQ_INT(c.hidden_size, 256);
    CHECK_EQ_INT(c.num_hidden_layers, 4);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.qk_rope_head_dim, 64);
    CHECK_EQ_INT(c.o_groups, 2);
    CHECK_EQ_INT(c.n_compress_ratios, 7);
    CHECK_EQ_INT(c.compress_ratios[2], 128);
    CHECK_NEAR(c.yarn.factor, 16, 0);
    CHECK_EQ_INT(c.yarn.original_max_position_embeddings, 65536);
    CHECK_NEAR(c.compress_rope_theta, 160000, 0);
    CHECK_NEAR(c.routed_scaling_factor, 1.5, 0);
    CHECK_NEAR(c.hc_eps, 1e-6, 0);
    CHECK_EQ_INT(c.max_position_embeddings, 1048576);
    CHECK(c.experts_fp4 && c.quantized && c.quant.block_out == 128 && c.quant.block_in == 128);
    CHECK(c.has_dspark);
    CHECK_EQ_INT(c.dspark_block_size, 5);
    CHECK_EQ_INT(c.n_dspark_target_layer_ids, 3);
    CHECK_EQ_INT(c.dspark_target_layer_ids[2], 3);
    CHECK_EQ_INT(c.dspark_noise_token_id, 500);
    CHECK_EQ_INT(c.dspark_markov_rank, 32);
    CHECK_EQ_INT(c.num_nextn_predict_layers, 1); /* read, but never the stage count */
    /* MODEL.md §5.2 rationale: 0 = ratio 0 + hash, 1 = ratio 4 + hash, 2 = 128, 3 = 4;
     * drafts (absolute ids 4..6) ratio 0, never hash (DSPARK.md §2.1 pitfall). */
    CHECK(dsv4_config_layer_ratio(&c, 0) == 0 && dsv4_config_layer_is_hash(&c, 0));
    CHECK(dsv4_config_layer_ratio(&c, 1) == 4 && dsv4_config_layer_is_hash(&c, 1));
    CHECK(dsv4_config_layer_ratio(&c, 2) == 128 && !dsv4_config_layer_is_hash(&c, 2));
    CHECK(dsv4_config_layer_ratio(&c, 3) == 4 && !dsv4_config_layer_is_hash(&c, 3));
    for (int l = 4; l < 7; l++) CHECK(dsv4_config_layer_ratio(&c, l) == 0 && !dsv4_config_layer_is_hash(&c, l));
    CHECK_STR(dsv4_attn_kind_name(4), "CSA");
    CHECK_STR(dsv4_attn_kind_name(128), "HCA");
    CHECK_STR(dsv4_attn_kind_name(0), "sliding");
}

/* Removing any required top-level key (or nested rope_scaling /
 * quantization_config key) fails naming it. */
static void test_missing_keys(void) {
    cJSON *base = cJSON_Parse(TINY);
    int n = 0;
    for (cJSON *k = base->child; k; k = k->next) {
        if (optional_key(k->string)) continue;
        cJSON *j = cJSON_Duplicate(base, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(j, k->string);
        dsv4_config c;
        dsv4_err err = {0};
        int rc = parse_json(j, &c, &err);
        if (!strcmp(k->string, "dspark_block_size")) {
            /* without it the dspark_* keys are simply not read: a non-DSpark config */
            CHECK_EQ_INT(rc, 0);
            CHECK(!c.has_dspark);
        } else {
            CHECK_MSG(rc != 0, "config without \"%s\" accepted", k->string);
            CHECK_CONTAINS(err.msg, k->string);
            CHECK_CONTAINS(err.msg, "config.json");
        }
        cJSON_Delete(j);
        n++;
    }
    CHECK(n >= 40); /* every required key was tried */
    static const char *nested[][2] = {{"rope_scaling", "factor"},
                                      {"rope_scaling", "beta_fast"},
                                      {"rope_scaling", "original_max_position_embeddings"},
                                      {"quantization_config", "fmt"},
                                      {"quantization_config", "weight_block_size"}};
    for (size_t i = 0; i < sizeof nested / sizeof nested[0]; i++) {
        cJSON *j = cJSON_Duplicate(base, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, nested[i][0]),
                                                nested[i][1]);
        dsv4_config c;
        dsv4_err err = {0};
        CHECK(parse_json(j, &c, &err) != 0);
        CHECK_CONTAINS(err.msg, nested[i][0]);
        CHECK_CONTAINS(err.msg, nested[i][1]);
        cJSON_Delete(j);
    }
    cJSON_Delete(base);
}

/* Replace key with a JSON value and expect an error naming needle. */
static void expect_bad(const char *key, const char *json_value, const char *needle) {
    cJSON *j = cJSON_Parse(TINY);
    cJSON_ReplaceItemInObjectCaseSensitive(j, key, cJSON_Parse(json_value));
    dsv4_config c;
    dsv4_err err = {0};
    int rc = parse_json(j, &c, &err);
    CHECK_MSG(rc != 0, "%s = %s accepted", key, json_value);
    CHECK_CONTAINS(err.msg, needle);
    cJSON_Delete(j);
}

static void test_wrong_values(void) {
    expect_bad("hidden_size", "\"256\"", "hidden_size");
    expect_bad("hidden_size", "256.5", "hidden_size");
    expect_bad("hidden_size", "0", "hidden_size");
    expect_bad("norm_topk_prob", "1", "norm_topk_prob");
    expect_bad("norm_topk_prob", "false", "norm_topk_prob");
    expect_bad("compress_ratios", "\"x\"", "compress_ratios");
    expect_bad("compress_ratios", "[0, 4, 64, 4]", "compress_ratios[2]");
    expect_bad("compress_ratios", "[0, 4, 128]", "compress_ratios");
    expect_bad("rope_scaling", "{\"type\": \"linear\", \"factor\": 2}", "rope_scaling.type");
    expect_bad("rope_scaling", "[1]", "rope_scaling");
    expect_bad("scoring_func", "\"softmax\"", "scoring_func");
    expect_bad("hidden_act", "\"gelu\"", "hidden_act");
    expect_bad("num_key_value_heads", "2", "num_key_value_heads");
    expect_bad("num_experts_per_tok", "9", "num_experts_per_tok");
    expect_bad("num_hash_layers", "5", "num_hash_layers");
    expect_bad("o_groups", "3", "o_groups");
    expect_bad("attention_bias", "true", "attention_bias");
    expect_bad("tie_word_embeddings", "true", "tie_word_embeddings");
    expect_bad("dspark_noise_token_id", "512", "dspark_noise_token_id");
    expect_bad("dspark_target_layer_ids", "[1, 2, 4]", "dspark_target_layer_ids");
    expect_bad("dspark_target_layer_ids", "[]", "dspark_target_layer_ids");
    expect_bad("quantization_config", "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", \"scale_fmt\": "
               "\"ue8m0\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}", "fmt");
    expect_bad("quantization_config", "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": "
               "\"ue8m0\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [64, 128]}",
               "weight_block_size");
    expect_bad("expert_dtype", "4", "expert_dtype");
    /* not JSON / not an object */
    dsv4_config c;
    dsv4_err err = {0};
    CHECK(dsv4_config_parse("[1]", 3, "config.json", &c, &err) != 0);
    CHECK_CONTAINS(err.msg, "config.json");
    CHECK(dsv4_config_parse("{\"a\":", 5, "config.json", &c, &err) != 0);
    /* eos as a list (some configs) takes the first id */
    cJSON *j = cJSON_Parse(TINY);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "eos_token_id", cJSON_Parse("[1, 7]"));
    CHECK_EQ_INT(parse_json(j, &c, &err), 0);
    CHECK_EQ_INT(c.eos_token_id, 1);
    /* a BF16 checkpoint config: no quantization_config, no expert_dtype */
    cJSON_DeleteItemFromObjectCaseSensitive(j, "quantization_config");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "expert_dtype");
    CHECK_EQ_INT(parse_json(j, &c, &err), 0);
    CHECK(!c.quantized && !c.experts_fp4);
    cJSON_Delete(j);
}

/* The kind comes from the tensors alone; preview vs 0731 is the encoder's
 * business (dsv4_encoder_detect_profile, tested in test_encoder). */
static void test_kind_name(void) {
    dsv4_config c = {0};
    c.draft_kind = DSV4_DRAFT_DSPARK;
    CHECK_STR(dsv4_config_kind_name(&c), "DSpark");
    c.draft_kind = DSV4_DRAFT_MTP;
    CHECK_STR(dsv4_config_kind_name(&c), "original Flash (MTP)");
    c.draft_kind = DSV4_DRAFT_NONE;
    CHECK_STR(dsv4_config_kind_name(&c), "target only (no draft)");
}

int main(void) {
    test_values();
    test_missing_keys();
    test_wrong_values();
    test_kind_name();
    return TEST_REPORT();
}
