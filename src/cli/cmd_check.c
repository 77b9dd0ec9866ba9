/*
 * dsv4 check MODEL_DIR — validate a checkpoint directory before a long start
 * (issue 2): config.json parsed, index consistent with the shards present,
 * no partial downloads, every tensor the config implies present with the
 * right dtype and shape, and no tensor left unbound. Prints a summary; on
 * any problem prints one message naming the file and tensor, exit status 1.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "text/encoder.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 check [--scan] [MODEL_DIR]\n"
            "\n"
            "Validate a DeepSeek-V4-Flash checkpoint directory (original Flash with its MTP block,\n"
            "DSpark preview, or the 0731 release with DSpark draft stages; FP8/FP4 or a BF16\n"
            "dequantised copy) the way the server will load it, without starting anything:\n"
            "  - config.json: every key the model needs, with supported values\n"
            "  - model.safetensors.index.json agrees exactly with the shards present;\n"
            "    no *.incomplete partial downloads; no truncated or malformed shard\n"
            "  - every tensor the config implies is present with the right dtype and shape,\n"
            "    and every tensor in the checkpoint is bound to exactly one slot\n"
            "  - the reasoning-effort profile from encoding/encoding_dsv4.py (preview / 0731)\n"
            "Prints a summary: checkpoint kind, layers by attention kind (ratio 0 / 4 / 128),\n"
            "hash-routed layers, expert dtype, draft stages, tensor count, parameters and bytes.\n"
            "\n"
            "  - values: NaN/Inf codes (E8M0 scale 0xFF, E4M3 0x7F/0xFF, non-finite BF16/F32)\n"
            "    are rejected; by default tensors up to 64 KiB (norms, biases, small scales)\n"
            "    are read entirely and larger ones in 4 windows of 1 KiB (cheap: catches a\n"
            "    tensor that is NaN throughout or in a large block)\n"
            "\n"
            "  --scan   read every byte of every tensor instead of sampling (reads the whole\n"
            "           checkpoint: slow)\n"
            "\n"
            "MODEL_DIR defaults to the embedded default model (%s).\n"
            "Exit status: 0 valid, 1 invalid (one message naming the file and tensor), 2 usage.\n",
            dsv4_default_model_dir());
}

static void list_layers(const dsv4_config *c, int ratio, char *out, size_t cap) {
    size_t n = 0;
    int cnt = 0;
    out[0] = '\0';
    for (int i = 0; i < c->num_hidden_layers; i++)
        if (dsv4_config_layer_ratio(c, i) == ratio) {
            if (cnt < 12 && n < cap) n += (size_t)snprintf(out + n, cap - n, "%s%d", cnt ? "," : "", i);
            else if (cnt == 12 && n < cap) n += (size_t)snprintf(out + n, cap - n, ",...");
            cnt++;
        }
}

static int count_ratio(const dsv4_config *c, int ratio) {
    int k = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) k += dsv4_config_layer_ratio(c, i) == ratio;
    return k;
}

static const char *expert_dtype_desc(dsv4_dtype dt) {
    switch (dt) {
    case DSV4_DT_I8: return "FP4 (I8-packed E2M1, E8M0 scale per 32)";
    case DSV4_DT_F8_E4M3: return "FP8 (E4M3, E8M0 scale per 128x128)";
    case DSV4_DT_BF16: return "BF16 (dequantised)";
    case DSV4_DT_F32: return "F32 (dequantised)";
    default: return "none";
    }
}

static void human_bytes(char *out, size_t cap, double b) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000.0 && i < 4) b /= 1000.0, i++;
    snprintf(out, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

int dsv4_cmd_check(int argc, char **argv) {
    const char *dir = NULL;
    int scan = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--scan")) {
            scan = 1;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "dsv4 check: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (dir) {
            fprintf(stderr, "dsv4 check: more than one MODEL_DIR given\n");
            return 2;
        }
        dir = argv[i];
    }
    if (!dir) dir = dsv4_default_model_dir();

    dsv4_err err = {0};
    dsv4_config cfg;
    dsv4_ckpt *ck = NULL;
    dsv4_weights *w = NULL;
    int rc = dsv4_config_load(dir, &cfg, &err);
    if (!rc) rc = dsv4_ckpt_open(dir, &ck, &err);
    if (!rc) rc = dsv4_config_set_drafts(&cfg, ck, &err);
    if (!rc) rc = dsv4_weights_bind(&cfg, ck, &w, &err);
    size_t scanned = 0;
    /* the sampled default: a few MB of reads even on the real checkpoint */
    if (!rc) rc = scan ? dsv4_weights_scan(ck, &scanned, &err)
                       : dsv4_weights_scan_sampled(ck, 64 << 10, 4, 1024, &scanned, &err);
    if (rc) {
        fprintf(stderr, "dsv4 check: %s: %s\n", dir, err.msg);
        dsv4_weights_free(w);
        dsv4_ckpt_free(ck);
        return 1;
    }

    char l0[128], l4[128], l128[128], hb[64], bytes[32];
    list_layers(&cfg, 0, l0, sizeof l0);
    list_layers(&cfg, 4, l4, sizeof l4);
    list_layers(&cfg, 128, l128, sizeof l128);
    size_t n = 0;
    hb[0] = '\0';
    for (int i = 0; i < cfg.num_hidden_layers && i < cfg.num_hash_layers && n < sizeof hb; i++)
        n += (size_t)snprintf(hb + n, sizeof hb - n, "%s%d", i ? "," : "", i);
    human_bytes(bytes, sizeof bytes, (double)w->n_bytes);

    printf("checkpoint:     %s\n", dir);
    dsv4_effort_profile prof;
    dsv4_err perr = {0};
    int have_prof = dsv4_encoder_detect_profile(dir, DSV4_PROFILE_AUTO, &prof, &perr) == 0;
    printf("kind:           %s%s%s\n", dsv4_config_kind_name(&cfg),
           cfg.draft_kind == DSV4_DRAFT_DSPARK && have_prof ? " " : "",
           cfg.draft_kind == DSV4_DRAFT_DSPARK && have_prof ? dsv4_profile_name(prof) : "");
    if (have_prof)
        printf("encoder:        reasoning-effort profile %s (encoding/encoding_dsv4.py)\n", dsv4_profile_name(prof));
    else
        printf("encoder:        profile unknown: %s (serve needs --reasoning-effort-profile)\n", perr.msg);
    printf("target layers:  %d: sliding (ratio 0) %d [%s], CSA (ratio 4) %d [%s], HCA (ratio 128) %d [%s]\n",
           cfg.num_hidden_layers, count_ratio(&cfg, 0), l0, count_ratio(&cfg, 4), l4,
           count_ratio(&cfg, 128), l128);
    printf("hash layers:    %d [%s]\n", cfg.num_hash_layers < cfg.num_hidden_layers ? cfg.num_hash_layers
                                                                                    : cfg.num_hidden_layers, hb);
    printf("experts:        %d routed (top-%d) + %d shared; routed stored as %s\n", cfg.n_routed_experts,
           cfg.num_experts_per_tok, cfg.n_shared_experts, expert_dtype_desc(w->expert_dtype));
    if (cfg.draft_kind == DSV4_DRAFT_DSPARK)
        printf("draft stages:   %d DSpark (mtp.0..%d), block size %d, target layers %d..%d, noise token %d\n",
               cfg.n_draft_stages, cfg.n_draft_stages - 1, cfg.dspark_block_size,
               cfg.dspark_target_layer_ids[0], cfg.dspark_target_layer_ids[cfg.n_dspark_target_layer_ids - 1],
               cfg.dspark_noise_token_id);
    else if (cfg.draft_kind == DSV4_DRAFT_MTP)
        printf("draft stages:   %d MTP block(s) (mtp.0%s)\n", cfg.n_draft_stages,
               cfg.n_draft_stages > 1 ? "..." : "");
    else
        printf("draft stages:   0\n");
    printf("tensors:        %zu in %zu file(s), all bound\n", w->n_tensors, dsv4_ckpt_num_files(ck));
    printf("parameters:     %llu (target %llu, draft %llu)\n", (unsigned long long)w->n_params,
           (unsigned long long)(w->n_params - w->n_param_draft), (unsigned long long)w->n_param_draft);
    printf("bytes:          %llu (%s)\n", (unsigned long long)w->n_bytes, bytes);
    printf("values:         %zu tensors %s, no NaN/Inf codes\n", scanned,
           scan ? "scanned in full" : "checked (small ones in full, large ones sampled; --scan reads all)");
    if (cfg.quantized && (w->expert_dtype == DSV4_DT_I8) != cfg.experts_fp4 &&
        (w->expert_dtype == DSV4_DT_I8 || w->expert_dtype == DSV4_DT_F8_E4M3))
        printf("note:           config.json expert_dtype says %s but routed experts are stored as %s; "
               "the stored dtype is used (spec/MODEL.md §2.2 Flash-Base note)\n",
               cfg.experts_fp4 ? "fp4" : "not fp4", dsv4_dtype_name(w->expert_dtype));
    printf("OK\n");
    dsv4_weights_free(w);
    dsv4_ckpt_free(ck);
    return 0;
}
