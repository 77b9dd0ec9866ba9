/*
 * cuda_kvrow.cu — host side of the coded KV rows (cuda_kvrow.cuh): format
 * recognition (as the CPU's dsv4_cpu_kv_fmt_of), the dense row encoder that
 * attention uses for a batch's own rows, and win_store into coded rings.
 */
#include "backend/cuda/cuda_kvrow.cuh"

int cu_kv_fmt_of(const dsv4_buf *b, int64_t rows, int64_t dim, const char *what, cu_kvfmt *f, dsv4_err *err) {
    if (!b || !b->data) return cu_err(err, DSV4_EINVAL, "cuda: %s: missing buffer", what);
    if (rows >= 0 && b->rows != rows)
        return cu_err(err, DSV4_EINVAL, "cuda: %s: %lld rows, expected %lld", what, (long long)b->rows,
                      (long long)rows);
    f->dim = (int)dim;
    f->rope = 0;
    if (b->dtype == DSV4_DT_F32 && b->cols == dim) f->t = DSV4_KV_F32;
    else if (b->dtype == DSV4_DT_BF16 && b->cols == dim) f->t = DSV4_KV_BF16;
    else if (b->dtype == DSV4_DT_U8 && (f->rope = dsv4_kvcodec_rope_dim(DSV4_KV_FP8_DS_MLA, (int)dim, b->cols)) >= 0)
        f->t = DSV4_KV_FP8_DS_MLA;
    else
        return cu_err(err, DSV4_EINVAL,
                      "cuda: %s: dtype %d rows of %lld columns are no KV row format for dim %lld (F32/BF16 [dim], "
                      "U8 fp8_ds_mla records)",
                      what, (int)b->dtype, (long long)b->cols, (long long)dim);
    f->nope = f->t == DSV4_KV_FP8_DS_MLA ? f->dim - f->rope : f->dim;
    f->scoff = f->t == DSV4_KV_FP8_DS_MLA ? f->nope + 2 * f->rope : 0;
    f->bytes = dsv4_kvcodec_row_bytes((dsv4_kv_dtype)f->t, f->dim, f->rope);
    if (f->t == DSV4_KV_FP8_DS_MLA && (f->nope % 8 || f->bytes % 8))
        return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: fp8_ds_mla rows of %d dims with %d rope dims (the CUDA "
                      "loaders need a nope part that is a multiple of 8)", what, f->dim, f->rope);
    return DSV4_OK;
}

/* One block per row: x[r] -> out[r]. */
__global__ void k_kv_encode_rows(cu_kvfmt f, const float *x, uint8_t *out) {
    const int64_t r = blockIdx.x;
    kv_encode_row(f.t, x + r * f.dim, out + r * f.bytes, f.dim, f.nope, f.scoff);
}

int cu_kv_encode_rows(cudaStream_t st, const cu_kvfmt *f, const float *x, int64_t n, uint8_t *out, dsv4_err *err) {
    if (n <= 0) return DSV4_OK;
    if (n > 0x7fffffff) return cu_err(err, DSV4_EINVAL, "cuda: kv encode: %lld rows", (long long)n);
    k_kv_encode_rows<<<(unsigned)n, 256, 0, st>>>(*f, x, out);
    CU_LAUNCHED(err, "kv rows (encode)");
    return DSV4_OK;
}

/* One block per row; only the last `cap` rows of a segment write (as k_win_store). */
__global__ void k_kv_win_store(cu_kvfmt f, uint8_t *rows, const float *kv, int cap, const int32_t *pos,
                               const int32_t *slot, const int32_t *r1) {
    const int t = blockIdx.x;
    if (t + cap < r1[t]) return;
    const int64_t r = (int64_t)slot[t] * cap + pos[t] % cap;
    kv_encode_row(f.t, kv + (int64_t)t * f.dim, rows + r * f.bytes, f.dim, f.nope, f.scoff);
}

int cu_kv_win_store(dsv4_backend *be, dsv4_win_state *ws, const dsv4_buf *kv, const int32_t *pos,
                    const int32_t *slot, const int32_t *r1, int n_rows, dsv4_err *err) {
    cu_kvfmt f;
    int rc = cu_kv_fmt_of(&ws->rows, (int64_t)ws->n_slots * ws->cap, kv->cols, "window ring", &f, err);
    if (rc || !n_rows) return rc;
    k_kv_win_store<<<n_rows, 256, 0, cube(be)->ctx->stream>>>(f, (uint8_t *)ws->rows.data, (const float *)kv->data,
                                                               ws->cap, pos, slot, r1);
    CU_LAUNCHED(err, "win_store (coded ring)");
    return DSV4_OK;
}
