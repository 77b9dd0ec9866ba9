#!/usr/bin/env python3
"""Reference outputs from Hugging Face transformers' DeepseekV4ForCausalLM for the tiny checkpoints.

What it does (spec/MODEL.md §5.3 steps 4-5, §5.4, §5.6, §6.6)
-------------------------------------------------------------
For each of tiny-flash and tiny-dspark (written by tools/gen_checkpoints.py):

1. Layout proof.  Load the BF16 dequantised copy `models/<m>-bf16` (same tensor names as the
   quantised checkpoint, values = exact dequantisation of its FP8/FP4 codes, written by our own
   safetensors writer, NOT by save_pretrained) with `DeepseekV4ForCausalLM.from_pretrained(...,
   output_loading_info=True)` -- transformers maps the official names itself through its
   `deepseek_v4` conversion table.  Asserted:
     * missing_keys, unexpected_keys, mismatched_keys and error_msgs are all empty;
     * nothing was re-initialised: two loads under different torch seeds give bit-identical
       state dicts, the model's persistent tensors hold exactly as many elements as the
       checkpoint's non-`mtp.*` tensors, their value multiset matches (sum and sum of squares in
       float64 agree; renames, stacking of experts and the w1|w3 concatenation all preserve it),
       and no tensor is constant (every checkpoint tensor is random, HF inits are 0/1/N(0,0.02));
     * `mtp.*` tensors: transformers has no MTP / DSpark modules and drops these names through
       `_keys_to_ignore_on_load_unexpected = (^|\\.)mtp\\..*` (so they never show up as
       "unexpected").  We account for them explicitly: the checkpoint's names minus the ones
       transformers consumed must be exactly the `mtp.*` names.  For tiny-flash, `mtp.0.*` is
       then consumed by the MTP reference below (every `mtp.0` tensor is bound to a module
       built from transformers' own DeepseekV4DecoderLayer / HyperHead / RMSNorm, strict
       load).  The DSpark stages of tiny-dspark (main_proj, markov_head, confidence_head) have
       no transformers implementation; their layout is checked by name/shape against
       spec/DSPARK.md §3.1 by the C loader tests, not here.
   Also (spec/MODEL.md §5.3 step 7, when `accelerate` is installed): the QUANTISED checkpoint
   itself loads through transformers' FP8 path `FineGrainedFP8Config(dequantize=True)` with
   empty loading info and a state dict bit-identical to the BF16 copy's -- so transformers reads
   our `.scale` tensors, E8M0 block scales and low-nibble-first FP4 experts as we wrote them
   (measured with 5.17.0 and 5.24.0; this answers spec §6.6 D15 / §8 item 3 for the tiny layout).
2. Reference logits in fp32 "HF numerics" for the spec/MODEL.md §5.4 inputs (see CASES), the
   per-layer 4-stream outputs for some cases, and an MTP reference (tiny-flash).  Written to
   tests/fixtures/ref/<model>/ (format in tools/README.md): index.json + raw little-endian f32.

How each known transformers deviation (spec/MODEL.md §6.6) is handled
--------------------------------------------------------------------
D1  bf16 loading broken (fp32-kept norm weights):  we load with dtype=float32.  BF16 checkpoint
    values are exact in fp32, F32 tensors (HC, sinks, ape, gate.bias) keep their F32 values.
D2  RMSNorm rounding order:  identical in fp32.
D3  per-head q norm precision:  fp32 throughout -> no difference.
D4  RoPE cos/sin cast to activation dtype:  activation dtype is fp32 -> fp32 tables.
D5  HC expand/mix in stream dtype:  streams are fp32 -> fp32 mixes, as official.
D6  compressor precision:  fp32 projections and pooling; NOTE transformers does not round the
    pooled row to bf16 before the compressor norm (official does) -- engine "HF mode" must not.
D7  no QAT (FP8 KV round-trip, indexer Hadamard+FP4, W8A8 activations):  these refs are
    "HF mode" numerics; compare the engine with every emulation switched off.
D8  indexer ties:  the tiny configs use 8 indexer heads (spec §5.2), measured to keep
    transformers chunk/decode-invariant; the script itself checks chunked and token-by-token
    runs against the single pass and records the max difference in index.json.
D9  attention softmax dtype:  fp32 (logits and sinks fp32).
D10 router precision:  fp32 logits; renormalisation + 1e-20 (negligible).  Near-ties in top-k
    can still flip expert choice between implementations; index.json records the smallest
    top-2 logit margin so a C test can tell near-ties from bugs.
D11 expert arithmetic order:  fp32, equal up to rounding.
D12 logits dtype:  lm_head in fp32 -> fp32 logits.
D13 output plumbing:  per-layer streams are taken with forward hooks on every decoder layer
    (output [B,S,4,D]) instead of output_hidden_states (which omits the last layer's streams);
    the MTP reference feeds it the hooked last-layer streams.
D14 save_pretrained is not an upstream writer:  never used; the BF16 copy is written by
    tools/gen_checkpoints.py with the upstream names.
D15 FP8 quantizer path unknown for `.scale` / FP4 I8:  not used -- we load the dequantised copy
    (step 4 of spec §5.3 is authoritative).  Batch 1, no padding (compressors ignore padding).
Also: the shared-expert SwiGLU clamp is present in the transformers used (checked at run time
by asserting DeepseekV4MLP.forward clamps); index.json records how many gate/up
pre-activations hit the ±10 clamps so the fixtures provably exercise them.

Usage
-----
  python3 tools/ref_transformers.py                 # regenerate tests/fixtures/ref/*
  python3 tools/ref_transformers.py --layout-only   # only the from_pretrained proof
"""

