/*
 * dsv4 run — greedy generation for one prompt on the CPU reference backend.
 *
 * The whole path a request takes, without the server: config + checkpoint
 * (strict binder) → prompt encoder (chat template, thinking resolved once) →
 * tokenizer → one prefill → greedy decode steps through src/model/forward.c
 * → incremental byte output. It exists to run the reference model by hand and
 * as the end-to-end smoke test of issue 4; it is not fast.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/forward.h"
#include "model/safetensors.h"
#include "text/encoder.h"
#include "text/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 run [MODEL_DIR] --prompt TEXT [options]\n"
            "Generate text greedily for one prompt with the CPU reference backend.\n"
            "MODEL_DIR defaults to the embedded default model (%s).\n"
            "  --prompt TEXT        user message (rendered with the checkpoint's chat encoder)\n"
            "  --raw                tokenize TEXT as is (no chat template, no BOS)\n"
            "  --max-tokens N       tokens to generate (default 32)\n"
            "  --thinking           render with thinking mode on (default off)\n"
            "  --numerics MODE      reference (official QAT numerics, default) or hf (transformers)\n"
            "  --show-ids           print the prompt and generated token ids to stderr\n",
            dsv4_default_model_dir());
}

typedef struct run_opts {
    const char *dir, *prompt;
    int raw, max_tokens, thinking, show_ids;
    dsv4_numerics numerics;
} run_opts;

static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 32;
    o->numerics = DSV4_NUMERICS_REFERENCE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            o->prompt = argv[++i];
        } else if (!strcmp(a, "--max-tokens") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1000000) {
                fprintf(stderr, "dsv4 run: --max-tokens: '%s' is not a count\n", argv[i]);
                return 2;
            }
            o->max_tokens = (int)v;
        } else if (!strcmp(a, "--numerics") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "reference")) o->numerics = DSV4_NUMERICS_REFERENCE;
            else if (!strcmp(m, "hf")) o->numerics = DSV4_NUMERICS_HF;
            else {
                fprintf(stderr, "dsv4 run: --numerics: '%s' (expected reference or hf)\n", m);
                return 2;
            }
        } else if (!strcmp(a, "--raw")) {
            o->raw = 1;
        } else if (!strcmp(a, "--thinking")) {
            o->thinking = 1;
        } else if (!strcmp(a, "--show-ids")) {
            o->show_ids = 1;
        } else if (a[0] != '-' && !o->dir) {
            o->dir = a;
        } else {
            fprintf(stderr, "dsv4 run: unknown or incomplete option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->prompt) {
        fprintf(stderr, "dsv4 run: --prompt is required (see --help)\n");
        return 2;
    }
    if (!o->dir) o->dir = dsv4_default_model_dir();
    return 0;
}

/* Prompt ids: chat-encoded (the server's path) or the raw text. */
static int prompt_ids(const run_opts *o, const dsv4_tokenizer *tok, dsv4_tokvec *ids, dsv4_err *err) {
    if (o->raw) return dsv4_tokenizer_encode(tok, o->prompt, strlen(o->prompt), 0, ids, err);
    dsv4_effort_profile prof;
    int rc = dsv4_encoder_detect_profile(o->dir, DSV4_PROFILE_AUTO, &prof, err);
    if (rc) return rc;
    cJSON *body = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(body, "messages"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", o->prompt);
    cJSON_AddItemToArray(msgs, m);
    if (o->thinking) {
        cJSON *kw = cJSON_AddObjectToObject(body, "chat_template_kwargs");
        cJSON_AddTrueToObject(kw, "thinking");
    }
    dsv4_encoder_config ec;
    dsv4_encoder_config_init(&ec, prof);
    dsv4_thinking th;
    dsv4_prompt pr = {0};
    rc = dsv4_encoder_build_chat(body, NULL, 0, &ec, tok, &th, &pr, ids, err);
    dsv4_prompt_free(&pr);
    cJSON_Delete(body);
    return rc;
}

/* One forward call over rows [p0, p0+n) of ids in slot 0; greedy argmax of the last row. */
static int step(dsv4_model *m, dsv4_state *st, const int32_t *ids, int p0, int n, float *logits,
                int32_t *next, dsv4_err *err) {
    int32_t *pos = malloc(sizeof(int32_t) * n * 3), *slot = pos + n, *seq = slot + n;
    if (!pos) return dsv4_err_set(err, DSV4_ENOMEM, "run: out of memory");
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        slot[i] = 0;
        seq[i] = 0;
    }
    int32_t cu[2] = {0, n}, sslot = 0, spos = p0, last = n - 1;
    dsv4_batch b = {.n_rows = n, .n_seqs = 1, .token = ids + p0, .pos = pos, .slot = slot, .seq_idx = seq,
                    .cu_seqlens = cu, .seq_slot = &sslot, .seq_pos0 = &spos};
    int rc = dsv4_forward(m, st, &b, &last, 1, logits, NULL, err);
    free(pos);
    if (rc) return rc;
    int best = 0;
    for (int v = 1; v < m->cfg->vocab_size; v++)
        if (logits[v] > logits[best]) best = v;
    *next = best;
    return DSV4_OK;
}

