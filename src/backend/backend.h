/*
 * backend.h — the op interface every backend implements (CPU reference, CUDA).
 *
 * Why an op table: the forward pass (src/model/forward.c) is written once, as a
 * sequence of calls on a `dsv4_backend`. The CPU backend (src/backend/cpu/) is
 * the readable reference; the CUDA backend implements the same ops and is
 * tested against it op by op (DESIGN.md "The CPU backend is the reference").
 *
 * Granularity: an op is what one (possibly fused) GPU kernel or library call
 * would do — a quantised GEMM, a Sinkhorn mix, a whole compressor emission, the
 * sink attention over window + compressed rows. Nothing smaller than a row
 * crosses the interface, so a GPU backend never needs a host round trip inside
 * a layer.
 *
 * Address spaces. Every pointer inside a dsv4_buf, and the data pointers of
 * the weight views passed to ops, live in the backend's memory (host memory
 * for the CPU backend, device memory for CUDA). Weights are moved there once
 * with `upload`. Batch metadata (dsv4_batch) is host memory; a backend that
 * needs it on the device copies it in `batch_begin`.
 *
 * Ragged batches (DESIGN.md "Per-request state is addressed by a stable
 * request slot, never by batch row"): one call processes T rows from several
 * requests — prefill chunks and decode/verify rows mixed. The rows of one
 * request form one contiguous segment with consecutive positions
 * (cu_seqlens). Per-request state is addressed by (slot, position) only.
 *
 * Numerics (spec/MODEL.md §3.10): `numerics` selects official "reference"
 * numerics (W8A8 activation quantisation for FP8/FP4 linears, FP8 round-trip
 * of KV rows, Hadamard + FP4 round-trip in the indexer, bf16-rounded attention
 * probabilities) or "HF" numerics (every emulation off, to compare with
 * transformers in fp32, §5.4b). Ops read it where their internals depend on it.
 *
 * Errors: every op returns 0 (DSV4_OK) or a status and fills `err` (may be
 * NULL) — bad shapes/dtypes are DSV4_EINVAL, device failures DSV4_EBACKEND.
 * A GPU backend may run ops asynchronously; `sync` reports deferred failures.
 */
#ifndef DSV4_BACKEND_H
#define DSV4_BACKEND_H

#include "dsv4/common.h"
#include "model/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Buffers                                                                 */
/* ---------------------------------------------------------------------- */

/*
 * A dense row-major 2-D buffer in backend memory: rows × cols elements of
 * dtype, row stride = cols. Activations are F32 on the CPU backend (a GPU
 * backend may use BF16 for activations it owns; see `act_dtype`). Integer
 * buffers (expert ids, selections) are I32. The buffer owns its memory when
 * created by buf_alloc and is released by buf_free.
 */
typedef struct dsv4_buf {
    void *data;
    dsv4_dtype dtype;
    int64_t rows, cols;
} dsv4_buf;

/* ---------------------------------------------------------------------- */
/* Batch metadata (host memory, valid for the duration of one forward)     */
/* ---------------------------------------------------------------------- */

/*
 * n_rows rows in n_seqs segments. Segment s covers rows
 * [cu_seqlens[s], cu_seqlens[s+1]), belongs to request slot seq_slot[s], and
 * holds positions seq_pos0[s], seq_pos0[s]+1, ... (consecutive). Per-row
 * copies (pos, slot) are given too so row-parallel kernels need no search.
 * For every row: rows of the same slot with positions < seq_pos0 come from
 * the per-slot state; positions >= seq_pos0 come from this batch.
 * A slot appears in at most one segment per batch.
 */
typedef struct dsv4_batch {
    int n_rows;                 /* T */
    int n_seqs;
    const int32_t *token;       /* [T] token ids (embedding, hash routing)      */
    const int32_t *pos;         /* [T] absolute 0-based position                */
    const int32_t *slot;        /* [T] request slot (0 .. n_slots-1)            */
    const int32_t *seq_idx;     /* [T] segment index of the row                 */
    const int32_t *cu_seqlens;  /* [n_seqs+1] row offsets, cu_seqlens[0] = 0    */
    const int32_t *seq_slot;    /* [n_seqs]                                     */
    const int32_t *seq_pos0;    /* [n_seqs] position of the segment's first row */
} dsv4_batch;

/* ---------------------------------------------------------------------- */
/* RoPE parameters (spec/MODEL.md §3.4.3)                                  */
/* ---------------------------------------------------------------------- */

#define DSV4_ROPE_MAX_PAIRS 64