import argparse
import hashlib
import inspect
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import gen_checkpoints as gc  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdv4  # noqa: E402

FORMAT = "dsv4-ref-v1"
# transformers renamed the forward's `past_key_values` to `cache` (5.2x deprecates the old name);
# 5.17 silently ignores an unknown `cache=` and runs every chunk without state.
CACHE_KW = "cache" if "cache" in inspect.signature(mdv4.DeepseekV4Model.forward).parameters \
    else "past_key_values"
REF_MODELS = ["tiny-flash", "tiny-dspark"]

# spec/MODEL.md §5.4: prefill lengths, decode (prefill 250 then 10 single steps), chunked 97+153.
CASES = [
    dict(name="prefill_3", n=3, chunks=[3]),
    dict(name="prefill_4", n=4, chunks=[4]),
    dict(name="prefill_20", n=20, chunks=[20], streams=True),
    dict(name="prefill_128", n=128, chunks=[128]),
    dict(name="prefill_129", n=129, chunks=[129], streams=True),
    dict(name="prefill_300", n=300, chunks=[300]),
    dict(name="decode_250_10", n=260, chunks=[250] + [1] * 10, ids_from="decode"),
    dict(name="chunked_97_153", n=250, chunks=[97, 153], ids_from="decode"),
]
BOUNDARY_POSITIONS = [31, 63, 126, 127, 128, 129, 191, 247, 248, 249, 254, 255, 256, 299]


def selected_positions(n, chunks):
    """Positions whose outputs are stored: all p < 20, the last 4 of every chunk, the positions
    around compressor / window boundaries, and every single-token decode step."""
    sel = set(range(min(n, 20)))
    end = 0
    for c in chunks:
        end += c
        sel.update(range(max(0, end - 4), end))
    sel.update(p for p in BOUNDARY_POSITIONS if p < n)
    return sorted(sel)


def case_ids(case):
    src = case.get("ids_from", case["name"])
    h = gc.hashes("dsv4-ref-inputs-v1", src, case["n"] if src == case["name"] else 260)
    ids = (h % np.uint64(510)).astype(np.int64) + 2  # values in [2, 512), spec §5.4
    return ids[:case["n"]]


