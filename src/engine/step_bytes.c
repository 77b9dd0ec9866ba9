/* HBM bytes of one forward step (src/engine/step_bytes.h). */
#include "engine/step_bytes.h"

#include <math.h>

static double cdiv(double a, double b) { return ceil(a / b); }

/* A dense linear [out][in]: FP8 + E8M0 per 128x128 block when quantised, else BF16. */
static double q8(const dsv4_config *c, double out, double in) {
    if (!c->quantized) return out * in * 2;
    double bo = c->quant.block_out > 0 ? c->quant.block_out : 128, bi = c->quant.block_in > 0 ? c->quant.block_in : 128;
    return out * in + cdiv(out, bo) * cdiv(in, bi);
}

/* One routed expert linear [out][in]: FP4 + E8M0 per 32 inputs, or as dense. */
static double ex(const dsv4_config *c, double out, double in) {
    if (c->quantized && c->experts_fp4) return out * in / 2 + out * in / 32;
    return q8(c, out, in);
}

static double expert_bytes(const dsv4_config *c) {
    double d = c->hidden_size, F = c->moe_intermediate_size;
    return 2 * ex(c, F, d) + ex(c, d, F);
}

/* One compressor (§3.4.5): ape F32 [ratio][cw], wkv + wgate BF16 [cw][d], norm BF16 [out]. */
static double compressor(const dsv4_config *c, int ratio, double out_dim) {
    double cw = out_dim * (ratio == 4 ? 2 : 1);
    return 4 * ratio * cw + 2 * (2 * cw * c->hidden_size) + 2 * out_dim;
}

/* Weights of target layer l other than the routed experts and the tid2eid table. */
static double layer_dense(const dsv4_config *c, int l) {
    double d = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, ql = c->q_lora_rank;
    double og = c->o_groups, ol = c->o_lora_rank, hc = c->hc_mult, mix = (2 + hc) * hc;
    double F = (double)c->moe_intermediate_size * c->n_shared_experts, E = c->n_routed_experts;
    int ratio = dsv4_config_layer_ratio(c, l);
    double b = q8(c, ql, d) + 2 * ql + q8(c, H * hd, ql) + q8(c, hd, d) + 2 * hd + q8(c, og * ol, H * hd / og) +
               q8(c, d, og * ol) + 4 * H;
    if (ratio > 0) b += compressor(c, ratio, hd);
    if (ratio == 4) {
        double Hi = c->index_n_heads, dk = c->index_head_dim;
        b += q8(c, Hi * dk, ql) + 2 * Hi * d + compressor(c, 4, dk);
    }
    b += 2 * (2 * d);                          /* attn_norm, ffn_norm */
    b += 2 * (4 * (mix * hc * d + mix + 3));  /* hc_attn, hc_ffn: fn, base, scale */
    b += 2 * E * d;                            /* router */
    if (!dsv4_config_layer_is_hash(c, l)) b += 4 * E; /* gate bias */
    b += 2 * q8(c, F, d) + q8(c, d, F);        /* shared expert */
    return b;
}

/* Top of the model: final norm, hc_head, head. */
static double top_dense(const dsv4_config *c) {
    double d = c->hidden_size, hc = c->hc_mult;
    return 2 * d + 4 * (hc * hc * d + hc + 1) + 2.0 * c->vocab_size * d;
}

double dsv4_step_bytes_weights_total(const dsv4_config *c) {
    double b = top_dense(c) + 2.0 * c->vocab_size * c->hidden_size; /* + embedding */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        b += layer_dense(c, l) + (double)c->n_routed_experts * expert_bytes(c);
        if (dsv4_config_layer_is_hash(c, l)) b += 8.0 * c->vocab_size * c->num_experts_per_tok;
    }
    return b;
}

int dsv4_step_bytes_compute(const dsv4_config *c, int n_seqs, int rows_per_seq, int64_t context,
                            int state_elem_bytes, dsv4_step_bytes *o, dsv4_err *err) {
    if (n_seqs < 1 || rows_per_seq < 1 || context < 0 || state_elem_bytes < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "step bytes: bad sizes (seqs %d, rows %d, context %lld, elem %d)",
                            n_seqs, rows_per_seq, (long long)context, state_elem_bytes);
    double R = (double)n_seqs * rows_per_seq, E = c->n_routed_experts, k = c->num_experts_per_tok;
    double eb = state_elem_bytes, hd = c->head_dim, dk = c->index_head_dim;
    *o = (dsv4_step_bytes){0};
    o->expert_bytes = expert_bytes(c);
    o->experts_per_layer = E * (1 - pow(1 - k / E, R));
    o->dense = top_dense(c);
    o->gathered = R * 2.0 * c->hidden_size; /* embedding rows */
    /* per request: positions visible to its last row */
    double seen = (double)context + rows_per_seq;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        o->dense += layer_dense(c, l);
        o->experts += o->experts_per_layer * o->expert_bytes;
        if (dsv4_config_layer_is_hash(c, l)) o->gathered += R * 8 * k;
        int ratio = dsv4_config_layer_ratio(c, l);
        double win = seen < c->sliding_window ? seen : c->sliding_window;
        double st = win * hd * eb;
        if (ratio == 4) {
            double nw = floor(seen / 4), sel = nw < c->index_topk ? nw : c->index_topk;
            st += nw * dk * eb + sel * hd * eb; /* indexer scan + the selected rows */
        } else if (ratio > 0) {
            st += floor(seen / ratio) * hd * eb; /* every compressed row */
        }
        o->state += n_seqs * st;
    }
    o->total = o->dense + o->experts + o->gathered + o->state;
    return DSV4_OK;
}