/*
 * Partial interleaved RoPE on the LAST rope_dim dims of each head: pair i
 * = dims (head_dim - rope_dim + 2i, +2i+1), angle p·freq[i]. freq[] already
 * includes YaRN (ratio>0 layers); no mscale anywhere. Build with
 * dsv4_rope_init (src/backend/rope_params.c). Host memory, passed by pointer;
 * 64 floats, so a GPU backend passes it as a kernel argument.
 */
typedef struct dsv4_rope {
    int rope_dim;                      /* 64 */
    float freq[DSV4_ROPE_MAX_PAIRS];   /* rope_dim/2 used */
} dsv4_rope;

/*
 * dsv4_rope_init — fill `r` for base theta; yarn_factor <= 1 disables YaRN,
 * otherwise YaRN with (factor, original_max_position_embeddings, beta_fast,
 * beta_slow) exactly as §3.4.3 (ramp between floor/ceil of the correction
 * range, frequencies blended, no magnitude scaling).
 * Errors: DSV4_EINVAL when rope_dim is odd, <= 0 or > 2*DSV4_ROPE_MAX_PAIRS.
 */
int dsv4_rope_init(dsv4_rope *r, int rope_dim, double theta, double yarn_factor,
                   double orig_max_pos, double beta_fast, double beta_slow, dsv4_err *err);

/* ---------------------------------------------------------------------- */
/* Per-request attention state (spec/MODEL.md §4.1), one per layer          */
/* ---------------------------------------------------------------------- */

/*
 * Raw sliding window: a position-addressed ring per slot.
 * Row of (slot, position p) = slot*cap + (p mod cap), head_dim wide.
 * cap >= sliding_window + (max rows of one request per step that may be
 * rejected) - 1, so re-writing rejected speculative rows never clobbers a
 * row a later query still needs. Rows are stored after kv_norm + RoPE (+ FP8
 * round-trip in reference numerics).
 */
typedef struct dsv4_win_state {
    int window;       /* sliding_window W (rows visible incl. the query's own) */
    int cap;          /* ring rows per slot */
    int n_slots;
    dsv4_buf rows;    /* [n_slots*cap][head_dim] */
} dsv4_win_state;

/*
 * Compressor state (spec/MODEL.md §3.4.5-3.4.6, §4.1), used for the main KV
 * compressor (out_dim = head_dim) and the indexer compressor (out_dim =
 * index_head_dim).
 *  - Token ring: per-token projections K and Z (+ape already added), width
 *    cw = out_dim * (overlap ? 2 : 1); row of (slot, p) = slot*cap + (p mod
 *    cap), cap >= ratio*(1+overlap) + max rejected rows per step.
 *  - Emitted rows: compressed row w of a slot at slot*max_rows + w, out_dim
 *    wide, final form (normed, RoPE'd at w*ratio, QAT'd in reference mode).
 * Both are position-addressed, so a rejected speculative window is simply
 * emitted again when its last position is re-processed.
 */
typedef struct dsv4_cmp_state {
    int ratio;        /* m: 4 or 128 */
    int overlap;      /* 1 for ratio 4 (window w pools Ka,Za of w-1 and Kb,Zb of w) */
    int out_dim;      /* 512 main, 128 indexer (Flash) */
    int cap;          /* token-ring rows per slot */
    int n_slots;
    int64_t max_rows; /* emitted rows per slot = max_model_len / ratio */
    dsv4_buf kv;      /* F32 [n_slots*cap][cw] */
    dsv4_buf score;   /* F32 [n_slots*cap][cw] */
    dsv4_buf rows;    /* [n_slots*max_rows][out_dim], or [n_pages*page_rows][out_dim] when paged */
    /*
     * Paging of the emitted rows (the engine's state pool, issue 5; vLLM's
     * block size is 256 tokens, so a page holds page_rows = 256/ratio rows).
     * block_table (backend memory, I32 [n_slots][max_pages]) maps page
     * w / page_rows of a slot to a page id; -1 = not mapped (an op must not
     * read or write it). block_table == NULL: unpaged, row = slot*max_rows + w.
     * Ops address emitted rows ONLY through DSV4_CMP_ROW so both layouts work.
     */
    int page_rows;
    int max_pages;
    const int32_t *block_table;
} dsv4_cmp_state;

/* Row index in cs->rows of emitted row w of `slot` (host and device code). */
#define DSV4_CMP_ROW(cs, slot, w)                                                              \
    ((cs)->block_table                                                                         \
         ? (int64_t)(cs)->block_table[(int64_t)(slot) * (cs)->max_pages + (w) / (cs)->page_rows] * \
                   (cs)->page_rows +                                                           \
               (w) % (cs)->page_rows                                                           \
         : (int64_t)(slot) * (cs)->max_rows + (w))