# --------------------------------------------------------------------------------------------
# Checkpoint access.
# --------------------------------------------------------------------------------------------
def read_checkpoint(d):
    """{name: torch tensor} for every tensor of a (BF16) checkpoint directory."""
    from safetensors import safe_open
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out = {}
    for fn in sorted(set(idx["weight_map"].values())):
        with safe_open(os.path.join(d, fn), "pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    assert sorted(out) == sorted(idx["weight_map"]), "index and shards disagree"
    return out


def ensure_models(models_dir, names):
    lock = gc.load_lock()
    for name in names:
        dest = os.path.join(models_dir, name)
        if not gc.up_to_date(dest, lock.get(name)):
            gc.build(name, dest)
        if not gc.up_to_date(dest, lock.get(name)):
            raise SystemExit(f"ref_transformers: {dest} does not match tools/checkpoints.lock.json")


def manifest(models_dir, name):
    return json.load(open(os.path.join(models_dir, name, "manifest.json")))


# --------------------------------------------------------------------------------------------
# 1. Layout proof.
# --------------------------------------------------------------------------------------------
def load_model(path, seed):
    torch.manual_seed(seed)
    model, info = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                        output_loading_info=True)
    model.eval()
    return model, info


def layout_proof(models_dir, name, log):
    """Returns (model, report dict).  Raises AssertionError on any layout problem."""
    path = os.path.join(models_dir, name + "-bf16")
    ckpt = read_checkpoint(path)
    cfg = DeepseekV4Config.from_pretrained(path)
    exp_types = {0: "sliding_attention", 4: "compressed_sparse_attention",
                 128: "heavily_compressed_attention"}
    raw = json.load(open(os.path.join(path, "config.json")))
    L = raw["num_hidden_layers"]
    assert cfg.layer_types == [exp_types[r] for r in raw["compress_ratios"][:L]], cfg.layer_types
    assert cfg.mlp_layer_types == ["hash_moe" if i < raw["num_hash_layers"] else "moe"
                                   for i in range(L)], cfg.mlp_layer_types
    comp = cfg.rope_parameters["compress"]
    assert comp["rope_type"] == "yarn" and comp.get("attention_factor") == 1.0, comp
    assert comp["rope_theta"] == 160000 and cfg.rope_parameters["main"]["rope_theta"] == 10000

    model, info = load_model(path, 1)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{name}: from_pretrained reported {k}: {sorted(info[k])[:10]}"
    model2, _ = load_model(path, 2)
    sd, sd2 = model.state_dict(), model2.state_dict()
    assert sorted(sd) == sorted(sd2)
    for k in sd:
        assert torch.equal(sd[k], sd2[k]), f"{name}: {k} depends on the init seed (re-initialised)"
    del model2, sd2

    main = {k: v for k, v in ckpt.items() if not k.startswith("mtp.")}
    mtp = sorted(k for k in ckpt if k.startswith("mtp."))
    n_ck = sum(v.numel() for v in main.values())
    n_md = sum(v.numel() for v in sd.values())
    assert n_ck == n_md, f"{name}: checkpoint has {n_ck} elements outside mtp.*, model {n_md}"

    def moments(ts):
        s1 = s2 = 0.0
        for t in ts:
            x = t.detach().to(torch.float64)
            s1 += float(x.sum())
            s2 += float((x * x).sum())
        return s1, s2
    c1, c2 = moments(main.values())
    m1, m2 = moments(sd.values())
    assert abs(c1 - m1) <= 1e-9 * max(1.0, c2) and abs(c2 - m2) <= 1e-9 * c2, \
        f"{name}: value multiset differs (sum {c1} vs {m1}, sumsq {c2} vs {m2})"
    for k, v in sd.items():
        if v.numel() > 1:
            assert not torch.all(v == v.flatten()[0]), f"{name}: {k} is constant (not loaded?)"
    # The tied-embedding pitfall: head and embed must stay separate.
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    # The shared-expert clamp must be in this transformers (spec §6.6 "§3.5 clamp").
    assert "clamp" in inspect.getsource(mdv4.DeepseekV4MLP.forward)

    fp8 = quantised_load_proof(models_dir, name, sd, log)
    rep = {"checkpoint": name + "-bf16", "transformers_tensors": len(sd),
           "checkpoint_tensors": len(ckpt), "checkpoint_tensors_outside_mtp": len(main),
           "mtp_tensors_ignored_by_transformers": len(mtp), "elements": n_ck,
           "missing": 0, "unexpected": 0, "mismatched": 0, "reinitialised": 0,
           "quantised_checkpoint_via_FineGrainedFP8Config_dequantize": fp8}
    log(f"{name}: layout ok: {len(main)} tensors -> {len(sd)} transformers tensors, "
        f"{n_ck} elements, value multiset equal; {len(mtp)} mtp.* tensors ignored by transformers")
    return model, ckpt, rep


