/*
 * safetensors checkpoint reader (spec/MODEL.md §2.1).
 *
 * A checkpoint directory holds either model.safetensors.index.json (whose
 * "weight_map" names the shard of every tensor) plus the shards, or a single
 * model.safetensors. Each shard is mmap'd read-only; tensor views point into
 * the mapping, so nothing is copied and opening the 160 GB real checkpoint
 * costs only its headers.
 *
 * Why so strict: a truncated download or a mismatched index silently gives
 * garbage weights later. Every header field is bounds-checked (header length
 * vs file size, data_offsets inside the data region, begin <= end,
 * nbytes == prod(shape) * dtype size (I8-packed FP4 counted as bytes), no
 * overlapping tensors, dims >= 0 with no overflow, known dtype strings) and
 * the index must agree with the shards exactly. Every error names the file
 * and, where there is one, the tensor.
 *
 * Lookup is a hash map (the real checkpoint has ~74k tensors).
 *
 * Alignment: every view a dsv4_ckpt hands out has data aligned to its element
 * size (safe to read as float / uint16_t / int64_t arrays). The format does
 * not guarantee that, so tensors that are misaligned in their file are copied
 * once into aligned memory owned by the checkpoint (in practice a few small
 * F32/I64 tensors; files written by the `safetensors` library are aligned).
 * dsv4_st_parse views point straight into the given buffer (no such promise).
 */
#ifndef DSV4_MODEL_SAFETENSORS_H
#define DSV4_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4/common.h"
#include "model/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- one safetensors file held in memory (the parser; fuzzed) ---------- */

typedef struct dsv4_st_file dsv4_st_file;

/*
 * dsv4_st_parse — parse a whole safetensors file image buf[0..size): 8-byte
 * little-endian header length N, N bytes of JSON header, data region.
 * Views point into buf (which must outlive the result). `label` names the
 * file in error messages. A "__metadata__" object (string values) is
 * allowed and ignored. Errors (DSV4_EFORMAT unless noted), each message
 * "<label>: ..." and naming the tensor where there is one:
 *   size < 8 or N > size-8 (truncated, DSV4_EIO); header not a JSON object;
 *   entry not an object / missing or wrong-typed dtype, shape, data_offsets;
 *   unknown dtype string; negative, non-integer or overflowing dims; more
 *   than DSV4_MAX_DIMS dims; begin > end; end beyond the data region
 *   (DSV4_EIO: truncated); end-begin != prod(shape)*dtype size; two tensors'
 *   byte ranges overlapping; duplicate names.
 * On success *out is owned by the caller (dsv4_st_free).
 */
int dsv4_st_parse(const void *buf, size_t size, const char *label, dsv4_st_file **out,
                  dsv4_err *err);
void dsv4_st_free(dsv4_st_file *f);
/* Tensors in header order. i in [0, count). */
size_t dsv4_st_count(const dsv4_st_file *f);
const dsv4_tview *dsv4_st_at(const dsv4_st_file *f, size_t i);

/* ---- a checkpoint directory -------------------------------------------- */

typedef struct dsv4_ckpt dsv4_ckpt;

/*
 * dsv4_ckpt_open — open a checkpoint directory and validate its file set.
 *   - any "*.incomplete" file in dir (an interrupted hub download) -> DSV4_EIO
 *     naming it;
 *   - with model.safetensors.index.json: "weight_map" must be an object of
 *     string values naming plain file names (no '/', no ".."); every shard
 *     named must exist and parse (missing -> DSV4_EIO naming the shard and
 *     a tensor mapped to it); every tensor of the index must be in its shard
 *     and every tensor of a shard must be in the index, mapped to that shard
 *     (DSV4_EFORMAT naming tensor and file);
 *   - without an index: model.safetensors alone; neither -> DSV4_EIO.
 * On success *out owns the mappings (dsv4_ckpt_free). err may be NULL.
 */
int dsv4_ckpt_open(const char *dir, dsv4_ckpt **out, dsv4_err *err);
void dsv4_ckpt_free(dsv4_ckpt *c);

/*
 * dsv4_ckpt_from_views — a checkpoint without files, over n views built by
 * the caller (--load-format dummy, src/model/dummy.c), so the binder and
 * dsv4_config_set_drafts run unchanged on it. `label` stands for the shard
 * file in messages ("dsv4_ckpt_file_of"). The views (names and data) are
 * copied by value and must outlive the result. Errors: DSV4_EFORMAT for a
 * duplicate or NULL name, DSV4_ENOMEM.
 */
int dsv4_ckpt_from_views(const char *label, const dsv4_tview *v, size_t n, dsv4_ckpt **out, dsv4_err *err);

/* Find a tensor by exact name; NULL if absent. O(1) expected. */
const dsv4_tview *dsv4_ckpt_find(const dsv4_ckpt *c, const char *name);

/* Iteration over all tensors: i in [0, count); order is shard order, then
 * header order within the shard. The pointer stays valid until free. */
size_t dsv4_ckpt_count(const dsv4_ckpt *c);
const dsv4_tview *dsv4_ckpt_at(const dsv4_ckpt *c, size_t i);
/* Index of a view returned by find/at (for per-tensor bookkeeping such as
 * "bound" flags), or (size_t)-1 if v is not one of this checkpoint's. */
size_t dsv4_ckpt_index_of(const dsv4_ckpt *c, const dsv4_tview *v);
/* File name (no directory) of the shard holding view v; "?" if unknown. */
const char *dsv4_ckpt_file_of(const dsv4_ckpt *c, const dsv4_tview *v);

/* The directory given to open; number of shard files; total tensor bytes. */
const char *dsv4_ckpt_dir(const dsv4_ckpt *c);
size_t dsv4_ckpt_num_files(const dsv4_ckpt *c);
uint64_t dsv4_ckpt_total_bytes(const dsv4_ckpt *c);

/* Elements of a view (product of its shape; 1 for a scalar). */
int64_t dsv4_tview_numel(const dsv4_tview *v);

#ifdef __cplusplus
}
#endif
#endif