int dsv4_cmd_run(int argc, char **argv) {
    run_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) return prc < 0 ? 0 : prc;
    dsv4_err err = {0};
    dsv4_config cfg;
    dsv4_ckpt *ck = NULL;
    dsv4_weights *w = NULL;
    dsv4_backend *be = NULL;
    dsv4_model *m = NULL;
    dsv4_state *st = NULL;
    dsv4_tokenizer *tok = NULL;
    dsv4_tokvec ids = {0};
    float *logits = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", o.dir);
    int rc = dsv4_config_load(o.dir, &cfg, &err);
    if (!rc) rc = dsv4_ckpt_open(o.dir, &ck, &err);
    if (!rc) rc = dsv4_config_set_drafts(&cfg, ck, &err);
    if (!rc) rc = dsv4_weights_bind(&cfg, ck, &w, &err);
    if (!rc) rc = dsv4_tokenizer_load(path, &tok, &err);
    if (!rc) rc = prompt_ids(&o, tok, &ids, &err);
    if (!rc && ids.n == 0) rc = dsv4_err_set(&err, DSV4_EINVAL, "run: the prompt has no tokens");
    if (!rc) {
        be = dsv4_backend_cpu_create(o.numerics, &err);
        if (!be) rc = err.code ? err.code : DSV4_ENOMEM;
    }
    if (!rc) rc = dsv4_model_create(&cfg, w, be, &m, &err);
    int max_len = (int)ids.n + o.max_tokens + 1;
    if (!rc) {
        int ratios[DSV4_MAX_LAYERS];
        for (int l = 0; l < cfg.num_hidden_layers; l++) ratios[l] = dsv4_config_layer_ratio(&cfg, l);
        rc = dsv4_state_create(be, &cfg, ratios, cfg.num_hidden_layers, 1, max_len, 0, &st, &err);
    }
    if (!rc && o.show_ids) {
        fprintf(stderr, "prompt ids (%zu):", ids.n);
        for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
        fputc('\n', stderr);
    }
    if (!rc && !(logits = malloc(sizeof(float) * (size_t)cfg.vocab_size)))
        rc = dsv4_err_set(&err, DSV4_ENOMEM, "run: out of memory");
    /* prefill the prompt, then one row per generated token */
    int p = 0, n_new = 0;
    int32_t next = 0;
    if (!rc && o.max_tokens > 0) {
        rc = step(m, st, ids.ids, 0, (int)ids.n, logits, &next, &err);
        p = (int)ids.n;
    }
    while (!rc && n_new < o.max_tokens) {
        if (dsv4_tokvec_push(&ids, next)) {
            rc = dsv4_err_set(&err, DSV4_ENOMEM, "run: out of memory");
            break;
        }
        n_new++;
        size_t len = 0;
        const char *bytes = dsv4_tokenizer_token_bytes(tok, next, &len);
        if (bytes) fwrite(bytes, 1, len, stdout);
        fflush(stdout);
        if (o.show_ids) fprintf(stderr, "[%d]", next);
        if (next == cfg.eos_token_id || n_new == o.max_tokens) break;
        rc = step(m, st, ids.ids, p, 1, logits, &next, &err);
        p++;
    }
    if (!rc) putchar('\n');
    if (rc) fprintf(stderr, "dsv4 run: %s: %s\n", dsv4_status_name(rc), err.msg);
    free(logits);
    dsv4_tokvec_free(&ids);
    dsv4_tokenizer_free(tok);
    dsv4_state_free(st);
    dsv4_model_free(m);
    if (be) be->free(be);
    dsv4_weights_free(w);
    dsv4_ckpt_free(ck);
    return rc ? 1 : 0;
}