def quantised_load_proof(models_dir, name, sd_bf16, log):
    """spec/MODEL.md §5.3 step 7: load the QUANTISED checkpoint (F8_E4M3 + `.scale`, I8 FP4
    experts) through transformers' own FP8 path, `FineGrainedFP8Config(dequantize=True)` (what
    its integration test uses for the real model), and require the identical state dict as the
    BF16 copy.  Needs `accelerate`; returns a short status string."""
    import importlib.util
    if importlib.util.find_spec("accelerate") is None:
        log(f"{name}: quantised-load proof skipped (accelerate not installed)")
        return "skipped: accelerate not installed"
    from transformers import FineGrainedFP8Config
    torch.manual_seed(3)
    m, info = DeepseekV4ForCausalLM.from_pretrained(
        os.path.join(models_dir, name), dtype=torch.float32, output_loading_info=True,
        quantization_config=FineGrainedFP8Config(dequantize=True))
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{name} (quantised): from_pretrained reported {k}: {sorted(info[k])[:10]}"
    sq = m.state_dict()
    assert sorted(sq) == sorted(sd_bf16), sorted(set(sq) ^ set(sd_bf16))[:10]
    for k, v in sd_bf16.items():
        assert sq[k].shape == v.shape and torch.equal(sq[k].float(), v.float()), \
            f"{name}: {k} differs between the quantised load and the BF16 copy"
    log(f"{name}: quantised checkpoint loads through FineGrainedFP8Config(dequantize=True) "
        f"to the same {len(sq)} tensors, bit-identical to the BF16 copy")
    return "ok: bit-identical to the BF16 copy"


