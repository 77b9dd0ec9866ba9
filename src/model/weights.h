/*
 * The weight binder: every checkpoint tensor bound to exactly one named slot
 * of dsv4_weights, or loading fails (DESIGN.md "Rules"; spec/DSPARK.md §3.3).
 *
 * Why a table of expected names instead of pattern rules: the binder builds
 * the full list of tensor names the config implies (from name segments such
 * as "layers" N "ffn" "shared_experts" "w1" "weight"), looks each up in the
 * checkpoint's hash map, and then requires that no checkpoint tensor was left
 * over. Matching whole names segment by segment cannot confuse `markov_w1`
 * with an FFN `w1` or `shared_experts` with `experts` — the substring bug
 * that dropped the 12 draft shared-expert tensors in the seed stack.
 *
 * All views point into the checkpoint's mmap (the dsv4_ckpt must outlive the
 * dsv4_weights). A slot that the config does not use has dtype
 * DSV4_DT_INVALID (e.g. compressor of a ratio-0 layer, tid2eid of a top-k
 * layer, main_proj of DSpark stages > 0).
 *
 * Accepted dtypes per slot kind (shapes per spec/MODEL.md §2.2, DSPARK.md §3.1):
 *   q8 linear    : F8_E4M3 [o,i] + .scale F8_E8M0 [ceil(o/128), ceil(i/128)],
 *                  or BF16/F32 [o,i] with no .scale (dequantised checkpoint)
 *   expert linear: I8 [o,i/2] + .scale F8_E8M0 [o,i/32] (FP4), or FP8 as a
 *                  q8 linear (Flash-Base), or BF16/F32 without .scale —
 *                  dispatch on the stored dtype (MODEL.md §2.2 Flash-Base note)
 *   plain tensor : BF16 or F32 (MODEL.md §5.3 step 5), shapes exact
 *   tid2eid      : I64 (or I32) [vocab, num_experts_per_tok], values checked
 *                  in [0, n_routed_experts)
 * Consumers must look at linear.w.dtype (and tview.dtype) — never assume.
 */
#ifndef DSV4_MODEL_WEIGHTS_H
#define DSV4_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "dsv4/common.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hyper-connection mixing parameters (MODEL.md §3.2, §3.6).
 *   block hc_attn/hc_ffn: fn [(2+hc)*hc, hc*d], base [(2+hc)*hc], scale [3]
 *   hc_head:              fn [hc, hc*d],        base [hc],          scale [1]
 * All F32 in the real checkpoint (BF16 accepted). */
typedef struct dsv4_hc_w {
    dsv4_tview fn, base, scale;
} dsv4_hc_w;

/* Compressor of a ratio-m layer (MODEL.md §3.4.5). With coff = 2 for
 * m == 4 (overlapping) and 1 for m == 128, width c (head_dim, or
 * index_head_dim for the indexer's own compressor):
 *   ape [m, coff*c] F32, wkv/wgate [coff*c, d] BF16, norm [c] BF16. */
typedef struct dsv4_compressor_w {
    dsv4_tview ape;
    dsv4_linear wkv, wgate;
    dsv4_tview norm;
} dsv4_compressor_w;

/* Attention of one block (MODEL.md §3.4; names layers.N.attn.*). */
typedef struct dsv4_attn_w {
    dsv4_linear wq_a;   /* q8 [q_lora_rank, d]                              */
    dsv4_tview q_norm;  /* [q_lora_rank]                                    */
    dsv4_linear wq_b;   /* q8 [n_h*head_dim, q_lora_rank]                   */
    dsv4_linear wkv;    /* q8 [head_dim, d]                                 */
    dsv4_tview kv_norm; /* [head_dim]                                       */
    dsv4_linear wo_a;   /* q8 [o_groups*o_lora_rank, n_h*head_dim/o_groups] */
    dsv4_linear wo_b;   /* q8 [d, o_groups*o_lora_rank]                     */
    dsv4_tview sink;    /* attn_sink F32 [n_h]                              */
    dsv4_compressor_w compressor;  /* ratio > 0 only                        */
    struct {                       /* ratio == 4 only (lightning indexer)   */
        dsv4_linear wq_b;          /* q8 [index_n_heads*index_head_dim, q_lora_rank] */
        dsv4_linear weights_proj;  /* BF16 [index_n_heads, d]              */
        dsv4_compressor_w compressor; /* ratio 4, c = index_head_dim       */
    } indexer;
} dsv4_attn_w;

/* One SwiGLU expert: w1 (gate) and w3 (up) [inter, d], w2 (down) [d, inter]. */
typedef struct dsv4_expert_w {
    dsv4_linear w1, w2, w3;
} dsv4_expert_w;

/* MoE FFN of one block (MODEL.md §3.5; names layers.N.ffn.*). */
typedef struct dsv4_ffn_w {
    dsv4_linear gate;     /* router BF16 [n_routed_experts, d]               */
    dsv4_tview gate_bias; /* F32 [n_routed_experts]       (non-hash layers)  */
    dsv4_tview tid2eid;   /* I64 [vocab, experts_per_tok] (hash layers)      */
    int n_experts;        /* = n_routed_experts                              */
    dsv4_expert_w *experts; /* [n_experts], routed (FP4, or FP8 / BF16)      */
    dsv4_expert_w shared;   /* q8, inter = n_shared_experts*moe_intermediate */
} dsv4_ffn_w;

