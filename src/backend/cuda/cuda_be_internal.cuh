/*
 * cuda_be_internal.cuh — what the two files of the CUDA op table share
 * (cuda_backend.cu: memory, weights, linears, MoE; cuda_be_ops.cu: the
 * small row-wise ops). Not a public header.
 */
#ifndef DSV4_CUDA_BE_INTERNAL_CUH
#define DSV4_CUDA_BE_INTERNAL_CUH

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.cuh"

/* The backend's private state (be->ctx). */
typedef struct cu_be {
    dsv4_cuda_ctx *ctx;
    dsv4_backend *be; /* the table this state belongs to (graph_epoch, static_shapes) */
    char name[16];
    void **views; /* device copies made by `upload`, freed with the backend */
    int nviews, capviews;
    struct cu_lin *lins;  /* linears made by `upload_linear` */
    struct cu_moe *moes;  /* expert sets assembled for moe_experts */
    /* device mirror of the last batch (batch_begin), batch_cap entries each:
     * token, pos, slot, then per row its segment's first position (seq_pos0),
     * first row and end row (cu_seqlens[s], cu_seqlens[s+1]) */
    int32_t *d_batch;
    int32_t *h_stage; /* host staging of the mirror, 6*batch_cap */
    int batch_cap;
    const int32_t *h_token, *h_pos; /* host arrays the mirror was made from */
    int n_rows;
    /* Deferred input errors (a kernel sets it; `sync` reports and clears it),
     * so no op needs a host round trip in the middle of a forward. Bit 0:
     * moe_route found a tid2eid id outside [0, n_exp). */
    int *d_flags;
    unsigned *d_hc_cnt;   /* [CU_HC_CNT] per-row arrival counters of k_hc_fused (zero between calls) */
    size_t ar_capture_lo; /* the context's arena top when the capture in progress began */
    void *prof;           /* per-op timing (cuda_op_profile.cu, DSV4_CUDA_OP_PROFILE=1 or 2) or NULL */
} cu_be;

#define CU_HC_CNT 16 /* rows of one k_hc_fused call (its HC_F_MAXT) */

static inline cu_be *cube(dsv4_backend *be) { return (cu_be *)be->ctx; }

/* Per-op time, one INFO line per forward (cuda_op_profile.cu): wraps be's table when env
 * DSV4_CUDA_OP_PROFILE=1 (eager forwards, each op synchronised) or 2 (in-stream stamps, graph
 * replays included), else nothing. Call after the table is filled; free the state with
 * cu_op_profile_free(cube(be)->prof). */
void cu_op_profile_install(dsv4_backend *be);
void cu_op_profile_free(void *prof);

/* Device copies of the batch's token / pos / slot arrays ([T] each); uploads
 * them if `b` is not the batch last given to batch_begin. */
int cu_be_batch(dsv4_backend *be, const dsv4_batch *b, const int32_t **token, const int32_t **pos,
                const int32_t **slot, dsv4_err *err);

/* Per-row segment data of the device batch mirror ([T] each): the row's
 * segment's first position, first row and end row (exclusive). */
int cu_be_batch_seg(dsv4_backend *be, const dsv4_batch *b, const int32_t **p0, const int32_t **r0,
                    const int32_t **r1, dsv4_err *err);

/* Check an F32 (or I32) device buffer's shape; names `what`. rows/cols < 0: any. */
int cu_be_check(const dsv4_buf *b, dsv4_dtype dt, int64_t rows, int64_t cols, const char *what,
                dsv4_err *err);
/* A weight vector (F32 or BF16, n elements; n < 0: any) in device memory. */
int cu_be_check_vec(const dsv4_tview *v, int64_t n, const char *what, dsv4_err *err);

/* Element i of a device F32 / BF16 tensor. */
__device__ __forceinline__ float cu_ldf(const void *p, int bf16, int64_t i) {
    if (bf16) return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
    return ((const float *)p)[i];
}

/* Nearest E4M3 (RNE, saturating at ±448) as float: the hardware conversion. */
__device__ __forceinline__ float e4m3_round(float v) {
    __nv_fp8_e4m3 q(v); /* __NV_SATFINITE, round to nearest even */
    return float(q);
}

/* Nearest E2M1 value (ties to the even code), saturating at ±6 (§3.4.6). */
__device__ __forceinline__ float e2m1_round(float x) {
    const float a = fabsf(x);
    const float step = a < 2.0f ? 0.5f : a < 4.0f ? 1.0f : 2.0f;
    float q = rintf(a / step) * step;
    if (q > 6.0f) q = 6.0f;
    return x < 0 ? -q : q;
}

/* Row index in cs.rows of emitted row w of `slot` through DSV4_CMP_ROW (paged or not), or -1
 * when the row must not be touched: w >= max_rows, its page unmapped (-1) or past the block
 * table, or the index past the buffer. The CPU reference reports DSV4_ERANGE for a visible
 * row it cannot reach; a kernel cannot, so it skips the row (the engine maps every page an
 * op touches before the step). */
