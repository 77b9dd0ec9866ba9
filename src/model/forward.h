/*
 * forward.h — the DeepSeek-V4 target forward pass, written once against the
 * backend op table (src/backend/backend.h), over a flat ragged batch of rows
 * (prefill chunks and decode/verify rows of several requests mixed) and
 * per-request state addressed by request slot and position.
 *
 * Pieces (one file each):
 *   model.c   dsv4_model: the weights made resident on a backend + RoPE tables
 *   state.c   dsv4_state: per-layer window rings and compressor stores
 *   block.c   dsv4_block_forward: one decoder block (§3.2-3.5), reused by the
 *             MTP block and the DSpark stages (branch `drafter`)
 *   forward.c dsv4_forward: embedding → blocks → hc_head → norm → head (§3.6)
 *
 * Chunking invariance (spec/MODEL.md §3.8): a request's rows may be split
 * over calls anywhere; keys older than the segment's first position come from
 * the state, so results equal one long prefill up to float rounding.
 */
#ifndef DSV4_MODEL_FORWARD_H
#define DSV4_MODEL_FORWARD_H

#include "backend/backend.h"
#include "model/kvcodec.h"
#include "model/config.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One block's weights resident on the backend, with what its ops need. */
/* Most capture sizes a model keeps (vLLM's default list up to 512 has 67). */
#define DSV4_MAX_GRAPH_SIZES 96
/* Longest segment a padded / captured decode-verify step has (k+1 rows, k <= 15). */
#define DSV4_GRAPH_MAX_ROWS_PER_SEQ 16

typedef struct dsv4_block_dev {
    dsv4_block_w w;          /* every view uploaded (data in backend memory) */
    dsv4_linear *w1, *w3, *w2; /* [n_experts] routed expert linears, for moe_experts */
    dsv4_rope rope;          /* θ=rope_theta (ratio 0) or compress θ + YaRN (ratio > 0) */
    struct dsv4_comm *comm;  /* tensor parallel (src/parallel/comm.h): the block holds one rank's
                                slice and all-reduces its attention and FFN outputs; NULL = whole */
} dsv4_block_dev;

/* The target model on a backend. Borrows cfg, the weights and the backend
 * (all must outlive it). */
typedef struct dsv4_model {
    const dsv4_config *cfg;
    dsv4_backend *be;
    dsv4_tview embed, norm;
    dsv4_linear head;
    dsv4_hc_w hc_head;
    int n_layers;
    dsv4_block_dev *layers;  /* [n_layers] */
    struct dsv4_comm *head_comm; /* tensor parallel, vocabulary-parallel head: `head` holds this rank's
                                    rows and the logits are all-gathered (src/parallel/tp_shard.c); NULL = whole */
    /* CUDA graphs (issue 7, src/model/forward_graph.c): graphs_on = 1 replays
     * captured forwards per batch shape (set by the runner; needs a backend
     * with graph ops); graphs = the captured ones (freed with the model). */
    int graphs_on;
    struct dsv4_fwd_graphs *graphs;
    /* Capture at start, padding at run time (issue 7, src/model/forward_pad.c).
     * n_pad_sizes > 0: a decode / verify batch of s sequences of r rows each
     * (every row's logits wanted) runs as the batch of the smallest size
     * S >= s in pad_sizes, the S - s extra sequences being r rows of the
     * reserved state slot pad_slot at positions 0 .. r-1 (that slot is never
     * given to a request, so its writes disturb nothing); only the real rows'
     * outputs are read back. graphs_fixed = 1: no shape is warmed or captured
     * outside graphs_warming (set by dsv4_model_runner_warmup at start), so
     * a shape not captured then runs eagerly instead of compiling at request
     * time. in_pad: recursion guard of the padded forward. */
    int n_pad_sizes;
    int pad_sizes[DSV4_MAX_GRAPH_SIZES]; /* ascending sequence counts */
    int pad_slot;
    unsigned pad_rows_mask;  /* bit r: segments of r rows are padded (the captured rows per sequence) */
    int graphs_fixed, graphs_warming, in_pad;
    unsigned long long n_padded; /* forwards that ran padded (diagnostics, tests) */
    /* forwards with graphs on, by path (DSV4_FWD_PATH_*), logged when the model is freed */
    unsigned long long n_path[5];
    /* How the latest forward runs / ran (DSV4_FWD_PATH_*), set before its launches;
     * diagnostics for tensor parallelism (tp_runner.c), read by other threads with
     * __atomic_load_n. */
    int last_path;
} dsv4_model;

