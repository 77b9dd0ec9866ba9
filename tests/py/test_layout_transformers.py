"""Tiny checkpoints: determinism, real layout (proved with transformers' from_pretrained), refs.

tools/gen_checkpoints.py writes the checkpoints, tools/ref_transformers.py the references in
tests/fixtures/ref/.  These tests check that regenerating gives exactly the files the references
were made from (tools/checkpoints.lock.json), that transformers loads the BF16 copies with no
missing / unexpected / re-initialised weights, and that the stored references are reproduced.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_checkpoints as gc  # noqa: E402

REF = os.path.join(ROOT, "tests", "fixtures", "ref")
HAVE_TORCH = importlib.util.find_spec("torch") is not None and \
    importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch/transformers not importable "
                                 "(pip install -r requirements-ref.txt)")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The tiny models regenerated from scratch into a temporary directory.  The 170 MB default
    model is taken from models/ when scripts/setup.sh already made it (the generator itself
    refuses output that differs from the lock), else generated here too."""
    out = tmp_path_factory.mktemp("models")
    names = [n for n in gc.MODELS if n != "default"]
    lock = gc.load_lock()
    root_default = os.path.join(ROOT, "models", "default")
    if gc.up_to_date(root_default, lock.get("default")):
        os.symlink(root_default, os.path.join(str(out), "default"))
    else:
        names.append("default")
    assert gc.main(["--out", str(out)] + sum((["--only", n] for n in names), [])) == 0
    yield str(out)
    shutil.rmtree(str(out), ignore_errors=True)  # up to ~230 MB; do not leave it in pytest's tmp


