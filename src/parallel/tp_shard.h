/*
 * tp_shard.h — one tensor-parallel rank's slice of the target model
 * (DESIGN.md "Parallelism"; the split is explained in tp_shard.c's banner).
 *
 * A shard is a dsv4_weights whose target-layer tensors are views into the
 * checkpoint (row slices) or small owned copies (column slices, which are not
 * contiguous in row-major storage), plus a LOCAL config: the same model with
 * num_attention_heads / tp heads and o_groups / tp output groups, so the
 * block forward (src/model/block.c) runs unchanged on a rank and only adds
 * the two all-reduces.
 */
#ifndef DSV4_PARALLEL_TP_SHARD_H
#define DSV4_PARALLEL_TP_SHARD_H

#include "model/config.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dsv4_dummy; /* model/dummy.h */

typedef struct dsv4_tp_shard {
    int rank, size;
    dsv4_config cfg;   /* local: heads and output groups divided by size */
    dsv4_weights w;    /* target tensors sliced; embed/norm/hc_head and drafts shared */
    int head_split;    /* w.head holds vocabulary rows [rank*V/size, +V/size): logits need an all_gather */
    /* private */
    dsv4_block_w *layers;
    dsv4_expert_w *experts;  /* all layers' expert slices, one allocation */
    void **owned;
    int n_owned, cap_owned;
    struct dsv4_dummy *dummy; /* the weights' dummy source, or NULL */
} dsv4_tp_shard;

/*
 * dsv4_tp_check — can the model of cfg be split over tp ranks? Checks, for the
 * Megatron split of tp_shard.c: tp divides num_attention_heads, o_groups,
 * the shared expert width (n_shared_experts × moe_intermediate_size) and
 * moe_intermediate_size; and every split of an FP8 tensor (128×128 block
 * scales, spec/MODEL.md §2.3) falls on block boundaries or inside a single
 * block (so each slice keeps whole scale blocks), every FP4 column split on a
 * multiple of 32. tp == 1 always passes.
 * Errors: DSV4_EINVAL naming the field and the numbers, e.g.
 * "--tensor-parallel-size 3 does not divide num_attention_heads 64".
 */
int dsv4_tp_check(const dsv4_config *cfg, int tp, dsv4_err *err);

/*
 * dsv4_tp_shard_create — rank `rank` of `size`: slice every target layer of
 * w (bound with cfg; must outlive the shard, as must the checkpoint). Draft
 * blocks (MTP, DSpark stages) are left whole: the drafter runs replicated on
 * rank 0 only. Errors: dsv4_tp_check's; a stored dtype the slicer does not
 * know (names the tensor); DSV4_ENOMEM.
 */
int dsv4_tp_shard_create(const dsv4_config *cfg, const dsv4_weights *w, int rank, int size,
                         dsv4_tp_shard **out, dsv4_err *err);
/*
 * dsv4_tp_shard_create_ex — the same for weights bound to a dummy checkpoint
 * (model/dummy.h; dummy NULL = a real one, as dsv4_tp_shard_create): sliced
 * dummy tensors get tags of dsv4_dummy_slice instead of offset pointers or
 * copies, so each rank's backend fills exactly its part of the whole dummy
 * model. Errors additionally: DSV4_EUNSUPPORTED an FP4 slice that is not
 * 4-byte aligned (the CUDA fill writes words), dsv4_dummy_slice's.
 */
int dsv4_tp_shard_create_ex(const dsv4_config *cfg, const dsv4_weights *w, int rank, int size,
                            struct dsv4_dummy *dummy, dsv4_tp_shard **out, dsv4_err *err);
void dsv4_tp_shard_free(dsv4_tp_shard *s);

#ifdef __cplusplus
}
#endif
#endif
