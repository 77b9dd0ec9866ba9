/*
 * cuda_fp8_lt.cu — prefill-sized FP8 block-scaled linears through cuBLASLt
 * (spec/MODEL.md §2.4: y = Σ_blocks (x_q · w_q) · x_scale · w_scale, 128-column
 * activation blocks, 128x128 weight blocks).
 *
 * Why cuBLASLt: cuBLAS 12.9+ runs FP8 GEMMs with DeepSeek-style block scales
 * on sm_90 (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for the activations,
 * BLK128x128_32F for the weights) as TMA + wgmma kernels; our mma.sync
 * k_fp8_gemm (cuda_linear.cu) reaches ~250 TFLOP/s at 4096 rows, an eighth of
 * the H200's FP8 peak (bench/results/2026-12-01-prefill-gemm-h200.md).
 * The numerics are the same form: exact E4M3 products, fp32 sums per
 * 128-column block scaled by both block scales.
 *
 * What we feed it (column-major views of our row-major tensors):
 *   A = weights  [R, K] row-major = col-major K x R, op T; scales fp32
 *       [R/128][K/128] (our E8M0 bytes widened; the layout the checkpoint ships)
 *   B = x_q      [n, K] row-major = col-major K x n, op N; scales fp32, token
 *       index fastest ([K/128][n], "outer-dimension major", as PyTorch's
 *       _scaled_mm requires for 1x128 blocks)
 *   D = y        [n, R] row-major = col-major R x n, fp32
 * DSV4_CUDA_FP8_LT_LAYOUT (bit 0: activation scales token-major off; bit 1:
 * weight scales transposed) exists to check those layouts on the GPU.
 *
 * Numerics, measured on H200 (cuBLAS 13, bench/results/2026-12-01-prefill-gemm-h200.md): the layouts
 * above are right (each other layout is off by O(1)), but the result differs
 * from k_fp8_gemm / the fp64 reference by a normalised 2.3e-4 (k_fp8_gemm:
 * 1.7e-7) at wo_b 4096x8192 and wq_b 32768x1024: the reduced-precision
 * accumulation of Hopper's FP8 wgmma inside a 128-column block (cuBLAS does
 * not promote per 32 columns the way our mma.sync steps do). That is 10x
 * below the bf16 rounding the official code applies to every linear's output
 * (spec/MODEL.md §2.4), and it is the accumulation the reference's own GPU
 * kernels and vLLM's (DeepGEMM / CUTLASS block-scaled wgmma) have on Hopper;
 * it is ~1000x above the CPU/CUDA difference of our mma.sync kernel.
 * So it is on by default where the speed matters and the token-equality tests
 * do not look: eager prefill chunks (DSV4_CUDA_FP8_LT unset or 1: not while a
 * CUDA graph is being captured, so decode / verify steps keep k_fp8_gemm and
 * their numerics); DSV4_CUDA_FP8_LT=2 also inside graphs (a 64 x 6 verify
 * step); DSV4_CUDA_FP8_LT=0 off (the exact path everywhere).
 *
 * Used for n >= DSV4_CUDA_FP8_LT_MIN rows (default 256) in whole
 * multiples of 16 rows (the rest of the rows go to the old kernels),
 * K % 512 == 0, R % 128 == 0. When cuBLASLt offers no algorithm (an older
 * library, another GPU) the caller falls back to k_fp8_gemm.
 * Scratch (widened scales + cuBLASLt workspace) is stream-ordered
 * (cudaMallocAsync), so this can run inside a captured graph.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_gemm.cuh"

#define LT_WS_BYTES ((size_t)32 << 20)

static int lt_same(const cu_lt_shape *a, const cu_lt_shape *b) {
    return a->kind == b->kind && a->R == b->R && a->K == b->K && a->btype == b->btype && a->dtype == b->dtype &&
           a->ldb == b->ldb && a->ldd == b->ldd && a->batch == b->batch && a->sb == b->sb && a->sd == b->sd;
}

/* A column-major rows x cols layout of type t, leading dimension ld, `batch` strided batches. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                int batch, int64_t stride) {
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
        const int32_t bc = batch;
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof stride);
    }
    return s;
}

int cu_lt_layouts(const cu_lt_shape *sh, int n, cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *ld) {
    cublasStatus_t s = lt_layout(lb, sh->btype, sh->K, n, sh->ldb, sh->batch, sh->sb);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_layout(ld, sh->dtype, sh->R, n, sh->ldd, sh->batch, sh->sd);
    return s == CUBLAS_STATUS_SUCCESS ? DSV4_OK : DSV4_EUNSUPPORTED;
}

int cu_lt_algo(dsv4_cuda_ctx *c, const cu_lt_shape *sh, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, int n,
               size_t ws_bytes, cublasLtMatmulAlgo_t *algo) {
    int nb = n;
    if (c->lt_bucket) {
        nb = 16;
        while (nb < n) nb *= 2;
        for (int i = 0; i < c->n_lt_cache; i++) {
            const cu_lt_entry *e = &c->lt_cache[i];
            if (e->nb == nb && lt_same(&e->sh, sh)) {
                *algo = e->algo;
                return DSV4_OK;
            }
        }
    }
    cublasLtMatrixLayout_t lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t s = cu_lt_layouts(sh, nb, &lb, &ld) == DSV4_OK ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(c->cublaslt, op, la, lb, ld, ld, pref, 1, &heur, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (s != CUBLAS_STATUS_SUCCESS || !found) return DSV4_EUNSUPPORTED;
    *algo = heur.algo;
    if (c->lt_bucket && c->n_lt_cache < CU_LT_CACHE_MAX) {
        cu_lt_entry *e = &c->lt_cache[c->n_lt_cache++];
        e->sh = *sh;
        e->nb = nb;
        e->algo = heur.algo;
    }
    return DSV4_OK;
}

int cu_lt_gemm(dsv4_cuda_ctx *c, const cu_lt_shape *sh, int64_t lda, int64_t sa, const void *A, const void *B, int n,
               float beta, float *y) {
    if (!c->blas_ws || !c->lt_bucket) return DSV4_EUNSUPPORTED;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const float one = 1.f;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulAlgo_t algo;
    cublasStatus_t s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_layout(&la, sh->btype, sh->K, sh->R, lda, sh->batch, sa);
    int rc = s == CUBLAS_STATUS_SUCCESS ? cu_lt_layouts(sh, n, &lb, &ld) : DSV4_EUNSUPPORTED;
    if (rc == DSV4_OK) rc = cu_lt_algo(c, sh, op, la, n, c->blas_ws_bytes, &algo);
    if (rc == DSV4_OK) {
        s = cublasLtMatmul(c->cublaslt, op, &one, A, la, B, lb, &beta, y, ld, y, ld, &algo, c->blas_ws,
                           c->blas_ws_bytes, c->stream);
        if (s != CUBLAS_STATUS_SUCCESS) rc = DSV4_EUNSUPPORTED;
    }
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

/* Widen the weight's E8M0 block scales and lay out the activation scales. */
__global__ void k_lt_scales(const uint8_t *__restrict__ ws, int RB, int C, const float *__restrict__ xs, int n,
                            int layout, float *__restrict__ wsf, float *__restrict__ xsf) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int nw = RB * C;
    if (i < nw) {
        const int rb = i / C, kb = i - rb * C;
        wsf[(layout & 2) ? kb * RB + rb : i] = e8m0_to_f32(ws[i]);
        return;
    }
    const int j = i - nw;
    if (j < n * C) {
        const int m = j / C, kb = j - m * C;
        xsf[(layout & 1) ? j : kb * n + m] = xs[j];
    }
}

