#!/usr/bin/env python3
"""MTP block reference (spec/MODEL.md §3.9, §5.6) for checkpoints with one `mtp.0` block.

Composed from transformers building blocks as MODEL.md §5.6 suggests: a DeepseekV4DecoderLayer of a
1-layer config (layer_types ["sliding_attention"], mlp_layer_types ["moe"]), DeepseekV4HyperHead,
three DeepseekV4RMSNorm (enorm, hnorm, norm) and two bias-free linears (e_proj, h_proj), loaded from
the dequantised `mtp.0.*` tensors; the shared `embed.weight` / `head.weight` of the target. Fed the
target's last-layer streams (hook on model.model.layers[-1]; `hidden_states[-1]` is post-norm) and
the ids shifted left by one (§3.9: H_i pairs with token i+1, the MTP row sits at RoPE position i
and predicts token i+2). The last row pairs H_{T-1} with the target's greedy token at T.

A second, independent computation with the primitives of tools/ref_dspark.py (`mtp_own`) gives the
same result in "hf" mode (checked by tests/py/test_ref_dspark.py::test_mtp_own_matches_transformers)
and also provides the "ref" numerics (W8A8 activations incl. e_proj/h_proj, FP8 KV round-trip).

Choices, each with the test that catches it flipping:
M1 Alignment (vLLM convention, §3.9): H_i with embed(token_{i+1}) at position i. A ds4-style pairing
   with token_i changes every row (`sensitivity.unshifted_ids` in meta.json); C test against
   this fixture.
M2 Position 0 is NOT zeroed (vLLM zeroes the MTP input embedding at position 0; the official file
   shows no such step). meta.json says `compare_from_position: 1` so the C side may do either.
M3 MTP attention: causal sliding window of `sliding_window` rows including the row itself, over the
   MTP's own K=V rows; RoPE theta = rope_theta without YaRN; top-k routing (layer id =
   num_hidden_layers, never hash). Caught by: test_mtp_causal (row t of a full-sequence call equals
   a call truncated after t) and test_mtp_own_matches_transformers.
M4 Per-stream hnorm: RMSNorm over each of the hc streams separately, with one weight vector.

Usage: python3 tools/ref_mtp.py MODEL_DIR [--out tests/fixtures/ref/mtp]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_dspark as R  # noqa: E402


def window_mask(T: int, window: int) -> torch.Tensor:
    """visible[i, j] = j <= i < j + window (MODEL.md §3.4.4: window includes the row itself)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return (j <= i) & (i - j < window)


class MTPTransformers(nn.Module):
    def __init__(self, cfg: dict, tensors: dict):
        super().__init__()
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        if R.count_stages(tensors.keys()) != 1 or "mtp.0.e_proj.weight" not in tensors:
            raise ValueError("not an MTP checkpoint (expects exactly mtp.0 with e_proj)")
        c1 = R.hf_config(cfg, n_layers=1, compress_ratios=[0], num_hash_layers=0)
        c1._attn_implementation = "eager"
        assert c1.layer_types == ["sliding_attention"] and c1.mlp_layer_types == ["moe"], c1.layer_types
        H, eps = c1.hidden_size, c1.rms_norm_eps
        self.c1 = c1
        self.layer = m.DeepseekV4DecoderLayer(c1, 0)
        self.hc_head = m.DeepseekV4HyperHead(c1)
        self.enorm, self.hnorm, self.norm = (m.DeepseekV4RMSNorm(H, eps) for _ in range(3))
        self.e_proj = nn.Linear(H, H, bias=False)
        self.h_proj = nn.Linear(H, H, bias=False)
        self.rotary = m.DeepseekV4RotaryEmbedding(c1)
        # mtp.0.* is a ratio-0, non-hash layer: reuse the target mapping under "layers.0.".
        layer_t = {"layers.0." + k[len("mtp.0."):]: v for k, v in tensors.items()
                   if k.startswith("mtp.0.") and k.split(".")[2] not in
                   ("e_proj", "h_proj", "enorm", "hnorm", "norm", "hc_head_fn", "hc_head_base", "hc_head_scale")}
        sd = {k[len("model.layers.0."):]: v for k, v in R.hf_state_dict(layer_t, 1).items()}
        self.layer.load_state_dict(sd, strict=True)
        with torch.no_grad():
            self.hc_head.hc_fn.copy_(tensors["mtp.0.hc_head_fn"])
            self.hc_head.hc_base.copy_(tensors["mtp.0.hc_head_base"])
            self.hc_head.hc_scale.copy_(tensors["mtp.0.hc_head_scale"])
            for n in ("enorm", "hnorm", "norm"):
                getattr(self, n).weight.copy_(tensors[f"mtp.0.{n}.weight"])
            self.e_proj.weight.copy_(tensors["mtp.0.e_proj.weight"])
            self.h_proj.weight.copy_(tensors["mtp.0.h_proj.weight"])
        self.embed = tensors["embed.weight"]
        self.head = tensors["head.weight"]
        self.window = c1.sliding_window

    @torch.no_grad()
    def forward(self, Hs: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor):
        """Hs [T, hc, H] target last-layer streams, next_ids [T], positions [T] (contiguous)
        -> (logits [T, V], output streams [T, hc, H])."""
        T = Hs.shape[0]
        e = self.enorm(self.embed[next_ids])
        X = self.e_proj(e)[:, None, :] + self.h_proj(self.hnorm(Hs))
        pos = positions[None]
        pe = {k: self.rotary(X, pos, layer_type=k) for k in ("main", "compress")}
        mask = torch.zeros(1, 1, T, T).masked_fill(~window_mask(T, self.window), float("-inf"))
        X = self.layer(X[None], position_embeddings=pe, position_ids=pos, attention_mask=mask,
                       cache=None, input_ids=None)[0]
        logits = self.norm(self.hc_head(X[None]))[0] @ self.head.t()
        return logits, X


