"""Why the CUDA backend's moe_experts differs from the CPU reference by ~1.6e-2.

Emulates, in numpy + ml_dtypes, the two numerics of the routed experts on
random FP4 experts (spec/MODEL.md §3.5), W8A8 activation quantisation in both:
  - CPU reference backend: fp32 between the linears (g, u, h, expert outputs);
  - CUDA kernel (dsv4_cuda_moe): g, u, h·w and every expert output rounded to
    bf16, as the official code stores them (MODEL.md §3.10).
Prints the normalised error between the two at the tiny and the Flash
conformance shapes. The bf16-rounded h is then FP8-quantised, so a rounding
can move a value across an E4M3 step: that is what makes the gap ~1e-2
rather than ~1e-3. Used by bench/results/2026-11-30-cuda-backend-conformance-h200.md.
Usage: python3 tools/moe_bf16_numerics.py   (about a minute)
"""
import numpy as np, ml_dtypes
rng = np.random.default_rng(1)
def bf16(a): return a.astype(ml_dtypes.bfloat16).astype(np.float32)
def e4m3(a): return a.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
def q8(x):  # W8A8 activation quant per 128, pow2 scale
    x = x.reshape(x.shape[0], -1, 128)
    am = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-4)
    s = 2.0 ** np.ceil(np.log2(am / 448))
    return (e4m3(np.clip(x / s, -448, 448)) * s).reshape(x.shape[0], -1)
lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
def w4(o, i):
    return lut[rng.integers(0, 16, (o, i))] * (2.0 ** rng.integers(-6, -3, (o, i // 32))).repeat(32, 1)
for d, F, E, k, T in [(256, 128, 8, 2, 24), (4096, 2048, 16, 6, 4)]:
    W1 = [w4(F, d) for _ in range(E)]; W3 = [w4(F, d) for _ in range(E)]; W2 = [w4(d, F) for _ in range(E)]
    x = rng.uniform(-2, 2, (T, d)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]); wt = rng.uniform(0.1, 0.5, (T, k)).astype(np.float32)
    xq = q8(x)
    ys = []
    for cuda in (0, 1):
        y = np.zeros((T, d), np.float32)
        for t in range(T):
            for j in range(k):
                e = ids[t, j]
                g = xq[t:t+1] @ W1[e].T; u = xq[t:t+1] @ W3[e].T
                if cuda: g, u = bf16(g), bf16(u)
                g = np.minimum(g, 10); u = np.clip(u, -10, 10)
                h = g / (1 + np.exp(-g)) * u * wt[t, j]
                if cuda: h = bf16(h)
                o = q8(h) @ W2[e].T
                if cuda: o = bf16(o)
                y[t] += o[0]
        ys.append(y)
    print(d, F, E, k, T, "nerr cuda-numerics vs cpu-numerics: %.3e" % (np.linalg.norm(ys[1] - ys[0]) / np.linalg.norm(ys[0])))
