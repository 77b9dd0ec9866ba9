/*
 * dummy_fill.h — the element values of dummy weights (backend.h dsv4_fill),
 * shared by the CPU fill (cpu/cpu_fill.c) and the CUDA kernels
 * (cuda/cuda_fill.cu), so both backends materialise bit-identical tensors.
 *
 * Why a counter hash and not a PRNG stream: element i is a pure function of
 * (seed, i), so a GPU thread per element needs no state, and a CUDA layout
 * that stores elements in another order (repacked FP4) can still produce the
 * value of the logical element it holds.
 *
 * Why doubles with explicit roundings: center + half·u is evaluated as one
 * double multiply and one double add (no FMA contraction: __dmul_rn /
 * __dadd_rn on the device; the C build is ISO C11, where GCC does not
 * contract), then rounded once to float — the same bits on both sides.
 */
#ifndef DSV4_BACKEND_DUMMY_FILL_H
#define DSV4_BACKEND_DUMMY_FILL_H

#include <stdint.h>

#include "backend/backend.h"

#ifdef __CUDACC__
#define DSV4_FILL_FN static __host__ __device__ __forceinline__
#else
#define DSV4_FILL_FN static inline
#endif

/* splitmix64 finaliser of seed + (i+1)·golden: a well-mixed 64-bit hash. */
DSV4_FILL_FN uint64_t dsv4_fill_hash(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The whole tensor's element index of a slice's element i (backend.h dsv4_fill map_*). */
DSV4_FILL_FN uint64_t dsv4_fill_map(const dsv4_fill *f, uint64_t i) {
    if (f->map_cols > 0) {
        uint64_t c = (uint64_t)f->map_cols;
        return f->map_off + (i / c) * (uint64_t)f->map_stride + i % c;
    }
    return f->map_off + i;
}

/* UNIFORM element i as float: center + half·u, u = (24-bit integer)/2^23 in [-1, 1). */
DSV4_FILL_FN float dsv4_fill_uniform(const dsv4_fill *f, uint64_t i) {
    i = dsv4_fill_map(f, i);
    int32_t u = (int32_t)(dsv4_fill_hash(f->seed, i) >> 40) - (1 << 23);
    double step = f->half * (1.0 / 8388608.0);
#ifdef __CUDA_ARCH__
    double v = __dadd_rn(__dmul_rn((double)u, step), f->center);
#else
    double v = (double)u * step + f->center;
#endif
    return (float)v;
}

/* fp32 -> bf16 bits, round to nearest even (inputs are finite). */
DSV4_FILL_FN uint16_t dsv4_fill_bf16(float x) {
    union {
        float f;
        uint32_t u;
    } c;
    c.f = x;
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

/* One byte for E4M3 / E8M0 / BYTES element i. BYTES (packed FP4, 97% of
 * the model) takes 8 bytes from one hash: byte i is byte i mod 8 (little
 * end first) of hash(seed, i / 8). */
DSV4_FILL_FN uint8_t dsv4_fill_byte(const dsv4_fill *f, uint64_t i) {
    i = dsv4_fill_map(f, i);
    uint64_t h = f->kind == DSV4_FILL_BYTES ? 0 : dsv4_fill_hash(f->seed, i);
    switch (f->kind) {
    case DSV4_FILL_E4M3: return (uint8_t)(((h >> 63) << 7) | ((h >> 32) % (uint64_t)(f->hi + 1)));
    case DSV4_FILL_E8M0: return (uint8_t)(f->lo + (int)((h >> 32) % (uint64_t)(f->hi - f->lo + 1)));
    default: return (uint8_t)(dsv4_fill_hash(f->seed, i >> 3) >> (8 * (i & 7)));
    }
}

/* INDEX element i of a [rows, k] table: row r = i / k holds
 * start + j·step (mod n), j < k, with (k-1)·step < n, so the k ids of a row
 * are distinct (tid2eid rows name k different experts). */
DSV4_FILL_FN int64_t dsv4_fill_index(const dsv4_fill *f, uint64_t i, int64_t k) {
    i = dsv4_fill_map(f, i);
    uint64_t n = (uint64_t)f->hi, r = i / (uint64_t)k, j = i % (uint64_t)k;
    uint64_t h = dsv4_fill_hash(f->seed, r);
    uint64_t span = k > 1 ? (n - 1) / (uint64_t)(k - 1) : 1;
    if (span < 1) span = 1;
    uint64_t start = (h & 0xffffffffull) % n, step = 1 + (h >> 32) % span;
    return (int64_t)((start + j * step) % n);
}

#endif
