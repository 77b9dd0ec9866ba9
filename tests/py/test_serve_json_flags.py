"""JSON-valued serve flags refuse text after the object instead of silently using the
first object alone (cJSON_Parse stops after one value: '{"num_speculative_tokens": 3} x'
used to start with k=3 and drop the rest). Each case must exit at start with a message
naming the flag, before any model load (seconds)."""
import socket
import subprocess

import pytest

from conftest import DEFAULT_MODEL, DSV4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flag,value", [
    ("--speculative-config", '{"method": "dspark", "num_speculative_tokens": 3} {"num_speculative_tokens": 5}'),
    ("--default-chat-template-kwargs", '{"thinking": false} trailing'),
    ("--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}, {"cudagraph_mode": "NONE"}'),
    ("--hf-overrides", '{"num_hidden_layers": 4} x'),
])
def test_trailing_text_after_json_is_refused(flag, value):
    port = free_port()  # some of these are read after the server listens
    p = subprocess.Popen([DSV4, "serve", DEFAULT_MODEL, "--device", "cpu", "--port", str(port), flag, value],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    try:
        for ln in p.stderr:  # until it exits, or says it is ready (the bug: it started anyway)
            lines.append(ln.decode(errors="replace"))
            if "ready:" in lines[-1]:
                break
    finally:
        if p.poll() is None:
            p.kill()
        rc = p.wait(timeout=60)
        p.stderr.close()
    err = "".join(lines)
    assert "ready:" not in err, err
    assert rc != 0, err
    assert flag in err, err


SMALL = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128,
         "o_groups": 2, "o_lora_rank": 64, "moe_intermediate_size": 128, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4, "index_topk": 4, "num_hash_layers": 2,
         "dspark_markov_rank": 32, "compress_ratios": [0, 0, 4, 128, 0, 0, 0], "dspark_target_layer_ids": [1, 2, 3]}


def test_default_max_model_len_is_the_models_maximum(tmp_path, server_factory):
    """Without --max-model-len the server takes the model's max_position_embeddings, as vLLM does
    (it used to take 8192 on every device, and refuse a model whose maximum was below that);
    a --max-model-len above the maximum is refused naming the flag."""
    import json
    import os
    import shutil
    import urllib.request
    from conftest import ROOT
    shutil.copy(os.path.join(ROOT, "configs", "deepseek-v4-flash-0731", "config.json"), tmp_path / "config.json")
    ov = json.dumps(dict(SMALL, max_position_embeddings=4096))
    s = server_factory(str(tmp_path), "--device", "cpu", "--load-format", "dummy", "--hf-overrides", ov,
                       "--max-num-seqs", "2", ready=True)
    with urllib.request.urlopen(s.base + "/v1/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["max_model_len"] == 4096
    s.log.seek(0)
    log = s.log.read().decode(errors="replace")
    assert "maximum concurrency for 4096-token requests" in log, log
    # given explicitly, the flag is named
    p = subprocess.run([DSV4, "serve", str(tmp_path), "--device", "cpu", "--load-format", "dummy",
                        "--hf-overrides", ov, "--max-model-len", "8192", "--port", str(free_port())], capture_output=True,
                       timeout=180)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and "--max-model-len 8192 exceeds" in err, err


def test_enforce_eager_with_a_graph_mode_warns():
    """--enforce-eager wins over -O cudagraph_mode FULL (as in vLLM), and says so instead of
    dropping the mode silently. A later start-up error (node rank) ends the run right after
    the flags are read."""
    p = subprocess.run([DSV4, "serve", "--enforce-eager", "-O", '{"cudagraph_mode": "FULL"}', "--nnodes", "1",
                        "--node-rank", "3", "--port", str(free_port())], capture_output=True, timeout=60)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    assert "--enforce-eager: the --compilation-config cudagraph_mode given is not used" in err, err