/* dsv4_model.last_path. Tensor parallel ranks must agree on whether a forward's
 * collectives run inside a CUDA graph (CAPTURE, REPLAY) or eagerly (the rest):
 * NCCL requires the same choice on every rank for each collective. */
enum {
    DSV4_FWD_PATH_EAGER = 0,    /* not graph-eligible (graphs off, prefill-sized, ...) */
    DSV4_FWD_PATH_WARM,         /* eligible, first sighting of the shape: eager */
    DSV4_FWD_PATH_CAPTURE,      /* captured now, then launched */
    DSV4_FWD_PATH_REPLAY,       /* a graph captured earlier, launched */
    DSV4_FWD_PATH_NOGRAPH,      /* eligible, but capture failed for this shape (or the cache is full): eager */
};
/* Short name of a DSV4_FWD_PATH_* value ("eager", "warm-up", "capture", "replay", "no-graph"). */
const char *dsv4_fwd_path_name(int path);

/*
 * dsv4_model_create — upload every target tensor of `w` to `be` and build the
 * per-layer RoPE tables (spec/MODEL.md §3.4.3: ratio 0 → rope_theta, no YaRN;
 * ratio > 0 → compress_rope_theta + YaRN). Draft blocks are not uploaded here
 * (dsv4_block_dev_init does one block). Errors: upload failures, bad config.
 */
int dsv4_model_create(const dsv4_config *cfg, const dsv4_weights *w, dsv4_backend *be,
                      dsv4_model **out, dsv4_err *err);
void dsv4_model_free(dsv4_model *m);

/*
 * dsv4_upload_view / dsv4_upload_linear — make a stored weight resident on be,
 * in place: *v / *l then point into backend memory. A linear goes through the
 * backend's upload_linear hook when it has one (a GPU backend repacks FP4
 * there), else weight and scale are uploaded as views. Absent views
 * (DSV4_DT_INVALID) are left alone. Errors name the tensor.
 */
int dsv4_upload_view(dsv4_backend *be, dsv4_tview *v, dsv4_err *err);
int dsv4_upload_linear(dsv4_backend *be, dsv4_linear *l, dsv4_err *err);

/* Upload one block (target layer, MTP block or DSpark stage) into *out, then
 * hand its routed experts to be->experts_ready when the backend has it
 * (backend.h: CUDA assembles them into one set here, at load time, never in a
 * forward). Free with dsv4_block_dev_free. */
int dsv4_block_dev_init(const dsv4_config *cfg, const dsv4_block_w *w, dsv4_backend *be,
                        dsv4_block_dev *out, dsv4_err *err);
void dsv4_block_dev_free(dsv4_block_dev *b);

/* Per-layer state of all slots (spec/MODEL.md §4.1; layout in docs/BACKEND.md). */
typedef struct dsv4_layer_state {
    int ratio;
    dsv4_win_state win;
    dsv4_cmp_state cmp; /* ratio > 0 */
    dsv4_cmp_state idx; /* ratio == 4: the indexer's keys */
} dsv4_layer_state;

typedef struct dsv4_state {
    dsv4_backend *be;
    int n_slots, max_len, max_spec;
    int n_layers;
    dsv4_layer_state *layers;
    /* Paged emitted rows (0 pages = unpaged): one block table for every layer,
     * page p of a slot = positions [p*page_tokens, (p+1)*page_tokens). */
    int page_tokens, n_pages, max_pages;
    dsv4_buf block_table;   /* backend I32 [n_slots][max_pages], -1 = unmapped */
    int32_t *bt_host;       /* host mirror of block_table */
} dsv4_state;

/*
 * dsv4_state_create — state for n_slots requests of up to max_len positions,
 * where at most max_spec rows of one request per step may later be rejected
 * (speculative verify width; 0 without speculation). One layer state per
 * ratio in `ratios[n_layers]` (target layers, or a draft's own blocks).
 * Errors: DSV4_EINVAL for non-positive sizes, allocation failures.
 */
int dsv4_state_create(dsv4_backend *be, const dsv4_config *cfg, const int *ratios, int n_layers,
                      int n_slots, int max_len, int max_spec, dsv4_state **out, dsv4_err *err);
