/*
 * Internals shared by the CPU backend's files (one file per op family).
 * Not a public header: only the src/backend/cpu sources include it.
 */
#ifndef DSV4_CPU_INTERNAL_H
#define DSV4_CPU_INTERNAL_H
#include "model/kvcodec.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_num.h"

/* Work (multiply-adds) below which an op stays single-threaded: thread
 * start-up and barriers cost more than tiny ops, badly so on a loaded machine. */
#define DSV4_CPU_PAR_MIN ((int64_t)1 << 22)

/* Dot product in fp32 with 8 interleaved partial sums: a fixed summation
 * order the compiler can vectorise (plain left-to-right sums it cannot). */
static inline float dsv4_cpu_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[k + j] * b[k + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* Checks shared by every op; each returns DSV4_OK or DSV4_EINVAL naming `what`. */
int dsv4_cpu_check_f32(const dsv4_buf *b, int64_t rows, int64_t cols, const char *what, dsv4_err *err);
int dsv4_cpu_check_i32(const dsv4_buf *b, int64_t rows, int64_t cols, const char *what, dsv4_err *err);
int dsv4_cpu_check_vec(const dsv4_tview *v, int64_t n, const char *what, dsv4_err *err);

/*
 * Emitted compressed rows (backend.h dsv4_cmp_state): check the store holds
 * F32 rows of width `cols` for its layout (unpaged: n_slots*max_rows rows;
 * paged: whole pages of page_rows, block table present), and address row w of
 * a slot ONLY through DSV4_CMP_ROW. cmp_row returns NULL for a row on an
 * unmapped page (block table entry -1), which an op must neither read nor write.
 */
int dsv4_cpu_check_cmp_rows(const dsv4_cmp_state *cs, int64_t cols, const char *what, dsv4_err *err);
/* Row index of emitted row w of slot in cs->rows, or -1 (unmapped page / out of range). */
static inline int64_t dsv4_cpu_cmp_index(const dsv4_cmp_state *cs, int slot, int64_t w) {
    if (w < 0 || w >= cs->max_rows) return -1;
    int64_t r = DSV4_CMP_ROW(cs, slot, w);
    return r < 0 || r >= cs->rows.rows ? -1 : r;
}

/*
 * Stored KV rows (window rings, main compressed rows) may be coded
 * (--kv-cache-dtype, src/model/kvcodec.h): an F32 buffer of `dim` columns is
 * plain floats; BF16 of `dim` columns is bf16; U8 of row_bytes columns is the
 * fp8_ds_mla record. kv_fmt_of recognises the buffer (DSV4_EINVAL otherwise).
 * kv_load returns a pointer to row r as floats: the row itself for F32,
 * else `scratch` [dim] decoded. kv_store encodes x[dim] into row r.
 */
typedef struct dsv4_cpu_kv_fmt {
    dsv4_kv_dtype t;
    int dim, rope_dim;
    int64_t bytes; /* per row */
} dsv4_cpu_kv_fmt;
int dsv4_cpu_kv_fmt_of(const dsv4_buf *b, int64_t rows, int64_t dim, const char *what, dsv4_cpu_kv_fmt *f,
                       dsv4_err *err);
static inline const float *dsv4_cpu_kv_load(const dsv4_buf *b, const dsv4_cpu_kv_fmt *f, int64_t r, float *scratch) {
    const uint8_t *p = (const uint8_t *)b->data + r * f->bytes;
    if (f->t == DSV4_KV_F32) return (const float *)p;
    dsv4_kvcodec_decode(f->t, f->dim, f->rope_dim, p, scratch);
    return scratch;
}
static inline void dsv4_cpu_kv_store(dsv4_buf *b, const dsv4_cpu_kv_fmt *f, int64_t r, const float *x) {
    dsv4_kvcodec_encode(f->t, f->dim, f->rope_dim, x, (uint8_t *)b->data + r * f->bytes);
}

/*
 * y[T][out] = x[T][in] · Wᵀ on plain float arrays, decoding the stored
 * weight one output row at a time. act_quant: quantise each x row to FP8 in
 * blocks of 128 first (W8A8, reference numerics for FP8/FP4 weights).
 * Errors: unsupported weight dtype.
 */
int dsv4_cpu_matmul(const float *x, int64_t T, const dsv4_linear *w, float *y, int act_quant,
                    dsv4_err *err);
/* Decode row r of a stored linear into out[w->in] (fp32). */
void dsv4_cpu_decode_row(const dsv4_linear *w, int64_t r, float *out);
/* Validate a linear's dtypes/shapes; names the tensor. */
int dsv4_cpu_check_linear(const dsv4_linear *w, const char *what, dsv4_err *err);

/* fill_dummy (cpu_fill.c): tensors live on a list at be->ctx, released by
 * dsv4_cpu_fill_release from the backend's free. */
int dsv4_cpu_fill_dummy(dsv4_backend *be, const dsv4_fill *how, dsv4_tview *dev, dsv4_err *err);
void dsv4_cpu_fill_release(dsv4_backend *be);

/* Op implementations (wired into the table by cpu_backend.c). */
int dsv4_cpu_embed(dsv4_backend *be, const dsv4_tview *table, const dsv4_batch *b, int n_copies,
                   dsv4_buf *out, dsv4_err *err);
int dsv4_cpu_add(dsv4_backend *be, const dsv4_buf *a, const dsv4_buf *b, dsv4_buf *y, dsv4_err *err);
int dsv4_cpu_rmsnorm(dsv4_backend *be, const dsv4_buf *x, const dsv4_tview *weight, int group,
                     float eps, dsv4_buf *y, dsv4_err *err);
int dsv4_cpu_rope(dsv4_backend *be, dsv4_buf *x, int head_dim, const dsv4_rope *rope,
                  const dsv4_batch *b, int inverse, dsv4_err *err);
void dsv4_cpu_rope_row(float *head, int head_dim, const dsv4_rope *rope, int64_t pos, int inverse);
int dsv4_cpu_qat_fp8(dsv4_backend *be, dsv4_buf *x, int head_dim, int n_quant, int block,
                     dsv4_err *err);
int dsv4_cpu_qat_hadamard_fp4(dsv4_backend *be, dsv4_buf *x, int head_dim, dsv4_err *err);
int dsv4_cpu_swiglu(dsv4_backend *be, const dsv4_buf *g, const dsv4_buf *u, float limit,
                    dsv4_buf *h, dsv4_err *err);
float dsv4_cpu_swiglu1(float g, float u, float limit);
/* Greedy id and top logprobs per logit row (backend.h logit_top; cpu_logit_top.c). */
int dsv4_cpu_logit_top(dsv4_backend *be, const dsv4_buf *x, dsv4_buf *ids, dsv4_buf *lp, dsv4_err *err);

int dsv4_cpu_linear(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, dsv4_buf *y,
                    dsv4_err *err);
int dsv4_cpu_linear_grouped(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w, int groups,
                            dsv4_buf *y, dsv4_err *err);

int dsv4_cpu_hc_pre(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                    const dsv4_tview *scale, int n_hc, int iters, float eps, dsv4_buf *y,
                    dsv4_buf *post, dsv4_buf *comb, dsv4_err *err);
int dsv4_cpu_hc_post(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post,
                     const dsv4_buf *comb, int n_hc, dsv4_buf *Xout, dsv4_err *err);
int dsv4_cpu_hc_post_pre_norm(dsv4_backend *be, const dsv4_buf *X, const dsv4_buf *f, const dsv4_buf *post_in,
                              const dsv4_buf *comb_in, int n_hc, dsv4_buf *Xout, const dsv4_tview *fn,
                              const dsv4_tview *base, const dsv4_tview *scale, int iters, float eps,
                              const dsv4_tview *norm, float norm_eps, dsv4_buf *y, dsv4_buf *post, dsv4_buf *comb,
                              dsv4_err *err);
int dsv4_cpu_hc_head(dsv4_backend *be, const dsv4_buf *X, const dsv4_tview *fn, const dsv4_tview *base,
                     const dsv4_tview *scale, int n_hc, float eps, dsv4_buf *y, dsv4_err *err);
/* DSpark tap features: y[:, col0 .. col0+d) = mean over the n_hc streams of X (backend.h hc_mean). */
int dsv4_cpu_hc_mean(dsv4_backend *be, const dsv4_buf *X, int n_hc, dsv4_buf *y, int64_t col0, dsv4_err *err);

int dsv4_cpu_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const dsv4_batch *b,
                       dsv4_err *err);
