/*
 * Number formats for the CPU reference backend (spec/MODEL.md §2.3, §2.4,
 * §3.4.2, §3.4.6): decoding stored weights (E4M3, E8M0, E2M1, BF16) and the
 * quantisation round-trips the official numerics apply to activations.
 * Plain scalar code: this is the definition, not the fast path.
 */
#ifndef DSV4_CPU_NUM_H
#define DSV4_CPU_NUM_H

#include <stdint.h>
#include "dsv4/common.h"

/* BF16 bits -> float (exact). */
float dsv4_cpu_bf16_to_f32(uint16_t h);
/* Round a float to the nearest BF16 value (ties to even), returned as float. */
float dsv4_cpu_round_bf16(float x);
/* E4M3FN byte -> float; NaN codes (0x7F/0xFF) decode to 0. */
float dsv4_cpu_e4m3_to_f32(uint8_t b);
/* E8M0 byte -> 2^(b-127). */
float dsv4_cpu_e8m0_to_f32(uint8_t b);
/* E2M1 nibble (bit 3 sign) -> float. */
float dsv4_cpu_e2m1_to_f32(unsigned nib);

/* Nearest E4M3 value of x (ties to even), saturating at ±448. */
float dsv4_cpu_round_e4m3(float x);
/* Nearest E2M1 value of x (ties to the even code), saturating at ±6. */
float dsv4_cpu_round_e2m1(float x);

/*
 * FP8 round-trip of n values in place: one power-of-two scale
 * s = 2^ceil(log2(max(amax, 1e-4)/448)), x <- E4M3(x/s)·s. Used per block
 * (64 for KV rows §3.4.2, 128 for W8A8 activations §2.4).
 */
void dsv4_cpu_fp8_roundtrip(float *x, int n);
/* FP4 round-trip of n values in place: s = 2^ceil(log2(max(amax, 6·2^-126)/6)). §3.4.6 */
void dsv4_cpu_fp4_roundtrip(float *x, int n);
/* Orthonormal Sylvester Hadamard transform of n = 2^k values in place (scaled by n^-½). */
void dsv4_cpu_hadamard(float *x, int n);

/* One element of a stored tensor (F32, BF16, F16) as float. */
float dsv4_cpu_load_f(const void *data, dsv4_dtype dt, int64_t i);

#endif
