"""`dsv4 run` end to end on the embedded default model (real DeepSeek-V4 tokenizer, 0731 encoder
marker, tiny random weights): prompt ids against the `tokenizers` library, chat framing, greedy
determinism, EOS/--max-tokens accounting and usage errors. The logits themselves are validated
against transformers by tests/unit/test_forward_ref.c; this checks the CLI plumbing around them.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DSV4 = os.environ.get("DSV4_BIN", os.path.join(ROOT, "build", "dsv4"))


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    if not os.path.exists(DSV4):
        pytest.skip(f"{DSV4} not built")
    d = os.path.join(ROOT, "models", "default")
    if os.path.exists(os.path.join(d, "manifest.json")):
        return d
    out = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_checkpoints.py"), "--out", str(out),
                    "--only", "default"], check=True, capture_output=True)
    return str(out / "default")


def run(model, *args):
    return subprocess.run([DSV4, "run", model, *args], capture_output=True, text=True, timeout=300)


def ids_of(stderr):
    m = re.search(r"prompt ids \((\d+)\):((?: \d+)*)", stderr)
    assert m, stderr
    prompt = [int(x) for x in m.group(2).split()]
    assert len(prompt) == int(m.group(1))
    gen = [int(x) for x in re.findall(r"\[(\d+)\]", stderr[m.end():])]
    return prompt, gen


def test_raw_prompt_ids_match_tokenizers(model):
    tokenizers = pytest.importorskip("tokenizers")
    text = "Hello world, ünïcode and 12345 digits."
    r = run(model, "--raw", "--prompt", text, "--max-tokens", "2", "--show-ids", "--numerics", "hf")
    assert r.returncode == 0, r.stderr
    prompt, gen = ids_of(r.stderr)
    tok = tokenizers.Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    assert prompt == tok.encode(text, add_special_tokens=False).ids
    assert len(gen) == 2


def test_chat_framing_and_determinism(model):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    r1 = run(model, "--prompt", "Hi there", "--max-tokens", "4", "--show-ids")
    r2 = run(model, "--prompt", "Hi there", "--max-tokens", "4", "--show-ids")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    p1, g1 = ids_of(r1.stderr)
    p2, g2 = ids_of(r2.stderr)
    assert (p1, g1) == (p2, g2) and r1.stdout == r2.stdout  # greedy is deterministic
    assert p1[0] == 0  # BOS
    assert tok.token_to_id("<｜User｜>") in p1
    # thinking off: the prompt ends with the assistant marker and a closed think block
    assert p1[-2:] == [tok.token_to_id("<｜Assistant｜>"), tok.token_to_id("</think>")]
    eos = 1
    assert len(g1) == 4 or (g1 and g1[-1] == eos)
    # the text printed is the decoding of the generated ids
    assert r1.stdout.rstrip("\n") == tok.decode(g1, skip_special_tokens=False)


def test_both_numerics_modes_run_on_the_same_prompt(model):
    a = run(model, "--raw", "--prompt", "The quick brown fox", "--max-tokens", "6", "--show-ids")
    b = run(model, "--raw", "--prompt", "The quick brown fox", "--max-tokens", "6", "--show-ids",
            "--numerics", "hf")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert ids_of(a.stderr)[0] == ids_of(b.stderr)[0]


@pytest.mark.parametrize("args,msg", [
    ([], "--prompt is required"),
    (["--prompt", "x", "--max-tokens", "many"], "--max-tokens"),
    (["--prompt", "x", "--numerics", "fast"], "--numerics"),
    (["--prompt", "x", "--bogus"], "--bogus"),
])
def test_usage_errors(model, args, msg):
    r = run(model, *args)
    assert r.returncode == 2
    assert msg in r.stderr


def test_missing_model_dir_names_it(tmp_path):
    if not os.path.exists(DSV4):
        pytest.skip("not built")
    r = subprocess.run([DSV4, "run", str(tmp_path / "nope"), "--prompt", "x"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "nope" in r.stderr


def test_speculative_run_reports_acceptance_and_keeps_tokens(model):
    plain = run(model, "--prompt", "Count to five", "--max-tokens", "6", "--show-ids")
    spec = run(model, "--prompt", "Count to five", "--max-tokens", "6", "--show-ids", "--spec", "3")
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    assert ids_of(spec.stderr) == ids_of(plain.stderr)  # speculation never changes greedy tokens
    assert "mean accepted length" in spec.stderr
    per_pos = re.search(r"per-position acceptance:((?: [0-9.]+)+)", spec.stderr)
    assert per_pos and len(per_pos.group(1).split()) == 3
    assert "speculative:" not in plain.stderr
    bad = run(model, "--prompt", "x", "--spec", "99")
    assert bad.returncode == 2 and "--spec" in bad.stderr


def test_prompt_ids_and_device_cpu_on_a_checkpoint_without_tokenizer():
    """--prompt-ids runs a checkpoint that has no tokenizer.json (generated ids printed as [id]);
    --device cpu is the reference path, and speculation (MTP, k=1) keeps the greedy tokens."""
    d = os.path.join(ROOT, "models", "tiny-flash")
    if not os.path.exists(DSV4) or not os.path.exists(os.path.join(d, "config.json")):
        pytest.skip("dsv4 or models/tiny-flash missing")
    args = ["--prompt-ids", "5,17,42,7", "--max-tokens", "6", "--show-ids", "--device", "cpu"]
    plain = run(d, *args)
    spec = run(d, *args, "--spec", "1")
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    p, g = ids_of(plain.stderr)
    assert p == [5, 17, 42, 7] and len(g) == 6
    assert ids_of(spec.stderr) == (p, g)
    assert plain.stdout.strip() == "".join(f"[{t}]" for t in g)
    both = run(d, "--prompt", "x", "--prompt-ids", "1")
    assert both.returncode == 2 and "--prompt-ids" in both.stderr
    bad = run(d, "--prompt-ids", "1", "--device", "tpu")
    assert bad.returncode == 2 and "--device" in bad.stderr


def test_kv_cache_dtype_names():
    """--kv-cache-dtype (vLLM's flag) on `dsv4 run`: "fp8" is vLLM's name for the fp8_ds_mla record on
    this model and gives the same tokens as "fp8_ds_mla"; "bfloat16" = "bf16"; "auto" on the CPU is the
    f32 reference storage, so it matches "f32"; a dtype with no record here is refused."""
    d = os.path.join(ROOT, "models", "tiny-flash")
    if not os.path.exists(DSV4) or not os.path.exists(os.path.join(d, "config.json")):
        pytest.skip("dsv4 or models/tiny-flash missing")
    args = ["--prompt-ids", "5,17,42,7,99,3", "--max-tokens", "6", "--device", "cpu", "--kv-cache-dtype"]
    out = {kv: run(d, *args, kv) for kv in ("auto", "f32", "bf16", "bfloat16", "fp8", "fp8_ds_mla")}
    for kv, r in out.items():
        assert r.returncode == 0, kv + ": " + r.stderr
    assert out["auto"].stdout == out["f32"].stdout
    assert out["bfloat16"].stdout == out["bf16"].stdout
    assert out["fp8"].stdout == out["fp8_ds_mla"].stdout
    bad = run(d, "--prompt-ids", "1", "--kv-cache-dtype", "fp8_e5m2")
    assert bad.returncode == 2 and "fp8_ds_mla" in bad.stderr