/* One decoder block: a target layer, the MTP block or a DSpark stage. */
typedef struct dsv4_block_w {
    int layer_id;         /* absolute id: target N, or num_hidden_layers + s */
    int ratio;            /* 0, 4 or 128                                     */
    bool hash;            /* routes by tid2eid                               */
    dsv4_tview attn_norm, ffn_norm; /* [d]                                   */
    dsv4_hc_w hc_attn, hc_ffn;
    dsv4_attn_w attn;
    dsv4_ffn_w ffn;
} dsv4_block_w;

/* Original Flash MTP block mtp.S (MODEL.md §2.2, §3.9). */
typedef struct dsv4_mtp_w {
    dsv4_block_w block;
    dsv4_linear e_proj, h_proj;      /* q8 [d, d]                            */
    dsv4_tview enorm, hnorm, norm;   /* [d]                                  */
    dsv4_hc_w hc_head;
} dsv4_mtp_w;

/* DSpark draft stage mtp.S (DSPARK.md §3.1). */
typedef struct dsv4_dspark_stage_w {
    dsv4_block_w block;
    /* stage 0 only */
    dsv4_linear main_proj;           /* q8 [d, d*n_target_layer_ids]         */
    dsv4_tview main_norm;            /* [d]                                  */
    /* last stage only */
    dsv4_tview norm;                 /* [d]                                  */
    dsv4_hc_w hc_head;
    dsv4_linear markov_w1, markov_w2;/* markov_head.markov_w{1,2}: BF16 [vocab, markov_rank] */
    dsv4_linear confidence_proj;     /* confidence_head.proj: BF16 [1, d + markov_rank] */
} dsv4_dspark_stage_w;

typedef struct dsv4_weights {
    dsv4_tview embed;                /* embed.weight BF16 [vocab, d]         */
    dsv4_linear head;                /* head.weight  BF16 [vocab, d]         */
    dsv4_tview norm;                 /* norm.weight  [d]                     */
    dsv4_hc_w hc_head;               /* hc_head_fn/_base/_scale              */
    int n_layers;                    /* = cfg->num_hidden_layers             */
    dsv4_block_w *layers;            /* [n_layers]                           */
    dsv4_draft_kind draft_kind;      /* = cfg->draft_kind                    */
    int n_mtp;                       /* DSV4_DRAFT_MTP: number of mtp blocks */
    dsv4_mtp_w *mtp;                 /* [n_mtp]                              */
    int n_stages;                    /* DSV4_DRAFT_DSPARK: stage count       */
    dsv4_dspark_stage_w *stages;     /* [n_stages]                           */

    /* summary */
    size_t n_tensors;                /* checkpoint tensors bound (= all)     */
    uint64_t n_params;               /* logical weight elements (FP4 counts 2
                                        per byte; .scale tensors excluded)   */
    uint64_t n_param_draft;          /* of which under mtp.*                 */
    uint64_t n_bytes;                /* bytes of all tensors                 */
    dsv4_dtype expert_dtype;         /* stored dtype of routed expert weights
                                        (I8 = FP4, F8_E4M3, BF16, F32)       */
} dsv4_weights;

/*
 * dsv4_weights_bind — bind every tensor of ckpt to its slot.
 * cfg must have been through dsv4_config_load and dsv4_config_set_drafts.
 * Errors (DSV4_EBIND; the message names the tensor and its shard file):
 *   "missing tensor NAME" — a slot the config requires is absent (checked
 *      first, in layer order);
 *   "unknown tensor NAME in FILE" — a checkpoint tensor bound to no slot;
 *   "tensor 'NAME' in FILE: dtype X, expected ..." / "shape [..], expected [..]";
 *   a .scale present for an unquantised (BF16/F32) weight, or missing for
 *   a quantised one ("missing tensor 'X.scale' ..."); tid2eid values out of
 *   range. Errors are DSV4_EBIND (DSV4_ENOMEM on allocation failure).
 * On success *out is owned by the caller (dsv4_weights_free); views point
 * into ckpt.
 */
int dsv4_weights_bind(const dsv4_config *cfg, const dsv4_ckpt *ckpt, dsv4_weights **out,
                      dsv4_err *err);
void dsv4_weights_free(dsv4_weights *w);

/*
 * dsv4_weights_scan — read every byte of the checkpoint and check the values
 * are legal (reads the whole checkpoint: minutes for the real one; `dsv4
 * check --scan`): F8_E8M0 scales never 0xFF (NaN, spec/MODEL.md §2.3);
 * F8_E4M3 weights never 0x7F/0xFF (NaN); BF16/F32 tensors finite; I8 FP4
 * has no illegal code. Error DSV4_EFORMAT naming the tensor, its file and
 * the first bad element's flat index. *n_checked (optional) gets the number
 * of tensors scanned.
 */
int dsv4_weights_scan(const dsv4_ckpt *ckpt, size_t *n_checked, dsv4_err *err);

/*
 * dsv4_weights_scan_sampled — the cheap default of `dsv4 check`: the same
 * value rules as dsv4_weights_scan, applied to every byte of tensors of at
 * most full_max bytes (norms, biases, small scales) and to n_windows windows
 * of window_bytes spread evenly over each larger tensor (first and last
 * bytes included). Catches a tensor that is NaN throughout or in a large
 * block; an isolated bad value in a big tensor needs the full scan. Error
 * DSV4_EFORMAT as dsv4_weights_scan. *n_checked (optional): tensors visited.
 */
int dsv4_weights_scan_sampled(const dsv4_ckpt *ckpt, size_t full_max, int n_windows, size_t window_bytes,
                              size_t *n_checked, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
