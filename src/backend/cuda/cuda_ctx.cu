/*
 * cuda_ctx.cu — device context, buffers, scratch workspace and the HBM
 * ceiling measurement (spec/PERFORMANCE.md §1: re-measure in the same run).
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_profiler_api.h>

#include <stdlib.h>
#include <string.h>

extern "C" int dsv4_cuda_ctx_create(int device, dsv4_cuda_ctx **out, dsv4_err *err) {
    if (!out) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_ctx_create: out is NULL");
    *out = NULL;
    int count = 0;
    CU_TRY(cudaGetDeviceCount(&count), err, "counting devices");
    if (device < 0 || device >= count)
        return cu_err(err, DSV4_EBACKEND, "cuda: device %d requested, %d present", device, count);
    dsv4_cuda_ctx *c = (dsv4_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return cu_err(err, DSV4_ENOMEM, "cuda: context allocation failed");
    c->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&c->prop, device);
    if (e != cudaSuccess) {
        free(c);
        return cu_err(err, DSV4_EBACKEND, "cuda: device %d: %s", device, cudaGetErrorString(e));
    }
    if (c->prop.major * 10 + c->prop.minor < 89) {
        int mj = c->prop.major, mn = c->prop.minor;
        free(c);
        return cu_err(err, DSV4_EUNSUPPORTED,
                      "cuda: device %d is compute capability %d.%d; the FP8 kernels need 8.9+",
                      device, mj, mn);
    }
    c->pdl = c->prop.major >= 9 && !getenv("DSV4_CUDA_NO_PDL");
    c->fuseq_max = getenv("DSV4_CUDA_FUSEQ_MAX") ? atoi(getenv("DSV4_CUDA_FUSEQ_MAX")) : CU_FUSED_QUANT_MAX;
    if (c->fuseq_max > 8) c->fuseq_max = 8;
    c->moe_persistent = getenv("DSV4_CUDA_MOE_PERSISTENT") != NULL;
    c->moe_fq = getenv("DSV4_CUDA_MOE_FQ") != NULL;
    c->moe_minb3 = getenv("DSV4_CUDA_MOE_MINB3") != NULL;
    {
        const char *mb = getenv("DSV4_CUDA_SCRATCH_MB");
        c->ar_mode = !(mb && atol(mb) <= 0);
        c->ar_poison = getenv("DSV4_CUDA_SCRATCH_POISON") != NULL;
    }
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(c);
        return cu_err(err, DSV4_EBACKEND, "cuda: stream: %s", cudaGetErrorString(e));
    }
    cublasStatus_t s = cublasCreate(&c->cublas);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->cublas, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtCreate(&c->cublaslt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        dsv4_cuda_ctx_free(c);
        return cu_err(err, DSV4_EBACKEND, "cublas: create: %s", cublasGetStatusString(s));
    }
    /*
     * A fixed cuBLAS workspace. Why: without one, cuBLAS (12.2+) takes each
     * call's workspace from the stream-ordered pool, and inside a captured
     * graph every BF16 split GEMM (cuda_dense.cu) and grouped wo_a GEMM
     * (cuda_rows.cu) became an alloc + a free node (issue 7: ~6 pairs per
     * layer at batch >= 8). All cuBLAS calls of the context run on its one
     * stream, so one area serves them in turn. Size: cuBLAS's recommended
     * 32 MiB on sm_90+ (4 MiB before), so the algorithm choice is the one
     * of its default pool. DSV4_CUDA_CUBLAS_WS_MB=0: no fixed area (the old
     * behaviour); another value sets the size in MiB. Set after
     * cublasSetStream, which resets the workspace to the default pool.
     */
    {
        const char *wmb = getenv("DSV4_CUDA_CUBLAS_WS_MB");
        const long mb = wmb ? atol(wmb) : (c->prop.major >= 9 ? 32 : 4);
        if (mb > 0) {
            const size_t bytes = (size_t)mb << 20;
            e = cudaMalloc(&c->blas_ws, bytes);
            if (e == cudaSuccess && cublasSetWorkspace(c->cublas, c->blas_ws, bytes) == CUBLAS_STATUS_SUCCESS) {
                c->blas_ws_bytes = bytes;
            } else { /* no room or refused: cuBLAS keeps its own pool, as before */
                cudaGetLastError();
                if (c->blas_ws) cudaFree(c->blas_ws);
                c->blas_ws = NULL;
            }
        }
    }
    {
        const char *bm = getenv("DSV4_CUDA_BF16_GEMV");
        c->bf16_mode = bm ? atoi(bm) : 2;
        const char *lb = getenv("DSV4_CUDA_LT_BUCKET");
        c->lt_bucket = !(lb && !strcmp(lb, "0"));
    }
    *out = c;
    return DSV4_OK;
}