def _splitmix_reference(key, i):
    """Plain-Python splitmix64 of counter i (independent of the vectorised numpy code)."""
    m = (1 << 64) - 1
    z = (key + (i + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_prng_matches_scalar_splitmix64():
    key = gc._key("seed", "name")
    h = gc.hashes("seed", "name", 1000)
    for i in (0, 1, 2, 500, 999):
        assert int(h[i]) == _splitmix_reference(key, i)
    z = gc.normal("seed", "name", (200000,))
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1.0) < 0.01


def test_fp8_fp4_quantisers_round_trip():
    w = gc.normal("t", "fp8", (256, 384), 0.03)
    q, s = gc.quant_fp8(w)
    assert q.shape == (256, 384) and s.shape == (2, 3)
    d = gc.dequant_fp8(q, s)
    # E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values in each block
    big = np.abs(w) > np.abs(w).max() / 64
    assert np.all(np.abs(d - w)[big] <= np.abs(w)[big] * 2.0 ** -4 + 1e-12)
    assert np.array_equal(gc.dequant_fp8(*gc.quant_fp8(d)), d)  # codes are a fixed point
    w = gc.normal("t", "fp4", (8, 64))
    p, s = gc.quant_fp4(w)
    assert p.shape == (8, 32) and s.shape == (8, 2)
    d = gc.dequant_fp4(p, s)
    # low nibble = even column (spec/MODEL.md §2.3)
    sc = 2.0 ** (s.astype(np.int32) - 127)
    assert d[0, 0] == gc.E2M1_VALUES[p[0, 0] & 0xF] * sc[0, 0]
    assert d[0, 1] == gc.E2M1_VALUES[p[0, 0] >> 4] * sc[0, 0]
    assert np.array_equal(gc.dequant_fp4(*gc.quant_fp4(d)), d)


def test_regeneration_matches_lock(generated):
    lock = gc.load_lock()
    assert sorted(lock) == sorted(gc.MODELS)
    for name in gc.MODELS:
        man = json.load(open(os.path.join(generated, name, "manifest.json")))
        assert man["files"] == lock[name]["files"], f"{name} differs from tools/checkpoints.lock.json"
        assert man["digest"] == lock[name]["digest"] == gc.manifest_digest(man["files"])
        assert gc.up_to_date(os.path.join(generated, name), lock[name])


def _header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def _inventory(d):
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    inv = {}
    for fn in sorted(set(idx["weight_map"].values())):
        for k, v in _header(os.path.join(d, fn)).items():
            if k != "__metadata__":
                assert idx["weight_map"][k] == fn
                inv[k] = (v["dtype"], v["shape"])
    assert sorted(inv) == sorted(idx["weight_map"])
    return inv


def test_dspark_draft_stage_layout(generated):
    """spec/DSPARK.md §3.1 scaled down: per stage 21 + 3*E weights and 8 + 3*E scales; main_proj /
    main_norm on stage 0 only; norm, hc_head, markov and confidence heads on the last stage."""
    d = os.path.join(generated, "tiny-dspark")
    cfg = json.load(open(os.path.join(d, "config.json")))
    inv = _inventory(d)
    ne, L = cfg["n_routed_experts"], cfg["num_hidden_layers"]
    stages = len(cfg["compress_ratios"]) - L
    assert stages == 3 and cfg["num_nextn_predict_layers"] == 1
    assert cfg["dspark_target_layer_ids"] == [L - 3, L - 2, L - 1]
    assert 0 < cfg["dspark_noise_token_id"] < cfg["vocab_size"]
    rank, hid = cfg["dspark_markov_rank"], cfg["hidden_size"]
    for s in range(stages):
        names = [k for k in inv if k.startswith(f"mtp.{s}.")]
        scales = [k for k in names if k.endswith(".scale")]
        extra_w = {0: 2, 1: 0, 2: 7}[s]
        assert len(names) - len(scales) == 21 + 3 * ne + extra_w, s
        assert len(scales) == 8 + 3 * ne + (1 if s == 0 else 0), s
        for w in ("w1", "w2", "w3"):
            assert f"mtp.{s}.ffn.shared_experts.{w}.weight" in inv
            assert inv[f"mtp.{s}.ffn.shared_experts.{w}.scale"][0] == "F8_E8M0"
    assert inv["mtp.0.main_proj.weight"] == ("F8_E4M3", [hid, 3 * hid])
    assert inv["mtp.2.markov_head.markov_w1.weight"] == ("BF16", [cfg["vocab_size"], rank])
    assert inv["mtp.2.confidence_head.proj.weight"] == ("BF16", [1, hid + rank])
    assert not any(k.startswith("mtp.1.") and ("norm.weight" == k[6:] or "hc_head" in k) for k in inv)
    assert inv["layers.0.ffn.experts.0.w1.weight"] == ("I8", [cfg["moe_intermediate_size"], hid // 2])
    assert inv["layers.0.ffn.gate.tid2eid"][0] == "I64"


def test_default_model_tokenizer(generated):
    d = os.path.join(generated, "default")
    cfg = json.load(open(os.path.join(d, "config.json")))
    tok = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert cfg["vocab_size"] == 129280 and max(ids.values()) < cfg["vocab_size"]
    assert ids["<｜place▁holder▁no▁799｜>"] == cfg["dspark_noise_token_id"] == 128799
    enc = open(os.path.join(d, "encoding", "encoding_dsv4.py"), encoding="utf-8").read()
    assert "REASONING_EFFORT_PROMPTS" in enc  # marks the 0731 profile (spec/SERVING.md §0.1)
    ns = {}
    exec(compile(enc, "encoding_dsv4.py", "exec"), ns)
    # SHA-256 values of the two prefixes as given in spec/SERVING.md §1.10
    assert hashlib.sha256(ns["REASONING_EFFORT_PROMPTS"]["high"].encode()).hexdigest() == \
        "f7a24f3b3050d4a83781e9b755b316aae2ec1d9dc87562541d90bcb04d7350f7"
    assert hashlib.sha256(ns["REASONING_EFFORT_PROMPTS"]["max"].encode()).hexdigest() == \
        "53fb31b8392ec5b4a926481943efc67636748f137c1a49d493a7af4d4fa55d2c"


def test_refs_were_made_from_locked_checkpoints():
    lock = gc.load_lock()
    for name in ("tiny-flash", "tiny-dspark"):
        idx = json.load(open(os.path.join(REF, name, "index.json")))
        assert idx["format"] == "dsv4-ref-v1"
        assert idx["checkpoint_digest"] == lock[name]["digest"]
        assert idx["checkpoint_bf16_digest"] == lock[name + "-bf16"]["digest"]
        for case in idx["cases"]:
            if len(case["chunks"]) > 1:  # transformers itself chunk/decode-invariant here
                assert case["selections_equal_single_pass"], case["name"]
                assert case["max_abs_diff_vs_single_pass"] < 1e-4, case["name"]
        entries = list(idx["cases"]) + ([idx["mtp"]] if "mtp" in idx else [])
        for case in entries:
            for arr in case["arrays"].values():
                data = open(os.path.join(REF, name, arr["file"]), "rb").read()
                assert len(data) == 4 * int(np.prod(arr["shape"]))
                assert hashlib.sha256(data).hexdigest() == arr["sha256"]


@needs_torch
@pytest.mark.parametrize("name", ["tiny-flash", "tiny-dspark"])
def test_from_pretrained_layout_and_refs(generated, name):
    """The BF16 copy loads into DeepseekV4ForCausalLM with no missing, unexpected, mismatched
    or re-initialised weights (ref_transformers.layout_proof asserts all of it), and the stored
    prefill_20 reference is reproduced by this transformers."""
    import torch
    import ref_transformers as rt
    torch.set_num_threads(2)
    model, ckpt, rep = rt.layout_proof(generated, name, lambda m: None)
    assert rep["missing"] == rep["unexpected"] == rep["mismatched"] == rep["reinitialised"] == 0
    assert rep["mtp_tensors_ignored_by_transformers"] == sum(k.startswith("mtp.") for k in ckpt)
    if importlib.util.find_spec("accelerate") is not None:  # quantised layout via the FP8 path
        assert rep["quantised_checkpoint_via_FineGrainedFP8Config_dequantize"].startswith("ok")
    idx = json.load(open(os.path.join(REF, name, "index.json")))
    case = next(c for c in idx["cases"] if c["name"] == "prefill_20")
    ids = np.array(case["input_ids"], dtype=np.int64)
    probe = rt.Probe(model)
    lg, _ = rt.run_case(model, probe, ids, case["chunks"])
    probe.close()
    arr = case["arrays"]["logits"]
    ref = np.fromfile(os.path.join(REF, name, arr["file"]), "<f4").reshape(arr["shape"])
    got = lg[case["positions"]].numpy()
    assert np.abs(got - ref).max() < 1e-3, np.abs(got - ref).max()


@needs_torch
@pytest.mark.parametrize("name", ["tiny-flash", "tiny-dspark"])
def test_safetensors_library_reads_quantised_shards(generated, name):
    """An independent reader (the safetensors library + torch's float8 dtypes) opens every shard
    of the quantised checkpoint, and dequantising with torch (E4M3 x E8M0 per 128x128 block;
    E2M1 nibbles, low first, x E8M0 per 32) gives exactly the BF16 copy."""
    import torch
    from safetensors import safe_open
    fp4 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])

    def load(d):
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        out = {}
        for fn in sorted(set(idx["weight_map"].values())):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    out[k] = f.get_tensor(k)
        return out
    q = load(os.path.join(generated, name))
    b = load(os.path.join(generated, name + "-bf16"))
    seen = {torch.float8_e4m3fn: 0, torch.int8: 0}
    for k, t in q.items():
        if k.endswith(".scale"):
            assert t.dtype == torch.float8_e8m0fnu, k
            continue
        if t.dtype in seen:
            s = q[k[:-len("weight")] + "scale"].float()
            if t.dtype == torch.float8_e4m3fn:
                rs = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:t.shape[0], :t.shape[1]]
                deq = t.float() * rs
            else:
                u = t.view(torch.uint8).long()
                nib = torch.stack([u & 15, u >> 4], -1).reshape(t.shape[0], -1)
                deq = fp4[nib] * s.repeat_interleave(32, 1)
            seen[t.dtype] += 1
            assert b[k].dtype == torch.bfloat16 and torch.equal(deq, b[k].float()), k
        else:
            assert torch.equal(t, b[k]), k
    assert sorted(k for k in q if not k.endswith(".scale")) == sorted(b)
    assert all(seen.values()), seen