int dsv4_cpu_attention(dsv4_backend *be, const dsv4_buf *q, const dsv4_buf *kv,
                       const dsv4_win_state *ws, const dsv4_cmp_state *cs, const dsv4_buf *sel,
                       const dsv4_tview *sinks, int n_heads, const dsv4_batch *b, dsv4_buf *o,
                       dsv4_err *err);
int dsv4_cpu_compress(dsv4_backend *be, dsv4_cmp_state *cs, const dsv4_buf *K, const dsv4_buf *Z,
                      const dsv4_tview *ape, const dsv4_tview *norm_w, float eps,
                      const dsv4_rope *rope, dsv4_qat qat, const dsv4_batch *b, dsv4_err *err);
int dsv4_cpu_indexer_select(dsv4_backend *be, const dsv4_buf *qi, const dsv4_buf *g, float g_scale,
                            const dsv4_cmp_state *idx, int topk, const dsv4_batch *b,
                            dsv4_buf *sel, dsv4_err *err);

int dsv4_cpu_moe_route(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *gate,
                       const dsv4_tview *bias, const dsv4_tview *tid2eid, int k, float route_scale,
                       const dsv4_batch *b, dsv4_buf *ids, dsv4_buf *weights, dsv4_err *err);
int dsv4_cpu_moe_experts(dsv4_backend *be, const dsv4_buf *x, const dsv4_linear *w1,
                         const dsv4_linear *w3, const dsv4_linear *w2, int n_exp,
                         const dsv4_buf *ids, const dsv4_buf *weights, float limit, dsv4_buf *y,
                         dsv4_err *err);

#endif
