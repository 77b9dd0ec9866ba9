/*
 * cuda_subtile.cu — quantised linears narrower than the CUDA tiles, by zero
 * padding (spec/MODEL.md §2.3-2.4; interface in cuda_subtile.cuh).
 *
 * Why: the FP8 kernels take 128-row x 128-column weight tiles and the FP4
 * ones 16 x 128, but a tensor-parallel rank of a small model holds slices
 * below that — on the tiny checkpoints at TP = 2, attn.wo_a and the shared
 * expert's w1/w3 are 64 FP8 rows, wo_b / shared w2 64 FP8 columns and the
 * routed experts' w2 64 FP4 columns (tp_shard.c). Such a weight is uploaded
 * zero-padded to multiples of 128 in both dims, and a linear on it pads its
 * input columns with zeros and drops the padded output columns.
 *
 * Why padding is exact, not an approximation, under the reference numerics:
 *  - weights: a row slice inside one 128x128 FP8 scale block keeps that
 *    block's scale, and the scale tensor of the slice already has
 *    ceil(out/128) x ceil(in/128) entries — the padded shape's. FP4 padding
 *    adds whole 32-column groups (scale 1, zero nibbles).
 *  - activations: W8A8 quantises x in blocks of 128 columns with the scale
 *    pow2_ceil(max(amax, 1e-4)/448); the CPU reference quantises the last,
 *    short block of a row (here: the whole 64-column row) the same way over
 *    its real values. Zeros do not change a block's amax, so the padded
 *    block gets the CPU's scale and the real values the CPU's E4M3 codes.
 *  - products: padded columns multiply zero weights (and zero inputs), so
 *    they add +0 to every dot product; padded output rows are dropped.
 *  - routed experts: padded w1/w3 rows give g = u = 0, h = silu(0)·0·w = 0,
 *    which quantises to 0 and meets zero w2 columns.
 * Cost: one memset + two 2-D copies per call; only sub-tile shapes take it
 * (no Flash weight does, at any TP up to 8).
 */
#include "backend/cuda/cuda_subtile.cuh"

#include <stdlib.h>
#include <string.h>

static int64_t up128(int64_t v) { return (v + 127) / 128 * 128; }

static int is_fp4(dsv4_dtype d) { return d == DSV4_DT_I8 || d == DSV4_DT_U8; }

int cu_subtile_needed(const dsv4_linear *lin) {
    if (lin->w.dtype != DSV4_DT_F8_E4M3 && !is_fp4(lin->w.dtype)) return 0;
    return lin->out % 128 != 0 || lin->in % 128 != 0;
}

