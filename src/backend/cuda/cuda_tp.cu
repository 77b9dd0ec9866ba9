/*
 * cuda_tp.cu — the few CUDA runtime calls tensor parallelism needs outside a
 * backend (cuda_backend.h): how many GPUs there are, and binding a rank's
 * thread to its GPU. Why apart from cuda_ctx.cu: the TP runner is plain C
 * built with or without CUDA; these are its only entry points into the runtime.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

extern "C" int dsv4_cuda_device_count(dsv4_err *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it for the next caller */
        dsv4_err_set(err, DSV4_EBACKEND, "cuda: counting GPUs: %s", cudaGetErrorString(e));
        return -1;
    }
    return n;
}

extern "C" int dsv4_cuda_bind(int device, dsv4_err *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return dsv4_err_set(err, DSV4_EBACKEND, "cuda: GPU %d: %s", device, cudaGetErrorString(e));
    return 0;
}

/* ------------------------------------------------------------------------
 * One-shot all-reduce over NVLink peer memory (issue 7; spec/PERFORMANCE.md
 * §1: an NCCL all-reduce of one 4096-wide row costs ~20 µs on these H200s,
 * flat up to ~1 MB, while a decode step's weights stream in ~1.25 ms per GPU
 * — 86 such calls per step would cost more than the weights).
 *
 * How: every rank owns a staging buffer (two halves, alternating by call) and
 * a flag array in its GPU memory; peer access makes the other ranks' buffers
 * and flags addressable. One kernel per call, in stream order: block b of
 * rank r copies chunk b of x into its own staging half, fences, writes the
 * call's epoch into flag[b][r] of every peer, waits until its own flag[b][k]
 * holds the epoch for every k, then sums chunk b of all ranks' staging
 * halves in rank order 0..N-1 (so every rank gets bit-identical sums) back
 * into x. Blocks never wait on each other (each chunk has its own flags).
 * Why two halves suffice: a peer overwrites half p at call e+2 only after
 * its call e+1 kernel ran, which waited for our e+1 signal, which we gave
 * after our call e kernel (the last reader of half p) had finished.
 * The epoch lives in device memory (per block) and is bumped by the kernel,
 * so a CUDA graph that contains the call stays valid on every replay.
 * Never multicast: plain peer loads and stores (the GPU machine's notes).
 * ---------------------------------------------------------------------- */

#define OS_MAX_RANKS 8
#define OS_MAX_BLOCKS 64
#define OS_THREADS 512

struct dsv4_cuda_oneshot {
    int rank, n, device;
    int64_t cap;                                  /* floats per staging half */
    float *stage;                                 /* this rank's [2][cap] */
    unsigned *flags;                              /* this rank's [OS_MAX_BLOCKS][OS_MAX_RANKS] */
    unsigned *epoch;                              /* this rank's [OS_MAX_BLOCKS] */
    float *peer_stage[OS_MAX_RANKS];              /* every rank's stage (peer addresses) */
    unsigned *peer_flags[OS_MAX_RANKS];
};

struct os_args {
    float *stage[OS_MAX_RANKS];
    unsigned *flags[OS_MAX_RANKS];
};

__global__ void k_oneshot(os_args a, unsigned *epoch, int rank, int n_ranks, float *x, int64_t n, int64_t cap) {
    int b = blockIdx.x;
    __shared__ unsigned e_s;
    if (threadIdx.x == 0) e_s = epoch[b] + 1;
    __syncthreads();
    unsigned e = e_s;
    int64_t per = (n + gridDim.x - 1) / gridDim.x, lo = (int64_t)b * per, hi = lo + per < n ? lo + per : n;
    float *mine = a.stage[rank] + (int64_t)(e & 1) * cap;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = x[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x < n_ranks) /* signal every rank (ourselves too: one code path) */
        *(volatile unsigned *)&a.flags[threadIdx.x][b * OS_MAX_RANKS + rank] = e;
    if (threadIdx.x < n_ranks) {
        volatile unsigned *f = &a.flags[rank][b * OS_MAX_RANKS + threadIdx.x];
        while (*f != e) {}
    }
    __threadfence_system();
    __syncthreads();
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float s = __ldcg(a.stage[0] + (int64_t)(e & 1) * cap + i);
        for (int k = 1; k < n_ranks; k++) s += __ldcg(a.stage[k] + (int64_t)(e & 1) * cap + i);
        x[i] = s;
    }
    if (threadIdx.x == 0) epoch[b] = e;
}

