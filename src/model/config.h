/*
 * config.json of a DeepSeek-V4-Flash checkpoint (spec/MODEL.md §1,
 * spec/DSPARK.md §2.1), parsed into a plain value struct (no allocation, no
 * free), plus the values derived from it.
 *
 * Why every key is required: a key that silently falls back to a default is
 * how the HF config picks the Pro layer pattern for Flash (MODEL.md §1
 * "Pitfall") and how drafters pick noise token 0 (DSPARK.md §2.1). Missing
 * or wrong-typed keys are errors naming the key. Keys that do not affect
 * inference are ignored.
 *
 * Draft stages are NOT read from num_nextn_predict_layers (it is 1 on 0731,
 * which has 3 stages): dsv4_config_set_drafts() derives them from the
 * checkpoint's tensor names mtp.0..S-1 (DSPARK.md §3.3 contract, step 1).
 */
#ifndef DSV4_MODEL_CONFIG_H
#define DSV4_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_MAX_LAYERS 256      /* target layers + draft stages           */
#define DSV4_MAX_TARGET_IDS 16   /* dspark_target_layer_ids                */

struct dsv4_ckpt;

/* Attention kind by compress ratio (MODEL.md §1 derived schedule). */
typedef enum dsv4_attn_kind {
    DSV4_ATTN_SLIDING = 0, /* ratio 0: sliding window only               */
    DSV4_ATTN_CSA = 4,     /* ratio 4: compressed sparse, with indexer   */
    DSV4_ATTN_HCA = 128,   /* ratio 128: heavily compressed, no indexer  */
} dsv4_attn_kind;

/* What follows the target layers in the checkpoint. */
typedef enum dsv4_draft_kind {
    DSV4_DRAFT_NONE = 0,   /* no mtp.* tensors                                */
    DSV4_DRAFT_MTP = 1,    /* original Flash: mtp.0 MTP block (e_proj/h_proj) */
    DSV4_DRAFT_DSPARK = 2, /* DSpark stages mtp.0..S-1 (main_proj, markov)    */
} dsv4_draft_kind;

typedef struct dsv4_config {
    /* ---- MODEL.md §1 ---- */
    int vocab_size, hidden_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim, qk_rope_head_dim;
    int q_lora_rank, o_groups, o_lora_rank;
    int sliding_window;
    int n_compress_ratios;               /* length of compress_ratios         */
    int compress_ratios[DSV4_MAX_LAYERS];/* each 0, 4 or 128                  */
    double rope_theta, compress_rope_theta;
    struct {                             /* rope_scaling (must be type yarn)  */
        double factor;
        int64_t original_max_position_embeddings;
        double beta_fast, beta_slow;
    } yarn;
    int64_t max_position_embeddings;
    int index_n_heads, index_head_dim, index_topk;
    int n_routed_experts, num_experts_per_tok, n_shared_experts, moe_intermediate_size;
    int num_hash_layers;
    char scoring_func[32];               /* "sqrtsoftplus"                    */
    char topk_method[32];                /* "noaux_tc"                        */
    bool norm_topk_prob;
    double routed_scaling_factor, swiglu_limit;
    char hidden_act[16];                 /* "silu"                            */
    int hc_mult, hc_sinkhorn_iters;
    double hc_eps, rms_norm_eps;
    int num_nextn_predict_layers;        /* informational only (see banner)   */
    bool experts_fp4;                    /* expert_dtype == "fp4"; absent or
                                            other value -> false (Flash-Base) */
    bool quantized;                      /* quantization_config present       */
    struct {                             /* quantization_config               */
        char quant_method[16], fmt[16], scale_fmt[16], activation_scheme[16];
        int block_out, block_in;         /* weight_block_size [128,128]       */
    } quant;
    bool tie_word_embeddings;
    int bos_token_id, eos_token_id;

    /* ---- DSPARK.md §2.1 (present only on DSpark checkpoints) ---- */
    bool has_dspark;                     /* dspark_block_size present         */
    int dspark_block_size;               /* gamma                             */
    int n_dspark_target_layer_ids;
    int dspark_target_layer_ids[DSV4_MAX_TARGET_IDS];
    int dspark_noise_token_id;
    int dspark_markov_rank;

    /* ---- derived ---- */
    int n_draft_stages;                  /* from tensor names (set_drafts)    */
    dsv4_draft_kind draft_kind;          /* from tensor names (set_drafts)    */
} dsv4_config;