# --------------------------------------------------------------------------------------------
# 2. Reference outputs.
# --------------------------------------------------------------------------------------------
class Probe:
    """Forward hooks: per-layer output streams, expert selections, indexer selections and SwiGLU
    clamp coverage."""

    def __init__(self, model):
        self.streams = []
        self.routing = {}   # layer -> [per-chunk LongTensor [T, k]]
        self.indexer = {}   # layer -> [per-chunk LongTensor [T, <=index_topk]]
        self.index_topk = model.config.index_topk
        self.clamp = {"shared_gate_gt_limit": 0, "shared_up_abs_gt_limit": 0,
                      "routed_gate_gt_limit": 0, "routed_up_abs_gt_limit": 0, "values": 0}
        self.hooks = []
        lim = model.config.swiglu_limit
        for layer in model.model.layers:
            self.hooks.append(layer.register_forward_hook(
                lambda m, i, o: self.streams.append(o.detach().clone())))
            mlp = layer.mlp
            li = layer.layer_idx
            self.hooks.append(mlp.gate.register_forward_hook(
                lambda m, i, o, li=li: self.routing.setdefault(li, []).append(o[2].detach().clone())))
            comp = getattr(layer.self_attn, "compressor", None)
            if comp is not None and hasattr(comp, "indexer"):
                self.hooks.append(comp.indexer.register_forward_hook(
                    lambda m, i, o, li=li: self.indexer.setdefault(li, []).append(o[0].detach().clone())))

            def shared_hook(m, inp, out, lim=lim):
                x = inp[0]
                g, u = m.gate_proj(x), m.up_proj(x)
                self.clamp["shared_gate_gt_limit"] += int((g > lim).sum())
                self.clamp["shared_up_abs_gt_limit"] += int((u.abs() > lim).sum())
                self.clamp["values"] += g.numel()

            def routed_hook(m, inp, out, lim=lim):
                x, idx, _ = inp
                for j in range(idx.shape[1]):
                    w = m.gate_up_proj[idx[:, j]]  # [T, 2I, D]
                    gu = torch.einsum("tod,td->to", w, x)
                    g, u = gu.chunk(2, dim=-1)
                    self.clamp["routed_gate_gt_limit"] += int((g > lim).sum())
                    self.clamp["routed_up_abs_gt_limit"] += int((u.abs() > lim).sum())
            self.hooks.append(mlp.shared_experts.register_forward_hook(shared_hook))
            self.hooks.append(mlp.experts.register_forward_hook(routed_hook))

    def take_streams(self):
        s, self.streams = self.streams, []
        return s

    def take_selections(self):
        """(routing LongTensor [L, n, k] sorted per row, {layer: LongTensor [n, index_topk]} with
        the valid picks sorted ascending and -1 padding after them), over all chunks since the
        last call."""
        routing = torch.stack([torch.cat(self.routing[li], 0).sort(-1).values
                               for li in sorted(self.routing)], 0)
        idx = {}
        for li, parts in sorted(self.indexer.items()):
            rows = []
            for p in parts:
                pad = torch.full((p.shape[0], self.index_topk), -1, dtype=torch.long)
                pad[:, :p.shape[1]] = p
                key = torch.where(pad < 0, torch.iinfo(torch.long).max, pad)
                rows.append(torch.gather(pad, 1, torch.sort(key, dim=-1, stable=True).indices))
            idx[li] = torch.cat(rows, 0)
        self.routing, self.indexer = {}, {}
        return routing, idx

    def close(self):
        for h in self.hooks:
            h.remove()


def run_case(model, probe, ids, chunks):
    """Feed `ids` in `chunks` through one DynamicCache; returns (logits [n,V], streams
    [L,n,4,D] or None when chunked)."""
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    logits, streams, pos = [], [], 0
    with torch.no_grad():
        for c in chunks:
            x = torch.from_numpy(ids[pos:pos + c]).unsqueeze(0)
            out = model(input_ids=x, use_cache=True, **{CACHE_KW: cache})
            logits.append(out.logits[0])
            streams.append(probe.take_streams())
            pos += c
    lg = torch.cat(logits, 0)
    st = torch.stack([torch.cat([s[layer][0] for s in streams], 0)
                      for layer in range(len(streams[0]))], 0)
    probe.last_selections = probe.take_selections()
    return lg, st


class MTPRef(torch.nn.Module):
    """spec/MODEL.md §3.9 / §5.6: the MTP block composed from transformers' own modules."""

    def __init__(self, config, raw):
        super().__init__()
        # A one-layer config from the checkpoint's own config.json: ratio 0 (sliding window,
        # RoPE theta 10000 without YaRN), not a hash layer (top-k with gate.bias).
        c = dict(raw, num_hidden_layers=1, compress_ratios=[0], num_hash_layers=0)
        c.pop("quantization_config", None)
        self.cfg = DeepseekV4Config(**c)
        self.cfg._attn_implementation = config._attn_implementation  # eager, as the main model
        self.cfg._experts_implementation = getattr(config, "_experts_implementation", None)
        assert self.cfg.layer_types == ["sliding_attention"] and self.cfg.mlp_layer_types == ["moe"]
        d = config.hidden_size
        self.layer = mdv4.DeepseekV4DecoderLayer(self.cfg, 0)
        self.rotary = mdv4.DeepseekV4RotaryEmbedding(self.cfg)
        self.e_proj = torch.nn.Linear(d, d, bias=False)
        self.h_proj = torch.nn.Linear(d, d, bias=False)
        self.enorm = mdv4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = mdv4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.norm = mdv4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.hc_head = mdv4.DeepseekV4HyperHead(self.cfg)