/* What to do to an emitted compressed row after norm + RoPE (reference numerics only). */
typedef enum dsv4_qat {
    DSV4_QAT_NONE = 0,
    DSV4_QAT_FP8_NOPE,     /* FP8 round-trip of dims [0, out_dim-rope_dim) in blocks of 64 (§3.4.2.3) */
    DSV4_QAT_HADAMARD_FP4, /* Hadamard over out_dim, then FP4 round-trip in blocks of 32 (§3.4.6) */
} dsv4_qat;

typedef enum dsv4_numerics {
    DSV4_NUMERICS_REFERENCE = 0, /* official QAT numerics (production)       */
    DSV4_NUMERICS_HF = 1,        /* emulations off: compare with transformers */
} dsv4_numerics;

/* ---------------------------------------------------------------------- */
/* The op table                                                            */
/* ---------------------------------------------------------------------- */

/* ---------------------------------------------------------------------- */
/* Dummy weights (--load-format dummy; src/model/dummy.h)                  */
/* ---------------------------------------------------------------------- */

/*
 * How to fill one dummy tensor. Element values are a pure function of
 * (seed, element index) through the counter hash of backend/dummy_fill.h, so
 * every backend materialises bit-identical tensors for the same spec.
 */
typedef enum dsv4_fill_kind {
    DSV4_FILL_UNIFORM = 1, /* F32 / BF16: center + half·u, u uniform on [-1, 1); BF16 rounded RNE */
    DSV4_FILL_E4M3,        /* F8_E4M3: random sign, magnitude code uniform on [0, hi] (hi <= 0x7E:
                              finite; 0x38 = 1.0)                                                 */
    DSV4_FILL_E8M0,        /* F8_E8M0: byte uniform on [lo, hi] (hi <= 254: never NaN)            */
    DSV4_FILL_BYTES,       /* I8 / U8 (packed FP4 pairs): every byte uniform on [0, 255]          */
    DSV4_FILL_INDEX,       /* I64 / I32 [rows, k]: row r holds k distinct ids in [0, hi)           */
} dsv4_fill_kind;

typedef struct dsv4_fill {
    dsv4_fill_kind kind;
    uint64_t seed;
    double center, half; /* UNIFORM */
    int lo, hi;          /* E4M3: hi; E8M0: [lo, hi]; INDEX: hi = number of ids */
    /* A slice of a larger tensor (tensor parallelism, src/parallel/tp_shard.c):
     * element i of the slice takes the value of element
     * map_off + (map_cols ? (i / map_cols) * map_stride + i % map_cols : i)
     * of the whole tensor, so each rank's shard holds exactly the values the
     * whole tensor has there. All zero (the default) = the whole tensor. */
    uint64_t map_off;
    int64_t map_cols, map_stride;
} dsv4_fill;

typedef struct dsv4_backend dsv4_backend;

struct dsv4_backend {
    const char *name;            /* "cpu", "cuda:0" */
    dsv4_numerics numerics;      /* read by ops; the forward may change it between calls */
    dsv4_dtype act_dtype;        /* dtype of activation buffers the forward allocates */
    void *ctx;                   /* backend private */
    /* Shape-static launches (issue 7, CUDA graphs): when set, ops size their
     * launches and scratch from the batch's shape and the state's capacity
     * (worst case, kernels exit early per row), never from the host's
     * positions, so a captured forward stays valid for any positions and
     * routing of the same (rows, seqs). Numerics may differ in the last bits
     * from the position-sized launches (attention split-K). 0 = off. */
    int static_shapes;
    /* Bumped by the backend whenever device addresses that captured graphs
     * bake in (the batch mirror) move: graphs of an older epoch are stale. */
    int graph_epoch;
    /* The device stream every op is queued on (CUDA: its cudaStream_t), or NULL
     * (CPU: ops complete before they return). Communicators (src/parallel/comm.h)
     * queue their collectives on it, in order with the ops, so a tensor-parallel
     * step needs no host synchronisation and can be captured in a CUDA graph. */
    void *stream;

    /* ---- lifetime and memory ---- */

    /* Release the backend and everything it owns. NULL-safe. */
    void (*free)(dsv4_backend *be);

