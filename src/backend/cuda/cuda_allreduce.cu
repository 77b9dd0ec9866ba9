/*
 * cuda_allreduce.cu — one-shot all-reduce of small messages over NVLink peer
 * memory (issue 7; spec/PERFORMANCE.md §1), the decode-step alternative to
 * NCCL for the two all-reduces per layer of one 4096-wide row per token.
 *
 * Why not NCCL for these: an NCCL all-reduce of 16 KB costs ~11 µs on the
 * 2x H200 machine (2026-11-30-tp2-cuda-h200x2.md), flat up to ~1 MB — pure
 * latency (protocol set-up, a ring of steps, several fences). 86 per step.
 *
 * Design (facts from NCCL's "LL" protocol and the vLLM / TensorRT-LLM one-shot
 * kernels; the code is ours):
 *  - Setup, once: peer access between every pair of GPUs; on every GPU a
 *    receive area [2 parities][n ranks][cap lines] of 16-byte lines, zeroed,
 *    plus a step counter (`epoch`) and a block-arrival counter in its own
 *    memory. Every rank keeps the peer addresses of the others' areas.
 *  - One kernel per call, in stream order on the rank's backend stream (no
 *    host involvement, no cudaMemcpy): line j carries 8 bytes of the message
 *    (2 F32 or 4 BF16 elements) plus the call's epoch twice, as
 *    {data.lo, epoch, data.hi, epoch}. Each thread PUSHES its lines into every
 *    peer's area (row = its own rank) with one 16-byte volatile store, then
 *    polls its own area until each peer's line shows the epoch in both flag
 *    words (8-byte halves of a 16-byte store are each seen whole, so a line
 *    with both flags right holds that call's data). No fences and no separate
 *    flag writes: one NVLink crossing of latency, not a write + fence + flag +
 *    read round trip.
 *  - Sum in rank order 0..N-1 in F32 (the rank's own part from its registers,
 *    the others' from the lines), rounded once to the message dtype: every rank
 *    computes the same additions in the same order, so the results are
 *    bit-identical on every rank (and, for 2 ranks, equal to NCCL's r0 + r1).
 *  - Graph replay: the epoch is read from device memory at the start and the
 *    last block to finish (arrival counter) writes epoch + 1, so a captured
 *    graph advances it on every replay; the ranks stay in step because they
 *    make the same sequence of calls. Flags are never reused (32-bit epochs),
 *    so stale lines of an older call never look ready.
 *  - Why two parities suffice: a peer writes parity p again at call e+2 only
 *    after it finished call e+1, which needed our e+1 lines, which we push
 *    only after our call-e kernel (the last reader of parity p) has ended.
 *  - Abort: every spin also watches a word in pinned host memory; `abort`
 *    sets it, so a kernel whose peer died returns (with a wrong sum; the
 *    communicator is dead by then) instead of spinning forever.
 * Never multicast / NVLS: plain peer loads and stores (the GPU machine's notes).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"

#define AR_MAX_RANKS 8
#define AR_THREADS 256
#define AR_MAX_BLOCKS 128

struct dsv4_cuda_oneshot {
    int rank, n, device;
    int64_t cap_lines;          /* lines per (parity, source rank) */
    uint4 *recv;                /* this rank's [2][n][cap_lines] */
    unsigned *ctr;              /* this rank's {epoch, arrivals} */
    unsigned *abort_h;          /* pinned host word: nonzero = stop waiting */
    unsigned *abort_d;          /* its device address */
    uint4 *peer_recv[AR_MAX_RANKS];
};

struct ar_args {
    uint4 *recv[AR_MAX_RANKS]; /* every rank's receive area (peer addresses; own for own rank) */
};