int cu_subtile_pad(const dsv4_linear *host, dsv4_linear *padded, void **bytes, dsv4_err *err) {
    *bytes = NULL;
    *padded = *host;
    const int64_t o = host->out, i = host->in, Po = up128(o), Pi = up128(i);
    const char *nm = host->w.name ? host->w.name : "linear";
    if (o <= 0 || i <= 0 || !host->w.data || host->w.ndim != 2)
        return cu_err(err, DSV4_EINVAL, "cuda: %s: bad shape [%lld, %lld] for padding", nm, (long long)o, (long long)i);
    if (host->w.dtype == DSV4_DT_F8_E4M3) {
        if (host->w.shape[0] != o || host->w.shape[1] != i || host->w.nbytes != (size_t)(o * i))
            return cu_err(err, DSV4_EINVAL, "cuda: %s: FP8 weight size does not match [%lld, %lld]", nm,
                          (long long)o, (long long)i);
        uint8_t *w = (uint8_t *)calloc((size_t)(Po * Pi), 1);
        if (!w) return cu_err(err, DSV4_ENOMEM, "cuda: %s: out of memory (padding)", nm);
        for (int64_t r = 0; r < o; r++) memcpy(w + r * Pi, (const uint8_t *)host->w.data + r * i, (size_t)i);
        /* the scale is already [ceil(o/128), ceil(i/128)] = [Po/128, Pi/128]: kept as is (checked at upload) */
        padded->w.data = w;
        padded->w.shape[0] = Po;
        padded->w.shape[1] = Pi;
        padded->w.nbytes = (size_t)(Po * Pi);
        *bytes = w;
    } else if (is_fp4(host->w.dtype)) {
        if (i % 32)
            return cu_err(err, DSV4_EUNSUPPORTED, "cuda: %s: FP4 in-dim %lld not a multiple of the scale group 32", nm,
                          (long long)i);
        if (host->w.shape[0] != o || host->w.shape[1] != i / 2 || host->w.nbytes != (size_t)(o * i / 2) ||
            !host->scale.data || host->scale.nbytes != (size_t)(o * (i / 32)))
            return cu_err(err, DSV4_EINVAL, "cuda: %s: FP4 weight/scale size does not match [%lld, %lld]", nm,
                          (long long)o, (long long)i);
        const size_t wb = (size_t)(Po * Pi / 2), sb = (size_t)(Po * Pi / 32);
        uint8_t *w = (uint8_t *)calloc(wb + sb, 1);
        if (!w) return cu_err(err, DSV4_ENOMEM, "cuda: %s: out of memory (padding)", nm);
        uint8_t *s = w + wb;
        memset(s, 127, sb); /* E8M0 127 = 1.0 for the padded groups (their nibbles are +0) */
        for (int64_t r = 0; r < o; r++) {
            memcpy(w + r * (Pi / 2), (const uint8_t *)host->w.data + r * (i / 2), (size_t)(i / 2));
            memcpy(s + r * (Pi / 32), (const uint8_t *)host->scale.data + r * (i / 32), (size_t)(i / 32));
        }
        padded->w.data = w;
        padded->w.shape[0] = Po;
        padded->w.shape[1] = Pi / 2;
        padded->w.nbytes = wb;
        padded->scale.data = s;
        padded->scale.shape[0] = Po;
        padded->scale.shape[1] = Pi / 32;
        padded->scale.nbytes = sb;
        *bytes = w;
    } else {
        return cu_err(err, DSV4_EINTERNAL, "cuda: %s: padding asked for an unquantised weight", nm);
    }
    padded->out = Po;
    padded->in = Pi;
    return DSV4_OK;
}

int cu_subtile_linear(dsv4_cuda_ctx *c, const dsv4_cuda_weight *cw, int64_t out, int64_t in, const float *x,
                      int64_t n, float *y, dsv4_err *err) {
    if (n <= 0) return DSV4_OK;
    const int64_t Po = cw->out, Pi = cw->in;
    if (Po < out || Pi < in || n > INT32_MAX)
        return cu_err(err, DSV4_EINTERNAL, "cuda: padded linear [%lld, %lld] smaller than [%lld, %lld]",
                      (long long)Po, (long long)Pi, (long long)out, (long long)in);
    cudaStream_t st = c->stream;
    const size_t xb = Pi != in ? cu_align((size_t)(n * Pi) * 4) : 0, yb = Po != out ? (size_t)(n * Po) * 4 : 0;
    void *buf = NULL;
    if (xb + yb) CU_TRY(cudaMallocAsync(&buf, xb + yb, st), err, "padded linear (scratch)");
    const float *xp = x;
    float *yp = y;
    int rc = DSV4_OK;
    cudaError_t e = cudaSuccess;
    if (xb) {
        float *p = (float *)buf;
        e = cudaMemsetAsync(p, 0, xb, st);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync(p, (size_t)Pi * 4, x, (size_t)in * 4, (size_t)in * 4, (size_t)n,
                                  cudaMemcpyDeviceToDevice, st);
        xp = p;
    }
    if (yb) yp = (float *)((uint8_t *)buf + xb);
    if (e == cudaSuccess) {
        rc = dsv4_cuda_linear(c, cw, xp, (int)n, yp, 0, err);
        if (!rc && yb)
            e = cudaMemcpy2DAsync(y, (size_t)out * 4, yp, (size_t)Po * 4, (size_t)out * 4, (size_t)n,
                                  cudaMemcpyDeviceToDevice, st);
    }
    if (buf) cudaFreeAsync(buf, st); /* stream-ordered: after the copies */
    if (!rc && e != cudaSuccess)
        rc = cu_err(err, DSV4_EBACKEND, "cuda: padded linear [%lld, %lld]: %s", (long long)out, (long long)in,
                    cudaGetErrorString(e));
    return rc;
}