    /* Allocate a zeroed rows×cols buffer of dtype. Error: DSV4_ENOMEM / DSV4_EBACKEND. */
    int (*buf_alloc)(dsv4_backend *be, dsv4_dtype dt, int64_t rows, int64_t cols,
                     dsv4_buf *out, dsv4_err *err);
    /* Free a buffer from buf_alloc or buf_alloc_scratch; sets data to NULL. NULL-data safe. */
    void (*buf_free)(dsv4_backend *be, dsv4_buf *b);
    /*
     * Optional (NULL: callers use buf_alloc). A rows×cols buffer of dtype whose
     * contents are undefined (not zeroed): scratch that the ops write before
     * anything reads it (model/scratch.h). Released by buf_free, in any order;
     * stream-ordered like buf_alloc. Why: on a GPU backend it comes from a
     * preallocated arena, so a captured decode step holds no allocation,
     * memset or free nodes (issue 7, spec/PERFORMANCE.md §6).
     * Errors: as buf_alloc.
     */
    int (*buf_alloc_scratch)(dsv4_backend *be, dsv4_dtype dt, int64_t rows, int64_t cols, dsv4_buf *out,
                             dsv4_err *err);
    /*
     * Optional (NULL: the backend has no memory of its own to budget, e.g. the
     * CPU). Bytes of device memory free now and in total (CUDA: cudaMemGetInfo
     * on the backend's GPU). Why: the KV pool is sized from what the weights
     * left, as vLLM's --gpu-memory-utilization (engine/model_runner.c).
     * Errors: DSV4_EBACKEND.
     */
    int (*mem_info)(dsv4_backend *be, int64_t *free_bytes, int64_t *total_bytes, dsv4_err *err);
    /* Copy host bytes into / out of a buffer (nbytes = rows*cols*dtype size). Synchronous. */
    int (*buf_write)(dsv4_backend *be, dsv4_buf *dst, const void *host, dsv4_err *err);
    int (*buf_read)(dsv4_backend *be, const dsv4_buf *src, void *host, dsv4_err *err);
    /* dst[i] = src[idx[i]] for i < n (idx host memory): picks the rows that need logits. */
    int (*buf_gather_rows)(dsv4_backend *be, const dsv4_buf *src, const int32_t *idx, int n,
                           dsv4_buf *dst, dsv4_err *err);

    /* Make a weight view resident in backend memory: `dev` gets the same
     * dtype/shape/name with data in backend memory (CPU: the same pointer,
     * no copy). The backend owns the copy until `free`. */
    int (*upload)(dsv4_backend *be, const dsv4_tview *host, dsv4_tview *dev, dsv4_err *err);

    /* Optional (NULL = upload w and scale separately with `upload`): make a
     * whole linear resident at once, so a backend can repack it (e.g. FP4
     * tiles in tensor-core fragment order). dev keeps out/in and dtypes; its
     * data pointers are whatever this backend's linear ops understand. */
    int (*upload_linear)(dsv4_backend *be, const dsv4_linear *host, dsv4_linear *dev, dsv4_err *err);

    /* Called before the ops of one forward on this batch / after the last one. */
    int (*batch_begin)(dsv4_backend *be, const dsv4_batch *b, dsv4_err *err);
    int (*sync)(dsv4_backend *be, dsv4_err *err);

    /* ---- elementwise / small ops ---- */

    /* out[T][n_copies*d] = n_copies copies of table[token[t]] (BF16 or F32 [V][d]).
     * §3.1 (n_copies = hc_mult); n_copies = 1 gives a plain embedding.
     * Error: token out of range names the token and row. */
    int (*embed)(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                 dsv4_buf *out, dsv4_err *err);

    /* y = a + b, same shape (may alias a or b). */
    int (*add)(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err);

    /*
     * RMSNorm over each contiguous group of `group` elements of every row
     * (group = cols for an ordinary norm; group = head_dim for the per-head q
     * norm of §3.4.1.3): y = x·(mean(x²)+eps)^-½ · weight (weight BF16/F32
     * [group], or NULL for unweighted). fp32 math, one rounding (§0). y may alias x.
     */
    int (*rmsnorm)(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group,
                   float eps, dsv4_buf *y, dsv4_err *err);

    /*
     * Rotate in place the last rope->rope_dim dims of each head_dim-wide head of
     * x [T][n_heads*head_dim] by angle b->pos[t]·freq[i] (inverse: −angle).
     * §3.4.3, §3.4.8.1. (Compressed rows are rotated inside `compress`.)
     */
    int (*rope)(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                const dsv4_batch *b, int inverse, dsv4_err *err);

    /*
     * Optional (NULL: rmsnorm then rope). In place on x [T][n_heads*head_dim]:
     * rmsnorm(x, weight, head_dim, eps, x) followed by rope(x, head_dim, rope,
     * b, forward) — each head normed over its head_dim values (weight [head_dim]
     * or NULL), then its last rope_dim values rotated. Same results as the two
     * ops. Why: the query heads (§3.4.1.3-4) and the KV head (§3.4.2) take
     * both at every step; one kernel instead of two (issue 7).
     */
    int (*rmsnorm_rope)(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim, float eps,
                        const dsv4_rope *rope, const dsv4_batch *b, dsv4_err *err);

    /*
     * FP8 E4M3 round-trip (quantise + dequantise) in place of dims [0, n_quant)
     * of every head_dim-wide head of x, blocks of `block` (64) with power-of-two
     * scale 2^ceil(log2(max(amax,1e-4)/448)). §3.4.2.3. Reference numerics only
     * (the forward does not call it in HF mode).
     */
    int (*qat_fp8)(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block,
                   dsv4_err *err);