/*
 * dsv4_state_create_paged — as dsv4_state_create, but the emitted compressed
 * and indexer rows of every layer live in one pool of n_pages pages shared by
 * all slots (the engine's state pool, issue 5; vLLM block size): a page holds
 * page_tokens positions, i.e. page_tokens/ratio rows of each compressed layer.
 * One block table per slot, shared by all layers, maps a slot's page index to
 * a page id (dsv4_state_set_pages); everything starts unmapped. Window and
 * compressor token rings stay per slot. page_tokens must be a positive
 * multiple of every compress ratio in `ratios` (DSV4_EINVAL otherwise);
 * n_pages >= 1. kv_dtype: how window rows and main compressed rows are
 * stored (src/model/kvcodec.h; index keys stay F32). n_pages = 0: unpaged.
 */
int dsv4_state_create_paged(dsv4_backend *be, const dsv4_config *cfg, const int *ratios, int n_layers, int n_slots,
                            int max_len, int max_spec, int page_tokens, int n_pages, dsv4_kv_dtype kv_dtype,
                            dsv4_state **out, dsv4_err *err);
/*
 * dsv4_state_page_bytes — bytes one page of page_tokens positions takes in a
 * paged state over these layers (main rows in kv_dtype's record + f32
 * indexer rows for ratio-4 layers), for sizing the pool from a memory budget.
 */
int64_t dsv4_state_page_bytes(const dsv4_config *cfg, const int *ratios, int n_layers, int page_tokens,
                              dsv4_kv_dtype kv_dtype);
/*
 * dsv4_state_fixed_bytes — bytes a paged state of n_slots slots holds outside
 * its pages: every layer's window ring (n_slots x (sliding_window + max_spec)
 * rows in kv_dtype's record), the compressor and indexer token rings (f32 kv
 * and score, n_slots x (ratio·(1+overlap) + max_spec) rows each) and the
 * block table (n_slots x ceil(max_len/page_tokens) i32). What
 * dsv4_state_create_paged allocates besides n_pages x dsv4_state_page_bytes;
 * -1 on bad arguments (page_tokens <= 0, n_slots < 1). For the KV pool's
 * memory budget (engine/model_runner.c; spec/SERVING.md, vLLM
 * --gpu-memory-utilization): these rings scale with the slots, not the pages
 * (~16 MB a slot on the 43-layer Flash config in fp8_ds_mla, ~4 GiB at 256 slots).
 */
int64_t dsv4_state_fixed_bytes(const dsv4_config *cfg, const int *ratios, int n_layers, int n_slots, int max_len,
                               int max_spec, int page_tokens, dsv4_kv_dtype kv_dtype);
/*
 * dsv4_state_set_pages — map pages [0, n) of `slot` to ids[0..n) (each in
 * [0, n_pages), or -1) and unmap the rest; written to the backend's block
 * table. The caller (the engine) guarantees no page id is mapped by two slots.
 * Errors: DSV4_EINVAL for an unpaged state, a slot/id out of range or
 * n > max_pages.
 */
int dsv4_state_set_pages(dsv4_state *st, int slot, int n, const int32_t *ids, dsv4_err *err);
void dsv4_state_free(dsv4_state *st);
/* Forget a slot's history (new request in the slot). Rows are position-
 * addressed, so this only has to make stale rows unreachable — it zeroes them
 * (paged emitted rows are left alone: the engine unmaps the slot's pages). */
int dsv4_state_reset_slot(dsv4_state *st, int slot, dsv4_err *err);
/*
 * dsv4_state_copy_slot — make slot dst hold the same state as slot src for
 * positions < n_pos (prefix caching, spec/SERVING.md §8.7): every ring row
 * (window rows, compressor token rings) and the emitted compressed / indexer
 * rows w < ceil(n_pos / ratio) (paged: rows whose page is mapped in both
 * slots; the caller maps dst's pages first). Goes through the backend's buf_read /
 * buf_write on row views (a host bounce), so it works on any backend.
 * Errors: DSV4_EINVAL for a slot out of range or src == dst, n_pos outside
 * [0, max_len]; allocation and backend failures.
 */
int dsv4_state_copy_slot(dsv4_state *st, int src, int dst, int64_t n_pos, dsv4_err *err);

/*
 * dsv4_block_forward — one decoder block (spec/MODEL.md §3.0, §3.2-3.5) in
 * place on the streams X [T][hc_mult*d], against the layer state `ls`.
 * Writes this batch's window rows and compressor rows into `ls`.
 * Requires be->batch_begin(b) to have been called.
 */
int dsv4_block_forward(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_layer_state *ls,
                       dsv4_backend *be, const dsv4_batch *b, dsv4_buf *X, dsv4_err *err);

