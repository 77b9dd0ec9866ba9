"""DSpark speculative decoding through the server (spec/DSPARK.md §4-5,
SERVING.md §3.9, §8.8): the seed launcher's --speculative-config works,
greedy output equals the non-speculative server's, the spec counters move,
and invalid configurations are refused at start with the reason."""
import json
import subprocess
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, DSV4, Server, free_port

SEED_SPEC = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'


def chat(base, content, n):
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": n}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {ln.split(" ")[0]: float(ln.split(" ")[-1]) for ln in text.splitlines() if ln.startswith(name)}


def test_spec_greedy_equals_plain(default_server):
    spec = Server(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "4", "--speculative-config", SEED_SPEC,
                  ready=True)
    try:
        prompts = ["Count to ten.", "Name a colour.", "What is 2+2?"]
        for p in prompts:
            a = chat(default_server.base, p, 14)
            b = chat(spec.base, p, 14)
            assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
            assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"] == 14
        m = metric(spec.base, "vllm:spec_decode_num_")
        drafts = m['vllm:spec_decode_num_drafts_total{model_name="deepseek-v4-flash-dspark",engine="0"}']
        tokens = m['vllm:spec_decode_num_draft_tokens_total{model_name="deepseek-v4-flash-dspark",engine="0"}']
        assert drafts > 0 and tokens == 5 * drafts
        per_pos = [k for k in m if "per_pos" in k]
        assert len(per_pos) == 5  # positions 0..4
        # sampled drafting (draft_sample_method probabilistic) at temperature > 0:
        # seeded requests reproduce exactly and drafts keep being verified
        def sampled(seed):
            body = {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0.9,
                    "seed": seed, "max_tokens": 12}
            req = urllib.request.Request(spec.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                return json.loads(r.read())["choices"][0]["message"]
        assert sampled(7) == sampled(7)
        m2 = metric(spec.base, "vllm:spec_decode_num_drafts_total")
        assert sum(m2.values()) > drafts
    finally:
        spec.stop()


@pytest.mark.parametrize("cfg,why", [
    ('{"method":"dspark","num_speculative_tokens":6}', "block size 5"),
    ('{"method":"mtp","num_speculative_tokens":1}', "has no MTP block"),
    ('{"method":"eagle","num_speculative_tokens":1}', "not supported"),
    ('{"method":"dspark","num_speculative_tokens":5,"bogus":1}', "bogus"),
    ('{"num_speculative_tokens":5}', "method"),
    ('{"method":"dspark","num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,1,5]]}',
     "num_speculative_tokens_per_batch_size"),
    ('not json', "JSON object"),
])
def test_bad_spec_configs_refused_at_start(cfg, why):
    r = subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--port", str(free_port()), "--max-model-len", "256",
                        "--max-num-seqs", "2", "--speculative-config", cfg], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert why in r.stderr, r.stderr


def test_spec_on_checkpoint_without_stages_refused(tmp_path):
    # tiny-flash (MTP block, no DSpark stages) with the default model's tokenizer next to it
    import os
    flash = DEFAULT_MODEL.replace("default", "tiny-flash")
    for f in os.listdir(flash):
        os.symlink(os.path.join(flash, f), tmp_path / f)
    os.symlink(os.path.join(DEFAULT_MODEL, "tokenizer.json"), tmp_path / "tokenizer.json")
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--port", str(free_port()),
                        "--max-model-len", "256", "--max-num-seqs", "2", "--reasoning-effort-profile", "0731",
                        "--speculative-config", '{"method":"dspark","num_speculative_tokens":3}'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no DSpark draft stages" in r.stderr, r.stderr
    # the same checkpoint serves with its MTP block (k = 1); k = 2 is refused with the reason
    r = subprocess.run([DSV4, "serve", str(tmp_path), "--port", str(free_port()), "--max-model-len", "256",
                        "--max-num-seqs", "2", "--reasoning-effort-profile", "0731",
                        "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "block size 1" in r.stderr, r.stderr
