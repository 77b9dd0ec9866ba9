/* Checkpoint -> engine runner (src/engine/model_runner.h). */
#include <stdlib.h>

#include "engine/model_runner.h"
#include "model/forward.h"
#include "model/safetensors.h"
#include "model/weights.h"

struct dsv4_model_runner {
    dsv4_config cfg;
    dsv4_ckpt *ckpt;
    dsv4_weights *w;
    dsv4_backend *be;
    dsv4_model *model;
    dsv4_state *state;
};

void dsv4_model_runner_free(dsv4_model_runner *mr) {
    if (!mr) return;
    dsv4_state_free(mr->state);
    dsv4_model_free(mr->model);
    if (mr->be) mr->be->free(mr->be);
    dsv4_weights_free(mr->w);
    dsv4_ckpt_free(mr->ckpt);
    free(mr);
}

int dsv4_model_runner_open(const char *dir, const dsv4_model_runner_opts *o, dsv4_model_runner **out,
                           dsv4_err *err) {
    *out = NULL;
    if (o->n_slots < 1 || o->max_len < 2 || o->max_spec < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "model runner: bad sizes (slots %d, max_len %d, max_spec %d)",
                            o->n_slots, o->max_len, o->max_spec);
    dsv4_model_runner *mr = calloc(1, sizeof *mr);
    if (!mr) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    int rc;
    if ((rc = dsv4_ckpt_open(dir, &mr->ckpt, err)) || (rc = dsv4_config_load(dir, &mr->cfg, err)) ||
        (rc = dsv4_config_set_drafts(&mr->cfg, mr->ckpt, err)) ||
        (rc = dsv4_weights_bind(&mr->cfg, mr->ckpt, &mr->w, err)))
        goto fail;
    mr->be = dsv4_backend_cpu_create(o->numerics, err);
    if (!mr->be) {
        rc = err ? err->code : DSV4_EBACKEND;
        goto fail;
    }
    if ((rc = dsv4_model_create(&mr->cfg, mr->w, mr->be, &mr->model, err))) goto fail;
    int L = mr->cfg.num_hidden_layers;
    int *ratios = malloc(sizeof(int) * (size_t)L);
    if (!ratios) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < L; l++) ratios[l] = dsv4_config_layer_ratio(&mr->cfg, l);
    rc = dsv4_state_create(mr->be, &mr->cfg, ratios, L, o->n_slots, o->max_len, o->max_spec, &mr->state, err);
    free(ratios);
    if (rc) goto fail;
    *out = mr;
    return DSV4_OK;
fail:
    dsv4_err_prefix(err, "%s: ", dir);
    dsv4_model_runner_free(mr);
    return rc;
}

static int runner_forward(void *ctx, const dsv4_batch *b, const int32_t *logit_rows, int n_logits, float *logits,
                          dsv4_err *err) {
    dsv4_model_runner *mr = ctx;
    return dsv4_forward(mr->model, mr->state, b, logit_rows, n_logits, logits, NULL, err);
}

static void runner_release(void *ctx, int slot) {
    dsv4_model_runner *mr = ctx;
    dsv4_err err = {0};
    if (dsv4_state_reset_slot(mr->state, slot, &err))
        dsv4_log(DSV4_LOG_ERROR, "resetting slot %d: %s", slot, err.msg);
}

dsv4_runner dsv4_model_runner_iface(dsv4_model_runner *mr) {
    dsv4_runner r = {mr, mr->cfg.vocab_size, mr->state->n_slots, runner_forward, runner_release};
    return r;
}

const dsv4_config *dsv4_model_runner_config(const dsv4_model_runner *mr) { return &mr->cfg; }
