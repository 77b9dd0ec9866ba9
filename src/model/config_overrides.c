/*
 * vLLM's --hf-overrides for config.json (model/config.h): a JSON object
 * merged over the checkpoint's config.json before anything is sized.
 *
 * Why stricter than vLLM (which setattr()s any key): a misspelt key would
 * silently leave the model at full size — the very mistake the flag exists
 * to avoid on a 141 GB GPU — so keys the engine does not know and values of
 * another JSON type than config.json's are refused, naming the key.
 *
 * Why num_hidden_layers also rewrites two lists: compress_ratios and
 * dspark_target_layer_ids are per-layer, and the draft layers' entries sit
 * after the target layers' (MODEL.md §1, DSPARK.md §2.1). "The same model
 * with fewer layers" keeps the first N target entries plus the draft
 * entries, and taps the same distance from the last layer (40,41,42 of 43
 * -> 5,6,7 of 8); num_hash_layers is capped at N. An override that names
 * these keys itself is taken as given. Every rewrite is reported in `note`.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

/* Every key dsv4_config_parse reads (config.c), so an override may add one
 * that config.json lacks (e.g. expert_dtype). */
static const char *const known_keys[] = {
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window",
    "compress_ratios", "rope_theta", "compress_rope_theta", "rope_scaling", "max_position_embeddings",
    "index_n_heads", "index_head_dim", "index_topk", "n_routed_experts", "num_experts_per_tok",
    "n_shared_experts", "moe_intermediate_size", "num_hash_layers", "scoring_func", "topk_method",
    "norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "hidden_act", "hc_mult",
    "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "num_nextn_predict_layers", "expert_dtype",
    "quantization_config", "tie_word_embeddings", "bos_token_id", "eos_token_id", "attention_bias",
    "dspark_block_size", "dspark_target_layer_ids", "dspark_noise_token_id", "dspark_markov_rank",
};

static int is_known(const char *k) {
    for (size_t i = 0; i < sizeof known_keys / sizeof known_keys[0]; i++)
        if (!strcmp(known_keys[i], k)) return 1;
    return 0;
}

static const char *jtype(const cJSON *j) {
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "a list";
    if (cJSON_IsObject(j)) return "an object";
    return "null";
}

/* Merge object `ov` into `base` (path names the nesting in messages). */
static int merge(cJSON *base, const cJSON *ov, const char *path, int top, dsv4_err *err) {
    for (const cJSON *o = ov->child; o; o = o->next) {
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", path, *path ? "." : "", o->string);
        cJSON *b = cJSON_GetObjectItemCaseSensitive(base, o->string);
        if (!b && !(top && is_known(o->string)))
            return dsv4_err_set(err, DSV4_EINVAL,
                                "--hf-overrides: unknown key \"%s\" (not in config.json and not a key dsv4 reads)", key);
        if (cJSON_IsNull(o))
            return dsv4_err_set(err, DSV4_EINVAL, "--hf-overrides: \"%s\" is null; give a value", key);
        if (b && strcmp(jtype(b), jtype(o)) != 0)
            return dsv4_err_set(err, DSV4_EINVAL, "--hf-overrides: \"%s\" must be %s like in config.json, got %s", key,
                                jtype(b), jtype(o));
        if (b && cJSON_IsObject(b)) {
            int rc = merge(b, o, key, 0, err);
            if (rc) return rc;
            continue;
        }
        cJSON *copy = cJSON_Duplicate(o, 1);
        if (!copy) return dsv4_err_set(err, DSV4_ENOMEM, "--hf-overrides: out of memory");
        if (b)
            cJSON_ReplaceItemInObjectCaseSensitive(base, o->string, copy);
        else
            cJSON_AddItemToObject(base, o->string, copy);
    }
    return DSV4_OK;
}

static void note_add(char *note, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note_add(char *note, size_t cap, const char *fmt, ...) {
    if (!note || !cap) return;
    size_t n = strlen(note);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + n, cap - n, fmt, ap);
    va_end(ap);
}

/* num_hidden_layers went from L0 to L: shorten the per-layer lists the
 * override did not set itself (banner). */