extern "C" int dsv4_cuda_oneshot_create(int n, int64_t cap_floats, dsv4_cuda_oneshot **ranks, dsv4_err *err) {
    if (n < 2 || n > OS_MAX_RANKS || cap_floats < 1)
        return dsv4_err_set(err, DSV4_EINVAL, "one-shot all-reduce: %d ranks (2..%d)", n, OS_MAX_RANKS);
    int prev = 0;
    cudaGetDevice(&prev);
    for (int r = 0; r < n; r++) ranks[r] = NULL;
    int rc = 0;
    for (int r = 0; r < n && !rc; r++) {
        dsv4_cuda_oneshot *h = (dsv4_cuda_oneshot *)calloc(1, sizeof *h);
        if (!h) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "one-shot all-reduce: out of memory");
            break;
        }
        ranks[r] = h;
        h->rank = r;
        h->n = n;
        h->device = r;
        h->cap = cap_floats;
        cudaError_t e = cudaSetDevice(r);
        for (int k = 0; k < n && e == cudaSuccess; k++) {
            if (k == r) continue;
            int can = 0;
            e = cudaDeviceCanAccessPeer(&can, r, k);
            if (e == cudaSuccess && !can) {
                rc = dsv4_err_set(err, DSV4_EUNSUPPORTED, "one-shot all-reduce: GPU %d cannot reach GPU %d", r, k);
                break;
            }
            if (e == cudaSuccess) {
                e = cudaDeviceEnablePeerAccess(k, 0);
                if (e == cudaErrorPeerAccessAlreadyEnabled) {
                    cudaGetLastError();
                    e = cudaSuccess;
                }
            }
        }
        if (!rc && e == cudaSuccess) e = cudaMalloc((void **)&h->stage, sizeof(float) * 2 * (size_t)cap_floats);
        if (!rc && e == cudaSuccess) e = cudaMalloc((void **)&h->flags, sizeof(unsigned) * OS_MAX_BLOCKS * OS_MAX_RANKS);
        if (!rc && e == cudaSuccess) e = cudaMemset(h->flags, 0, sizeof(unsigned) * OS_MAX_BLOCKS * OS_MAX_RANKS);
        if (!rc && e == cudaSuccess) e = cudaMalloc((void **)&h->epoch, sizeof(unsigned) * OS_MAX_BLOCKS);
        if (!rc && e == cudaSuccess) e = cudaMemset(h->epoch, 0, sizeof(unsigned) * OS_MAX_BLOCKS);
        if (!rc && e == cudaSuccess) e = cudaDeviceSynchronize();
        if (!rc && e != cudaSuccess)
            rc = dsv4_err_set(err, DSV4_EBACKEND, "one-shot all-reduce: GPU %d: %s", r, cudaGetErrorString(e));
    }
    for (int r = 0; r < n && !rc; r++)
        for (int k = 0; k < n; k++) {
            ranks[r]->peer_stage[k] = ranks[k]->stage;
            ranks[r]->peer_flags[k] = ranks[k]->flags;
        }
    cudaSetDevice(prev);
    if (rc) {
        for (int r = 0; r < n; r++) dsv4_cuda_oneshot_free(ranks[r]);
        for (int r = 0; r < n; r++) ranks[r] = NULL;
    }
    return rc;
}

extern "C" int64_t dsv4_cuda_oneshot_capacity(const dsv4_cuda_oneshot *h) { return h ? h->cap : 0; }

extern "C" int dsv4_cuda_oneshot_all_reduce(dsv4_cuda_oneshot *h, float *x, int64_t n, void *stream, dsv4_err *err) {
    if (n <= 0) return 0;
    if (n > h->cap)
        return dsv4_err_set(err, DSV4_EINVAL, "one-shot all-reduce: %lld floats > capacity %lld", (long long)n,
                            (long long)h->cap);
    os_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < h->n; k++) {
        a.stage[k] = h->peer_stage[k];
        a.flags[k] = h->peer_flags[k];
    }
    /* ~8K floats a block (32 KB): one block for a 4096-wide row, up to OS_MAX_BLOCKS */
    int64_t nb = (n + 8191) / 8192;
    int blocks = (int)(nb < 1 ? 1 : nb > OS_MAX_BLOCKS ? OS_MAX_BLOCKS : nb);
    k_oneshot<<<blocks, OS_THREADS, 0, (cudaStream_t)stream>>>(a, h->epoch, h->rank, h->n, x, n, h->cap);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_err_set(err, DSV4_EBACKEND, "one-shot all-reduce: rank %d: %s", h->rank, cudaGetErrorString(e));
    return 0;
}

extern "C" void dsv4_cuda_oneshot_free(dsv4_cuda_oneshot *h) {
    if (!h) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(h->device);
    cudaDeviceSynchronize();
    cudaFree(h->stage);
    cudaFree(h->flags);
    cudaFree(h->epoch);
    cudaSetDevice(prev);
    free(h);
}
