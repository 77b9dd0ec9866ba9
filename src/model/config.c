/*
 * config.json parser (model/config.h; spec/MODEL.md §1, spec/DSPARK.md §2.1).
 *
 * Every key that changes the computation is required and type-checked; the
 * values the engine implements exactly one way (silu, sqrtsoftplus,
 * noaux_tc, renormalised top-k, yarn, FP8 e4m3 with ue8m0 128x128 blocks) are
 * checked too, so a checkpoint asking for something else is refused by
 * `dsv4 check` instead of being run wrongly.
 */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

typedef struct P {
    const cJSON *root;
    const char *label;
    dsv4_err *err;
    int rc;
} P;

static const cJSON *need(P *p, const cJSON *obj, const char *key, const char *what) {
    if (p->rc) return NULL;
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!j) p->rc = dsv4_err_set(p->err, DSV4_EFORMAT, "%s: missing key \"%s\" (%s)", p->label, key, what);
    return j;
}

static void wrong(P *p, const char *key, const char *what) {
    if (!p->rc)
        p->rc = dsv4_err_set(p->err, DSV4_EFORMAT, "%s: key \"%s\" must be %s", p->label, key, what);
}

static int64_t get_i(P *p, const cJSON *obj, const char *key, int64_t lo, int64_t hi) {
    const cJSON *j = need(p, obj, key, "integer");
    if (!j) return 0;
    double d = j->valuedouble;
    if (!cJSON_IsNumber(j) || d != floor(d) || d < (double)lo || d > (double)hi) {
        char what[96];
        snprintf(what, sizeof what, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        wrong(p, key, what);
        return 0;
    }
    return (int64_t)d;
}

static double get_d(P *p, const cJSON *obj, const char *key, double lo) {
    const cJSON *j = need(p, obj, key, "number");
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo) {
        char what[64];
        snprintf(what, sizeof what, "a finite number >= %g", lo);
        wrong(p, key, what);
        return 0;
    }
    return j->valuedouble;
}

static bool get_b(P *p, const cJSON *obj, const char *key) {
    const cJSON *j = need(p, obj, key, "boolean");
    if (!j) return false;
    if (!cJSON_IsBool(j)) {
        wrong(p, key, "true or false");
        return false;
    }
    return cJSON_IsTrue(j);
}

static void get_s(P *p, const cJSON *obj, const char *key, char *out, size_t cap) {
    const cJSON *j = need(p, obj, key, "string");
    if (!j) return;
    if (!cJSON_IsString(j) || strlen(j->valuestring) >= cap) {
        wrong(p, key, "a (short) string");
        return;
    }
    memcpy(out, j->valuestring, strlen(j->valuestring) + 1);
}

/* Require a string key to equal one supported value. */
static void expect_s(P *p, const char *key, const char *val, const char *want) {
    if (!p->rc && strcmp(val, want) != 0)
        p->rc = dsv4_err_set(p->err, DSV4_EUNSUPPORTED, "%s: \"%s\" is \"%s\"; only \"%s\" is supported",
                             p->label, key, val, want);
}

static void check(P *p, bool ok, const char *fmt, const char *a, long long v) {
    if (!p->rc && !ok) {
        char m[400];
        snprintf(m, sizeof m, fmt, a, v);
        p->rc = dsv4_err_set(p->err, DSV4_EFORMAT, "%s: %s", p->label, m);
    }
}

#define I32MAX 2147483647