@torch.no_grad()
def mtp_own(W: R.Weights, c: R.DraftConfig, Hs, next_ids, positions):
    """The same MTP block from the primitives of ref_dspark (any numeric mode of W)."""
    p = "mtp.0."
    e = R.rms(W["embed.weight"][next_ids], W[p + "enorm.weight"], c.eps)
    X = W.lin(e, p + "e_proj.weight")[:, None, :] + W.lin(R.rms(Hs, W[p + "hnorm.weight"], c.eps),
                                                         p + "h_proj.weight")
    vis = window_mask(len(positions), c.window)

    def attention(y):
        q = R.queries(W, c, y, p, positions)
        kv = R.kv_rows(W, c, y, p, positions)
        o = R.sink_attention(q, kv, vis, W[p + "attn.attn_sink"], c.head_dim, W.mode == "ref")
        return R.attn_out(W, c, o, p, positions)

    X = R.block(W, c, X, p, c.n_layers, attention)
    h = R.hc_head(W, X, p, c.hc_eps, c.eps)
    return R.rms(h, W[p + "norm.weight"], c.eps) @ W["head.weight"].t(), X


def mtp_inputs(run: dict, ids: torch.Tensor, n_layers: int, shift=True):
    """(H streams, next ids, positions) for every prompt position (M1)."""
    T = len(ids)
    Hs = run["out"][n_layers - 1]
    nxt = torch.cat([ids[1:], run["logits"][-1].argmax()[None]]) if shift else ids.clone()
    return Hs, nxt, torch.arange(T)


@torch.no_grad()
def make_fixtures(model_dir: str, out_dir: str, prompts=None):
    cfg, tensors, quantised = R.load_checkpoint(model_dir)
    c = R.model_config(cfg)
    target = R.Target(cfg, tensors)
    mtp = MTPTransformers(cfg, tensors).eval()
    if prompts is None:
        g = torch.Generator().manual_seed(4321)
        prompts = [torch.randint(2, c.vocab, (T,), generator=g) for T in (9, 30)]
    w = R.FixtureWriter(out_dir)
    cases, worst = [], float("inf")
    for pi, ids in enumerate(prompts):
        run = target.run(ids)
        Hs, nxt, pos = mtp_inputs(run, ids, c.n_layers)
        logits, Xo = mtp(Hs, nxt, pos)
        own_ref, _ = mtp_own(R.Weights(tensors, quantised, "ref"), c, Hs, nxt, pos)
        alt, _ = mtp(*mtp_inputs(run, ids, c.n_layers, shift=False))
        worst = min(worst, float((alt[1:] - logits[1:]).abs().max()))
        n = f"p{pi}"
        cases.append({
            "name": n, "input_ids": ids.tolist(), "next_ids": nxt.tolist(), "positions": pos.tolist(),
            "argmax_hf": logits.argmax(-1).tolist(), "min_top2_margin_hf": R.top2_margin(logits[1:]),
            "arrays": {"streams": w.add(f"{n}/streams", Hs), "logits_hf": w.add(f"{n}/hf/logits", logits),
                       "out_streams_hf": w.add(f"{n}/hf/out_streams", Xo),
                       "logits_ref": w.add(f"{n}/ref/logits", own_ref)}})
    import transformers

    w.finish({
        "format": "dsv4-ref-v1", "kind": "mtp",
        "what": "MTP block reference (tools/ref_mtp.py, spec/MODEL.md §3.9, §5.6); layout: tools/REF_FORMAT.md",
        "model": os.path.basename(os.path.normpath(model_dir)),
        "checkpoint_digest": R.checkpoint_digest(model_dir),
        "numerics": {"hf": "transformers building blocks, fp32", "ref": "own primitives (tools/ref_dspark.py) "
                     "with W8A8 activations (incl. e_proj/h_proj) and the FP8 K/V round-trip"},
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "alignment": "row i = target last-layer streams at i + enorm(embed(next_ids[i])), next_ids[i] = "
                     "input_ids[i+1] (last: target greedy token), RoPE position i, predicts token i+2",
        "compare_from_position": 1, "cases": cases,
        "sensitivity": {"unshifted_ids": worst},
        "tolerance": {"hf": {"logits_abs": 1e-3}, "ref": {"logits_abs": 5e-2}},
    })
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", nargs="?", default="models/tiny-flash")
    ap.add_argument("--out", default="tests/fixtures/ref/mtp")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(make_fixtures(a.model_dir, a.out)))


if __name__ == "__main__":
    sys.exit(main())