    /*
     * Hadamard (orthonormal Sylvester, per head_dim-wide head, head_dim a power
     * of two) followed by an FP4 E2M1 round-trip in blocks of 32 with scale
     * 2^ceil(log2(max(amax, 6·2^-126)/6)), in place. §3.4.6. Reference only.
     */
    int (*qat_hadamard_fp4)(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err);

    /*
     * Optional (NULL: rmsnorm_rope — or rmsnorm, rope — then qat_fp8). In place
     * on x [T][n_heads*head_dim]: rmsnorm_rope(x, weight, head_dim, eps, rope,
     * b) followed by qat_fp8(x, head_dim, n_quant, block); same results as the
     * ops. Why: the KV head (§3.4.2) takes all three at every step in
     * reference numerics; one kernel instead of two (issue 7).
     */
    int (*rmsnorm_rope_qat_fp8)(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim,
                                float eps, const dsv4_rope *rope, const dsv4_batch *b, int n_quant,
                                int block, dsv4_err *err);

    /*
     * Optional (NULL: rope (forward) then qat_hadamard_fp4). In place on
     * x [T][n_heads*head_dim]; same results as the two ops. Why: the
     * indexer's queries (§3.4.6) take both at every step in reference
     * numerics; one kernel instead of two (issue 7).
     */
    int (*rope_qat_hadamard_fp4)(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                                 const dsv4_batch *b, dsv4_err *err);

    /* ---- linears (spec/MODEL.md §2.3-2.4) ---- */

    /*
     * y[T][out] = x[T][in] · Wᵀ for a stored linear (FP8 block-scaled, FP4
     * per-32 scaled, BF16 or F32). Reference numerics: FP8/FP4 weights run W8A8
     * (x quantised to E4M3 in blocks of 128 along `in`, pow2 scales), fp32
     * accumulate. BF16/F32 weights: plain fp32 matmul in both modes (router,
     * compressor, head are fp32 in the official code).
     */
    int (*linear)(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y,
                  dsv4_err *err);

    /*
     * Grouped (block-diagonal) linear, §3.4.8.3: x [T][G*in_g], W [G*out_g][in_g];
     * y[t][g*out_g + j] = Σ_k x[t][g*in_g + k] · W[g*out_g + j][k].
     * Official dequantises wo_a to BF16 and runs a BF16 einsum: no activation
     * quantisation in either mode.
     */
    int (*linear_grouped)(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, int groups,
                          dsv4_buf *y, dsv4_err *err);

    /*
     * Optional (NULL: call `linear` n times). y[i] = linear(x, w[i]) for n
     * linears that read the same x [T][in], i < n <= DSV4_LINEAR_MULTI_MAX,
     * each output exactly what `linear` computes (no y[i] may alias x).
     * Why: at decode a block's query, KV, compressor and indexer projections
     * read one normed x; a GPU backend quantises x once and streams several
     * FP8 weights in one launch (issue 7: kernels per layer).
     * Errors: as `linear`, for the first weight at fault.
     */
    int (*linear_multi)(dsv4_backend *be, const dsv4_buf *x, int n, const dsv4_linear *const *w,
                        dsv4_buf *const *y, dsv4_err *err);

    /* ---- hyper-connections (spec/MODEL.md §3.2, §3.3, §3.6) ---- */

    /*
     * HC pre: X [T][n_hc*d] → y [T][d] (collapse Σ pre_h X_h), post [T][n_hc],
     * comb [T][n_hc*n_hc] (row-major C[i][j]). fn F32 [n_hc*(2+n_hc)][n_hc*d],
     * base F32 [n_hc*(2+n_hc)], scale F32 [3]. Sinkhorn with `iters` column
     * passes and iters-1 row passes, eps = hc_eps (also used as the epsilon of
     * the mixes' RMS normalisation; rms_norm_eps == hc_eps == 1e-6 in every
     * config). All fp32.
     */
    int (*hc_pre)(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                  const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y,
                  dsv4_buf *post, dsv4_buf *comb, dsv4_err *err);

    /*
     * Optional (NULL: hc_pre, then rmsnorm(y, norm, d, norm_eps, y)). hc_pre
     * whose y [T][d] comes back RMS-normalised with weight norm [d] (BF16/F32):
     * every hc_pre of a block is followed by its attn_norm / ffn_norm
     * (§3.2, §3.7). Same outputs as the two ops up to the order of the fp32
     * sum of squares. Why: one kernel fewer per sub-layer at decode (issue 7).
     */
    int (*hc_pre_norm)(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                       const dsv4_tview *scale, int n_hc, int iters, float eps, const dsv4_tview *norm,
                       float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb, dsv4_err *err);