static int relayer(cJSON *root, const cJSON *ov, int L0, int L, char *note, size_t cap, dsv4_err *err) {
    cJSON *cr = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
    if (L < L0 && !cJSON_GetObjectItemCaseSensitive(ov, "compress_ratios") && cJSON_IsArray(cr) &&
        cJSON_GetArraySize(cr) >= L0) {
        int n = cJSON_GetArraySize(cr);
        cJSON *nl = cJSON_CreateArray();
        if (!nl) return dsv4_err_set(err, DSV4_ENOMEM, "--hf-overrides: out of memory");
        for (int i = 0; i < n; i++)
            if (i < L || i >= L0) cJSON_AddItemToArray(nl, cJSON_Duplicate(cJSON_GetArrayItem(cr, i), 1));
        cJSON_ReplaceItemInObjectCaseSensitive(root, "compress_ratios", nl);
        note_add(note, cap, "compress_ratios: first %d target entries + %d draft entries; ", L, n - L0);
    }
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "dspark_target_layer_ids");
    if (!cJSON_GetObjectItemCaseSensitive(ov, "dspark_target_layer_ids") && cJSON_IsArray(ids)) {
        int ok = 1;
        for (cJSON *x = ids->child; x; x = x->next)
            if (!cJSON_IsNumber(x) || x->valuedouble - L0 + L < 0) ok = 0;
        if (ok) {
            for (cJSON *x = ids->child; x; x = x->next) cJSON_SetNumberValue(x, x->valuedouble - L0 + L);
            note_add(note, cap, "dspark_target_layer_ids shifted by %d (same distance from the last of %d layers); ",
                     L - L0, L);
        } else {
            return dsv4_err_set(err, DSV4_EINVAL,
                                "--hf-overrides: num_hidden_layers %d is too few to keep the DSpark taps "
                                "(dspark_target_layer_ids %d layers from the last one); use at least %d layers or "
                                "give \"dspark_target_layer_ids\" in the override too, e.g. "
                                "'{\"num_hidden_layers\": %d, \"dspark_target_layer_ids\": [0]}'",
                                L, L0 - 1 - (int)ids->child->valuedouble, L0 - (int)ids->child->valuedouble, L);
        }
    }
    cJSON *nh = cJSON_GetObjectItemCaseSensitive(root, "num_hash_layers");
    if (!cJSON_GetObjectItemCaseSensitive(ov, "num_hash_layers") && cJSON_IsNumber(nh) && nh->valuedouble > L) {
        cJSON_SetNumberValue(nh, L);
        note_add(note, cap, "num_hash_layers capped at %d; ", L);
    }
    return DSV4_OK;
}

int dsv4_config_merge_overrides(const char *json, size_t len, const char *overrides, char **merged, char *note,
                                size_t note_cap, dsv4_err *err) {
    *merged = NULL;
    if (note && note_cap) note[0] = '\0';
    cJSON *ov = cJSON_ParseWithOpts(overrides ? overrides : "", NULL, 1); /* no text after the object */
    if (!cJSON_IsObject(ov)) {
        cJSON_Delete(ov);
        return dsv4_err_set(err, DSV4_EINVAL, "--hf-overrides must be a JSON object such as '{\"num_hidden_layers\": 8}', "
                                              "got '%.200s'", overrides ? overrides : "");
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    int rc = DSV4_OK;
    if (!cJSON_IsObject(root)) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "config.json: not a JSON object");
        goto out;
    }
    const cJSON *l0 = cJSON_GetObjectItemCaseSensitive(root, "num_hidden_layers");
    int L0 = cJSON_IsNumber(l0) ? (int)l0->valuedouble : -1;
    if ((rc = merge(root, ov, "", 1, err))) goto out;
    const cJSON *l1 = cJSON_GetObjectItemCaseSensitive(ov, "num_hidden_layers");
    if (l1 && L0 > 0 && l1->valuedouble == floor(l1->valuedouble) && l1->valuedouble >= 1 &&
        l1->valuedouble != L0 && (rc = relayer(root, ov, L0, (int)l1->valuedouble, note, note_cap, err)))
        goto out;
    if (!(*merged = cJSON_PrintUnformatted(root))) rc = dsv4_err_set(err, DSV4_ENOMEM, "--hf-overrides: out of memory");
out:
    cJSON_Delete(ov);
    cJSON_Delete(root);
    return rc;
}

int dsv4_config_load_ex(const char *dir, const char *overrides, dsv4_config *cfg, dsv4_err *err) {
    if (!overrides || !*overrides) return dsv4_config_load(dir, cfg, err);
    memset(cfg, 0, sizeof *cfg);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir ? dir : ".");
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_config_load(dir, cfg, err); /* the same error as without overrides */
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    do {
        if (n + 65536 + 1 > cap) {
            char *nb = realloc(buf, cap = 2 * (n + 65536 + 1));
            if (!nb) {
                free(buf);
                fclose(f);
                return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
    } while (r > 0);
    fclose(f);
    char *merged = NULL, note[512];
    int rc = dsv4_config_merge_overrides(buf, n, overrides, &merged, note, sizeof note, err);
    free(buf);
    if (rc) return rc;
    rc = dsv4_config_parse(merged, strlen(merged), "config.json with --hf-overrides", cfg, err);
    free(merged);
    /* once per process: every rank (and the service) loads the config, with the same overrides */
    static int said;
    if (!rc && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        dsv4_log(DSV4_LOG_INFO, "--hf-overrides %s applied over %s%s%s", overrides, path, note[0] ? "; " : "", note);
    return rc;
}