__global__ void k_lt_round(float *y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = round_bf16(y[i]);
}

/* Rows this path takes of an n-row call on c's stream (0: none; the mode
 * DSV4_CUDA_FP8_LT 0 / 1 (default) / 2 of the note above). */
int cu_fp8_lt_rows(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, int n) {
    const int mode = cu_env_int("DSV4_CUDA_FP8_LT", 1);
    if (mode <= 0) return 0;
    if (n < cu_env_int("DSV4_CUDA_FP8_LT_MIN", 256)) return 0;
    if (w->kind != DSV4_CUDA_W_FP8 || w->out % 128 || w->in % 512) return 0;
    if (mode == 1) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(c->stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return 0;
    }
    return n & ~15;
}

/*
 * y[0..n) = FP8 linear of n rows (n % 16 == 0, from cu_fp8_lt_rows).
 * Returns DSV4_OK, DSV4_EUNSUPPORTED when cuBLASLt has no algorithm (nothing
 * launched: the caller uses its own kernel), or another error.
 */
int cu_fp8_lt(dsv4_cuda_ctx *c, const dsv4_cuda_weight *w, const uint8_t *xq, const float *xs, int n, float *y,
              int flags, dsv4_err *err) {
    const int R = (int)w->out, K = (int)w->in, C = K / 128, RB = R / 128;
    const int layout = cu_env_int("DSV4_CUDA_FP8_LT_LAYOUT", 0);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulAlgo_t algo;
    const cu_lt_shape sh = {CU_LT_FP8_BLOCK, R, K, CUDA_R_8F_E4M3, CUDA_R_32F, K, R, 1, 0, 0};
    int found = 0, rc = DSV4_OK;
    void *p = NULL;
    const size_t wsb = cu_align((size_t)RB * C * 4), xsb = cu_align((size_t)n * C * 4);
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const int32_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const size_t wsbytes = LT_WS_BYTES;
    const float one = 1.f, zero = 0.f;
    float *wsf = NULL, *xsf = NULL;
    const void *wsp = NULL, *xsp = NULL;
    void *lt_ws = c->blas_ws && c->blas_ws_bytes >= wsbytes ? c->blas_ws : NULL;
    int arena = 0;
    cublasStatus_t s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
#define LT_SET(call) \
    if (s == CUBLAS_STATUS_SUCCESS) s = (call)
    LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
    LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
    LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode));
    LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode));
    LT_SET(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)R, K));
    if (s == CUBLAS_STATUS_SUCCESS && cu_lt_layouts(&sh, n, &lb, &ld) != DSV4_OK) s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS) {
        /* the heuristic needs the scale pointers' alignment only: set them after the scratch exists.
         * With the context's fixed cuBLAS workspace (cuda_ctx.cu) the scales come from the scratch arena
         * and the workspace is that area (same stream, calls in turn): no alloc / free graph nodes. */
        if (lt_ws) {
            if ((rc = cu_arena_alloc(c, wsb + xsb, &p, err))) goto out;
            arena = 1;
        } else {
            cudaError_t e = cudaMallocAsync(&p, wsb + xsb + wsbytes, c->stream);
            if (e != cudaSuccess) {
                rc = cu_err(err, DSV4_EBACKEND, "cuda: fp8 linear (cublasLt scratch): %s", cudaGetErrorString(e));
                goto out;
            }
        }
        wsf = (float *)p;
        xsf = (float *)((uint8_t *)p + wsb);
        wsp = wsf;
        xsp = xsf;
        LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsp, sizeof wsp));
        LT_SET(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xsp, sizeof xsp));
    }
    if (s == CUBLAS_STATUS_SUCCESS) found = cu_lt_algo(c, &sh, op, la, n, wsbytes, &algo) == DSV4_OK;
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        rc = DSV4_EUNSUPPORTED; /* no error: the caller falls back (DSV4_CUDA_FP8_LT_DEBUG=1 says why) */
        if (cu_env_int("DSV4_CUDA_FP8_LT_DEBUG", 0))
            fprintf(stderr, "dsv4 cuda: cublasLt block-scaled fp8 %dx%d n=%d: %s, %d algorithms\n", R, K, n,
                    cublasGetStatusString(s), found);
        goto out;
    }
    {
        const int items = RB * C + n * C;
        k_lt_scales<<<(unsigned)((items + 255) / 256), 256, 0, c->stream>>>((const uint8_t *)w->scale, RB, C, xs, n,
                                                                            layout, wsf, xsf);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
            rc = cu_err(err, DSV4_EBACKEND, "cuda: fp8 linear (scales): %s", cudaGetErrorString(e));
            goto out;
        }
    }
    s = cublasLtMatmul(c->cublaslt, op, &one, w->w, la, xq, lb, &zero, y, ld, y, ld, &algo,
                       lt_ws ? lt_ws : (uint8_t *)p + wsb + xsb, wsbytes, c->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        /* the bucket's algorithm refused this n (cu_lt_algo): the caller's kernel takes it */
        static int warned;
        if (!warned++)
            fprintf(stderr, "dsv4 cuda: cublasLt fp8 %dx%d: the algorithm of n's bucket refused n=%d (%s); "
                    "falling back to k_fp8_gemm for such calls\n", R, K, n, cublasGetStatusString(s));
        rc = DSV4_EUNSUPPORTED;
        goto out;
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        rc = cu_err(err, DSV4_EBACKEND, "cublasLt: fp8 linear %dx%d n=%d: %s", R, K, n, cublasGetStatusString(s));
        goto out;
    }
    if (cu_env_int("DSV4_CUDA_FP8_LT_DEBUG", 0) > 1)
        fprintf(stderr, "dsv4 cuda: cublasLt block-scaled fp8 %dx%d n=%d layout %d\n", R, K, n, layout);
    if (flags & DSV4_CUDA_OUT_BF16) {
        const size_t ny = (size_t)n * R;
        k_lt_round<<<(unsigned)((ny + 255) / 256), 256, 0, c->stream>>>(y, ny);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) rc = cu_err(err, DSV4_EBACKEND, "cuda: fp8 linear (bf16 round): %s", cudaGetErrorString(e));
    }
#undef LT_SET
out:
    if (p && arena) cu_arena_free(c, p);
    else if (p) cudaFreeAsync(p, c->stream);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}
