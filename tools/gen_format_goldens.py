#!/usr/bin/env python3
"""Golden tables for the number formats of spec/MODEL.md §2.3-2.4, from ml_dtypes.

The C tests (tests/unit/test_formats.c) compare src/model/formats.c against
these tables. ml_dtypes is an independent implementation of the OCP formats
(float8_e4m3fn, float8_e8m0fnu, float4_e2m1fn, bfloat16); it does not
saturate E4M3 (|x| >= 464 -> NaN), so encode inputs stay inside +-464 and the
saturating cases are tested from the definition in C.

Output (little-endian raw arrays, deterministic, a few KB):
  e4m3_decode.f32     256 float32, value of every E4M3FN code
  e8m0_decode.f32     256 float32, value of every E8M0 code
  e2m1_decode.f32     16 float32, value of every FP4 nibble
  bf16_enc_in.f32 / bf16_enc_out.u16        f32 -> bf16 RNE
  e4m3_enc_in.f32 / e4m3_enc_out.u8         f32 -> E4M3 RNE
  e2m1_enc_in.f32 / e2m1_enc_out.u8         f32 -> E2M1 RNE (saturating)
  actq_in.f32 (rows of 300) / actq_q.u8 / actq_s.f32   W8A8 activation
      quantiser of §2.4 (block 128, amax>=1e-4, s = 2^ceil(log2(amax*(1/448)))
      computed on fp32 bits as the official fast_round_scale does)

Usage: python3 tools/gen_format_goldens.py [outdir]   (default tests/fixtures/formats)
"""
import os
import sys

import ml_dtypes
import numpy as np

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "formats")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(20260731)


def save(name, arr):
    arr.tofile(os.path.join(out, name))


codes = np.arange(256, dtype=np.uint8)
save("e4m3_decode.f32", codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
save("e8m0_decode.f32", codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
nib = np.arange(16, dtype=np.uint8)
save("e2m1_decode.f32", nib.view(ml_dtypes.float4_e2m1fn).astype(np.float32))

# bf16: random bit patterns (all binades, incl. subnormals) + exact ties.
bits = rng.integers(0, 2**32, size=4000, dtype=np.uint64).astype(np.uint32)
ties = (rng.integers(0, 2**16, size=500, dtype=np.uint32) << 16) | 0x8000
x = np.concatenate([bits, ties]).view(np.float32)
x = x[np.isfinite(x)]
save("bf16_enc_in.f32", x)
save("bf16_enc_out.u16", x.astype(ml_dtypes.bfloat16).view(np.uint16))

# E4M3: every code's value, midpoints between neighbours (ties), random values.
vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
fin = np.unique(vals[np.isfinite(vals)].astype(np.float64))
mids = (fin[:-1] + fin[1:]) / 2
rnd = rng.uniform(-460, 460, size=2000) * np.exp2(rng.integers(-14, 1, size=2000))
x = np.concatenate([fin, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), rnd])
x = x.astype(np.float32)
x = x[np.abs(x) < 464]
save("e4m3_enc_in.f32", x)
save("e4m3_enc_out.u8", x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))

# E2M1: values, midpoints, random, beyond +-6 (ml_dtypes saturates here).
m = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
mids = (m[:-1] + m[1:]) / 2
x = np.concatenate([m, -m, mids, -mids, rng.uniform(-8, 8, size=1000)]).astype(np.float32)
save("e2m1_enc_in.f32", x)
save("e2m1_enc_out.u8", x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))


# Activation quantiser (W8A8, spec/MODEL.md §2.4).
def pow2_ceil_bits(v):
    b = np.asarray(v, dtype=np.float32).view(np.uint32)
    e = ((b >> 23) & 0xFF).astype(np.int64) - 127 + ((b & 0x7FFFFF) != 0)
    return ((e + 127).astype(np.uint32) << 23).view(np.float32)


rows, n, blk = 8, 300, 128
xs = (rng.standard_normal((rows, n)) * np.exp2(rng.integers(-20, 12, size=(rows, 1)))).astype(np.float32)
xs[3, :128] = 0.0                      # amax floor 1e-4
xs[4, 5] = np.float32(448 * 2.0**-3)   # exact power-of-two quotient
xs[5, :] = xs[5, :].astype(ml_dtypes.bfloat16).astype(np.float32)
qs, ss = [], []
inv = np.float32(1.0) / np.float32(448.0)
for r in range(rows):
    for b0 in range(0, n, blk):
        blkv = xs[r, b0:b0 + blk]
        amax = np.float32(max(np.float32(np.max(np.abs(blkv))), np.float32(1e-4)))
        s = pow2_ceil_bits(np.float32(amax * inv))
        v = np.clip(blkv / s, -448, 448).astype(np.float32)
        qs.append(v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
        ss.append(np.float32(s))
save("actq_in.f32", xs.reshape(-1))
save("actq_q.u8", np.concatenate(qs))
save("actq_s.f32", np.array(ss, dtype=np.float32))
print("wrote", out)