    /* HC post: Xout[t][j] = post[t][j]·f[t] + Σ_i comb[t][i][j]·X[t][i] (Cᵀ X). Xout must not alias X. */
    int (*hc_post)(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                   const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err);

    /*
     * Optional (NULL: hc_post, then hc_pre_norm or hc_pre + rmsnorm). One
     * sub-layer's hc_post feeding the next sub-layer's hc_pre_norm (§3.2,
     * §3.7): Xout [T][n_hc·d] = hc_post(X, f, post_in, comb_in) exactly as
     * hc_post, then y [T][d], post [T][n_hc], comb [T][n_hc²] = hc_pre_norm
     * of Xout with fn / base / scale / norm. Same outputs as the two ops
     * (bit for bit where the backend's hc_pre_norm would take the same path).
     * Xout must not alias X; post / comb must not alias post_in / comb_in;
     * y must not alias f. Why: the hc_post kernel of every sub-layer but the
     * last of a step is folded into the next mixes' launch (issue 7: ~40
     * latency-bound launches a layer at batch 1).
     */
    int (*hc_post_pre_norm)(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                            const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_tview *fn,
                            const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps,
                            const dsv4_tview *norm, float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                            dsv4_err *err);

    /* HC head: y[t] = Σ_h (σ(m_h·scale[0] + base[h]) + eps) X_h, m = RMS-normalised fn·x.
     * fn F32 [n_hc][n_hc*d], base [n_hc], scale [1]. §3.6.1. */
    int (*hc_head)(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                   const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err);

    /* ---- attention state and attention (spec/MODEL.md §3.4.4-3.4.7, §3.8) ---- */

    /* Write the batch's kv rows [T][head_dim] into the window ring at (slot, pos).
     * Call AFTER the layer's attention (a long chunk would overwrite rows that
     * earlier queries of the same chunk still read from the ring). */
    int (*win_store)(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                     dsv4_err *err);

    /*
     * Compressor step for the batch (§3.4.5; the indexer's own compressor,
     * §3.4.6, is the same op with its state). K, Z: [T][cw] projections of the
     * attention input (fp32); ape: F32 [ratio][cw] added to Z at p mod ratio.
     * For every row whose position p completes a window ((p+1) mod ratio == 0)
     * emits row w = p / ratio: per-channel softmax pooling over the window's
     * slots (overlap: Ka,Za of window w-1 ⊕ Kb,Zb of window w; absent w-1 → weight
     * 0), RMSNorm with norm_w (eps), RoPE at position w*ratio, then `qat`
     * (reference numerics only). Window slots at positions < seq_pos0 come from
     * the token ring, the others from K/Z. Finally writes the batch's K, Z+ape
     * into the token ring. Emission happens before any attention of the batch.
     */
    int (*compress)(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                    const dsv4_tview *ape, const dsv4_tview *norm_w, float eps,
                    const dsv4_rope *rope, dsv4_qat qat, const dsv4_batch *b, dsv4_err *err);

    /*
     * Lightning-indexer selection (§3.4.6): for row t (slot s, position p),
     * score of emitted row w < (p+1)/ratio:
     * I = Σ_h g_scale·g[t][h]·ReLU(qi[t][h]·k[s][w]), g_scale = (dk·H)^-½.
     * qi [T][H*dk] (RoPE'd, QAT'd by the caller), g [T][H] (weights_proj output),
     * keys = idx->rows. sel I32 [T][topk]: the top-min(topk, visible) rows by
     * score, then −1 padding. Order within the set is unspecified.
     */
    int (*indexer_select)(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float g_scale,
                          const dsv4_cmp_state *idx, int topk, const dsv4_batch *b,
                          dsv4_buf *sel, dsv4_err *err);

    /*
     * Sink attention, one softmax over raw window + compressed rows (§3.4.7).
     * q [T][H*hd]; kv [T][hd] the batch's own rows (K = V); window ring ws;
     * cs = main compressed rows or NULL (ratio 0); sel: I32 [T][k] selected
     * compressed rows (−1 = none) or NULL = all visible rows w < (p+1)/ratio.
     * sinks F32 [H]. scale = hd^-½. Raw keys for query p are positions
     * max(0, p−W+1)..p. o [T][H*hd] (before inverse RoPE). Reference numerics
     * round probabilities to bf16 before the PV product.
     */
    int (*attention)(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv,
                     const dsv4_win_state *ws, const dsv4_cmp_state *cs, const dsv4_buf *sel,
                     const dsv4_tview *sinks, int n_heads, const dsv4_batch *b, dsv4_buf *o,
                     dsv4_err *err);