def mtp_state_dict(ckpt, ne):
    """Map the upstream `mtp.0.*` names onto MTPRef (the same renames as transformers'
    conversion table applies to layers.N.*); every mtp.0 tensor must be used exactly once."""
    used, sd = set(), {}

    def take(src, dst):
        sd[dst] = ckpt[src].to(torch.float32)
        used.add(src)
    p = "mtp.0."
    ren = {"attn_norm.weight": "layer.input_layernorm.weight",
           "ffn_norm.weight": "layer.post_attention_layernorm.weight",
           "hc_attn_fn": "layer.attn_hc.fn", "hc_attn_base": "layer.attn_hc.base",
           "hc_attn_scale": "layer.attn_hc.scale", "hc_ffn_fn": "layer.ffn_hc.fn",
           "hc_ffn_base": "layer.ffn_hc.base", "hc_ffn_scale": "layer.ffn_hc.scale",
           "attn.attn_sink": "layer.self_attn.sinks",
           "attn.wq_a.weight": "layer.self_attn.q_a_proj.weight",
           "attn.q_norm.weight": "layer.self_attn.q_a_norm.weight",
           "attn.wq_b.weight": "layer.self_attn.q_b_proj.weight",
           "attn.wkv.weight": "layer.self_attn.kv_proj.weight",
           "attn.kv_norm.weight": "layer.self_attn.kv_norm.weight",
           "attn.wo_a.weight": "layer.self_attn.o_a_proj.weight",
           "attn.wo_b.weight": "layer.self_attn.o_b_proj.weight",
           "ffn.gate.weight": "layer.mlp.gate.weight",
           "ffn.gate.bias": "layer.mlp.gate.e_score_correction_bias",
           "ffn.shared_experts.w1.weight": "layer.mlp.shared_experts.gate_proj.weight",
           "ffn.shared_experts.w3.weight": "layer.mlp.shared_experts.up_proj.weight",
           "ffn.shared_experts.w2.weight": "layer.mlp.shared_experts.down_proj.weight",
           "e_proj.weight": "e_proj.weight", "h_proj.weight": "h_proj.weight",
           "enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight",
           "norm.weight": "norm.weight", "hc_head_fn": "hc_head.hc_fn",
           "hc_head_base": "hc_head.hc_base", "hc_head_scale": "hc_head.hc_scale"}
    for s, d in ren.items():
        take(p + s, d)
    gu, dn = [], []
    for e in range(ne):
        for w in ("w1", "w3", "w2"):
            used.add(f"{p}ffn.experts.{e}.{w}.weight")
        gu.append(torch.cat([ckpt[f"{p}ffn.experts.{e}.w1.weight"],
                             ckpt[f"{p}ffn.experts.{e}.w3.weight"]], 0).to(torch.float32))
        dn.append(ckpt[f"{p}ffn.experts.{e}.w2.weight"].to(torch.float32))
    sd["layer.mlp.experts.gate_up_proj"] = torch.stack(gu, 0)
    sd["layer.mlp.experts.down_proj"] = torch.stack(dn, 0)
    left = sorted(k for k in ckpt if k.startswith(p) and k not in used)
    assert not left, f"mtp.0 tensors not bound by the MTP reference: {left}"
    return sd, len(used)


