"""tools/ref_official.py (the reference-numerics oracle of tests/unit/test_forward_ref.c) is itself
checked: in HF numerics it must reproduce transformers' committed logits, and in reference
numerics it must reproduce its committed fixture (up to the fp32 floor the fixture records:
the QAT roundings are discontinuous, so torch's thread count can flip a few of them).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    mdir = os.path.join(ROOT, "models", "tiny-flash-bf16")
    if not os.path.exists(os.path.join(mdir, "manifest.json")):
        out = tmp_path_factory.mktemp("models")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_checkpoints.py"), "--out", str(out),
                        "--only", "tiny-flash", "--only", "tiny-flash-bf16"], check=True, capture_output=True)
        mdir = str(out / "tiny-flash-bf16")
    import ref_official
    torch.set_grad_enabled(False)
    fx = os.path.join(ROOT, "tests", "fixtures", "ref")
    return torch, ref_official, mdir, fx


def load(torch, path, rows, cols):
    return torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32).view(rows, cols)


def test_hf_mode_matches_transformers(setup):
    torch, R, mdir, fx = setup
    idx = json.load(open(os.path.join(fx, "tiny-flash", "index.json")))
    case = next(c for c in idx["cases"] if c["name"] == "prefill_129")
    ref = load(torch, os.path.join(fx, "tiny-flash", case["arrays"]["logits"]["file"]), len(case["positions"]),
               idx["vocab_size"])
    ours = R.Model(mdir, "hf").forward(case["input_ids"])[case["positions"]]
    assert (ours - ref).abs().max().item() < 1e-3


def test_reference_mode_reproduces_fixture(setup):
    torch, R, mdir, fx = setup
    idx = json.load(open(os.path.join(fx, "official", "tiny-flash", "index.json")))
    case = idx["cases"][0]
    want = load(torch, os.path.join(fx, "official", "tiny-flash", case["arrays"]["logits"]["file"]),
                len(case["positions"]), 512)
    got = R.Model(mdir, "reference").forward(case["input_ids"])[case["positions"]]
    d = R.distance(got, want)
    floor = idx["sensitivity"]["fp64_vs_fp32"]["mean_kl"]
    assert d["mean_kl"] <= 2 * floor, d


def test_each_emulation_is_observable(setup):
    """The fixture's sensitivity table: removing any one emulation moves the logits well past the
    fp32 floor, so the C test's tolerance (2x floor) would catch a missing emulation."""
    _, _, _, fx = setup
    sens = json.load(open(os.path.join(fx, "official", "tiny-flash", "index.json")))["sensitivity"]
    floor = sens["fp64_vs_fp32"]["mean_kl"]
    for emu in ("w8a8", "kv_fp8", "indexer_fp4", "bf16_probs"):
        assert sens[f"without_{emu}"]["mean_kl"] > 4 * floor, emu


def test_quantiser_helpers():
    torch = pytest.importorskip("torch")
    import ref_official as R
    # E2M1 ties go to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0])
    assert R.e2m1_round(v.clamp(-6, 6)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0]
    h = R.hadamard_matrix(128)
    assert torch.allclose(h @ h, torch.eye(128), atol=1e-5)
    # amax 1344 -> scale 2^ceil(log2(1344/448)) = 4; 1344/4 = 336 lies halfway between the E4M3
    # values 320 (mantissa 2) and 352 (mantissa 3): ties go to even -> 320, i.e. 1280 after scaling
    x = torch.tensor([[1.0] * 63 + [1344.0]])
    y = R.fp8_roundtrip(x, 64)
    assert y[0, -1].item() == 1280.0
    assert y[0, 0].item() == 1.0