__device__ __forceinline__ int64_t cu_cmp_index(const dsv4_cmp_state &cs, int slot, int64_t w) {
    if (w < 0 || w >= cs.max_rows) return -1;
    if (cs.block_table && (w / cs.page_rows >= cs.max_pages ||
                           cs.block_table[(int64_t)slot * cs.max_pages + w / cs.page_rows] < 0))
        return -1;
    const int64_t r = DSV4_CMP_ROW(&cs, slot, w);
    return r < cs.rows.rows ? r : -1;
}

/* The small ops (cuda_be_ops.cu), wired into the table by cuda_backend.cu. */
int cu_be_embed(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                dsv4_buf *out, dsv4_err *err);
int cu_be_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err);
int cu_be_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group,
                  float eps, dsv4_buf *y, dsv4_err *err);
int cu_be_hc_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                      const dsv4_tview *scale, int n_hc, int iters, float eps, const dsv4_tview *norm, float norm_eps,
                      dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb, dsv4_err *err);
int cu_be_rmsnorm_rope(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim, float eps,
                       const dsv4_rope *rope, const dsv4_batch *b, dsv4_err *err);
int cu_be_rope(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
               const dsv4_batch *b, int inverse, dsv4_err *err);
int cu_be_qat_fp8(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block,
                  dsv4_err *err);
int cu_be_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err);
int cu_be_rmsnorm_rope_qat_fp8(dsv4_backend *be, dsv4_buf *x, const dsv4_tview *weight, int head_dim, float eps,
                               const dsv4_rope *rope, const dsv4_batch *b, int n_quant, int block, dsv4_err *err);
int cu_be_rope_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                                const dsv4_batch *b, dsv4_err *err);
int cu_be_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                 dsv4_buf *h, dsv4_err *err);
int cu_be_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                 const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y,
                 dsv4_buf *post, dsv4_buf *comb, dsv4_err *err);
int cu_be_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                  const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err);
int cu_be_hc_post_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                           const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_tview *fn,
                           const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps,
                           const dsv4_tview *norm, float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                           dsv4_err *err);
int cu_be_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                  const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err);
int cu_be_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                    dsv4_err *err);
/* Mean over the n_hc streams of X [T][n_hc*d] into columns [col0, col0+d)
 * of y [T][ycols] (the DSpark target taps, backend.h hc_mean). */
int cu_be_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err);
/* Router tail: logits [T][E] (fp32) -> ids, weights (§3.5). bias may be NULL;
 * tid2eid (I64 [V][k], device) selects hash routing; tokens are the device batch. */
/* The attention-state ops (cuda_compress.cu, cuda_indexer.cu, cuda_attn.cu). */
int cu_be_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                   const dsv4_tview *ape, const dsv4_tview *norm_w, float eps, const dsv4_rope *rope,
                   dsv4_qat qat, const dsv4_batch *b, dsv4_err *err);
int cu_be_indexer_select(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float g_scale,
                         const dsv4_cmp_state *idx, int topk, const dsv4_batch *b, dsv4_buf *sel,
                         dsv4_err *err);
int cu_be_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                    const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                    const dsv4_batch *b, dsv4_buf *o, dsv4_err *err);
int cu_be_attention_rope(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv, const dsv4_win_state *ws,
                         const dsv4_cmp_state *cs, const dsv4_buf *sel, const dsv4_tview *sinks, int n_heads,
                         const dsv4_batch *b, const dsv4_rope *rope, dsv4_buf *o, dsv4_err *err);
/* Emitted-row state checks shared by those files: F32 rows, out_dim wide, and
 * (unpaged) n_slots*max_rows rows or (paged) whole pages. */
int cu_be_check_cmp_rows(const dsv4_cmp_state *cs, int64_t out_dim, const char *what, dsv4_err *err);

int cu_be_route_tail(dsv4_backend *be, const float *logits, int T, int E, const dsv4_tview *bias,
                     const dsv4_tview *tid2eid, const int32_t *d_token, int k, float route_scale,
                     int32_t *ids, float *weights, dsv4_err *err);

/* Dummy weights (cuda_fill.cu; backend.h fill_dummy / fill_dummy_linear). */
int cu_be_fill_dummy(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err);
int cu_be_fill_dummy_linear(dsv4_backend *be, const dsv4_fill *wfill, const dsv4_fill *sfill,
                                       dsv4_linear *dev, dsv4_err *err);
/* Record a linear whose device data was made elsewhere (cuda_fill.cu) as
 * upload_linear would: *cw (FP8 / FP4 repacked / BF16) or f32 (an F32 copy
 * [out][in]) becomes the backend's on success, stays the caller's on
 * failure (DSV4_ENOMEM). *dev = *meta with the record's data pointers. */
int cu_be_adopt_linear(dsv4_backend *be, const dsv4_linear *meta, const dsv4_cuda_weight *cw, float *f32,
                       dsv4_linear *dev, dsv4_err *err);

#endif
