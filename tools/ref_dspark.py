#!/usr/bin/env python3
"""Independent PyTorch reference of the DSpark drafter (spec/DSPARK.md §2).

Written from the spec text, not from any C code of this repository, so that the C drafter
(src/model/dspark.c) can be validated against a second reading of the same document. The target
model that produces the context features is transformers' DeepseekV4ForCausalLM (fp32) loaded with
weights dequantised here (spec/MODEL.md §2.3); its streams are captured with forward hooks.

Usage:
    python3 tools/ref_dspark.py MODEL_DIR [--out tests/fixtures/ref/dspark]

Writes draft logits, greedy draft tokens and confidence for a few prompts and anchor positions, in
two numeric modes (below), in the format described in tools/REF_FORMAT.md.

Numeric modes
-------------
* "hf":  fp32 everywhere, no quantisation steps (matches an engine run in "HF mode", MODEL.md §3.10).
* "ref": fp32 arithmetic plus the discrete steps of the official numerics that move results far
         more than rounding does (MODEL.md §5.4b): W8A8 activation quantisation (FP8 E4M3, blocks of
         128 input elements, power-of-two scale) in front of every FP8/FP4 linear (wq_a, wq_b, wkv,
         wo_b, main_proj, shared and routed experts; not wo_a, gate, head, Markov, confidence), the
         FP8 round-trip of the 448 (head_dim - rope) nope dims of every drafter K/V row, ring rows
         and block rows alike (DSPARK.md §2.3 step 2, §2.4), and bf16-rounded attention
         probabilities (MODEL.md §3.4.7; the C CPU backend's reference numerics do the same).
         The official code's bf16 storage of activations is NOT emulated; compare "ref" results
         with a tolerance.
Both modes consume the same context features (computed once by the fp32 transformers target), and
the fixture stores those features, so the drafter can be validated in isolation from the target.

Choices where the sources differ, and the test that catches each one flipping
---------------------------------------------------------------------------------
The C side of every "C test" below is tests/unit/test_dspark_ref.c (src/model/dspark.c against
this fixture: per-case logits, the batched case, the trace replay, and an end-to-end run from the
C target's own features).
C1 Anchor position (DSPARK.md §4.8): the anchor token x0 sits at its own position P; block slot i is
   at position P+i; context = committed positions <= P-1. (vLLM-A puts it at P-1: wrong.)
   Caught by: C test comparing draft logits to this fixture (the fixture's index.json records
   `sensitivity.anchor_at_P_minus_1`, the change a P-1 convention causes, which is far above the
   tolerance); pytest test_anchor_convention_is_observable asserts that change is large.
C2 Tap points (DSPARK.md §2.2, §7.1): features = plain mean over the hc streams of the OUTPUT of
   target layers dspark_target_layer_ids (after the block's ffn hc-post), concatenated in list
   order; the last id's output is the residual fed to hc_head. (V4.1/"input of layer k" is wrong.)
   Caught by: C test comparing its captured features with `features` in the fixture;
   pytest test_tap_points (hook on layer L output == pre-hook input of layer L+1, last layer ==
   hc_head input) and test_tap_convention_is_observable (input-of-layer taps change the drafts).
C3 KV FP8 round-trip (DSPARK.md §2.3, §7.7): in "ref" mode applied to ring rows AND block K/V, after
   kv_norm and RoPE, on dims [0, head_dim - rope_dim) in groups of 64, amax floored at 1e-4, scale
   2^ceil(log2(amax/448)), E4M3 RNE; rope dims untouched. Off in "hf" mode.
   Caught by: C test against the "ref" fixture (`sensitivity.ref_without_kv_fp8` is large);
   pytest test_kv_roundtrip_properties and test_kv_roundtrip_is_observable.
C4 Ring update from accepted rows only (DSPARK.md §4.6): after a verify with a accepted of k, only
   positions P..P+a are written; rejected rows never reach the ring (they would overwrite a slot
   still inside the next window). Ring slot = position mod sliding_window; a write of more than
   `window` rows keeps only the last `window`.
   Caught by: pytest test_ring_accepted_rows_only (incremental ring == ring rebuilt from the
   committed sequence; writing the rejected rows changes the next draft),
   test_spec_trace_lossless_and_ring and test_ring_ignores_stale_slots (slots >= P of a reused
   ring are invisible); C side: replay `trace` (index.json) of the fixture (scripted partial acceptance).
C5 Noise token id: read `dspark_noise_token_id` from config.json, refuse if absent (never 0, never
   vocab_size). Caught by: pytest test_noise_id_required.
C6 Stage count: inferred from tensor names mtp.0..mtp.{S-1} (contiguous), never from
   num_nextn_predict_layers (which is 1 on 0731). Caught by: pytest test_stage_count_from_names.
C7 Draft stages are absolute layers num_hidden_layers + s: top-k routing with gate.bias, no hash
   routing even when num_hash_layers > s; RoPE theta = rope_theta without YaRN
   (compress_ratios[n+s] must be 0). Caught by: pytest test_no_hash_routing_in_stages.
C8 Shared expert uses the same +-swiglu_limit clamps as the routed experts (DSPARK.md §2.4).
   Caught by: C test against the fixture (the tiny checkpoint's clamps fire).
C9 Markov head: z_i = U_{i-1} + W2 . W1[prev_i], prev_1 = anchor, prev_{i+1} = d_i (greedy argmax).
   Caught by: pytest test_markov_teacher_forced.
C10 Confidence: raw logit w . [h_i ; e_i] with h_i the PRE-norm hc_head output of slot i-1 and e_i
   the Markov embedding of the token preceding draft i; c_i = sigmoid(logit). Both are stored.
C11 Block attention is non-causal inside the block (all gamma queries see all gamma block rows and
   the same context rows). Caught by: pytest test_block_is_noncausal.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# Checkpoint reading and dequantisation (spec/MODEL.md §2.1, §2.3), written from the format text:
# the safetensors header is parsed by hand and every number format is decoded from its bit layout,
# so nothing here depends on a library's FP8/FP4 support.
# --------------------------------------------------------------------------------------------


def _e4m3_table() -> np.ndarray:
    """fp32 value of each E4M3FN byte (MODEL.md §2.3): bias 7, no infinities, 0x7F/0xFF NaN."""
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m * 2.0 ** -9
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
# E2M1 code -> value (bit 3 sign, bits 2..0 magnitude index), MODEL.md §2.3.
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def e8m0(b: np.ndarray) -> np.ndarray:
    """E8M0 scale byte -> 2^(b-127); 255 is NaN and must not occur."""
    if np.any(b == 255):
        raise ValueError("E8M0 scale byte 255 (NaN)")
    return np.ldexp(np.float32(1.0), b.astype(np.int32) - 127).astype(np.float32)


def read_safetensors(path: str) -> dict:
    """name -> (dtype string, shape, raw bytes) of one .safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        b, e = h["data_offsets"]
        out[name] = (h["dtype"], tuple(h["shape"]), data[b:e])
    return out


