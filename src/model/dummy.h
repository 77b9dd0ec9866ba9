/*
 * --load-format dummy: the real model's tensors (names, shapes, dtypes of a
 * checkpoint, spec/MODEL.md §2.2, spec/DSPARK.md §3.1) with random values
 * made directly in backend memory — no safetensors file is read and no host
 * copy of the model is made (the real one is ~160 GB; a GPU host has 128 GB).
 * Like vLLM's dummy loader, it measures full-size speed without the
 * checkpoint.
 *
 * How it fits the normal load path, unchanged:
 *  1. dsv4_dummy_create lists every tensor a checkpoint for this config has
 *     (the "inventory") and wraps it as a file-less dsv4_ckpt whose views
 *     carry no data, only a tag. dsv4_config_set_drafts and the strict
 *     binder (model/weights.h) then run on it as on a real checkpoint — so
 *     the inventory is checked against the binder's expectations tensor by
 *     tensor on every dummy load.
 *  2. dsv4_dummy_backend wraps the backend: uploads of tagged views call the
 *     backend's fill_dummy / fill_dummy_linear (backend.h) instead of
 *     copying; everything else passes through. model.c, dspark.c and mtp.c
 *     upload as usual.
 *
 * Values (benign, so a forward gives finite logits; backend/dummy_fill.h):
 *   FP8 E4M3 weights: random sign, magnitude codes 0..0x38 (|q| <= 1), with
 *     a constant E8M0 block scale 2^k chosen so the dequantised weights have
 *     std within a factor sqrt(2) of 1/sqrt(in) (a power-of-two step);
 *   FP4 (I8-packed E2M1): every nibble uniform, per-32 E8M0 scale likewise;
 *   BF16/F32 linears (router, compressor, indexer proj, head, Markov head):
 *     uniform with std 1/sqrt(in); embedding uniform on [-1, 1];
 *   norm weights uniform on 1 ± 0.05; hc fn std 1/sqrt(hc·d), hc base
 *     ±0.5, hc scale 0.5 ± 0.25; attention sinks ±1; compressor ape ±0.5;
 *     router bias ±0.01; tid2eid rows of k distinct expert ids (made on the
 *     host, 6 MB a hash layer, so the binder checks them as usual).
 * Each tensor's values are a function of (seed, tensor name), so a layer
 * gets the same weights whatever the layer count or backend.
 */
#ifndef DSV4_MODEL_DUMMY_H
#define DSV4_MODEL_DUMMY_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsv4_dummy dsv4_dummy;

/*
 * dsv4_dummy_create — the dummy checkpoint for cfg (parsed config.json,
 * overrides applied). Draft stages come from the config, since there are no
 * tensor names to count: DSpark configs (dspark_block_size present) get
 * len(compress_ratios) - num_hidden_layers stages (DSPARK.md §2.1), others
 * num_nextn_predict_layers MTP blocks (MODEL.md §2.2). Then
 * dsv4_config_set_drafts runs on the inventory, filling cfg->n_draft_stages
 * and cfg->draft_kind. Errors: DSV4_EFORMAT for a DSpark config without
 * draft entries in compress_ratios; set_drafts' errors; DSV4_ENOMEM.
 */
int dsv4_dummy_create(dsv4_config *cfg, uint64_t seed, dsv4_dummy **out, dsv4_err *err);
void dsv4_dummy_free(dsv4_dummy *d);

/* The file-less checkpoint (valid while d lives): bind it with
 * dsv4_weights_bind; its views must be made resident through a backend from
 * dsv4_dummy_backend. Its shard name is "dummy weights". */
const dsv4_ckpt *dsv4_dummy_ckpt(const dsv4_dummy *d);

/*
 * dsv4_dummy_fill_for — the fill a tagged view of d gets (NULL for a view
 * that is not one of d's tags, e.g. tid2eid, which holds real host values).
 */
const dsv4_fill *dsv4_dummy_fill_for(const dsv4_dummy *d, const dsv4_tview *v);

/*
 * dsv4_dummy_backend — a backend that behaves as `real` except that
 * `upload` / `upload_linear` of d's tagged views materialise them with
 * real->fill_dummy / fill_dummy_linear. It takes ownership of `real` (its
 * free frees real too); d must outlive it. Errors (NULL returned):
 * DSV4_EUNSUPPORTED when real has no fill_dummy (or has upload_linear but no
 * fill_dummy_linear), DSV4_ENOMEM (real is then freed).
 */
dsv4_backend *dsv4_dummy_backend(dsv4_dummy *d, dsv4_backend *real, dsv4_err *err);

/*
 * dsv4_dummy_slice — a tag for part of the dummy tensor whose view data is
 * `tag` (tensor parallelism: a rank's rows or columns, src/parallel/tp_shard.c):
 * element i of a view carrying the returned tag is filled with the value of
 * element off + (cols ? (i / cols) * stride + i % cols : i) of the whole
 * tensor (dsv4_fill map_*), so a sharded dummy model holds exactly the
 * values of the unsharded one. Units are the stored elements (bytes for FP8,
 * E8M0 and packed FP4). Valid while d lives. Errors (NULL returned):
 * DSV4_EINTERNAL tag is not one of d's whole tensors, or more slices than
 * tensors; DSV4_ENOMEM.
 */
const void *dsv4_dummy_slice(dsv4_dummy *d, const void *tag, uint64_t off, int64_t cols, int64_t stride,
                             dsv4_err *err);

/* Tensors and bytes made resident through dummy backends of d so far
 * (filled or, for tid2eid, uploaded). */
void dsv4_dummy_stats(const dsv4_dummy *d, uint64_t *n_tensors, uint64_t *n_bytes);

#ifdef __cplusplus
}
#endif
#endif
