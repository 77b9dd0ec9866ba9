"""Internal consistency of the DSpark drafter and MTP references (tools/ref_dspark.py,
tools/ref_mtp.py). Each test asserts a property the spec states (spec/DSPARK.md §2, §4.6, §4.8,
spec/MODEL.md §2.3, §3.9) and can fail; the choice labels C1..C11 refer to the header of
tools/ref_dspark.py.

The models are small random checkpoints built here in memory (and, for the loader test, written
as quantised safetensors), so the tests do not depend on models/ having been generated. When
tests/fixtures/ref/dspark exists, its internal consistency is checked too.
"""
import json
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install -r requirements-ref.txt)")
pytest.importorskip("transformers", reason="transformers not installed (pip install -r requirements-ref.txt)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ref_dspark as R  # noqa: E402
import ref_mtp as M  # noqa: E402

torch.set_num_threads(1)

# ------------------------------------------------------------------------------------------
# Tiny random checkpoints in the real layout (spec/MODEL.md §5.2, DSPARK.md §3.1).
# ------------------------------------------------------------------------------------------

BASE_CFG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 64,
    "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "num_hash_layers": 2,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu",
    "sliding_window": 16, "compress_ratios": [0, 4, 128, 4, 0],
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 1048576,
    "index_n_heads": 8, "index_head_dim": 128, "index_topk": 4,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "rms_norm_eps": 1e-06,
    "num_nextn_predict_layers": 1, "expert_dtype": "fp4",
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "attention_bias": False, "torch_dtype": "bfloat16",
}


def dspark_cfg(stages=3):
    c = dict(BASE_CFG)
    c["compress_ratios"] = [0, 4, 128, 4] + [0] * stages
    c.update({"dspark_block_size": 5, "dspark_target_layer_ids": [1, 2, 3],
              "dspark_noise_token_id": 509, "dspark_markov_rank": 32,
              "num_nextn_predict_layers": 1})
    return c


def _layer(t, g, cfg, pfx, ratio, hash_layer):
    H, nh, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
    qlr, G, olr = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    E, I, V, k = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["vocab_size"], cfg["num_experts_per_tok"]

    def lin(o, i, gain=1.0):
        return torch.randn(o, i, generator=g) * (gain / math.sqrt(i))

    def nw(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    t[pfx + "attn_norm.weight"], t[pfx + "ffn_norm.weight"] = nw(H), nw(H)
    for h in ("attn", "ffn"):
        t[pfx + f"hc_{h}_fn"] = torch.randn(24, 4 * H, generator=g) * 0.05
        t[pfx + f"hc_{h}_base"] = torch.randn(24, generator=g)
        t[pfx + f"hc_{h}_scale"] = 1 + 0.2 * torch.randn(3, generator=g)
    a = pfx + "attn."
    t[a + "attn_sink"] = torch.randn(nh, generator=g)
    t[a + "wq_a.weight"], t[a + "q_norm.weight"] = lin(qlr, H), nw(qlr)
    t[a + "wq_b.weight"] = lin(nh * hd, qlr)
    t[a + "wkv.weight"], t[a + "kv_norm.weight"] = lin(hd, H), nw(hd)
    t[a + "wo_a.weight"] = lin(G * olr, nh * hd // G)
    t[a + "wo_b.weight"] = lin(H, G * olr)
    if ratio:
        w = 2 * hd if ratio == 4 else hd
        t[a + "compressor.ape"] = torch.randn(ratio, w, generator=g) * 0.5
        t[a + "compressor.wkv.weight"], t[a + "compressor.wgate.weight"] = lin(w, H), lin(w, H)
        t[a + "compressor.norm.weight"] = nw(hd)
    if ratio == 4:
        ih, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
        t[a + "indexer.wq_b.weight"] = lin(ih * ihd, qlr)
        t[a + "indexer.weights_proj.weight"] = lin(ih, H)
        t[a + "indexer.compressor.ape"] = torch.randn(4, 2 * ihd, generator=g) * 0.5
        t[a + "indexer.compressor.wkv.weight"] = lin(2 * ihd, H)
        t[a + "indexer.compressor.wgate.weight"] = lin(2 * ihd, H)
        t[a + "indexer.compressor.norm.weight"] = nw(ihd)
    f = pfx + "ffn."
    t[f + "gate.weight"] = lin(E, H, 2.0)
    if hash_layer:
        t[f + "gate.tid2eid"] = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(V)])
    else:
        t[f + "gate.bias"] = torch.randn(E, generator=g) * 0.3
    for e in range(E):
        gain = 6.0 if e == 0 else 1.5  # expert 0 and the shared expert exceed the +-10 clamps
        t[f + f"experts.{e}.w1.weight"], t[f + f"experts.{e}.w3.weight"] = lin(I, H, gain), lin(I, H, gain)
        t[f + f"experts.{e}.w2.weight"] = lin(H, I)
    s = f + "shared_experts."
    t[s + "w1.weight"], t[s + "w3.weight"], t[s + "w2.weight"] = lin(I, H, 6.0), lin(I, H, 6.0), lin(H, I)