__device__ __forceinline__ void st_line(uint4 *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ uint4 ld_line(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

/* Elements per 8-byte payload, and storing one summed element (partial tail lines write only [0, n)). */
template <typename T> struct ar_elt;
template <> struct ar_elt<float> {
    enum { PER = 2 };
    static __device__ __forceinline__ void put(float *x, int64_t i, float v) { x[i] = v; }
};
template <> struct ar_elt<__nv_bfloat16> {
    enum { PER = 4 };
    static __device__ __forceinline__ void put(__nv_bfloat16 *x, int64_t i, float v) { x[i] = __float2bfloat16(v); }
};

/* payload of line j of x (zeros past n) as two 32-bit words */
template <typename T> __device__ __forceinline__ uint2 load_payload(const T *x, int64_t j, int64_t n);
template <> __device__ __forceinline__ uint2 load_payload<float>(const float *x, int64_t j, int64_t n) {
    int64_t i = j * 2;
    if (i + 1 < n && !((uintptr_t)(x + i) & 7)) return *(const uint2 *)(x + i);
    uint2 p;
    p.x = __float_as_uint(x[i]);
    p.y = i + 1 < n ? __float_as_uint(x[i + 1]) : 0u;
    return p;
}
template <>
__device__ __forceinline__ uint2 load_payload<__nv_bfloat16>(const __nv_bfloat16 *x, int64_t j, int64_t n) {
    int64_t i = j * 4;
    if (i + 3 < n && !((uintptr_t)(x + i) & 7)) return *(const uint2 *)(x + i);
    unsigned short h[4];
    const unsigned short *xs = (const unsigned short *)x;
#pragma unroll
    for (int k = 0; k < 4; k++) h[k] = i + k < n ? xs[i + k] : (unsigned short)0;
    return make_uint2((unsigned)h[0] | ((unsigned)h[1] << 16), (unsigned)h[2] | ((unsigned)h[3] << 16));
}

template <typename T> __device__ __forceinline__ void unpack(uint2 p, float *v);
template <> __device__ __forceinline__ void unpack<float>(uint2 p, float *v) {
    v[0] = __uint_as_float(p.x);
    v[1] = __uint_as_float(p.y);
}
template <> __device__ __forceinline__ void unpack<__nv_bfloat16>(uint2 p, float *v) {
    v[0] = __uint_as_float(p.x << 16);
    v[1] = __uint_as_float(p.x & 0xffff0000u);
    v[2] = __uint_as_float(p.y << 16);
    v[3] = __uint_as_float(p.y & 0xffff0000u);
}

/* Wait until `line` holds epoch e in both flag words; gives up (returns zeros) once *abort_w is set. */
__device__ __forceinline__ uint2 wait_line(const uint4 *line, unsigned e, const volatile unsigned *abort_w) {
    uint4 v = ld_line(line);
    unsigned spins = 0;
    while (v.y != e || v.w != e) {
        if (!(++spins & 0xfffu) && *abort_w) return make_uint2(0, 0);
        v = ld_line(line);
    }
    return make_uint2(v.x, v.z);
}

template <typename T>
__global__ void __launch_bounds__(AR_THREADS)
    k_allreduce_ll(ar_args a, const uint4 *own, unsigned *ctr, const unsigned *abort_w, int rank, int n_ranks, T *x, int64_t n,
                   int64_t cap_lines) {
    typedef ar_elt<T> E;
    const unsigned e = *(volatile unsigned *)ctr + 1;
    const int64_t lines = (n + E::PER - 1) / E::PER;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, j0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t par = (int64_t)(e & 1u) * n_ranks;
    /* push: our lines into every peer's row `rank` */
    for (int64_t j = j0; j < lines; j += stride) {
        uint2 p = load_payload<T>(x, j, n);
        uint4 v = make_uint4(p.x, e, p.y, e);
#pragma unroll
        for (int k = 0; k < AR_MAX_RANKS; k++) /* unrolled: a.recv stays in parameter space */
            if (k < n_ranks && k != rank) st_line(a.recv[k] + (par + rank) * cap_lines + j, v);
    }
    /* pull from our own area, sum in rank order, write back in place */
    const uint4 *mine = own + par * cap_lines;
    for (int64_t j = j0; j < lines; j += stride) {
        float acc[E::PER], v[E::PER];
#pragma unroll
        for (int k = 0; k < AR_MAX_RANKS; k++) {
            if (k >= n_ranks) break;
            uint2 p = k == rank ? load_payload<T>(x, j, n) : wait_line(mine + (int64_t)k * cap_lines + j, e, abort_w);
            unpack<T>(p, v);
#pragma unroll
            for (int q = 0; q < E::PER; q++) acc[q] = k ? acc[q] + v[q] : v[q];
        }
#pragma unroll
        for (int q = 0; q < E::PER; q++)
            if (j * E::PER + q < n) E::put(x, j * E::PER + q, acc[q]);
    }
    /* the last block to arrive advances the epoch (every block has read it by then) */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&ctr[1], 1u) == gridDim.x - 1) {
            ctr[1] = 0;
            *(volatile unsigned *)ctr = e;
        }
    }
}