int dsv4_config_parse(const char *json, size_t len, const char *label, dsv4_config *cfg,
                      dsv4_err *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!label) label = "config.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: not a JSON object", label);
    }
    P p = {root, label, err, 0};
    P *q = &p;
    const cJSON *r = root;
    cfg->vocab_size = (int)get_i(q, r, "vocab_size", 1, I32MAX);
    cfg->hidden_size = (int)get_i(q, r, "hidden_size", 1, 1 << 20);
    cfg->num_hidden_layers = (int)get_i(q, r, "num_hidden_layers", 1, DSV4_MAX_LAYERS - 1);
    cfg->num_attention_heads = (int)get_i(q, r, "num_attention_heads", 1, 4096);
    cfg->num_key_value_heads = (int)get_i(q, r, "num_key_value_heads", 1, 4096);
    cfg->head_dim = (int)get_i(q, r, "head_dim", 1, 1 << 16);
    cfg->qk_rope_head_dim = (int)get_i(q, r, "qk_rope_head_dim", 0, 1 << 16);
    cfg->q_lora_rank = (int)get_i(q, r, "q_lora_rank", 1, 1 << 20);
    cfg->o_groups = (int)get_i(q, r, "o_groups", 1, 4096);
    cfg->o_lora_rank = (int)get_i(q, r, "o_lora_rank", 1, 1 << 20);
    cfg->sliding_window = (int)get_i(q, r, "sliding_window", 1, I32MAX);
    cfg->rope_theta = get_d(q, r, "rope_theta", 1e-30);
    cfg->compress_rope_theta = get_d(q, r, "compress_rope_theta", 1e-30);
    cfg->max_position_embeddings = get_i(q, r, "max_position_embeddings", 1, INT64_C(1) << 40);
    cfg->index_n_heads = (int)get_i(q, r, "index_n_heads", 1, 4096);
    cfg->index_head_dim = (int)get_i(q, r, "index_head_dim", 1, 1 << 16);
    cfg->index_topk = (int)get_i(q, r, "index_topk", 1, I32MAX);
    cfg->n_routed_experts = (int)get_i(q, r, "n_routed_experts", 1, 1 << 16);
    cfg->num_experts_per_tok = (int)get_i(q, r, "num_experts_per_tok", 1, 1 << 16);
    cfg->n_shared_experts = (int)get_i(q, r, "n_shared_experts", 0, 64);
    cfg->moe_intermediate_size = (int)get_i(q, r, "moe_intermediate_size", 1, 1 << 20);
    cfg->num_hash_layers = (int)get_i(q, r, "num_hash_layers", 0, DSV4_MAX_LAYERS);
    get_s(q, r, "scoring_func", cfg->scoring_func, sizeof cfg->scoring_func);
    get_s(q, r, "topk_method", cfg->topk_method, sizeof cfg->topk_method);
    cfg->norm_topk_prob = get_b(q, r, "norm_topk_prob");
    cfg->routed_scaling_factor = get_d(q, r, "routed_scaling_factor", 0.0);
    cfg->swiglu_limit = get_d(q, r, "swiglu_limit", 0.0);
    get_s(q, r, "hidden_act", cfg->hidden_act, sizeof cfg->hidden_act);
    cfg->hc_mult = (int)get_i(q, r, "hc_mult", 1, 64);
    cfg->hc_sinkhorn_iters = (int)get_i(q, r, "hc_sinkhorn_iters", 0, 1 << 16);
    cfg->hc_eps = get_d(q, r, "hc_eps", 0.0);
    cfg->rms_norm_eps = get_d(q, r, "rms_norm_eps", 0.0);
    cfg->num_nextn_predict_layers = (int)get_i(q, r, "num_nextn_predict_layers", 0, DSV4_MAX_LAYERS);
    cfg->tie_word_embeddings = get_b(q, r, "tie_word_embeddings");
    cfg->bos_token_id = (int)get_i(q, r, "bos_token_id", 0, I32MAX);
    {
        const cJSON *e = need(q, r, "eos_token_id", "integer or list of integers");
        if (e && cJSON_IsArray(e)) e = e->child; /* a list: the first is the primary EOS */
        if (e && !q->rc) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                e->valuedouble > I32MAX)
                wrong(q, "eos_token_id", "a non-negative integer (or a list of them)");
            else
                cfg->eos_token_id = (int)e->valuedouble;
        }
    }
    if (get_b(q, r, "attention_bias") && !q->rc)
        q->rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "%s: \"attention_bias\" true is not supported", label);

    /* compress_ratios */
    const cJSON *cr = need(q, r, "compress_ratios", "list of 0/4/128");
    if (cr && !q->rc) {
        if (!cJSON_IsArray(cr)) {
            wrong(q, "compress_ratios", "a list of integers 0, 4 or 128");
        } else {
            int n = cJSON_GetArraySize(cr), i = 0;
            check(q, n <= DSV4_MAX_LAYERS, "key \"%s\" has more than %lld entries", "compress_ratios",
                  DSV4_MAX_LAYERS);
            check(q, n >= cfg->num_hidden_layers,
                  "key \"%s\" has fewer entries than num_hidden_layers (%lld)", "compress_ratios",
                  cfg->num_hidden_layers);
            for (const cJSON *x = cr->child; x && !q->rc; x = x->next, i++) {
                double d = cJSON_IsNumber(x) ? x->valuedouble : -1;
                if (d != 0 && d != 4 && d != 128) {
                    char m[64];
                    snprintf(m, sizeof m, "compress_ratios[%d]", i);
                    wrong(q, m, "0, 4 or 128");
                }
                cfg->compress_ratios[i] = (int)d;
            }
            cfg->n_compress_ratios = n;
        }
    }
    /* rope_scaling: YaRN only (MODEL.md §3.4.3) */
    const cJSON *rs = need(q, r, "rope_scaling", "yarn object");
    if (rs && !q->rc) {
        if (!cJSON_IsObject(rs)) {
            wrong(q, "rope_scaling", "an object");
        } else {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "type");
            if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
            if (!cJSON_IsString(t))
                wrong(q, "rope_scaling.type", "a string");
            else
                expect_s(q, "rope_scaling.type", t->valuestring, "yarn");
            char sl[300];
            snprintf(sl, sizeof sl, "%s (rope_scaling)", label);
            P sub = {rs, sl, err, q->rc};
            cfg->yarn.factor = get_d(&sub, rs, "factor", 1e-30);
            cfg->yarn.original_max_position_embeddings =
                get_i(&sub, rs, "original_max_position_embeddings", 1, INT64_C(1) << 40);
            cfg->yarn.beta_fast = get_d(&sub, rs, "beta_fast", 0.0);
            cfg->yarn.beta_slow = get_d(&sub, rs, "beta_slow", 0.0);
            q->rc = sub.rc;
        }
    }
    /* expert_dtype (optional) */
    const cJSON *ed = cJSON_GetObjectItemCaseSensitive(r, "expert_dtype");
    if (ed && !q->rc) {
        if (!cJSON_IsString(ed))
            wrong(q, "expert_dtype", "a string");
        else
            cfg->experts_fp4 = !strcmp(ed->valuestring, "fp4");
    }
    /* quantization_config (optional: a dequantised BF16 checkpoint has none) */
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(r, "quantization_config");
    if (qc && !q->rc) {
        if (!cJSON_IsObject(qc)) {
            wrong(q, "quantization_config", "an object");
        } else {
            cfg->quantized = true;
            char ql[300];
            snprintf(ql, sizeof ql, "%s (quantization_config)", label);
            P sub = {qc, ql, err, 0};
            get_s(&sub, qc, "quant_method", cfg->quant.quant_method, sizeof cfg->quant.quant_method);
            get_s(&sub, qc, "fmt", cfg->quant.fmt, sizeof cfg->quant.fmt);
            get_s(&sub, qc, "scale_fmt", cfg->quant.scale_fmt, sizeof cfg->quant.scale_fmt);
            get_s(&sub, qc, "activation_scheme", cfg->quant.activation_scheme,
                  sizeof cfg->quant.activation_scheme);
            const cJSON *bs = need(&sub, qc, "weight_block_size", "[128, 128]");
            if (bs && !sub.rc) {
                if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(bs->child) ||
                    !cJSON_IsNumber(bs->child->next))
                    wrong(&sub, "quantization_config.weight_block_size", "a list of two integers");
                else {
                    cfg->quant.block_out = (int)bs->child->valuedouble;
                    cfg->quant.block_in = (int)bs->child->next->valuedouble;
                }
            }
            expect_s(&sub, "quantization_config.quant_method", cfg->quant.quant_method, "fp8");
            expect_s(&sub, "quantization_config.fmt", cfg->quant.fmt, "e4m3");
            expect_s(&sub, "quantization_config.scale_fmt", cfg->quant.scale_fmt, "ue8m0");
            expect_s(&sub, "quantization_config.activation_scheme", cfg->quant.activation_scheme,
                     "dynamic");
            if (!sub.rc && (cfg->quant.block_out != 128 || cfg->quant.block_in != 128))
                sub.rc = dsv4_err_set(err, DSV4_EUNSUPPORTED,
                                      "%s: quantization_config.weight_block_size must be [128, 128]", label);
            if (sub.rc) q->rc = sub.rc;
        }
    }
    /* DSpark keys (DSPARK.md §2.1): all or none */
    if (cJSON_GetObjectItemCaseSensitive(r, "dspark_block_size") && !q->rc) {
        cfg->has_dspark = true;
        cfg->dspark_block_size = (int)get_i(q, r, "dspark_block_size", 1, 1024);
        cfg->dspark_noise_token_id = (int)get_i(q, r, "dspark_noise_token_id", 0, I32MAX);
        cfg->dspark_markov_rank = (int)get_i(q, r, "dspark_markov_rank", 1, 1 << 20);
        const cJSON *t = need(q, r, "dspark_target_layer_ids", "list of layer ids");
        if (t && !q->rc) {
            int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
            if (n < 1 || n > DSV4_MAX_TARGET_IDS)
                wrong(q, "dspark_target_layer_ids", "a non-empty list of at most 16 integers");
            int i = 0;
            for (const cJSON *x = n > 0 ? t->child : NULL; x && !q->rc; x = x->next, i++) {
                if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
                    x->valuedouble >= cfg->num_hidden_layers)
                    wrong(q, "dspark_target_layer_ids", "a list of target layer ids in [0, num_hidden_layers)");
                else
                    cfg->dspark_target_layer_ids[i] = (int)x->valuedouble;
            }
            cfg->n_dspark_target_layer_ids = n > 0 ? n : 0;
        }
        check(q, cfg->dspark_noise_token_id < cfg->vocab_size,
              "key \"%s\" (%lld) must be below vocab_size", "dspark_noise_token_id",
              cfg->dspark_noise_token_id);
    }
    /* values implemented one way only */
    if (!q->rc) expect_s(q, "hidden_act", cfg->hidden_act, "silu");
    if (!q->rc) expect_s(q, "scoring_func", cfg->scoring_func, "sqrtsoftplus");
    if (!q->rc) expect_s(q, "topk_method", cfg->topk_method, "noaux_tc");
    if (!q->rc && !cfg->norm_topk_prob)
        q->rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "%s: \"norm_topk_prob\" false is not supported", label);
    if (!q->rc && cfg->tie_word_embeddings)
        q->rc = dsv4_err_set(err, DSV4_EUNSUPPORTED,
                             "%s: \"tie_word_embeddings\" true is not supported (V4 has embed and head)", label);
    /* shape consistency */
    check(q, cfg->num_key_value_heads == 1, "key \"%s\" must be 1 (one shared K=V head), got %lld",
          "num_key_value_heads", cfg->num_key_value_heads);
    check(q, cfg->qk_rope_head_dim <= cfg->head_dim && cfg->qk_rope_head_dim % 2 == 0,
          "key \"%s\" (%lld) must be even and at most head_dim", "qk_rope_head_dim", cfg->qk_rope_head_dim);
    check(q, q->rc || cfg->num_attention_heads % cfg->o_groups == 0,
          "key \"%s\" (%lld) must divide num_attention_heads", "o_groups", cfg->o_groups);
    check(q, cfg->num_experts_per_tok <= cfg->n_routed_experts,
          "key \"%s\" (%lld) exceeds n_routed_experts", "num_experts_per_tok", cfg->num_experts_per_tok);
    check(q, cfg->num_hash_layers <= cfg->num_hidden_layers,
          "key \"%s\" (%lld) exceeds num_hidden_layers", "num_hash_layers", cfg->num_hash_layers);
    check(q, cfg->index_head_dim >= cfg->qk_rope_head_dim,
          "key \"%s\" (%lld) must be at least qk_rope_head_dim", "index_head_dim", cfg->index_head_dim);
    check(q, cfg->bos_token_id < cfg->vocab_size && cfg->eos_token_id < cfg->vocab_size,
          "key \"%s\" / eos_token_id must be below vocab_size (%lld)", "bos_token_id", cfg->vocab_size);
    int rc = q->rc;
    cJSON_Delete(root);
    if (rc && err && err->code == DSV4_OK) dsv4_err_set(err, rc, "%s: invalid", label);
    return rc;
}