def run_mtp(model, raw, ckpt, ids, h_last, log):
    """MTP logits for positions 0..n-2: main last-layer streams H[i] paired with token ids[i+1]
    (vLLM alignment, spec §3.9), RoPE position i, its own sliding cache; predicts token i+2."""
    from transformers import DynamicCache
    mtp = MTPRef(model.config, raw)
    sd, n_used = mtp_state_dict(ckpt, model.config.n_routed_experts)
    rot = {k: v for k, v in mtp.state_dict().items() if "inv_freq" in k}
    sd.update(rot)
    mtp.load_state_dict(sd, strict=True)  # raises on any missing / unexpected name
    mtp.eval()
    n = len(ids) - 1
    tok = torch.from_numpy(ids[1:]).unsqueeze(0)                      # [1, n]
    H = h_last[:n].unsqueeze(0)                                        # [1, n, 4, D]
    pos = torch.arange(n).unsqueeze(0)
    with torch.no_grad():
        e = mtp.enorm(model.model.embed_tokens(tok))
        x = mtp.e_proj(e).unsqueeze(2) + mtp.h_proj(mtp.hnorm(H))
        cache = DynamicCache(config=mtp.cfg)
        mask = mdv4.create_sliding_window_causal_mask(config=mtp.cfg, inputs_embeds=e, attention_mask=None,
                                                      position_ids=pos, **{CACHE_KW: cache})
        pe = {"main": mtp.rotary(e, position_ids=pos, layer_type="main"),
              "compress": mtp.rotary(e, position_ids=pos, layer_type="compress")}
        X = mtp.layer(x, position_embeddings=pe, position_ids=pos, attention_mask=mask,
                      input_ids=tok, **{CACHE_KW: cache})
        logits = model.lm_head(mtp.norm(mtp.hc_head(X)))[0]
    log(f"MTP reference: {n_used} mtp.0 tensors bound, {n} positions")
    return logits, X[0], n_used


def write_array(outdir, fname, arr, dtype="f32"):
    a = np.ascontiguousarray(arr.detach().cpu().numpy().astype({"f32": "<f4", "i32": "<i4"}[dtype]))
    with open(os.path.join(outdir, fname), "wb") as f:
        f.write(a.tobytes())
    return {"file": fname, "dtype": dtype, "shape": list(a.shape),
            "sha256": hashlib.sha256(a.tobytes()).hexdigest()}