extern "C" void dsv4_cuda_ctx_free(dsv4_cuda_ctx *c) {
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->stream) { /* the areas came stream-ordered from the device pool */
        for (int i = 0; i < c->n_ws_old; i++) cudaFreeAsync(c->ws_old[i], c->stream);
        if (c->ws) cudaFreeAsync(c->ws, c->stream);
        if (c->ar_base) cudaFreeAsync(c->ar_base, c->stream);
        cudaStreamSynchronize(c->stream);
    }
    free(c->ws_old);
    if (c->cublaslt) cublasLtDestroy(c->cublaslt);
    if (c->cublas) cublasDestroy(c->cublas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" void *dsv4_cuda_stream(dsv4_cuda_ctx *c) { return c ? (void *)c->stream : NULL; }
extern "C" const char *dsv4_cuda_device_name(const dsv4_cuda_ctx *c) { return c ? c->prop.name : ""; }
extern "C" int dsv4_cuda_sm_count(const dsv4_cuda_ctx *c) { return c ? c->prop.multiProcessorCount : 0; }

extern "C" int dsv4_cuda_sync(dsv4_cuda_ctx *c, dsv4_err *err) {
    if (!c) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_sync: ctx is NULL");
    CU_TRY(cudaStreamSynchronize(c->stream), err, "stream synchronize");
    return DSV4_OK;
}

extern "C" int dsv4_cuda_alloc(dsv4_cuda_ctx *c, size_t bytes, void **out, dsv4_err *err) {
    if (!c || !out) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_alloc: NULL argument");
    *out = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        *out = NULL;
        return cu_err(err, e == cudaErrorMemoryAllocation ? DSV4_ENOMEM : DSV4_EBACKEND,
                      "cuda: allocating %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return DSV4_OK;
}

extern "C" void dsv4_cuda_free(dsv4_cuda_ctx *c, void *p) {
    (void)c;
    if (p) cudaFree(p);
}

extern "C" int dsv4_cuda_upload(dsv4_cuda_ctx *c, void *dst, const void *src, size_t bytes,
                                dsv4_err *err) {
    if (!c || (bytes && (!dst || !src))) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_upload: NULL argument");
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), err, "upload");
    CU_TRY(cudaStreamSynchronize(c->stream), err, "upload (synchronize)");
    return DSV4_OK;
}

extern "C" int dsv4_cuda_download(dsv4_cuda_ctx *c, void *dst, const void *src, size_t bytes,
                                  dsv4_err *err) {
    if (!c || (bytes && (!dst || !src))) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_download: NULL argument");
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), err, "download");
    CU_TRY(cudaStreamSynchronize(c->stream), err, "download (synchronize)");
    return DSV4_OK;
}

/*
 * Growing the scratch area. Two hazards of the old "synchronise, cudaFree,
 * cudaMalloc" growth, both reached by tensor parallelism over CUDA:
 *  - CUDA graphs bake the area's address into their kernels. Freeing it on
 *    growth left every graph captured before replaying into freed memory.
 *    Bumping the backend's graph epoch instead (recapture) would make the
 *    graph-or-eager choice rank-local (rank 0 also runs the drafter on this
 *    area), and NCCL requires every rank to make the same choice for each
 *    collective. So old areas are kept (freed with the context) and graphs
 *    stay valid; growth at least doubles, so what is kept is less than the
 *    current area.
 *  - Ops grow the area in the middle of a forward, when a peer GPU of this
 *    process may already be inside an NCCL all-reduce waiting for this rank.
 *    cudaStreamSynchronize + cudaFree + cudaMalloc there is NCCL's documented
 *    hazard (a CUDA call that waits on, or locks out, the launch the peer's
 *    kernel is waiting for). The new area comes stream-ordered from the
 *    device pool (cudaMallocAsync, as every op's scratch): no host wait.
 * When growth happens after start-up: the area needed is not monotone in the
 * rows (attention split-K: a 10-row prefill on a 32-head TP rank needs 3.44 MB,
 * a 12-row one 3.34 MB), so on 2x H200 (0731 config, TP=2) the 10-row prefill
 * of the second "Request N" prompt, resumed from the prefix cache after the
 * first request's 12-row prefill and its captured 6-row verify graphs, is the
 * first step that grows it — the step after which serving hung (the exact
 * mechanism is not confirmed on the GPU yet).
 */