    /*
     * Optional (NULL: attention then rope(o, kv->cols, rope, b, inverse)).
     * attention as above, then the inverse RoPE of the last rope_dim values
     * of each of o's heads (§3.4.8); o what the two ops give, up to the
     * rounding of the rotation (the CUDA kernel: ~1e-9 absolute apart,
     * bench/results/2026-12-01-decode-latency-h200.md). Why: at decode the
     * rope was a launch of its own per layer; a GPU backend rotates o where
     * attention writes it (issue 7).
     */
    int (*attention_rope)(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv,
                          const dsv4_win_state *ws, const dsv4_cmp_state *cs, const dsv4_buf *sel,
                          const dsv4_tview *sinks, int n_heads, const dsv4_batch *b,
                          const dsv4_rope *rope, dsv4_buf *o, dsv4_err *err);

    /* ---- MoE (spec/MODEL.md §3.5) ---- */

    /*
     * Router, fp32: a = sqrt(softplus(x·gateᵀ)) [n_exp]. Hash layers (tid2eid
     * I64 [V][k] given): ids = tid2eid[token]; else ids = top-k of a + bias
     * (bias F32 [n_exp], may be absent = zero). weights = a[ids]/Σ a[ids] ·
     * route_scale. ids I32 [T][k], weights F32 [T][k].
     */
    int (*moe_route)(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *gate,
                     const dsv4_tview *bias, const dsv4_tview *tid2eid, int k, float route_scale,
                     const dsv4_batch *b, dsv4_buf *ids, dsv4_buf *weights, dsv4_err *err);

    /*
     * Routed experts, grouped: y[t] = Σ_j weights[t][j] · E_{ids[t][j]}(x[t]),
     * E(x) = w2( silu(min(x·w1ᵀ, limit)) · clamp(x·w3ᵀ, ±limit) ), with the
     * routing weight applied before w2 (official). w1/w3/w2: arrays of n_exp
     * linears (FP4, FP8 or BF16), W8A8 in reference numerics. y [T][d] is
     * overwritten (not accumulated).
     */
    int (*moe_experts)(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1,
                       const dsv4_linear *w3, const dsv4_linear *w2, int n_exp,
                       const dsv4_buf *ids, const dsv4_buf *weights, float limit, dsv4_buf *y,
                       dsv4_err *err);

    /*
     * Optional (NULL: moe_experts runs on the linears as uploaded, e.g. the
     * CPU). experts_ready — the n_exp routed experts w1/w3/w2 of one MoE
     * block are resident (upload_linear or fill_dummy_linear done): the
     * backend may now put them in the form its moe_experts runs on (CUDA: one
     * expert-major allocation per block, cuda_backend.cu). Called once per
     * block at load time (dsv4_block_dev_init), before the KV pool is sized
     * from mem_info and before any forward or collective, so that (issue 7,
     * docs/REVIEW-2026-12-01.md S1/S2):
     *  - any transient copy fits in memory the pool has not taken yet, and
     *    the pool is sized on the final footprint;
     *  - no forward allocates, synchronises or frees device memory for the
     *    experts (under tensor parallelism a peer rank may be inside a
     *    collective then).
     * Contract: the same w1/w3/w2 arrays (the addresses, not copies) are
     * later passed to moe_experts, and stay put until the backend is freed or
     * the block is. The linears stay valid for `linear`. Experts of a kind the
     * backend does not reorganise are left alone (DSV4_OK; moe_experts
     * reports what it cannot run). May synchronise the backend's stream.
     * Errors: DSV4_EINVAL (experts of unlike shapes), DSV4_ENOMEM /
     * DSV4_EBACKEND (device allocation or copy).
     */
    int (*experts_ready)(dsv4_backend *be, const dsv4_linear *w1, const dsv4_linear *w3,
                         const dsv4_linear *w2, int n_exp, dsv4_err *err);

    /* Clamped SwiGLU for the shared expert (§3.5): h = silu(min(g,limit))·clamp(u,±limit). h may alias g. */
    int (*swiglu)(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                  dsv4_buf *h, dsv4_err *err);

    /*
     * Optional (NULL: swiglu, linear, add). The shared expert's down
     * projection added to the routed experts' output (§3.5): y [T][w.out] +=
     * w · h, h = silu(min(g, limit))·clamp(u, ±limit), g, u [T][w.in] (not
     * written). Same outputs as swiglu(g, u) → h, linear(h, w) → t,
     * add(y, t) → y. Why: at decode, two kernels fewer a layer (issue 7).
     */
    int (*linear_swiglu_add)(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                             const dsv4_linear *w, dsv4_buf *y, dsv4_err *err);

    /* ---- dummy weights (optional; NULL = the backend cannot load dummy weights) ---- */

