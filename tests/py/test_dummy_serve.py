"""`--load-format dummy` and `--hf-overrides` end to end (issue 7): `dsv4 serve` / `dsv4 run` on a
directory holding only a config.json (the real 0731 config, shrunk by keys merged here) start on
the CPU backend with random weights, log what they made, fall back to the default model's
tokenizer, and answer completions. Token values are random by design; only the plumbing is
checked.
"""
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, DSV4, ROOT, free_port

# Small shapes over the real 0731 config; vocab stays the real one so the real tokenizer fits.
SMALL = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128,
         "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 64, "moe_intermediate_size": 128,
         "n_routed_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4,
         "index_topk": 4, "num_hash_layers": 2, "dspark_markov_rank": 32,
         "compress_ratios": [0, 0, 4, 128, 0, 0, 0], "dspark_target_layer_ids": [1, 2, 3]}


@pytest.fixture
def config_dir(tmp_path):
    if not os.path.exists(DSV4):
        pytest.skip(f"{DSV4} not built")
    if not os.path.exists(os.path.join(DEFAULT_MODEL, "tokenizer.json")):
        pytest.fail("models/default is missing: run ./scripts/setup.sh")
    with open(os.path.join(ROOT, "configs", "deepseek-v4-flash-0731", "config.json")) as f:
        cfg = json.load(f)
    cfg.update(SMALL)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(cfg, f)
    return tmp_path


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def log_of(s):
    s.log.seek(0)
    return s.log.read().decode(errors="replace")


def test_serve_config_only(server_factory, config_dir):
    assert sorted(os.listdir(config_dir)) == ["config.json"]
    s = server_factory(str(config_dir), "--load-format", "dummy", "--max-model-len", "256",
                       "--max-num-seqs", "2", ready=True)
    r = post(s.base, "/v1/completions", {"prompt": "Hello, dummy", "max_tokens": 4, "temperature": 0})
    assert r["choices"][0]["finish_reason"] in ("length", "stop")
    assert 1 <= r["usage"]["completion_tokens"] <= 4
    assert isinstance(r["choices"][0]["text"], str)
    log = log_of(s)
    assert "has no tokenizer.json; using the default model's" in log
    assert "dummy weights: " in log and " tensors, " in log and " GB in backend memory, " in log


def test_serve_overrides_tokenizer_and_spec(server_factory, config_dir):
    shutil.copy(os.path.join(DEFAULT_MODEL, "tokenizer.json"), config_dir / "tokenizer.json")
    s = server_factory(str(config_dir), "--load-format", "dummy", "--max-model-len", "256",
                       "--max-num-seqs", "2", "--hf-overrides", '{"num_hidden_layers": 3}',
                       "--speculative-config", '{"method": "dspark", "num_speculative_tokens": 2}',
                       ready=True)
    r = post(s.base, "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0})
    assert 1 <= r["usage"]["completion_tokens"] <= 3
    log = log_of(s)
    assert "no tokenizer.json" not in log
    assert "--hf-overrides" in log and "first 3 target entries" in log
    assert "3 layers" in log


def test_serve_refuses_bad_override(config_dir):
    r = subprocess.run([DSV4, "serve", str(config_dir), "--load-format", "dummy", "--port", str(free_port()),
                        "--hf-overrides", '{"num_hidden_layer": 8}'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert 'unknown key "num_hidden_layer"' in r.stderr


def test_run_dummy(config_dir):
    r = subprocess.run([DSV4, "run", str(config_dir), "--load-format", "dummy", "--prompt", "Hi",
                        "--max-tokens", "3", "--show-ids"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "dummy weights: " in r.stderr and "generated 3 tokens" in r.stderr


def test_real_checkpoint_needs_its_files(config_dir):
    """Without --load-format dummy a directory without weights is refused, naming what is missing."""
    shutil.copy(os.path.join(DEFAULT_MODEL, "tokenizer.json"), config_dir / "tokenizer.json")
    r = subprocess.run([DSV4, "run", str(config_dir), "--raw", "--prompt", "Hi"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "no model.safetensors" in r.stderr, r.stderr