def _raw_to_array(dtype: str, shape, raw: bytes) -> np.ndarray:
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape).copy()
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "I64":
        return np.frombuffer(raw, dtype="<i8").reshape(shape).copy()
    if dtype == "I32":
        return np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(shape)
    if dtype in ("F8_E4M3", "F8_E8M0", "I8", "U8"):
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape).copy()
    raise ValueError(f"unsupported safetensors dtype {dtype}")


def dequant_fp8(w: np.ndarray, s: np.ndarray, name: str) -> np.ndarray:
    """FP8 E4M3 [o,i] with E8M0 128x128 block scales [ceil(o/128), ceil(i/128)] -> fp32."""
    o, i = w.shape
    if s.shape != ((o + 127) // 128, (i + 127) // 128):
        raise ValueError(f"{name}: FP8 scale shape {s.shape} does not fit weight {w.shape}")
    sc = e8m0(s)
    sc = np.repeat(np.repeat(sc, 128, axis=0)[:o], 128, axis=1)[:, :i]
    v = E4M3[w]
    if np.isnan(v).any():
        raise ValueError(f"{name}: FP8 NaN code")
    return v * sc


def dequant_fp4(p: np.ndarray, s: np.ndarray, name: str) -> np.ndarray:
    """Packed E2M1 [o, i/2] (low nibble = even column) with E8M0 per-32 scales [o, i/32] -> fp32."""
    o, half = p.shape
    i = half * 2
    if s.shape != (o, i // 32):
        raise ValueError(f"{name}: FP4 scale shape {s.shape} does not fit packed weight {p.shape}")
    v = np.empty((o, i), dtype=np.float32)
    v[:, 0::2] = FP4[p & 0xF]
    v[:, 1::2] = FP4[p >> 4]
    return v * np.repeat(e8m0(s), 32, axis=1)


def load_checkpoint(model_dir: str):
    """Read config.json and every *.safetensors of MODEL_DIR.

    Returns (config dict, tensors: name -> torch fp32 (int64 for I64) with every quantised weight
    dequantised and its `.scale` consumed, quantised: set of weight names that were FP8/FP4).
    Fails on a `.scale` without its weight or a quantised weight without its scale.
    """
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    raw = {}
    files = sorted(x for x in os.listdir(model_dir) if x.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no .safetensors files")
    for fn in files:
        for k, v in read_safetensors(os.path.join(model_dir, fn)).items():
            if k in raw:
                raise ValueError(f"{fn}: tensor {k} appears twice")
            raw[k] = v
    tensors, quantised, used_scales = {}, set(), set()
    for name, (dt, shape, data) in raw.items():
        if name.endswith(".scale"):
            continue
        a = _raw_to_array(dt, shape, data)
        if dt in ("F8_E4M3", "I8"):
            sname = name[: -len("weight")] + "scale" if name.endswith(".weight") else None
            if sname is None or sname not in raw or raw[sname][0] != "F8_E8M0":
                raise ValueError(f"{name}: quantised weight ({dt}) without an F8_E8M0 .scale")
            s = _raw_to_array(*raw[sname])
            a = dequant_fp8(a, s, name) if dt == "F8_E4M3" else dequant_fp4(a, s, name)
            used_scales.add(sname)
            quantised.add(name)
        tensors[name] = torch.from_numpy(a)
    stray = [k for k in raw if k.endswith(".scale") and k not in used_scales]
    if stray:
        raise ValueError(f"scale tensors without a quantised weight: {stray[:4]}")
    return cfg, tensors, quantised


# --------------------------------------------------------------------------------------------
# Configuration of the drafter (DSPARK.md §2.1): everything is read, nothing is defaulted.
# --------------------------------------------------------------------------------------------


def count_stages(names, prefix="mtp") -> int:
    """Number of draft stages S from tensor names mtp.0..mtp.{S-1} (C6). Must be contiguous."""
    ids = sorted({int(m.group(1)) for n in names if (m := re.match(rf"{prefix}\.(\d+)\.", n))})
    if not ids:
        return 0
    if ids != list(range(len(ids))):
        raise ValueError(f"draft stages are not contiguous from 0: found mtp.{ids}")
    return len(ids)


@dataclass
class DraftConfig:
    hidden: int
    vocab: int
    n_layers: int
    n_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window: int
    rope_theta: float
    eps: float
    hc_mult: int
    hc_iters: int
    hc_eps: float
    n_experts: int
    top_k: int
    routed_scale: float
    swiglu_limit: float
    num_hash_layers: int
    block: int = 0  # gamma (DSpark only)
    target_layers: list = field(default_factory=list)
    noise_id: int = -1
    n_stages: int = 0
    markov_rank: int = 0

    def stage_layer_id(self, s: int) -> int:
        """Absolute layer id of draft stage s (C7): num_hidden_layers + s."""
        return self.n_layers + s


def _req(cfg: dict, key: str):
    if key not in cfg:
        raise ValueError(f"config.json: required key '{key}' is absent")
    return cfg[key]


def model_config(cfg: dict) -> DraftConfig:
    """Constants shared by every ratio-0 block (draft stages, MTP); no DSpark keys."""
    return DraftConfig(
        hidden=_req(cfg, "hidden_size"), vocab=_req(cfg, "vocab_size"),
        n_layers=_req(cfg, "num_hidden_layers"),
        n_heads=_req(cfg, "num_attention_heads"), head_dim=_req(cfg, "head_dim"),
        rope_dim=_req(cfg, "qk_rope_head_dim"), q_lora_rank=_req(cfg, "q_lora_rank"),
        o_groups=_req(cfg, "o_groups"), o_lora_rank=_req(cfg, "o_lora_rank"),
        window=_req(cfg, "sliding_window"), rope_theta=float(_req(cfg, "rope_theta")),
        eps=float(_req(cfg, "rms_norm_eps")), hc_mult=_req(cfg, "hc_mult"),
        hc_iters=_req(cfg, "hc_sinkhorn_iters"), hc_eps=float(_req(cfg, "hc_eps")),
        n_experts=_req(cfg, "n_routed_experts"), top_k=_req(cfg, "num_experts_per_tok"),
        routed_scale=float(_req(cfg, "routed_scaling_factor")),
        swiglu_limit=float(_req(cfg, "swiglu_limit")),
        num_hash_layers=cfg.get("num_hash_layers", 0),
    )


def draft_config(cfg: dict, tensor_names) -> DraftConfig:
    """Parse the drafter's constants. Refuses a missing dspark_noise_token_id (C5), infers the
    stage count from tensor names (C6) and checks compress_ratios of the stages are 0 (C7)."""
    c = model_config(cfg)
    tensor_names = set(tensor_names)
    S = count_stages(tensor_names)
    if S == 0:
        raise ValueError("no mtp.* tensors: not a DSpark checkpoint")
    if "mtp.0.main_proj.weight" not in tensor_names:
        raise ValueError("mtp.0.main_proj.weight absent: an MTP checkpoint, not DSpark")
    noise = _req(cfg, "dspark_noise_token_id")
    if not isinstance(noise, int) or isinstance(noise, bool) or not (0 <= noise < c.vocab):
        raise ValueError(f"config.json: dspark_noise_token_id {noise!r} is not a token id < {c.vocab}")
    ratios = _req(cfg, "compress_ratios")
    for s in range(S):
        lid = c.n_layers + s
        if lid < len(ratios) and ratios[lid] != 0:
            raise ValueError(f"compress_ratios[{lid}] = {ratios[lid]}: draft stages must be ratio 0")
    tl = list(_req(cfg, "dspark_target_layer_ids"))
    if not tl or any(not (0 <= L < c.n_layers) for L in tl):
        raise ValueError(f"dspark_target_layer_ids {tl} outside 0..{c.n_layers - 1}")
    c.block = _req(cfg, "dspark_block_size")
    c.target_layers, c.noise_id, c.n_stages = tl, noise, S
    c.markov_rank = cfg.get("dspark_markov_rank", 0)
    return c


# --------------------------------------------------------------------------------------------
# Numeric primitives (fp32). MODEL.md §0, §2.4, §3.2-3.5.
# --------------------------------------------------------------------------------------------


def fp8_roundtrip(x: torch.Tensor, group: int) -> torch.Tensor:
    """Quantise->dequantise along the last dim in groups: amax floored at 1e-4, scale
    2^ceil(log2(amax/448)), x/scale clamped to +-448, rounded to E4M3 (RNE). MODEL.md §2.4, §3.4.2."""
    shp = x.shape
    g = x.reshape(*shp[:-1], shp[-1] // group, group)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    q = (g / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * scale).reshape(shp)


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def rope(x: torch.Tensor, pos: torch.Tensor, rd: int, theta: float, inverse=False) -> torch.Tensor:
    """Interleaved (GPT-J) RoPE on the last rd dims of x [..., T, (heads,) D]; pos [T]. Plain base
    theta, no YaRN (draft stages and MTP are ratio-0 layers). MODEL.md §3.4.3."""
    omega = theta ** (-torch.arange(0, rd, 2, dtype=torch.float32) / rd)
    ang = pos.to(torch.float32)[:, None] * omega[None, :]  # [T, rd/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    if inverse:
        sin = -sin
    while cos.dim() < x.dim():  # broadcast over head dims between T and D
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    a, b = x[..., -rd:][..., 0::2], x[..., -rd:][..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = x.clone()
    out[..., -rd:] = torch.stack((ra, rb), dim=-1).flatten(-2)
    return out


class Weights:
    """Tensors by upstream name plus the numeric mode. `lin` applies W8A8 activation quantisation
    in "ref" mode for weights that the checkpoint stores as FP8/FP4 (MODEL.md §2.4)."""

    def __init__(self, tensors: dict, quantised: set, mode: str = "hf", kv_fp8: bool | None = None):
        assert mode in ("hf", "ref")
        self.t, self.q, self.mode = tensors, quantised, mode
        self.kv_fp8 = (mode == "ref") if kv_fp8 is None else kv_fp8
        self.trace = None  # optional list collecting (layer_id, selected experts) per MoE call

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.t:
            raise KeyError(f"tensor {name} absent from the checkpoint")
        return self.t[name]

    def has(self, name):
        return name in self.t

    def lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self[name]
        if self.mode == "ref" and name in self.q and not name.endswith("attn.wo_a.weight"):
            x = fp8_roundtrip(x, 128)
        return x @ w.t()


def hc_pre(W: Weights, X: torch.Tensor, pfx: str, hc_eps: float, iters: int, eps: float):
    """mHC pre (MODEL.md §3.2). X [N, hc, H] -> (collapsed y [N, H], post [N, hc], comb [N, hc, hc])."""
    fn, base, scale = W[pfx + "_fn"], W[pfx + "_base"], W[pfx + "_scale"]
    N, hc, H = X.shape
    a = X.reshape(N, hc * H)
    m = (a @ fn.t()) * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    L = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).reshape(N, hc, hc)  # L[i][j] = m[8+4i+j]
    C = torch.softmax(L, dim=-1) + hc_eps
    C = C / (C.sum(-2, keepdim=True) + hc_eps)  # column normalisation
    for _ in range(iters - 1):
        C = C / (C.sum(-1, keepdim=True) + hc_eps)  # rows
        C = C / (C.sum(-2, keepdim=True) + hc_eps)  # columns
    y = (pre[:, :, None] * X).sum(1)
    return y, post, C


def hc_post(X, out, post, C):
    """X'_j = post_j * out + sum_i C[i][j] X_i  (contraction over the FIRST index, MODEL.md §3.3)."""
    return post[:, :, None] * out[:, None, :] + torch.einsum("nij,nid->njd", C, X)


def hc_head(W: Weights, X, pfx: str, hc_eps: float, eps: float):
    """Final HC collapse (MODEL.md §3.6 step 1): no Sinkhorn, no post."""
    fn, base, scale = W[pfx + "hc_head_fn"], W[pfx + "hc_head_base"], W[pfx + "hc_head_scale"]
    N, hc, H = X.shape
    a = X.reshape(N, hc * H)
    m = (a @ fn.t()) * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps)
    pre = torch.sigmoid(m * scale[0] + base) + hc_eps
    return (pre[:, :, None] * X).sum(1)


def swiglu(W: Weights, x, pfx, limit, weight=None):
    g = W.lin(x, pfx + "w1.weight").clamp(max=limit)
    u = W.lin(x, pfx + "w3.weight").clamp(-limit, limit)
    h = F.silu(g) * u
    if weight is not None:  # official: routing weight applied before w2 (matters under W8A8)
        h = h * weight
    return W.lin(h, pfx + "w2.weight")


def moe(W: Weights, c: DraftConfig, x, pfx: str, layer_id: int, token_ids=None):
    """MoE FFN (MODEL.md §3.5). Hash routing only for absolute layer_id < num_hash_layers."""
    scores = torch.sqrt(F.softplus(x @ W[pfx + "gate.weight"].t()))
    if layer_id < c.num_hash_layers:
        sel = W[pfx + "gate.tid2eid"][token_ids].long()
    else:
        sel = torch.topk(scores + W[pfx + "gate.bias"], c.top_k, dim=-1).indices
    if W.trace is not None:
        W.trace.append((layer_id, sel.clone(), scores.clone()))
    wts = scores.gather(1, sel)
    wts = wts / wts.sum(-1, keepdim=True) * c.routed_scale
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for k in range(sel.shape[1]):
            e = int(sel[n, k])
            out[n] += swiglu(W, x[n:n + 1], f"{pfx}experts.{e}.", c.swiglu_limit, wts[n, k])[0]
    return out + swiglu(W, x, pfx + "shared_experts.", c.swiglu_limit)


def kv_rows(W: Weights, c: DraftConfig, x, pfx, pos):
    """K=V rows: kv_norm(wkv x), RoPE on the last rope dims at `pos`, then (if enabled) the FP8
    round-trip of the nope dims (order: norm -> RoPE -> round-trip; DSPARK.md §2.3 step 2)."""
    kv = rms(W.lin(x, pfx + "attn.wkv.weight"), W[pfx + "attn.kv_norm.weight"], c.eps)
    kv = rope(kv, pos, c.rope_dim, c.rope_theta)
    if W.kv_fp8:
        nope = c.head_dim - c.rope_dim
        kv = torch.cat([fp8_roundtrip(kv[:, :nope], 64), kv[:, nope:]], dim=-1)
    return kv


def queries(W: Weights, c: DraftConfig, y, pfx, pos):
    """q = wq_b q_norm(wq_a y), per-head unweighted RMS over all head dims, then RoPE (§2.4)."""
    ql = rms(W.lin(y, pfx + "attn.wq_a.weight"), W[pfx + "attn.q_norm.weight"], c.eps)
    q = W.lin(ql, pfx + "attn.wq_b.weight").reshape(-1, c.n_heads, c.head_dim)
    q = rms(q, None, c.eps)
    return rope(q, pos, c.rope_dim, c.rope_theta)


def sink_attention(q, keys, visible, sink, head_dim, bf16_probs=False):
    """q [T, nh, D], keys [K, D] (K = V), visible [T, K] bool, sink [nh] -> o [T, nh, D].
    The sink logit enters the softmax denominator only (MODEL.md §3.4.7). bf16_probs ("ref"
    numerics): probabilities rounded to bf16 before the PV product, as the official kernel does."""
    s = torch.einsum("thd,kd->thk", q, keys) / math.sqrt(head_dim)
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    sk = sink[None, :, None].expand(s.shape[0], -1, 1)
    p = torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :-1]
    if bf16_probs:
        p = p.to(torch.bfloat16).to(torch.float32)
    return torch.einsum("thk,kd->thd", p, keys)


def attn_out(W: Weights, c: DraftConfig, o, pfx, pos):
    """Inverse RoPE at the query position, grouped wo_a, then wo_b (MODEL.md §3.4.8)."""
    o = rope(o, pos, c.rope_dim, c.rope_theta, inverse=True)
    T = o.shape[0]
    G = c.o_groups
    u = o.reshape(T, G, -1)  # group g = heads g*nh/G .. (g+1)*nh/G - 1
    wa = W[pfx + "attn.wo_a.weight"].reshape(G, c.o_lora_rank, -1)
    z = torch.einsum("tgi,gri->tgr", u, wa).reshape(T, G * c.o_lora_rank)
    return W.lin(z, pfx + "attn.wo_b.weight")


def block(W: Weights, c: DraftConfig, X, pfx, layer_id, attention, token_ids=None):
    """One V4 decoder block (MODEL.md §3.0) on streams X [N, hc, H]; `attention(y) -> [N, H]`
    is called on the attn_norm output."""
    y, post, C = hc_pre(W, X, pfx + "hc_attn", c.hc_eps, c.hc_iters, c.eps)
    a = attention(rms(y, W[pfx + "attn_norm.weight"], c.eps))
    X = hc_post(X, a, post, C)
    y, post, C = hc_pre(W, X, pfx + "hc_ffn", c.hc_eps, c.hc_iters, c.eps)
    f = moe(W, c, rms(y, W[pfx + "ffn_norm.weight"], c.eps), pfx + "ffn.", layer_id, token_ids)
    return hc_post(X, f, post, C)


# --------------------------------------------------------------------------------------------
# The drafter (DSPARK.md §2.3-2.6).
# --------------------------------------------------------------------------------------------


class Ring:
    """Per-request, per-stage context ring (DSPARK.md §2.3 step 3): slot = position mod window.
    `pos` records which position each slot holds (-1 = empty) so tests can inspect it."""

    def __init__(self, n_stages, window, dim):
        self.k = torch.zeros(n_stages, window, dim)
        self.pos = torch.full((n_stages, window), -1, dtype=torch.long)
        self.window = window

    def write(self, positions: torch.Tensor, ck: torch.Tensor):
        """positions [T]; ck [S, T, D]. Rows are written in order, so with T > window only the last
        `window` survive."""
        for j, p in enumerate(positions.tolist()):
            slot = p % self.window
            self.k[:, slot] = ck[:, j]
            self.pos[:, slot] = p

    def visible(self, P: int):
        """Keys visible to a block anchored at P: slots 0..min(window, P)-1 (DSPARK.md §2.4)."""
        n = min(self.window, P)
        return self.k[:, :n]


class Drafter:
    def __init__(self, c: DraftConfig, W: Weights):
        self.c, self.W = c, W
        self.last = f"mtp.{c.n_stages - 1}."
        if c.markov_rank and W[self.last + "markov_head.markov_w1.weight"].shape[1] != c.markov_rank:
            raise ValueError("markov_w1 width differs from dspark_markov_rank")

    def context_rows(self, feats: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Context path (§2.3): feats [T, n_target_layers*H] at `positions` -> ck [S, T, head_dim]."""
        c, W = self.c, self.W
        mx = rms(W.lin(feats, "mtp.0.main_proj.weight"), W["mtp.0.main_norm.weight"], c.eps)
        return torch.stack([kv_rows(W, c, mx, f"mtp.{s}.", positions) for s in range(c.n_stages)])

    def draft(self, requests, anchor_offset: int = 0):
        """One draft step for a batch. requests: list of (ring: Ring, anchor token x0, P).
        Block slot i of request r is at position P_r + i + anchor_offset (anchor_offset = -1 only to
        measure the P-1 convention, C1). Returns a dict of tensors with a leading request dim."""
        c, W = self.c, self.W
        g = c.block
        B = len(requests)
        ids = torch.tensor([[x0] + [c.noise_id] * (g - 1) for _, x0, _ in requests])  # [B, g]
        pos = torch.stack([torch.arange(g) + P + anchor_offset for _, _, P in requests])  # [B, g]
        X = W["embed.weight"][ids.reshape(-1)]  # [B*g, H]
        X = X[:, None, :].expand(-1, c.hc_mult, -1).clone()
        for s in range(c.n_stages):
            pfx = f"mtp.{s}."

            def attention(y, s=s, pfx=pfx):
                outs = []
                for r, (ring, _, P) in enumerate(requests):
                    yr, pr = y[r * g:(r + 1) * g], pos[r]
                    q = queries(W, c, yr, pfx, pr)
                    bk = kv_rows(W, c, yr, pfx, pr)  # block's own K=V, transient (never in the ring)
                    keys = torch.cat([ring.visible(P)[s], bk], dim=0)
                    vis = torch.ones(g, keys.shape[0], dtype=torch.bool)  # non-causal (C11)
                    o = sink_attention(q, keys, vis, W[pfx + "attn.attn_sink"], c.head_dim, W.mode == "ref")
                    outs.append(attn_out(W, c, o, pfx, pr))
                return torch.cat(outs, dim=0)

            X = block(W, c, X, pfx, c.stage_layer_id(s), attention, ids.reshape(-1))
        h = hc_head(W, X, self.last, c.hc_eps, c.eps)  # pre-norm draft hidden [B*g, H]
        U = rms(h, W[self.last + "norm.weight"], c.eps) @ W["head.weight"].t()
        h, U = h.reshape(B, g, -1), U.reshape(B, g, -1)
        W1 = W[self.last + "markov_head.markov_w1.weight"]
        W2 = W[self.last + "markov_head.markov_w2.weight"]
        wconf = W[self.last + "confidence_head.proj.weight"][0]
        prev = ids[:, 0]
        Z, D, E = [], [], []
        for i in range(g):
            e = W1[prev]  # [B, rank]
            z = U[:, i] + e @ W2.t()
            d = z.argmax(-1)
            Z.append(z), D.append(d), E.append(e)
            prev = d
        Z, D, E = torch.stack(Z, 1), torch.stack(D, 1), torch.stack(E, 1)
        conf_logit = torch.cat([h, E], dim=-1) @ wconf
        return dict(base_logits=U, logits=Z, tokens=D, markov_emb=E, hidden=h,
                    conf_logit=conf_logit, conf=torch.sigmoid(conf_logit), positions=pos, ids=ids)


# --------------------------------------------------------------------------------------------
# Target model (transformers, fp32) and feature capture (C2).
# --------------------------------------------------------------------------------------------


def hf_state_dict(tensors: dict, n_layers: int) -> dict:
    """Map upstream names of the target model (not mtp.*) to DeepseekV4ForCausalLM parameter names.
    Every non-mtp tensor must map; the caller loads with strict=True so every parameter is set."""
    attn = {"attn_sink": "sinks", "wq_a.weight": "q_a_proj.weight", "q_norm.weight": "q_a_norm.weight",
            "wq_b.weight": "q_b_proj.weight", "wkv.weight": "kv_proj.weight",
            "kv_norm.weight": "kv_norm.weight", "wo_a.weight": "o_a_proj.weight",
            "wo_b.weight": "o_b_proj.weight",
            "compressor.ape": "compressor.position_bias",
            "compressor.wkv.weight": "compressor.kv_proj.weight",
            "compressor.wgate.weight": "compressor.gate_proj.weight",
            "compressor.norm.weight": "compressor.kv_norm.weight",
            "indexer.wq_b.weight": "compressor.indexer.q_b_proj.weight",
            "indexer.weights_proj.weight": "compressor.indexer.scorer.weights_proj.weight",
            "indexer.compressor.ape": "compressor.indexer.position_bias",
            "indexer.compressor.wkv.weight": "compressor.indexer.kv_proj.weight",
            "indexer.compressor.wgate.weight": "compressor.indexer.gate_proj.weight",
            "indexer.compressor.norm.weight": "compressor.indexer.kv_norm.weight"}
    top = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
           "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
           "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
    sd, experts = {}, {}
    for name, t in tensors.items():
        if name.startswith("mtp."):
            continue
        if name in top:
            sd[top[name]] = t
            continue
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        if not m:
            raise ValueError(f"unmapped target tensor {name}")
        L, rest = int(m.group(1)), m.group(2)
        p = f"model.layers.{L}."
        if rest.startswith("attn.") and rest[5:] in attn:
            sd[p + "self_attn." + attn[rest[5:]]] = t
        elif (mm := re.fullmatch(r"hc_(attn|ffn)_(fn|base|scale)", rest)):
            sd[p + f"{mm.group(1)}_hc.{mm.group(2)}"] = t
        elif rest == "attn_norm.weight":
            sd[p + "input_layernorm.weight"] = t
        elif rest == "ffn_norm.weight":
            sd[p + "post_attention_layernorm.weight"] = t
        elif rest == "ffn.gate.weight":
            sd[p + "mlp.gate.weight"] = t
        elif rest == "ffn.gate.bias":
            sd[p + "mlp.gate.e_score_correction_bias"] = t
        elif rest == "ffn.gate.tid2eid":
            sd[p + "mlp.gate.tid2eid"] = t
        elif (mm := re.fullmatch(r"ffn\.shared_experts\.(w[123])\.weight", rest)):
            sd[p + "mlp.shared_experts." + {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}[mm.group(1)]
               + ".weight"] = t
        elif (mm := re.fullmatch(r"ffn\.experts\.(\d+)\.(w[123])\.weight", rest)):
            experts.setdefault(L, {})[(int(mm.group(1)), mm.group(2))] = t
        else:
            raise ValueError(f"unmapped target tensor {name}")
    for L, ex in experts.items():
        n = 1 + max(e for e, _ in ex)
        p = f"model.layers.{L}.mlp.experts."
        sd[p + "gate_up_proj"] = torch.stack([torch.cat([ex[(e, "w1")], ex[(e, "w3")]], 0) for e in range(n)])
        sd[p + "down_proj"] = torch.stack([ex[(e, "w2")] for e in range(n)])
    return sd


def hf_config(cfg: dict, n_layers: int | None = None, **override):
    """DeepseekV4Config from upstream keys; compress_ratios truncated to the target layers."""
    from transformers import DeepseekV4Config

    d = dict(cfg)
    d.pop("quantization_config", None)
    if n_layers is not None:
        d["num_hidden_layers"] = n_layers
    d["compress_ratios"] = list(cfg["compress_ratios"])[: d["num_hidden_layers"]]
    d.update(override)
    return DeepseekV4Config(**d)


class Target:
    """transformers DeepseekV4ForCausalLM in fp32 with hooks that capture the hc streams."""

    def __init__(self, cfg: dict, tensors: dict):
        from transformers import DeepseekV4ForCausalLM

        hc = hf_config(cfg)
        hc._attn_implementation = "eager"
        self.model = DeepseekV4ForCausalLM(hc).eval()
        sd = hf_state_dict(tensors, hc.num_hidden_layers)
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if "rotary_emb" not in k]
        if missing or unexpected:
            raise ValueError(f"target weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.n_layers = hc.num_hidden_layers

    @torch.no_grad()
    def run(self, ids):
        """ids [T] -> dict(logits [T, V], out[L] = streams after layer L [T, hc, H],
        inp[L] = streams entering layer L, head_in = streams entering hc_head)."""
        out, inp, head = {}, {}, {}
        hooks = []
        for L, layer in enumerate(self.model.model.layers):
            hooks.append(layer.register_forward_hook(lambda m, a, kw, o, L=L: out.__setitem__(L, o[0]),
                                                     with_kwargs=True))
            hooks.append(layer.register_forward_pre_hook(
                lambda m, a, kw, L=L: inp.__setitem__(L, (a[0] if a else kw["hidden_states"])[0]),
                with_kwargs=True))
        hooks.append(self.model.model.hc_head.register_forward_pre_hook(
            lambda m, a: head.__setitem__("x", a[0][0])))
        try:
            logits = self.model(input_ids=torch.as_tensor(ids)[None], use_cache=False).logits[0]
        finally:
            for h in hooks:
                h.remove()
        return dict(logits=logits, out=out, inp=inp, head_in=head["x"])


def features(run: dict, layers, tap="output") -> torch.Tensor:
    """Context features (C2): mean over the hc streams of layer outputs, concatenated in list order.
    tap="input" gives the (wrong, V4.1-style) input-of-layer convention, for sensitivity only."""
    src = run["out"] if tap == "output" else run["inp"]
    return torch.cat([src[L].mean(dim=1) for L in layers], dim=-1)


# --------------------------------------------------------------------------------------------
# Fixture writer (format: tools/REF_FORMAT.md).
# --------------------------------------------------------------------------------------------


class FixtureWriter:
    """Writes arrays in the dsv4-ref-v1 layout of branch `fixtures` (tools/README.md): raw
    little-endian float32, row-major, no header, described by {file, dtype, shape, sha256}."""

    def __init__(self, out_dir):
        self.dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        for f in os.listdir(out_dir):
            if f.endswith((".f32", ".bin")) or f in ("index.json", "meta.json"):
                os.remove(os.path.join(out_dir, f))

    def add(self, name: str, t) -> dict:
        a = np.ascontiguousarray(torch.as_tensor(t).detach().to(torch.float32).numpy().astype("<f4"))
        fn = name.replace("/", ".") + ".f32"
        with open(os.path.join(self.dir, fn), "wb") as f:
            f.write(a.tobytes())
        return {"file": fn, "dtype": "f32", "shape": list(a.shape),
                "sha256": hashlib.sha256(a.tobytes()).hexdigest()}

    def finish(self, index: dict):
        with open(os.path.join(self.dir, "index.json"), "w") as f:
            json.dump(index, f, indent=1)
            f.write("\n")


def checkpoint_digest(model_dir: str):
    """`digest` of MODEL_DIR/manifest.json (tools/gen_checkpoints.py), None if absent."""
    try:
        with open(os.path.join(model_dir, "manifest.json")) as f:
            return json.load(f).get("digest")
    except FileNotFoundError:
        return None


def top2_margin(z: torch.Tensor) -> float:
    """Smallest top-1/top-2 gap over rows of z (near-tie indicator for greedy comparisons)."""
    t = z.topk(2, dim=-1).values
    return float((t[..., 0] - t[..., 1]).min())


def build_ring(drafter: Drafter, feats: torch.Tensor, P: int) -> Ring:
    """Ring after committing positions 0..P-1 (one prefill write)."""
    c = drafter.c
    ring = Ring(c.n_stages, c.window, c.head_dim)
    pos = torch.arange(P)
    ring.write(pos, drafter.context_rows(feats[:P], pos))
    return ring


@torch.no_grad()
def spec_trace(target: Target, d: Drafter, prompt_ids: torch.Tensor, steps: int, k: int, forced=None):
    """Greedy speculative decoding with the drafter (DSPARK.md §4.2, §4.6, §4.7), the target
    recomputed from scratch each step (no cache). With `forced` (accept counts per step) the
    verification outcome is scripted instead (a = forced[i]; the emitted token after the accepted
    drafts is still the target's greedy token at row a): random tiny drafters almost never match the
    target, and this makes the partial-acceptance ring path (C4) occur. Returns one record per step:
    P, anchor, drafts (first k verified), verify-row features [k+1, F], accepted a, emitted tokens,
    ring positions written (P..P+a only, C4) and the draft logits."""
    c = d.c
    seq = prompt_ids.clone()
    run = target.run(seq)
    P = len(seq)
    anchor = int(run["logits"][-1].argmax())
    ring = Ring(c.n_stages, c.window, c.head_dim)
    pos = torch.arange(P)
    ring.write(pos, d.context_rows(features(run, c.target_layers), pos))
    out = []
    for _ in range(steps):
        r = d.draft([(ring, anchor, P)])
        drafts = r["tokens"][0, :k]
        vrun = target.run(torch.cat([seq, torch.tensor([anchor]), drafts]))
        vf = features(vrun, c.target_layers)[P:P + k + 1]  # verify rows P..P+k
        tgt = vrun["logits"][P:P + k + 1].argmax(-1)  # target greedy token after each row
        a = 0
        while a < k and int(drafts[a]) == int(tgt[a]):
            a += 1
        if forced is not None:
            a = min(forced[len(out)], k)
        emitted = drafts[:a].tolist() + [int(tgt[a])]
        rows = torch.arange(P, P + a + 1)
        ring.write(rows, d.context_rows(vf[:a + 1], rows))
        out.append(dict(P=P, anchor=anchor, drafts=drafts.clone(), verify_features=vf, accepted=a,
                        emitted=emitted, logits=r["logits"][0], written=rows))
        seq = torch.cat([seq, torch.tensor([anchor]), drafts[:a]])
        P, anchor = P + a + 1, emitted[-1]
    return out


def default_prompts(vocab: int, noise: int):
    """Deterministic prompts (ids in [2, vocab), noise id excluded); lengths cross the window."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for T in (11, 37):
        ids = torch.randint(2, vocab, (T,), generator=g)
        ids[ids == noise] = 2
        out.append(ids)
    return out


FORCED_ACCEPT = [2, 0, 4, 1, 3, 0]


@torch.no_grad()
def make_fixtures(model_dir: str, out_dir: str, prompts=None, anchors=None):
    cfg, tensors, quantised = load_checkpoint(model_dir)
    c = draft_config(cfg, tensors.keys())
    target = Target(cfg, tensors)
    prompts = prompts or default_prompts(c.vocab, c.noise_id)
    w = FixtureWriter(out_dir)
    pinfo, cases = [], []
    worst = {"anchor_at_P_minus_1": float("inf"), "tap_input_of_layer": float("inf"),
             "ref_without_kv_fp8": float("inf")}

    def note(key, alt, r):
        worst[key] = min(worst[key], float((alt["logits"] - r["logits"]).abs().max()))

    for pi, ids in enumerate(prompts):
        T = len(ids)
        run = target.run(ids)
        feats = features(run, c.target_layers)
        feats_in = features(run, c.target_layers, tap="input")
        first = int(run["logits"][-1].argmax())  # first sampled token, anchor at P = T
        Ps = anchors[pi] if anchors else sorted({1, min(c.window - 1, T), min(c.window + 1, T), T})
        pn = f"p{pi}"
        arrays = {"features": w.add(f"{pn}/features", feats),
                  "target_logits_last": w.add(f"{pn}/target_logits_last", run["logits"][-1])}
        for mode in ("hf", "ref"):
            d = Drafter(c, Weights(tensors, quantised, mode))
            arrays[f"ring_rows_{mode}"] = w.add(f"{pn}/{mode}/ring_rows", d.context_rows(feats, torch.arange(T)))
            for P in Ps:
                x0 = int(ids[P]) if P < T else first
                ring = build_ring(d, feats, P)
                r = d.draft([(ring, x0, P)])
                name = f"{pn}_{mode}_P{P}"
                cases.append({
                    "name": name, "prompt": pn, "mode": mode, "P": P, "anchor": x0,
                    "tokens": r["tokens"][0].tolist(), "min_top2_margin": top2_margin(r["logits"][0]),
                    "arrays": {k: w.add(f"{pn}/{mode}/P{P}/{k}", r[k][0]) for k in
                               ("logits", "base_logits", "conf_logit", "conf", "hidden", "markov_emb")}})
                # Sensitivity of the fixture to each flipped choice (max |delta logits|).
                note("anchor_at_P_minus_1", d.draft([(ring, x0, P)], anchor_offset=-1), r)
                note("tap_input_of_layer", d.draft([(build_ring(d, feats_in, P), x0, P)]), r)
                if mode == "ref":
                    d2 = Drafter(c, Weights(tensors, quantised, "ref", kv_fp8=False))
                    note("ref_without_kv_fp8", d2.draft([(build_ring(d2, feats, P), x0, P)]), r)
        pinfo.append({"name": pn, "input_ids": ids.tolist(), "target_greedy_next": first, "arrays": arrays})
    # A batched draft of several requests (batch independence, per-request rings and positions).
    reqs_meta = [{"prompt": f"p{pi}", "P": len(ids) - 2, "anchor": int(ids[len(ids) - 2])}
                 for pi, ids in enumerate(prompts)]
    batch = {"requests": reqs_meta}
    for mode in ("hf", "ref"):
        d = Drafter(c, Weights(tensors, quantised, mode))
        reqs = [(build_ring(d, features(target.run(prompts[pi]), c.target_layers), q["P"]), q["anchor"], q["P"])
                for pi, q in enumerate(reqs_meta)]
        r = d.draft(reqs)
        batch[mode] = {"tokens": r["tokens"].tolist(), "arrays": {"logits": w.add(f"batch/{mode}/logits", r["logits"])}}
    # A short speculative loop with scripted partial acceptance (C4: only accepted rows reach the ring).
    trace = {"prompt": "p0", "k": 4, "forced_accept": FORCED_ACCEPT}
    for mode in ("hf", "ref"):
        steps = spec_trace(target, Drafter(c, Weights(tensors, quantised, mode)), prompts[0], steps=6, k=4,
                           forced=FORCED_ACCEPT)
        trace[mode] = [{"P": s["P"], "anchor": s["anchor"], "accepted": s["accepted"], "emitted": s["emitted"],
                        "drafts": s["drafts"].tolist(), "written": s["written"].tolist(),
                        "arrays": {"logits": w.add(f"trace/{mode}/s{i}/logits", s["logits"]),
                                   "verify_features": w.add(f"trace/{mode}/s{i}/verify_features",
                                                            s["verify_features"])}}
                       for i, s in enumerate(steps)]
    import transformers

    index = {
        "format": "dsv4-ref-v1", "kind": "dspark-drafter",
        "what": "DSpark drafter reference (tools/ref_dspark.py, spec/DSPARK.md §2); layout: tools/REF_FORMAT.md",
        "model": os.path.basename(os.path.normpath(model_dir)),
        "checkpoint_digest": checkpoint_digest(model_dir),
        "numerics": {"hf": "fp32, no quantisation steps", "ref": "fp32 + W8A8 activation quantisation of "
                     "FP8/FP4 linears + FP8 round-trip of K/V nope dims (no bf16 storage emulation)",
                     "features": "transformers DeepseekV4ForCausalLM fp32 (HF numerics), shared by both modes"},
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "config": {"block": c.block, "noise_id": c.noise_id, "target_layers": c.target_layers,
                   "n_stages": c.n_stages, "window": c.window, "vocab": c.vocab, "hidden": c.hidden,
                   "head_dim": c.head_dim, "markov_rank": c.markov_rank},
        "prompts": pinfo, "cases": cases, "batch": batch, "trace": trace,
        "sensitivity": worst,
        "tolerance": {"hf": {"logits_abs": 1e-3}, "ref": {"logits_abs": 5e-2, "note":
                      "W8A8 block scales can flip at rounding ties; compare greedy tokens only where the "
                      "top-1/top-2 margin of the logits exceeds the tolerance"}},
    }
    w.finish(index)
    return index


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?", default="models/tiny-dspark")
    ap.add_argument("--out", default="tests/fixtures/ref/dspark")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    index = make_fixtures(a.model_dir, a.out)
    print(json.dumps({"cases": len(index["cases"]), "sensitivity": index["sensitivity"]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