    /*
     * fill_dummy — materialise a weight tensor directly in backend memory
     * (--load-format dummy: no checkpoint byte is read, no host copy made).
     * dev: name, dtype, ndim, shape and nbytes set by the caller; the op
     * allocates dev->data (owned by the backend until `free`, like `upload`)
     * and fills it per `how` (the kind must suit dev->dtype: UNIFORM for
     * F32/BF16, E4M3 for F8_E4M3, E8M0 for F8_E8M0, BYTES for I8/U8, INDEX for
     * I64/I32). Values equal dsv4_fill_value() of backend/dummy_fill.h element
     * by element, so all backends agree. Errors: DSV4_EINVAL (kind/dtype
     * mismatch, nbytes != numel·size), DSV4_ENOMEM / DSV4_EBACKEND.
     */
    int (*fill_dummy)(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err);

    /*
     * fill_dummy_linear — the same for a whole linear, for backends whose
     * `upload_linear` keeps linears in their own layout (CUDA repacks FP4):
     * dev->w / dev->scale carry name, dtype and stored shape, out/in are set;
     * the op produces what upload_linear of the checkpoint-layout tensors
     * filled per wfill / sfill would have produced (sfill NULL when there is
     * no scale). NULL on backends without upload_linear (fill_dummy on w and
     * scale is equivalent there). Errors as fill_dummy and upload_linear.
     */
    int (*fill_dummy_linear)(dsv4_backend *be, const dsv4_fill *wfill, const dsv4_fill *sfill,
                             dsv4_linear *dev, dsv4_err *err);

    /* ---- optional ops (NULL = the forward does it on the host) ---- */

    /* ---- graph capture (issue 7; optional: NULL where unsupported, e.g. CPU) ----
     * graph_begin starts capturing the backend's stream: the ops issued until
     * graph_end are recorded, not run (buffers allocated meanwhile keep their
     * addresses on every replay). graph_end stops it and instantiates the
     * graph (*graph, opaque; NULL on failure, and the capture is discarded).
     * graph_launch queues one replay; graph_free releases one. Errors:
     * DSV4_EBACKEND (driver refused: an op that cannot be captured). */
    int (*graph_begin)(dsv4_backend *be, dsv4_err *err);
    int (*graph_end)(dsv4_backend *be, void **graph, dsv4_err *err);
    int (*graph_launch)(dsv4_backend *be, void *graph, dsv4_err *err);
    void (*graph_free)(dsv4_backend *be, void *graph);

    /*
     * Stream mean for the DSpark target taps (spec/DSPARK.md §2.3):
     * y[t][col0 + k] = (Σ_h X[t][h*d + k]) / n_hc, summed in h order, for
     * X [T][n_hc*d], y [T][ycols] (F32), col0 + d <= ycols. Lets a GPU
     * backend keep the taps on the device until the end of the forward
     * instead of reading the streams back in the middle of it.
     */
    int (*hc_mean)(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0,
                   dsv4_err *err);

    /*
     * Greedy token and top logprobs per logit row (issue 7: sampling on the
     * device; spec/SERVING.md §7.2, §3.3), so a step whose rows all decode
     * greedily reads back 4 bytes per row instead of the whole row.
     *   x   F32 [n][V] raw logits (not modified);
     *   ids I32 [n][k], k = ids->cols >= 1: ids[r][0] is the argmax of row r
     *       under the host sampler's rule (src/engine/sampler.c: a scan from
     *       id 0 where only a strictly larger value replaces the best, so ties
     *       go to the lowest id, a NaN never wins and a NaN at id 0 is kept);
     *       ids[r][j], j >= 1, continue the order "larger value first, ties by
     *       lower id" over the non-NaN values (dsv4_token_logprob_compute's
     *       top list); k <= DSV4_LOGIT_TOP_MAX and k <= V;
     *   lp  F32 [n][k] or NULL: log_softmax(x[r])[ids[r][j]] (natural log;
     *       log-sum-exp around the row's maximum, summed in double).
     * Errors: DSV4_EINVAL for shapes / dtypes / k out of range. Optional
     * (NULL: the runner reads the logits back and the engine picks on the host).
     */
    int (*logit_top)(dsv4_backend *be, const dsv4_buf *x, dsv4_buf *ids, dsv4_buf *lp, dsv4_err *err);
};

/* Most linears one linear_multi call takes. */
#define DSV4_LINEAR_MULTI_MAX 8

/* Most ids per row logit_top returns (OpenAI top_logprobs <= 20, plus headroom). */
#define DSV4_LOGIT_TOP_MAX 32

/* The CPU reference backend (src/backend/cpu/). Never NULL on success. */
dsv4_backend *dsv4_backend_cpu_create(dsv4_numerics numerics, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