extern "C" int dsv4_cuda_workspace_reserve(dsv4_cuda_ctx *c, size_t bytes, dsv4_err *err) {
    if (!c) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_workspace_reserve: ctx is NULL");
    if (bytes <= c->ws_bytes) return DSV4_OK;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CU_TRY(cudaStreamIsCapturing(c->stream, &st), err, "capture status");
    if (st != cudaStreamCaptureStatusNone)
        return cu_err(err, DSV4_ERANGE,
                      "cuda: workspace of %zu bytes needed during graph capture, %zu reserved "
                      "(reserve it before capturing)", bytes, c->ws_bytes);
    if (c->ws) {
        void **o = (void **)realloc(c->ws_old, sizeof(void *) * (size_t)(c->n_ws_old + 1));
        if (!o) return cu_err(err, DSV4_ENOMEM, "cuda: workspace: out of host memory");
        c->ws_old = o;
    }
    size_t want = bytes + bytes / 4; /* some headroom: fewer regrowths */
    if (want < 2 * c->ws_bytes) want = 2 * c->ws_bytes;
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, want, c->stream);
    if (e != cudaSuccess)
        return cu_err(err, DSV4_ENOMEM, "cuda: workspace of %zu bytes: %s", want, cudaGetErrorString(e));
    if (c->ws) c->ws_old[c->n_ws_old++] = c->ws;
    c->ws = p;
    c->ws_bytes = want;
    return DSV4_OK;
}

int cu_workspace(dsv4_cuda_ctx *c, size_t bytes, void **out, dsv4_err *err) {
    int rc = dsv4_cuda_workspace_reserve(c, bytes, err);
    if (rc) return rc;
    *out = c->ws;
    return DSV4_OK;
}

/* ------------------------------------------------------------- scratch arena */

int cu_arena_reserve(dsv4_cuda_ctx *c, dsv4_err *err) {
    if (!c->ar_mode || c->ar_base) return DSV4_OK;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CU_TRY(cudaStreamIsCapturing(c->stream, &st), err, "capture status");
    if (st != cudaStreamCaptureStatusNone) return DSV4_OK; /* next time, outside capture */
    const char *mb = getenv("DSV4_CUDA_SCRATCH_MB");
    size_t cap = (size_t)(mb ? atol(mb) : 512) << 20; /* 64 x 6-row verify at Flash shapes: ~300 MB */
    void *p = NULL;
    /* from the device pool, stream-ordered: no host wait (see dsv4_cuda_workspace_reserve) */
    cudaError_t e = cudaMallocAsync(&p, cap, c->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        c->ar_mode = 0; /* no room: every scratch comes from the pool, as before */
        return DSV4_OK;
    }
    c->ar_base = (unsigned char *)p;
    c->ar_cap = cap;
    c->ar_top = 0;
    c->ar_n = 0;
    return DSV4_OK;
}

int cu_arena_alloc(dsv4_cuda_ctx *c, size_t bytes, void **out, dsv4_err *err) {
    const size_t n = cu_align(bytes ? bytes : 1);
    void *p = NULL;
    if (c->ar_base && c->ar_n < CU_ARENA_MAX && n <= c->ar_cap - c->ar_top) {
        p = c->ar_base + c->ar_top;
        c->ar_ent[c->ar_n].off = c->ar_top;
        c->ar_ent[c->ar_n].end = c->ar_top + n;
        c->ar_ent[c->ar_n].live = 1;
        c->ar_n++;
        c->ar_top += n;
        if (c->ar_top > c->ar_peak) c->ar_peak = c->ar_top;
    } else {
        cudaError_t e = cudaMallocAsync(&p, n, c->stream);
        if (e != cudaSuccess)
            return cu_err(err, e == cudaErrorMemoryAllocation ? DSV4_ENOMEM : DSV4_EBACKEND,
                          "cuda: scratch of %zu bytes: %s", n, cudaGetErrorString(e));
        if (c->ar_base) c->ar_fallbacks++;
    }
    if (c->ar_poison) CU_TRY(cudaMemsetAsync(p, 0xff, n, c->stream), err, "scratch poison");
    *out = p;
    return DSV4_OK;
}