/*
 * dsv4_config_load — read <dir>/config.json into *cfg (zeroed first).
 * Required (error DSV4_EFORMAT naming the key when missing or wrong-typed):
 * every key of the MODEL.md §1 table except expert_dtype and
 * quantization_config (optional: absent = unquantised / FP8 experts).
 * rope_scaling.type must be "yarn". If dspark_block_size is present, all four
 * dspark_* keys are required. Consistency checks (DSV4_EFORMAT, naming keys):
 * positive dims; compress_ratios entries in {0,4,128} and at least
 * num_hidden_layers long; num_key_value_heads == 1; head_dim divisible by
 * o_groups-compatible splits (num_attention_heads % o_groups == 0);
 * qk_rope_head_dim <= head_dim; num_experts_per_tok <= n_routed_experts;
 * num_hash_layers <= num_hidden_layers; target layer ids within
 * [0, num_hidden_layers); noise token < vocab_size. Missing file -> DSV4_EIO.
 */
int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err);
/* Same, from a JSON text (label names it in messages); used by load and by
 * tests/fuzzers. */
int dsv4_config_parse(const char *json, size_t len, const char *label, dsv4_config *cfg,
                      dsv4_err *err);

/*
 * dsv4_config_load_ex — dsv4_config_load with vLLM's --hf-overrides:
 * `overrides` (NULL or "" = none) is a JSON object merged over config.json
 * before parsing (nested objects such as rope_scaling merge key by key).
 * Refused (DSV4_EINVAL, naming the key): not a JSON object; a key neither in
 * config.json nor read by the parser; null; a JSON type other than
 * config.json's. Overriding num_hidden_layers downwards also cuts
 * compress_ratios to the first N target entries + the draft entries, shifts
 * dspark_target_layer_ids to the same distance from the last layer and caps
 * num_hash_layers at N, unless the override sets those keys itself
 * (config_overrides.c; logged). Then every dsv4_config_load check applies,
 * with messages labelled "config.json with --hf-overrides".
 */
int dsv4_config_load_ex(const char *dir, const char *overrides, dsv4_config *cfg, dsv4_err *err);
/* The merge alone, on config.json text: *merged (malloc'd, caller frees) is
 * the merged JSON; note (optional) receives the rewrites made. Errors as
 * dsv4_config_load_ex before parsing. */
int dsv4_config_merge_overrides(const char *json, size_t len, const char *overrides, char **merged, char *note,
                                size_t note_cap, dsv4_err *err);

/*
 * dsv4_config_set_drafts — derive n_draft_stages and draft_kind from the
 * checkpoint's tensor names (DSPARK.md §3.3 step 1): stages are the distinct
 * S of names "mtp.S.*" and must be exactly 0..n-1 (a gap -> DSV4_EBIND
 * naming the missing stage). Kind: mtp.0.main_proj.* present -> DSPARK
 * (requires has_dspark, else DSV4_EBIND naming dspark_block_size);
 * otherwise MTP when stages exist; NONE when there are none. Every stage s
 * needs compress_ratios[num_hidden_layers + s] when the list is long enough;
 * a nonzero entry there -> DSV4_EUNSUPPORTED (drafts are window-only).
 */
int dsv4_config_set_drafts(dsv4_config *cfg, const struct dsv4_ckpt *ckpt, dsv4_err *err);

/* Ratio of absolute layer id L (target 0..num_hidden_layers-1, drafts after
 * it): compress_ratios[L], or 0 for draft layers beyond the list. */
int dsv4_config_layer_ratio(const dsv4_config *cfg, int layer);
/* Hash-routed layer? Target layers with id < num_hash_layers only; drafts
 * never (DSPARK.md §2.1 pitfall: test the absolute id). */
bool dsv4_config_layer_is_hash(const dsv4_config *cfg, int layer);
/* "sliding" / "CSA" / "HCA" for a ratio, "?" otherwise. */
const char *dsv4_attn_kind_name(int ratio);
/* Human label of the checkpoint kind from its tensors: "original Flash (MTP)",
 * "DSpark", "target only (no draft)". Preview vs 0731 is not in the
 * checkpoint's tensors or config (SERVING.md §0.1): the text layer decides it
 * from encoding/encoding_dsv4.py (dsv4_encoder_detect_profile). */
const char *dsv4_config_kind_name(const dsv4_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