/*
 * dsv4_hc_carry — a block's last hc_post left pending so that the next
 * block's first hc_pre runs it, fused, in one op (be->hc_post_pre_norm;
 * issue 7: one launch fewer a layer at decode). Owned by the caller of the
 * blocks: X2 [T][hc_mult·d] and sub [T][d] (act dtype) hold the pending
 * hc_post's streams and sub-layer output, post[cur] [T][hc_mult] and
 * comb[cur] [T][hc_mult²] (F32) its weights; the blocks also use these as
 * their own X2 / sub / post / comb. pending = 1: X is not yet the block's
 * output; dsv4_hc_carry_flush makes it so.
 */
typedef struct dsv4_hc_carry {
    dsv4_buf X2, sub, post[2], comb[2];
    int cur, pending;
} dsv4_hc_carry;

/* Allocates the carry's buffers for T rows on be (buf_alloc). Errors: DSV4_ENOMEM / backend allocation
 * failures, nothing left allocated. */
int dsv4_hc_carry_init(dsv4_backend *be, const dsv4_config *cfg, int T, dsv4_hc_carry *c, dsv4_err *err);
/* Runs the pending hc_post into X [T][hc_mult·d] (nothing when none is pending). */
int dsv4_hc_carry_flush(dsv4_backend *be, int n_hc, dsv4_hc_carry *c, dsv4_buf *X, dsv4_err *err);
/* Frees the carry's buffers (NULL-data safe). */
void dsv4_hc_carry_free(dsv4_backend *be, dsv4_hc_carry *c);

/*
 * dsv4_block_forward with a carry (NULL = dsv4_block_forward): a pending
 * hc_post in carry runs first, fused with this block's first hc_pre; with
 * defer != 0 this block's last hc_post is left pending instead of written
 * to X (carry required). Same outputs as dsv4_block_forward once flushed.
 */
int dsv4_block_forward_carry(const dsv4_config *cfg, const dsv4_block_dev *blk, dsv4_layer_state *ls,
                             dsv4_backend *be, const dsv4_batch *b, dsv4_buf *X, dsv4_hc_carry *carry, int defer,
                             dsv4_err *err);

/*
 * dsv4_forward — the target model on one batch.
 *  logit_rows[n_logits]: batch rows whose logits are wanted (e.g. the last
 *    row of each prefill segment, every verify row); logits: host F32
 *    [n_logits][vocab] (fp32 head, §3.6). n_logits may be 0.
 *  streams: optional, host F32 [T][hc_mult*d], receives the final streams
 *    before hc_head (the MTP/DSpark input, §3.9).
 * Errors: batch inconsistent (names the row), slot/position out of range,
 * token out of vocabulary, backend failures.
 */
int dsv4_forward(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const int32_t *logit_rows,
                 int n_logits, float *logits, float *streams, dsv4_err *err);

/* Everything a forward can hand back (all host memory, every field optional). */
typedef struct dsv4_fwd_out {
    const int32_t *logit_rows; /* [n_logits] batch rows whose logits are wanted      */
    int n_logits;
    float *logits;             /* F32 [n_logits][vocab] (fp32 head, §3.6)            */
    float *streams;            /* F32 [T][hc_mult*d] final streams before hc_head     */
    const int *tap_layers;     /* [n_taps] target layer ids (DSPARK.md §2.2)         */
    int n_taps;
    float *taps;               /* F32 [T][n_taps*d]: for each tap, in list order, the
                                  mean over the hc streams of that layer's OUTPUT
                                  (after its ffn hc-post) — the DSpark context features */
    int32_t *ids;              /* I32 [n_logits]: instead of the logits, the greedy id of each
                                  wanted row (backend logit_top on the device: ties -> lowest
                                  id, as the host sampler), so only 4 bytes a row come back
                                  (issue 7). When set, `logits` is not written. */
    int read_rows;             /* > 0: only the first read_rows rows of the logits / ids, taps
                                  and streams are read back (a padded batch's real rows,
                                  src/model/forward_pad.c); 0 = all */
    /* Backend buffer F32 [>= T][n_taps*d] (rows = capacity) that gets the taps instead of
       `taps` (then NULL): never read back to the host. Why: DSpark's context path reads them
       on the same device, and a prefill chunk's features are 48 KB a row (400 MB at 8192 rows:
       +42-46 ms through host memory, bench/results/2026-12-01-warmup-prefill-h200.md). An
       eager forward writes them in place; a graph replay or a padded batch copies its real
       rows in (buf_gather_rows). Needs be->hc_mean (else DSV4_EUNSUPPORTED). */
    const dsv4_buf *taps_dev;
} dsv4_fwd_out;