extern "C" int dsv4_cuda_oneshot_create(int n, int64_t cap_bytes, dsv4_cuda_oneshot **ranks, dsv4_err *err) {
    for (int r = 0; r < n && r < AR_MAX_RANKS; r++) ranks[r] = NULL;
    if (n < 2 || n > AR_MAX_RANKS || cap_bytes < 8)
        return dsv4_err_set(err, DSV4_EINVAL, "one-shot all-reduce: %d ranks (2..%d), %lld bytes", n, AR_MAX_RANKS,
                            (long long)cap_bytes);
    int prev = 0;
    cudaGetDevice(&prev);
    int64_t cap_lines = (cap_bytes + 7) / 8;
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
        h->cap_lines = cap_lines;
        cudaError_t e = cudaSetDevice(r);
        for (int k = 0; k < n && e == cudaSuccess && !rc; k++) {
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
        size_t area = sizeof(uint4) * 2 * (size_t)n * (size_t)cap_lines;
        if (!rc && e == cudaSuccess) e = cudaMalloc((void **)&h->recv, area);
        if (!rc && e == cudaSuccess) e = cudaMemset(h->recv, 0, area);
        if (!rc && e == cudaSuccess) e = cudaMalloc((void **)&h->ctr, 2 * sizeof(unsigned));
        if (!rc && e == cudaSuccess) e = cudaMemset(h->ctr, 0, 2 * sizeof(unsigned));
        if (!rc && e == cudaSuccess)
            e = cudaHostAlloc((void **)&h->abort_h, sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable);
        if (!rc && e == cudaSuccess) *(volatile unsigned *)h->abort_h = 0;
        if (!rc && e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&h->abort_d, h->abort_h, 0);
        if (!rc && e == cudaSuccess) e = cudaDeviceSynchronize();
        if (!rc && e != cudaSuccess)
            rc = dsv4_err_set(err, DSV4_EBACKEND, "one-shot all-reduce: GPU %d: %s", r, cudaGetErrorString(e));
    }
    for (int r = 0; r < n && !rc; r++)
        for (int k = 0; k < n; k++) ranks[r]->peer_recv[k] = ranks[k]->recv;
    cudaSetDevice(prev);
    if (rc) {
        cudaGetLastError();
        for (int r = 0; r < n; r++) {
            dsv4_cuda_oneshot_free(ranks[r]);
            ranks[r] = NULL;
        }
    }
    return rc;
}

extern "C" int64_t dsv4_cuda_oneshot_capacity(const dsv4_cuda_oneshot *h) { return h ? h->cap_lines * 8 : 0; }

extern "C" int dsv4_cuda_oneshot_all_reduce(dsv4_cuda_oneshot *h, void *x, int64_t n, int bf16, void *stream,
                                            dsv4_err *err) {
    if (n <= 0) return 0;
    int64_t bytes = n * (bf16 ? 2 : 4), lines = (bytes + 7) / 8;
    if (lines > h->cap_lines)
        return dsv4_err_set(err, DSV4_EINVAL, "one-shot all-reduce: %lld bytes > capacity %lld", (long long)bytes,
                            (long long)(h->cap_lines * 8));
    ar_args a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < h->n; k++) a.recv[k] = h->peer_recv[k];
    int64_t nb = (lines + AR_THREADS - 1) / AR_THREADS;
    int blocks = (int)(nb > AR_MAX_BLOCKS ? AR_MAX_BLOCKS : nb);
    cudaStream_t st = (cudaStream_t)stream;
    if (bf16)
        k_allreduce_ll<__nv_bfloat16><<<blocks, AR_THREADS, 0, st>>>(a, h->recv, h->ctr, h->abort_d, h->rank, h->n,
                                                                     (__nv_bfloat16 *)x, n, h->cap_lines);
    else
        k_allreduce_ll<float><<<blocks, AR_THREADS, 0, st>>>(a, h->recv, h->ctr, h->abort_d, h->rank, h->n, (float *)x, n,
                                                             h->cap_lines);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_err_set(err, DSV4_EBACKEND, "one-shot all-reduce: rank %d: %s", h->rank, cudaGetErrorString(e));
    return 0;
}

extern "C" void dsv4_cuda_oneshot_abort(dsv4_cuda_oneshot *h) {
    if (h && h->abort_h) __atomic_store_n(h->abort_h, 1u, __ATOMIC_RELEASE);
}

extern "C" void dsv4_cuda_oneshot_free(dsv4_cuda_oneshot *h) {
    if (!h) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(h->device);
    cudaDeviceSynchronize();
    cudaFree(h->recv);
    cudaFree(h->ctr);
    if (h->abort_h) cudaFreeHost(h->abort_h);
    cudaSetDevice(prev);
    cudaGetLastError();
    free(h);
}