void cu_arena_free(dsv4_cuda_ctx *c, void *p) {
    if (!p) return;
    if (!cu_arena_owns(c, p)) {
        cudaFreeAsync(p, c->stream);
        return;
    }
    const size_t off = (size_t)((unsigned char *)p - c->ar_base);
    for (int i = c->ar_n - 1; i >= 0; i--)
        if (c->ar_ent[i].off == off && c->ar_ent[i].live) {
            c->ar_ent[i].live = 0;
            break;
        }
    while (c->ar_n > 0 && !c->ar_ent[c->ar_n - 1].live) c->ar_n--;
    c->ar_top = c->ar_n ? c->ar_ent[c->ar_n - 1].end : 0;
}

/* ------------------------------------------------------------------ ceilings */

/* Sum of every 16-byte word: each element read once, coalesced; the sum is
 * written so the loads cannot be dropped. */
__global__ void k_stream_read(const uint4 *p, size_t n16, unsigned *sink) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride);
        uint4 c = ld_stream(p + i + 2 * stride), d = ld_stream(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^
               d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = ld_stream(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

extern "C" void dsv4_cuda_profiler(int on) {
    if (on) (void)cudaProfilerStart();
    else (void)cudaProfilerStop();
}

extern "C" int dsv4_cuda_read_bytes(dsv4_cuda_ctx *c, const void *p, size_t bytes, dsv4_err *err) {
    if (!c || !p || (bytes & 15)) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_read_bytes: bad argument");
    static unsigned *sink = NULL; /* never written in practice (see k_stream_read) */
    if (!sink) CU_TRY(cudaMalloc(&sink, 4), err, "read sink");
    size_t n16 = bytes / 16;
    unsigned blocks = (unsigned)((n16 + 4 * 512 - 1) / (4 * 512));
    unsigned maxb = (unsigned)c->prop.multiProcessorCount * 8;
    if (blocks > maxb) blocks = maxb;
    if (blocks < 1) blocks = 1;
    k_stream_read<<<blocks, 512, 0, c->stream>>>((const uint4 *)p, n16, sink);
    CU_LAUNCHED(err, "read kernel");
    return DSV4_OK;
}

extern "C" int dsv4_cuda_measure_hbm(dsv4_cuda_ctx *c, size_t bytes, double *read_gbs,
                                     double *copy_gbs, dsv4_err *err) {
    if (!c || !read_gbs || !copy_gbs) return cu_err(err, DSV4_EINVAL, "dsv4_cuda_measure_hbm: NULL argument");
    bytes &= ~(size_t)4095;
    void *a = NULL, *b = NULL;
    unsigned *sink = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = DSV4_OK;
    float best_r = 1e30f, best_c = 1e30f;
#define M_TRY(call, what)                                                                    \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            rc = cu_err(err, DSV4_EBACKEND, "cuda: hbm: %s: %s", what, cudaGetErrorString(e_)); \
            goto out;                                                                        \
        }                                                                                    \
    } while (0)
    M_TRY(cudaMalloc(&a, bytes), "alloc");
    M_TRY(cudaMalloc(&b, bytes), "alloc");
    M_TRY(cudaMalloc(&sink, 4), "alloc");
    M_TRY(cudaMemsetAsync(a, 0x5a, bytes, c->stream), "memset");
    M_TRY(cudaEventCreate(&e0), "event");
    M_TRY(cudaEventCreate(&e1), "event");
    for (int it = 0; it < 6; it++) {
        float ms = 0;
        M_TRY(cudaEventRecord(e0, c->stream), "record");
        k_stream_read<<<c->prop.multiProcessorCount * 8, 512, 0, c->stream>>>(
            (const uint4 *)a, bytes / 16, sink);
        M_TRY(cudaGetLastError(), "read kernel");
        M_TRY(cudaEventRecord(e1, c->stream), "record");
        M_TRY(cudaEventSynchronize(e1), "sync");
        M_TRY(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
        if (it > 0 && ms < best_r) best_r = ms;
        M_TRY(cudaEventRecord(e0, c->stream), "record");
        M_TRY(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
        M_TRY(cudaEventRecord(e1, c->stream), "record");
        M_TRY(cudaEventSynchronize(e1), "sync");
        M_TRY(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
        if (it > 0 && ms < best_c) best_c = ms;
    }
    *read_gbs = (double)bytes / (best_r * 1e-3) / 1e9;
    *copy_gbs = 2.0 * (double)bytes / (best_c * 1e-3) / 1e9;
#undef M_TRY
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (sink) cudaFree(sink);
    return rc;
}