/* Rows of logits (or ids) a forward produces for `out`. */
static inline int dsv4_fwd_n_logits(const dsv4_fwd_out *out) {
    return out->logits || out->ids ? out->n_logits : 0;
}

/* Taps a forward produces for `out` (to the host or into taps_dev). */
static inline int dsv4_fwd_n_taps(const dsv4_fwd_out *out) { return out->taps || out->taps_dev ? out->n_taps : 0; }

/*
 * dsv4_forward_ex — dsv4_forward with every output in one struct (DSpark taps
 * included). Errors: as dsv4_forward; a tap layer outside [0, n_layers);
 * out->ids on a backend without logit_top (DSV4_EUNSUPPORTED).
 */
int dsv4_forward_ex(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                    dsv4_err *err);

/*
 * The forward in three parts, for graph capture (src/model/forward_graph.c).
 * dsv4_forward_launch: every launch of dsv4_forward_ex after batch_begin
 * (embedding, blocks, head); returns the streams X [T][hc*d], the logits lg
 * [n_logits][V] (F32; with out->ids, the greedy ids I32 [n_logits][1] instead) and the device taps (F32 [T][n_taps*d], when the backend
 * has hc_mean) in backend buffers; `host` is a [T][hc*d] F32 scratch used only
 * without hc_mean. *taps with data on entry: the taps go there (T rows; the
 * caller's taps_dev in place), else a buffer is allocated (pass it zeroed).
 * dsv4_forward_finish: reads them into `out` (taps into out->taps_dev when
 * set, on the backend), syncs (reports `rc` if nonzero instead) and frees
 * them. dsv4_forward_graph: replays (or
 * captures, then replays) the graph of this batch shape after batch_begin;
 * returns 1 when it does not handle the batch (shape not eligible, capture
 * failed or still warming up: the caller runs eagerly), else a status.
 * dsv4_forward_graphs_free: drops every captured graph (NULL-safe).
 */
int dsv4_forward_launch(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                        float *host, dsv4_buf *X, dsv4_buf *lg, dsv4_buf *taps, dsv4_err *err);
int dsv4_forward_finish(dsv4_model *m, const dsv4_fwd_out *out, dsv4_buf *X, dsv4_buf *lg, dsv4_buf *taps, int rc,
                        dsv4_err *err);
/*
 * dsv4_forward_graph_shaped: 1 when a captured graph could hold a batch of this
 * shape (at most FG_MAX_ROWS rows and DSV4_GRAPH_MAX_ROWS_PER_SEQ rows per
 * sequence: decode and verify steps), 0 for prefill-sized steps. Pure; no
 * errors. Those steps never replay a graph, so dsv4_forward runs them with the
 * backend's static_shapes off: launches sized by the batch's positions, not by
 * the state's capacity (max_model_len), which is bit-identical by the ops'
 * design (attention split boundaries and indexer selection follow the capacity
 * either way) and saves the work over candidates no row can see: an 8K-token
 * prefill at --max-model-len 1048576 took 3x the time of one at 16384
 * (bench/results/2026-12-01-prefill-static-shapes-h200.md).
 */
int dsv4_forward_graph_shaped(const dsv4_batch *b);
int dsv4_forward_graph(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                       dsv4_err *err);
void dsv4_forward_graphs_free(dsv4_model *m);
/* Count m->last_path in m->n_path (after the forward's path is decided; not during the warm-up). */
void dsv4_forward_path_count(dsv4_model *m);
/* Captured graphs currently held (replayable), for the start-up log. */
int dsv4_forward_graphs_count(const dsv4_model *m);

/*
 * dsv4_forward_padded — dsv4_forward_ex of b padded to the next capture size
 * (m->pad_sizes, see dsv4_model): b must be n_seqs segments of r rows each
 * (bit r of m->pad_rows_mask set: a captured decode / verify width), every row's logits wanted in row order
 * (out->logit_rows = 0..T-1) — the shape of a decode or uniform verify step.
 * The padded rows go to slot m->pad_slot at positions 0..r-1, token 0; out
 * receives exactly what the unpadded forward writes (the real rows). Returns
 * 1 when b is not such a batch, no size >= n_seqs exists or no padding is
 * needed (the caller runs b as is), else a status as dsv4_forward_ex.
 * Called by dsv4_forward_ex; issue 7.
 */
int dsv4_forward_padded(dsv4_model *m, dsv4_state *st, const dsv4_batch *b, const dsv4_fwd_out *out,
                        dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