int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir ? dir : ".");
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) return dsv4_err_set(err, DSV4_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = (n + 4096 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    fclose(f);
    buf[n] = '\0';
    int rc = dsv4_config_parse(buf, n, "config.json", cfg, err);
    free(buf);
    return rc;
}

/* "mtp.<S>." with S a plain decimal number: returns S, else -1. */
static long mtp_stage(const char *name) {
    if (strncmp(name, "mtp.", 4) != 0) return -1;
    const char *s = name + 4;
    long v = 0;
    int nd = 0;
    while (*s >= '0' && *s <= '9' && nd < 6) v = v * 10 + (*s++ - '0'), nd++;
    if (nd == 0 || *s != '.' || (nd > 1 && name[4] == '0')) return -1;
    return v;
}

int dsv4_config_set_drafts(dsv4_config *cfg, const struct dsv4_ckpt *ckpt, dsv4_err *err) {
    bool seen[DSV4_MAX_LAYERS] = {0};
    int n = 0;
    size_t count = dsv4_ckpt_count(ckpt);
    for (size_t i = 0; i < count; i++) {
        const dsv4_tview *v = dsv4_ckpt_at(ckpt, i);
        long s = mtp_stage(v->name);
        if (s < 0) continue; /* non-draft, or a malformed mtp name the binder reports */
        if (s >= DSV4_MAX_LAYERS - cfg->num_hidden_layers)
            return dsv4_err_set(err, DSV4_EBIND, "tensor '%s' in %s: draft stage %ld is out of range",
                                v->name, dsv4_ckpt_file_of(ckpt, v), s);
        seen[s] = true;
        if (s + 1 > n) n = (int)s + 1;
    }
    for (int s = 0; s < n; s++)
        if (!seen[s])
            return dsv4_err_set(err, DSV4_EBIND,
                                "draft stages must be contiguous: tensors of mtp.%d exist but none of mtp.%d",
                                n - 1, s);
    cfg->n_draft_stages = n;
    if (n == 0) {
        cfg->draft_kind = DSV4_DRAFT_NONE;
    } else if (dsv4_ckpt_find(ckpt, "mtp.0.main_proj.weight")) {
        cfg->draft_kind = DSV4_DRAFT_DSPARK;
        if (!cfg->has_dspark)
            return dsv4_err_set(err, DSV4_EBIND,
                                "checkpoint has DSpark draft stages (mtp.0.main_proj.weight) but config.json "
                                "has no \"dspark_block_size\" / dspark_* keys");
    } else {
        cfg->draft_kind = DSV4_DRAFT_MTP;
    }
    int L = cfg->num_hidden_layers;
    if (n > 0 && cfg->n_compress_ratios > L && cfg->n_compress_ratios - L != n)
        return dsv4_err_set(err, DSV4_EBIND,
                            "config.json: compress_ratios has %d entries beyond num_hidden_layers (%d) "
                            "but the checkpoint has %d draft stage(s) mtp.0..%d",
                            cfg->n_compress_ratios - L, L, n, n - 1);
    for (int s = 0; s < n; s++)
        if (dsv4_config_layer_ratio(cfg, L + s) != 0)
            return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                                "config.json: compress_ratios[%d] (draft stage mtp.%d) is %d; draft "
                                "layers are sliding-window only (ratio 0)",
                                L + s, s, dsv4_config_layer_ratio(cfg, L + s));
    return DSV4_OK;
}

int dsv4_config_layer_ratio(const dsv4_config *cfg, int layer) {
    return (layer >= 0 && layer < cfg->n_compress_ratios) ? cfg->compress_ratios[layer] : 0;
}

bool dsv4_config_layer_is_hash(const dsv4_config *cfg, int layer) {
    return layer >= 0 && layer < cfg->num_hidden_layers && layer < cfg->num_hash_layers;
}

const char *dsv4_attn_kind_name(int ratio) {
    switch (ratio) {
    case 0: return "sliding";
    case 4: return "CSA";
    case 128: return "HCA";
    default: return "?";
    }
}

const char *dsv4_config_kind_name(const dsv4_config *cfg) {
    switch (cfg->draft_kind) {
    case DSV4_DRAFT_MTP: return "original Flash (MTP)";
    case DSV4_DRAFT_DSPARK:
        return "DSpark";
    default: return "target only (no draft)";
    }
}