def make_refs(models_dir, name, model, ckpt, layout, final_dir, log):
    """Writes into <final_dir>.tmp and swaps it in only when everything succeeded."""
    import shutil
    outdir = final_dir + ".tmp"
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    man_q, man_b = manifest(models_dir, name), manifest(models_dir, name + "-bf16")
    probe = Probe(model)
    cases, single = [], {}
    for case in CASES:
        ids = case_ids(case)
        lg, st = run_case(model, probe, ids, case["chunks"])
        pos = selected_positions(len(ids), case["chunks"])
        ent = {"name": case["name"], "input_ids": [int(i) for i in ids], "chunks": case["chunks"],
               "positions": pos, "arrays": {}}
        ent["arrays"]["logits"] = write_array(outdir, f"{case['name']}.logits.f32", lg[pos])
        top2 = torch.topk(lg[pos], 2, dim=-1).values
        ent["min_top2_margin"] = float((top2[:, 0] - top2[:, 1]).min())
        ent["argmax"] = [int(i) for i in lg[pos].argmax(-1)]
        routing, idxsel = probe.last_selections
        ent["arrays"]["experts"] = write_array(outdir, f"{case['name']}.experts.i32",
                                               routing[:, pos], "i32")
        ent["arrays"]["experts"]["note"] = "routed expert ids per layer, sorted ascending per row"
        if idxsel:
            layers = sorted(idxsel)
            ent["arrays"]["indexer_topk"] = write_array(
                outdir, f"{case['name']}.indexer_topk.i32",
                torch.stack([idxsel[li][pos] for li in layers], 0), "i32")
            ent["arrays"]["indexer_topk"]["layers"] = layers
            ent["arrays"]["indexer_topk"]["note"] = ("compressed-row ids chosen by the indexer, "
                                                     "sorted ascending, -1 padding after them")
        if case.get("streams"):
            ent["arrays"]["layer_streams"] = write_array(outdir, f"{case['name']}.layer_streams.f32",
                                                         st[:, pos])
        if len(case["chunks"]) == 1:
            single[case["name"]] = (ids, lg, st)
        else:  # transformers self-consistency: same ids in one pass
            from transformers import DynamicCache  # noqa: F401
            lg1, _ = run_case(model, probe, ids, [len(ids)])
            r1, i1 = probe.last_selections
            ent["selections_equal_single_pass"] = bool(
                torch.equal(r1, routing) and all(torch.equal(i1[k], idxsel[k]) for k in i1))
            ent["max_abs_diff_vs_single_pass"] = float((lg1 - lg).abs().max())
            assert ent["max_abs_diff_vs_single_pass"] < 1e-3, ent["max_abs_diff_vs_single_pass"]
        cases.append(ent)
        log(f"{name}: {case['name']}: {len(pos)} positions stored"
            + (f", vs single pass {ent['max_abs_diff_vs_single_pass']:.2e}"
               if "max_abs_diff_vs_single_pass" in ent else ""))
    mtp_ent = None
    if name == "tiny-flash":
        ids, _, st = single["prefill_129"]
        raw = json.load(open(os.path.join(models_dir, name + "-bf16", "config.json")))
        mlg, mX, n_used = run_mtp(model, raw, ckpt, ids, st[-1], log)
        pos = selected_positions(len(ids) - 1, [len(ids) - 1])
        mtp_ent = {"name": "mtp_129", "source_case": "prefill_129", "positions": pos,
                   "alignment": "row i = main last-layer streams at i + embed(input_ids[i+1]), "
                                "RoPE position i, predicts input_ids[i+2]",
                   "mtp_tensors_bound": n_used, "arrays": {}}
        mtp_ent["arrays"]["logits"] = write_array(outdir, "mtp_129.logits.f32", mlg[pos])
        mtp_ent["arrays"]["streams"] = write_array(outdir, "mtp_129.streams.f32", mX[pos])
        layout["mtp_tensors_bound_by_mtp_reference"] = n_used
    probe_stats = dict(probe.clamp)
    probe.close()
    assert probe_stats["shared_gate_gt_limit"] > 0 and probe_stats["shared_up_abs_gt_limit"] > 0
    assert probe_stats["routed_gate_gt_limit"] > 0 and probe_stats["routed_up_abs_gt_limit"] > 0
    index = {
        "format": FORMAT,
        "model": name,
        "checkpoint_digest": man_q["digest"],
        "checkpoint_bf16_digest": man_b["digest"],
        "generator_version": man_q["generator_version"],
        "numerics": "transformers fp32 (HF mode: dequantised weights, no QAT, fp32 activations)",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "vocab_size": model.config.vocab_size,
        "num_hidden_layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "hc_mult": model.config.hc_mult,
        "layout_proof": layout,
        "swiglu_clamp_coverage": probe_stats,
        "cases": cases,
    }
    if mtp_ent:
        index["mtp"] = mtp_ent
    with open(os.path.join(outdir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir))
    shutil.rmtree(final_dir, ignore_errors=True)
    os.rename(outdir, final_dir)
    log(f"{name}: wrote {final_dir} ({size / 1e6:.2f} MB)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.path.join(ROOT, "models"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "ref"))
    ap.add_argument("--only", action="append", choices=REF_MODELS)
    ap.add_argument("--layout-only", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)

    def log(msg):
        print("ref_transformers: " + msg, flush=True)
    names = args.only or REF_MODELS
    ensure_models(args.models, [n for m in names for n in (m, m + "-bf16")])
    for name in names:
        model, ckpt, layout = layout_proof(args.models, name, log)
        if not args.layout_only:
            make_refs(args.models, name, model, ckpt, layout, os.path.join(args.out, name), log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