QUANT_SUFFIXES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
                  "attn.wo_b.weight", "indexer.wq_b.weight", "main_proj.weight", "e_proj.weight",
                  "h_proj.weight")


def is_quantised(name):
    return (name.endswith(QUANT_SUFFIXES) or ".shared_experts.w" in name or ".experts." in name) \
        and name.endswith(".weight")


def make_model(kind="dspark", stages=3, seed=0):
    """Random tiny checkpoint: (config, tensors by upstream name, set of FP8/FP4 weight names)."""
    cfg = dspark_cfg(stages) if kind == "dspark" else dict(BASE_CFG)
    g = torch.Generator().manual_seed(seed)
    H, V, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    t = {"embed.weight": torch.randn(V, H, generator=g),
         "head.weight": torch.randn(V, H, generator=g) / math.sqrt(H) * 4,
         "norm.weight": 1 + 0.1 * torch.randn(H, generator=g),
         "hc_head_fn": torch.randn(4, 4 * H, generator=g) * 0.05,
         "hc_head_base": torch.randn(4, generator=g), "hc_head_scale": 1 + 0.2 * torch.randn(1, generator=g)}
    for L in range(n):
        _layer(t, g, cfg, f"layers.{L}.", cfg["compress_ratios"][L], L < cfg["num_hash_layers"])
    S = stages if kind == "dspark" else 1
    for s in range(S):
        p = f"mtp.{s}."
        _layer(t, g, cfg, p, 0, False)
        last = s == S - 1
        if kind == "dspark" and s == 0:
            nT = len(cfg["dspark_target_layer_ids"])
            t[p + "main_proj.weight"] = torch.randn(H, nT * H, generator=g) / math.sqrt(nT * H)
            t[p + "main_norm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
        if kind == "mtp":
            t[p + "e_proj.weight"] = torch.randn(H, H, generator=g) / math.sqrt(H)
            t[p + "h_proj.weight"] = torch.randn(H, H, generator=g) / math.sqrt(H)
            t[p + "enorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
            t[p + "hnorm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
        if last:
            t[p + "norm.weight"] = 1 + 0.1 * torch.randn(H, generator=g)
            t[p + "hc_head_fn"] = torch.randn(4, 4 * H, generator=g) * 0.05
            t[p + "hc_head_base"] = torch.randn(4, generator=g)
            t[p + "hc_head_scale"] = 1 + 0.2 * torch.randn(1, generator=g)
        if last and kind == "dspark":
            r = cfg["dspark_markov_rank"]
            t[p + "markov_head.markov_w1.weight"] = torch.randn(V, r, generator=g)
            t[p + "markov_head.markov_w2.weight"] = torch.randn(V, r, generator=g) / math.sqrt(r) * 2
            t[p + "confidence_head.proj.weight"] = torch.randn(1, H + r, generator=g) * 0.005
    return cfg, t, {k for k in t if is_quantised(k)}


_CACHE = {}


def model(kind="dspark", stages=3):
    if (kind, stages) not in _CACHE:
        _CACHE[(kind, stages)] = make_model(kind, stages)
    return _CACHE[(kind, stages)]


def weights(mode="hf", kind="dspark", kv_fp8=None):
    cfg, t, q = model(kind)
    return R.Weights(t, q, mode, kv_fp8)


def drafter(mode="hf", kv_fp8=None, cfg_override=None):
    cfg, t, q = model("dspark")
    cfg = dict(cfg, **(cfg_override or {}))
    return R.Drafter(R.draft_config(cfg, t.keys()), R.Weights(t, q, mode, kv_fp8))


_RUNS = {}


def target_run(ids, kind="dspark"):
    key = (kind, tuple(int(i) for i in ids))
    if key not in _RUNS:
        if ("target", kind) not in _RUNS:
            cfg, t, _ = model(kind)
            _RUNS[("target", kind)] = R.Target(cfg, t)
        _RUNS[key] = _RUNS[("target", kind)].run(torch.as_tensor(ids))
    return _RUNS[key]


def prompt(T=30, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 500, (T,), generator=g)


def feats_of(ids, tap="output"):
    cfg, t, _ = model("dspark")
    return R.features(target_run(ids), cfg["dspark_target_layer_ids"], tap)


# ------------------------------------------------------------------------------------------
# Safetensors writing with real quantisation (independent of the reader: torch's float8 cast and
# ml_dtypes' float4 rounding produce the codes).
# ------------------------------------------------------------------------------------------


def quant_fp8(w):
    o, i = w.shape
    blk = w.reshape(o // 128, 128, i // 128, 128)
    amax = blk.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-30)
    e = torch.ceil(torch.log2(amax / 448.0))
    q = (blk / torch.exp2(e)).to(torch.float8_e4m3fn)
    return q.reshape(o, i).view(torch.uint8).numpy(), (e[:, 0, :, 0] + 127).to(torch.uint8).numpy()


def quant_fp4(w):
    import ml_dtypes
    o, i = w.shape
    blk = w.reshape(o, i // 32, 32)
    e = torch.ceil(torch.log2(blk.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 6.0))
    q = (blk / torch.exp2(e)).numpy().astype(ml_dtypes.float4_e2m1fn).reshape(o, i)
    codes = q.view(np.uint8) & 0xF
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), (e[..., 0] + 127).to(torch.uint8).numpy()


def write_safetensors(path, cfg, tensors, quantised):
    entries, blobs, off = {}, [], 0

    def put(name, dtype, arr):
        nonlocal off
        b = np.ascontiguousarray(arr).tobytes()
        entries[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)

    for name, t in tensors.items():
        if name in quantised:
            fp4 = ".experts." in name and ".shared_experts." not in name
            w, s = quant_fp4(t) if fp4 else quant_fp8(t)
            put(name, "I8" if fp4 else "F8_E4M3", w)
            put(name[:-len("weight")] + "scale", "F8_E8M0", s)
        elif t.dtype == torch.int64:
            put(name, "I64", t.numpy())
        elif name.endswith(("_fn", "_base", "_scale", "attn_sink", "gate.bias", ".ape")):
            put(name, "F32", t.numpy().astype("<f4"))
        else:  # BF16 by truncation-free rounding through torch
            put(name, "BF16", t.to(torch.bfloat16).view(torch.int16).numpy())
    head = json.dumps(entries).encode()
    head += b" " * (-len(head) % 8)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head + b"".join(blobs))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


# ------------------------------------------------------------------------------------------
# Number formats and loading (MODEL.md §2.3).
# ------------------------------------------------------------------------------------------


def test_e4m3_table_matches_torch():
    codes = torch.arange(256, dtype=torch.uint8)
    ref = codes.view(torch.float8_e4m3fn).to(torch.float32).numpy()
    nan = np.isnan(ref)
    assert list(np.nonzero(nan)[0]) == [0x7F, 0xFF]
    assert np.array_equal(np.isnan(R.E4M3), nan)
    assert np.array_equal(R.E4M3[~nan], ref[~nan])
    assert R.E4M3[0x38] == 1.0 and R.E4M3[0x7E] == 448.0 and R.E4M3[0x01] == 2.0 ** -9


def test_fp4_nibble_order_and_table():
    import ml_dtypes
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(R.FP4, ref)
    # byte 0x21: low nibble 1 (+0.5) is column 0, high nibble 2 (+1.0) column 1; scale 2^(128-127)
    p = np.array([[0x21] * 16], dtype=np.uint8)
    s = np.array([[128]], dtype=np.uint8)
    v = R.dequant_fp4(p, s, "t")
    assert v.shape == (1, 32) and v[0, 0] == 1.0 and v[0, 1] == 2.0


def test_loader_dequantises_written_checkpoint(tmp_path):
    cfg, t, q = model("dspark")
    sub = {k: v for k, v in t.items() if k.startswith(("mtp.0.", "embed", "head", "layers.0."))}
    qs = {k for k in q if k in sub}
    write_safetensors(tmp_path, cfg, sub, qs)
    cfg2, t2, q2 = R.load_checkpoint(str(tmp_path))
    assert cfg2 == cfg and q2 == qs and set(t2) == set(sub)  # every .scale consumed
    name = "mtp.0.attn.wq_b.weight"
    w8, s8 = quant_fp8(sub[name])
    ind = torch.from_numpy(w8).view(torch.float8_e4m3fn).float() * \
        torch.exp2(torch.from_numpy(s8.astype(np.float32)) - 127).repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(t2[name], ind)
    rel = (t2[name] - sub[name]).norm() / sub[name].norm()
    assert rel < 0.05
    e = "mtp.0.ffn.experts.3.w2.weight"
    assert (t2[e] - sub[e]).norm() / sub[e].norm() < 0.15
    assert torch.equal(t2["mtp.0.hc_attn_fn"], sub["mtp.0.hc_attn_fn"])  # F32 stays F32
    assert torch.equal(t2["layers.0.ffn.gate.tid2eid"], sub["layers.0.ffn.gate.tid2eid"])


# ------------------------------------------------------------------------------------------
# Configuration (C5, C6, C7).
# ------------------------------------------------------------------------------------------


def test_noise_id_required():
    cfg, t, _ = model("dspark")
    assert R.draft_config(cfg, t.keys()).noise_id == 509
    bad = dict(cfg)
    del bad["dspark_noise_token_id"]
    with pytest.raises(ValueError, match="dspark_noise_token_id"):
        R.draft_config(bad, t.keys())
    for v in (cfg["vocab_size"], -1, True, None):
        with pytest.raises(ValueError, match="dspark_noise_token_id"):
            R.draft_config(dict(cfg, dspark_noise_token_id=v), t.keys())


def test_stage_count_from_names():
    cfg, t, _ = model("dspark")
    assert cfg["num_nextn_predict_layers"] == 1
    assert R.draft_config(cfg, t.keys()).n_stages == 3
    gap = [k for k in t if not k.startswith("mtp.1.")]
    with pytest.raises(ValueError, match="contiguous"):
        R.draft_config(cfg, gap)
    two = [k for k in t if not k.startswith("mtp.2.")]
    assert R.draft_config(dict(cfg, compress_ratios=cfg["compress_ratios"][:-1]), two).n_stages == 2
    with pytest.raises(ValueError, match="ratio 0"):
        R.draft_config(dict(cfg, compress_ratios=[0, 4, 128, 4, 0, 4, 0]), t.keys())
    mcfg, mt, _ = model("mtp")
    with pytest.raises(ValueError, match="main_proj"):
        R.draft_config(dict(mcfg, dspark_noise_token_id=5), mt.keys())


def test_no_hash_routing_in_stages():
    d = drafter()
    c = d.c
    assert c.num_hash_layers == 2 and [c.stage_layer_id(s) for s in range(3)] == [4, 5, 6]
    ids = prompt()
    ring = R.build_ring(d, feats_of(ids), 20)
    d.W.trace = []
    d.draft([(ring, int(ids[20]), 20)])
    assert [lid for lid, _, _ in d.W.trace] == [4, 5, 6]
    for s, (_, sel, scores) in enumerate(d.W.trace):
        want = torch.topk(scores + d.W[f"mtp.{s}.ffn.gate.bias"], c.top_k, dim=-1).indices
        assert torch.equal(sel.sort(-1).values, want.sort(-1).values)
    # Numbering the stages 0..2 would route stage 0/1 through a tid2eid the drafter does not have.
    x = torch.randn(2, c.hidden)
    with pytest.raises(KeyError, match="tid2eid"):
        R.moe(d.W, c, x, "mtp.0.ffn.", 0, torch.tensor([3, 4]))


# ------------------------------------------------------------------------------------------
# The draft step (C1, C3, C4, C9, C10, C11).
# ------------------------------------------------------------------------------------------


def test_markov_teacher_forced():
    d = drafter()
    ids = prompt()
    P = 25
    r = d.draft([(R.build_ring(d, feats_of(ids), P), int(ids[P]), P)])
    W1 = d.W["mtp.2.markov_head.markov_w1.weight"]
    W2 = d.W["mtp.2.markov_head.markov_w2.weight"]
    prev = [int(ids[P])] + r["tokens"][0, :-1].tolist()
    for i in range(5):
        z = r["base_logits"][0, i] + W2 @ W1[prev[i]]
        assert torch.allclose(z, r["logits"][0, i], atol=1e-5)
        assert int(z.argmax()) == int(r["tokens"][0, i])
        assert torch.equal(r["markov_emb"][0, i], W1[prev[i]])
    w = d.W["mtp.2.confidence_head.proj.weight"][0]
    cl = torch.stack([w @ torch.cat([r["hidden"][0, i], W1[prev[i]]]) for i in range(5)])
    assert torch.allclose(cl, r["conf_logit"][0], atol=1e-5)
    assert torch.allclose(r["conf"][0], torch.sigmoid(cl))
    # base logits use the drafter's own final norm on the pre-norm hidden (DSPARK.md §2.4 Head)
    U = R.rms(r["hidden"][0], d.W["mtp.2.norm.weight"], 1e-6) @ d.W["head.weight"].t()
    assert torch.allclose(U, r["base_logits"][0], atol=1e-4)


def test_block_is_noncausal():
    ids = prompt()
    P = 20
    outs = []
    for noise in (509, 300):
        d = drafter(cfg_override={"dspark_noise_token_id": noise})
        outs.append(d.draft([(R.build_ring(d, feats_of(ids), P), int(ids[P]), P)]))
    assert torch.equal(outs[0]["ids"][0, 1:], torch.full((4,), 509))
    # slot 0 holds the anchor in both runs; it differs only through attention to the noise slots
    assert (outs[0]["base_logits"][0, 0] - outs[1]["base_logits"][0, 0]).abs().max() > 1e-3


def test_batch_independence():
    d = drafter("hf")
    reqs = []
    for seed, P in ((7, 20), (8, 3), (9, 29)):
        ids = prompt(seed=seed)
        reqs.append((R.build_ring(d, feats_of(ids), P), int(ids[P]), P))
    rb = d.draft(reqs)
    for b, req in enumerate(reqs):
        r1 = d.draft([req])
        assert torch.allclose(rb["logits"][b], r1["logits"][0], atol=1e-4)
        assert torch.equal(rb["tokens"][b], r1["tokens"][0])
        assert torch.equal(rb["positions"][b], torch.arange(5) + req[2])


def test_context_causal_in_prefix():
    """A draft anchored at P depends only on positions < P: a target run on ids[:P] gives the same
    draft as one on the whole prompt (features are causal; the ring holds only rows < P)."""
    d = drafter()
    ids = prompt()
    P = 22
    full = d.draft([(R.build_ring(d, feats_of(ids), P), int(ids[P]), P)])
    pre = d.draft([(R.build_ring(d, feats_of(ids[:P]), P), int(ids[P]), P)])
    assert torch.allclose(full["logits"], pre["logits"], atol=1e-4)
    assert torch.equal(full["tokens"], pre["tokens"])


def test_ring_rowwise_and_last_window():
    ids = prompt()
    f = feats_of(ids)
    T = len(ids)
    for mode in ("hf", "ref"):
        d = drafter(mode)
        ck = d.context_rows(f, torch.arange(T))
        one = torch.cat([d.context_rows(f[t:t + 1], torch.tensor([t])) for t in range(T)], dim=1)
        off = (ck - one).abs() > 1e-5
        # "ref": W8A8 / FP8 codes may flip where GEMM summation order moves a value across a
        # rounding boundary; such flips must stay rare (here: < 1 element in 1000).
        assert off.float().mean() <= (0 if mode == "hf" else 1e-3), mode
    a, b = R.Ring(3, 16, 128), R.Ring(3, 16, 128)
    a.write(torch.arange(T), ck)
    for t in range(T):
        b.write(torch.tensor([t]), ck[:, t:t + 1])
    assert torch.equal(a.k, b.k) and torch.equal(a.pos, b.pos)
    assert sorted(a.pos[0].tolist()) == list(range(T - 16, T))
    assert all(p % 16 == s for s, p in enumerate(a.pos[0].tolist()))


def test_ring_accepted_rows_only():
    """Verify of k=4 drafts at anchor P with a=2 accepted: only rows P..P+2 may reach the ring
    (DSPARK.md §4.6). The incremental ring equals a ring rebuilt from the committed sequence, and
    writing the rejected rows too changes the next draft."""
    d = drafter()
    ids = prompt(40)
    f = feats_of(ids)
    P, a, k = 22, 2, 4
    ring = R.build_ring(d, f, P)
    rows = torch.arange(P, P + k + 1)
    wrong = feats_of(prompt(40, seed=99))  # rejected rows carry other tokens' features
    vf = torch.cat([f[P:P + a + 1], wrong[P + a + 1:P + k + 1]])
    ck = d.context_rows(vf, rows)
    good = R.Ring(3, 16, 128)
    good.k, good.pos = ring.k.clone(), ring.pos.clone()
    good.write(rows[:a + 1], ck[:, :a + 1])
    bad = R.Ring(3, 16, 128)
    bad.k, bad.pos = ring.k.clone(), ring.pos.clone()
    bad.write(rows, ck)
    Pn = P + a + 1
    x0 = int(ids[Pn])
    ref = d.draft([(R.build_ring(d, f, Pn), x0, Pn)])
    rg = d.draft([(good, x0, Pn)])
    rb = d.draft([(bad, x0, Pn)])
    assert torch.allclose(rg["logits"], ref["logits"], atol=1e-5)
    assert (rb["logits"] - ref["logits"]).abs().max() > 1e-2


def test_anchor_convention_is_observable():
    d = drafter()
    ids = prompt()
    P = 20
    ring = R.build_ring(d, feats_of(ids), P)
    r = d.draft([(ring, int(ids[P]), P)])
    alt = d.draft([(ring, int(ids[P]), P)], anchor_offset=-1)
    assert torch.equal(r["positions"][0], torch.arange(P, P + 5))
    assert (alt["logits"] - r["logits"]).abs().max() > 1e-2


def test_tap_points():
    cfg, _, _ = model("dspark")
    run = target_run(prompt())
    n = cfg["num_hidden_layers"]
    for L in range(n - 1):
        assert torch.equal(run["out"][L], run["inp"][L + 1])
    assert torch.equal(run["out"][n - 1], run["head_in"])
    f = R.features(run, [1, 2, 3])
    H = cfg["hidden_size"]
    assert torch.allclose(f[:, 2 * H:], run["head_in"].mean(1))
    assert torch.allclose(f[:, :H], run["out"][1].mean(1))


def test_tap_convention_is_observable():
    d = drafter()
    ids = prompt()
    P = 20
    r = d.draft([(R.build_ring(d, feats_of(ids), P), int(ids[P]), P)])
    alt = d.draft([(R.build_ring(d, feats_of(ids, "input"), P), int(ids[P]), P)])
    assert (alt["logits"] - r["logits"]).abs().max() > 1e-2


def test_kv_roundtrip_properties():
    x = torch.randn(6, 128) * torch.logspace(-3, 2, 6)[:, None]
    y = R.fp8_roundtrip(x, 64)
    assert torch.equal(R.fp8_roundtrip(y, 64), y)  # idempotent
    g = y.reshape(6, 2, 64)
    sc = torch.exp2(torch.ceil(torch.log2(x.reshape(6, 2, 64).abs().amax(-1, keepdim=True) / 448)))
    codes = g / sc
    assert torch.equal(codes.to(torch.float8_e4m3fn).float(), codes) and codes.abs().max() <= 448
    assert ((y - x).abs() <= x.abs() * 2 ** -4 + 1e-30).all()  # within half an E4M3 ulp (3 bits)
    # in the drafter: only the nope dims move, the rope dims are untouched
    d_on, d_off = drafter("hf", kv_fp8=True), drafter("hf", kv_fp8=False)
    f = feats_of(prompt())
    a, b = d_on.context_rows(f, torch.arange(30)), d_off.context_rows(f, torch.arange(30))
    assert torch.equal(a[..., 64:], b[..., 64:])
    assert (a[..., :64] - b[..., :64]).abs().max() > 0
    assert torch.equal(R.fp8_roundtrip(b[..., :64], 64), a[..., :64])


def test_kv_roundtrip_is_observable():
    ids = prompt()
    P = 20
    outs = []
    for kv in (True, False):
        d = drafter("ref", kv_fp8=kv)
        outs.append(d.draft([(R.build_ring(d, feats_of(ids), P), int(ids[P]), P)])["logits"])
    assert (outs[0] - outs[1]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------
# MTP (MODEL.md §3.9, §5.6).
# ------------------------------------------------------------------------------------------


def mtp_setup(ids):
    cfg, t, q = model("mtp")
    run = target_run(ids, "mtp")
    return cfg, t, q, M.mtp_inputs(run, ids, cfg["num_hidden_layers"])


def test_mtp_own_matches_transformers():
    ids = prompt(24)
    cfg, t, q, (Hs, nxt, pos) = mtp_setup(ids)
    assert torch.equal(nxt[:-1], ids[1:])
    l1, X1 = M.MTPTransformers(cfg, t)(Hs, nxt, pos)
    l2, X2 = M.mtp_own(R.Weights(t, q, "hf"), R.model_config(cfg), Hs, nxt, pos)
    assert (l1 - l2).abs().max() < 1e-3 * l1.abs().max()
    assert (X1 - X2).abs().max() < 1e-4 * X1.abs().max()
    lr, _ = M.mtp_own(R.Weights(t, q, "ref"), R.model_config(cfg), Hs, nxt, pos)
    assert (lr - l1).abs().max() > 1e-3  # the ref-mode fixture is not a copy of the hf one


def test_mtp_causal():
    ids = prompt(24)
    cfg, t, q, (Hs, nxt, pos) = mtp_setup(ids)
    mtp = M.MTPTransformers(cfg, t)
    full, _ = mtp(Hs, nxt, pos)
    for T in (1, 10, 17, 20):  # window 16: rows 17+ see a truncated window
        part, _ = mtp(Hs[:T], nxt[:T], pos[:T])
        assert torch.allclose(part[-1], full[T - 1], atol=1e-4)


# ------------------------------------------------------------------------------------------
# Committed fixtures (when present): shapes and internal consistency.
# ------------------------------------------------------------------------------------------


def load_fixture(name):
    d = os.path.join(ROOT, "tests", "fixtures", "ref", name)
    p = os.path.join(d, "index.json")
    if not os.path.exists(p):
        pytest.skip(f"{p} not generated yet")
    index = json.load(open(p))

    def get(entry):
        a = np.fromfile(os.path.join(d, entry["file"]), dtype="<f4")
        assert a.size == int(np.prod(entry["shape"])), entry["file"]
        import hashlib
        if "sha256" in entry:
            assert hashlib.sha256(a.tobytes()).hexdigest() == entry["sha256"], entry["file"]
        return torch.from_numpy(a.reshape(entry["shape"]))

    return index, get


def test_dspark_fixture_consistent():
    index, get = load_fixture("dspark")
    assert index["format"] == "dsv4-ref-v1"
    g, V = index["config"]["block"], index["config"]["vocab"]
    for case in index["cases"]:
        z = get(case["arrays"]["logits"])
        assert z.shape == (g, V)
        assert z.argmax(-1).tolist() == case["tokens"]
        assert torch.allclose(get(case["arrays"]["conf"]), torch.sigmoid(get(case["arrays"]["conf_logit"])))
    tol = index["tolerance"]
    for key, v in index["sensitivity"].items():
        assert v > 10 * tol["ref" if key.startswith("ref") else "hf"]["logits_abs"], key
    tr = index["trace"]
    for mode in ("hf", "ref"):
        steps = tr[mode]
        for i, s in enumerate(steps):
            a = s["accepted"]
            assert a == tr["forced_accept"][i] and s["written"] == list(range(s["P"], s["P"] + a + 1))
            assert s["emitted"][:a] == s["drafts"][:a]
            assert get(s["arrays"]["logits"]).argmax(-1)[:tr["k"]].tolist() == s["drafts"]
            if i + 1 < len(steps):
                assert steps[i + 1]["P"] == s["P"] + a + 1 and steps[i + 1]["anchor"] == s["emitted"][-1]


def test_mtp_fixture_consistent():
    index, get = load_fixture("mtp")
    for case in index["cases"]:
        assert case["next_ids"][:-1] == case["input_ids"][1:]
        z = get(case["arrays"]["logits_hf"])
        assert z.shape[0] == len(case["input_ids"]) and z.argmax(-1).tolist() == case["argmax_hf"]
    assert index["sensitivity"]["unshifted_ids"] > 10 * index["tolerance"]["hf"]["logits_abs"]


def tiny(name):
    d = os.path.join(ROOT, "models", name)
    if not os.path.exists(os.path.join(d, "config.json")):
        pytest.skip(f"{d} absent (python3 tools/gen_checkpoints.py --out models)")
    return d


def test_target_matches_transformers_fixture():
    """Own loader + name mapping + transformers reproduce the target logits that branch
    `fixtures` made with from_pretrained (tests/fixtures/ref/tiny-dspark, prefill_20)."""
    cfg, t, q = R.load_checkpoint(tiny("tiny-dspark"))
    index, get = load_fixture("tiny-dspark")
    case = next(c for c in index["cases"] if c["name"] == "prefill_20")
    run = R.Target(cfg, t).run(torch.tensor(case["input_ids"]))
    want = get(case["arrays"]["logits"])
    assert (run["logits"][case["positions"]] - want).abs().max() < 1e-4
    ls = get(case["arrays"]["layer_streams"])  # [L, npos, hc, H]: output of layer l
    for L in range(ls.shape[0]):
        assert (run["out"][L][case["positions"]] - ls[L]).abs().max() < 1e-3 * ls[L].abs().max()


def test_mtp_matches_transformers_fixture():
    """Both MTP computations here reproduce the MTP reference of branch `fixtures` (a separate
    composition of transformers modules) on tiny-flash prefill_129."""
    cfg, t, q = R.load_checkpoint(tiny("tiny-flash"))
    index, get = load_fixture("tiny-flash")
    m = index["mtp"]
    src = next(c for c in index["cases"] if c["name"] == m["source_case"])
    ids = torch.tensor(src["input_ids"])
    run = R.Target(cfg, t).run(ids)
    Hs, nxt, pos = M.mtp_inputs(run, ids, cfg["num_hidden_layers"])
    want = get(m["arrays"]["logits"])
    mine, X = M.MTPTransformers(cfg, t)(Hs, nxt, pos)
    own, _ = M.mtp_own(R.Weights(t, q, "hf"), R.model_config(cfg), Hs, nxt, pos)
    assert (mine[m["positions"]] - want).abs().max() < 1e-4
    assert (own[m["positions"]] - want).abs().max() < 1e-3
    ws = get(m["arrays"]["streams"])
    assert (X[m["positions"]] - ws).abs().max() < 1e-5 * ws.abs().max()


@pytest.mark.parametrize("forced", [None, [3, 0, 4, 1]])
def test_spec_trace_lossless_and_ring(forced):
    """Greedy speculative decoding with the reference drafter emits exactly the target's greedy
    continuation, and every step's draft equals a draft from a ring rebuilt from the committed
    sequence (so nothing from rejected rows leaked into the ring). With scripted accept counts
    (`forced`, partial acceptance) only the ring property applies."""
    d = drafter()
    target_run(prompt())  # builds the cached target
    tg = _RUNS[("target", "dspark")]
    ids = prompt(18)
    steps = R.spec_trace(tg, d, ids, steps=4, k=4, forced=forced)
    seq = ids.clone()
    for s in steps:
        run = tg.run(seq)
        if s is steps[0]:
            assert s["anchor"] == int(run["logits"][-1].argmax())
        assert s["P"] == len(seq) and list(s["written"]) == list(range(s["P"], s["P"] + s["accepted"] + 1))
        r = d.draft([(R.build_ring(d, R.features(run, d.c.target_layers), s["P"]), s["anchor"], s["P"])])
        assert torch.allclose(r["logits"][0], s["logits"], atol=1e-4)
        seq = torch.cat([seq, torch.tensor([s["anchor"]] + s["emitted"][:-1])])
    if forced:
        assert [s["accepted"] for s in steps] == forced
        return
    greedy = ids.clone()
    for _ in range(len(seq) - len(ids)):
        greedy = torch.cat([greedy, tg.run(greedy)["logits"][-1].argmax()[None]])
    assert torch.equal(greedy, seq)


def test_ring_ignores_stale_slots():
    """With P < window only slots 0..P-1 are visible (DSPARK.md §2.4): a ring slot reused from an
    earlier request (stale rows in slots >= P) must not change the draft."""
    d = drafter()
    ids = prompt()
    P = 5
    fresh = R.build_ring(d, feats_of(ids), P)
    stale = R.build_ring(d, feats_of(prompt(seed=3)), 16)  # previous occupant of the slot
    pos = torch.arange(P)
    stale.write(pos, d.context_rows(feats_of(ids)[:P], pos))
    assert not torch.equal(stale.k[:, P:], fresh.k[:, P:])
    a = d.draft([(fresh, int(ids[P]), P)])
    b = d.draft([(stale, int(ids[P]), P)])
    assert torch.equal(a["logits"], b["logits"])


def test_fixtures_tied_to_locked_checkpoints_and_reproducible():
    """The committed fixtures were made from the locked tiny checkpoints, and the committed
    scripts still reproduce them (one drafter case per mode, one MTP case)."""
    lock = json.load(open(os.path.join(ROOT, "tools", "checkpoints.lock.json")))
    index, get = load_fixture("dspark")
    assert index["checkpoint_digest"] == lock["tiny-dspark"]["digest"]
    mindex, mget = load_fixture("mtp")
    assert mindex["checkpoint_digest"] == lock["tiny-flash"]["digest"]
    cfg, t, q = R.load_checkpoint(tiny("tiny-dspark"))
    c = R.draft_config(cfg, t.keys())
    p0 = index["prompts"][0]
    ids = torch.tensor(p0["input_ids"])
    feats = R.features(R.Target(cfg, t).run(ids), c.target_layers)
    want = get(p0["arrays"]["features"])
    # summation order (torch thread count) moves fp32 results by ulps: compare relatively
    assert (feats - want).abs().max() < 1e-5 * want.abs().max()
    for mode in ("hf", "ref"):
        tol = index["tolerance"][mode]["logits_abs"]
        case = next(k for k in index["cases"] if k["prompt"] == "p0" and k["mode"] == mode and k["P"] > 1)
        d = R.Drafter(c, R.Weights(t, q, mode))
        r = d.draft([(R.build_ring(d, feats, case["P"]), case["anchor"], case["P"])])
        assert (r["logits"][0] - get(case["arrays"]["logits"])).abs().max() < tol
        if case["min_top2_margin"] > 2 * tol:
            assert r["tokens"][0].tolist() == case["tokens"]
    cfg, t, q = R.load_checkpoint(tiny("tiny-flash"))
    case = mindex["cases"][0]
    ids = torch.tensor(case["input_ids"])
    Hs, nxt, pos = M.mtp_inputs(R.Target(cfg, t).run(ids), ids, cfg["num_hidden_layers"])
    assert nxt.tolist() == case["next_ids"]
    lg, _ = M.MTPTransformers(cfg, t)(Hs, nxt, pos)
    assert (lg - mget(case["arrays"]["logits_hf"])).abs().max() < 1e-4
