"""Tensor parallelism through the server (issue 7, DESIGN.md "Parallelism"):
`dsv4 serve --tensor-parallel-size 2 --device cpu` runs two ranks as threads
(src/parallel/tp_runner.h) and serves requests whose greedy output equals the
single-rank server's, with DSpark speculation on too; sizes that do not divide
the model are refused at start with the reason.
Under TP the engine's paged KV pool is on (its "KV cache pool:" start line)."""
import json
import subprocess
import urllib.request

from conftest import DEFAULT_MODEL, DSV4, Server, free_port

SPEC = '{"method":"dspark","num_speculative_tokens":3}'


def chat(base, content, n):
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": n}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def test_tp2_serves_and_matches_tp1(default_server):
    tp = Server(DEFAULT_MODEL, "--tensor-parallel-size", "2", "--device", "cpu", "--max-model-len", "512",
                "--max-num-seqs", "4", ready=True)
    tps = Server(DEFAULT_MODEL, "-tp", "2", "--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "4",
                 "--speculative-config", SPEC, ready=True)
    try:
        for p in ["Count to ten.", "What is 2+2?"]:
            a = chat(default_server.base, p, 12)
            b = chat(tp.base, p, 12)
            c = chat(tps.base, p, 12)
            want = a["choices"][0]["message"]["content"]
            assert b["choices"][0]["message"]["content"] == want
            assert c["choices"][0]["message"]["content"] == want
            assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]
    finally:
        tp.stop()
        tps.stop()
    tp.log.seek(0)
    log = tp.log.read().decode(errors="replace")
    assert "tensor parallel 2" in log
    # TP ranks share the engine's paged KV pool (every rank maps the same page ids)
    assert "KV cache pool:" in log


def run_serve(*args):
    return subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--port", str(free_port()), *args], capture_output=True,
                          text=True, timeout=120)


def test_tp_size_that_does_not_divide_is_refused():
    r = run_serve("--tensor-parallel-size", "4", "--max-model-len", "256")
    assert r.returncode != 0
    assert "--tensor-parallel-size 4 does not divide o_groups 2" in r.stderr


def test_multi_node_is_refused_with_the_reason():
    # --nnodes > 1 is served now (tests/py/test_server_multinode.py)
    r = run_serve("--device", "cuda", "--tensor-parallel-size", "2")
    assert r.returncode != 0
    assert "tensor parallelism runs CPU ranks only" in r.stderr


def test_dummy_weights_with_tp_are_refused():
    # dummy views carry no bytes to slice (src/engine/model_runner.h)
    r = run_serve("--load-format", "dummy", "-tp", "2", "--max-model-len", "256")
    assert r.returncode != 0
    assert "--load-format dummy with --tensor-parallel-size 2 is not supported yet" in r.stderr
