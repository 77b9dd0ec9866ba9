"""Two nodes serving one model (issue 7, DESIGN.md "Parallelism"; src/parallel/multinode.h):
`dsv4 serve --nnodes 2 --node-rank 0|1 --master-addr 127.0.0.1 --master-port P -tp 2` as two
processes on this host, ranks joined by the TCP communicator (src/parallel/comm_tcp.c).

- greedy output over HTTP equals the single-process TP=1 server's, with DSpark speculation
  off and on (chat and completions), and node 1 logs that it follows node 0;
- node 0 stopping (SIGTERM) makes the follower exit 0;
- different --tensor-parallel-size on the two nodes fails at start on BOTH nodes with the
  field named; a follower started with another --max-model-len fails at the pool check;
- a follower killed mid-generation fails the request and makes node 0 exit 1 with an error
  naming node 1 (vLLM's policy when a worker dies), never a hang;
- `dsv4 run --nnodes 2` prints the single-process greedy ids, speculation off and on;
- the start-up warm-up (DSV4_WARMUP=1 runs it on the CPU too) runs on both nodes as a step plan,
  output still the single process's; nodes whose warm-ups would differ (DSV4_WARMUP, --max-num-batched-tokens,
  DSV4_WARMUP_PREFILL, --cuda-graph-sizes) fail the start on both, naming it.
Every wait has a timeout."""
import json
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, DSV4, Server, free_master_port, free_port, multinode_env, node_flags

SPEC = '{"method":"dspark","num_speculative_tokens":3}'
COMMON = ("--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "4")


class Follower:
    """Node R > 0: a `dsv4 serve` with no HTTP server; its log in a file."""

    def __init__(self, mport, *args, rank=1, env=None):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [DSV4, "serve", DEFAULT_MODEL, "--port", str(free_port()), *node_flags(mport, rank), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env={**multinode_env(), **(env or {})})

    def text(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def node0(mport, *args, env=None):
    return Server(DEFAULT_MODEL, *node_flags(mport, 0), *args, env={**multinode_env(), **(env or {})}, ready=True)


def node0_fails(mport, *args, env=None):
    """Node 0 in the foreground (no --master-addr: the default) for a start that must fail."""
    return subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--port", str(free_port()), *node_flags(mport, 0, addr=None),
                           *args], capture_output=True, text=True, timeout=60,
                          env={**multinode_env(), **(env or {})})


def pair(*args, env=None):
    mport = free_master_port()
    f = Follower(mport, "-tp", "2", *COMMON, *args, env=env)
    try:
        s = node0(mport, "-tp", "2", *COMMON, *args, env=env)
    except Exception:
        f.kill()
        raise
    return s, f


def post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def chat(base, content, n):
    return post(base, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": n})


def complete(base, prompt, n):
    return post(base, "/v1/completions", {"prompt": prompt, "temperature": 0, "max_tokens": n, "ignore_eos": True})


def log_of(server):
    server.log.seek(0)
    return server.log.read().decode(errors="replace")


@pytest.mark.parametrize("extra", [(), ("--speculative-config", SPEC)], ids=["spec-off", "spec-on"])
def test_two_nodes_match_one_process(default_server, extra):
    s, f = pair(*extra)
    try:
        a = chat(default_server.base, "Count to ten.", 12)
        b = chat(s.base, "Count to ten.", 12)
        assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
        assert b["usage"]["completion_tokens"] == a["usage"]["completion_tokens"] == 12
        a = complete(default_server.base, "The quick brown fox", 16)
        b = complete(s.base, "The quick brown fox", 16)
        assert b["choices"][0]["text"] == a["choices"][0]["text"]
    finally:
        rc0 = s.stop()
        rc1 = f.proc.wait(timeout=20)  # node 0 stopping makes the follower exit
    assert rc0 == 0
    assert rc1 == 0, f.text()
    log0, log1 = log_of(s), f.text()
    assert "tcp communicator up (2 ranks, one per node)" in log0
    assert "tensor parallel 2" in log0
    assert ("speculation dspark k=3" if extra else "speculation off") in log0
    assert "node 1 following node 0 at 127.0.0.1:" in log1
    assert "node 0 quit; exiting" in log1
    assert "listening on" not in log1  # no HTTP server on a follower


def test_two_nodes_warm_up_together(default_server):
    """Node 0 sends the start-up warm-up as a step plan: both nodes run its forwards (their all-reduces pair
    up), and the output afterwards is the single process's (the warm-up's borrowed pages left nothing)."""
    s, f = pair("--speculative-config", SPEC, env={"DSV4_WARMUP": "1"})
    try:
        prompt = "The quick brown fox " + "jumps over the lazy dog " * 60  # > one 256-token page
        a = complete(default_server.base, prompt, 16)
        b = complete(s.base, prompt, 16)
        assert b["choices"][0]["text"] == a["choices"][0]["text"]
    finally:
        rc0 = s.stop()
        rc1 = f.proc.wait(timeout=20)
    assert rc0 == 0
    assert rc1 == 0, f.text()
    assert "warm-up at start: decode / verify steps of" in log_of(s)


@pytest.mark.parametrize("env1,env0,args1,args0,named", [
    ({"DSV4_WARMUP": "0"}, {"DSV4_WARMUP": "1"}, (), (), "node 1 has 2 warm-up mode"),
    ({"DSV4_WARMUP": "1"}, {"DSV4_WARMUP": "1"}, ("--max-num-batched-tokens", "512"),
     ("--max-num-batched-tokens", "2048"), "node 1 has 512 rows of the largest step (--max-num-batched-tokens)"),
    ({"DSV4_WARMUP": "1", "DSV4_WARMUP_PREFILL": "0"}, {"DSV4_WARMUP": "1"}, (), (),
     "node 1 and node 0 differ in warm-up prefill steps (DSV4_WARMUP_PREFILL)"),
    ({"DSV4_WARMUP": "1"}, {"DSV4_WARMUP": "1"}, ("--cuda-graph-sizes", "1", "2"), (),
     "node 1 and node 0 differ in CUDA graph shapes"),
], ids=["no-warm-up", "batched-tokens", "warmup-prefill", "graph-sizes"])
def test_nodes_that_would_warm_up_differently_fail_at_start(env1, env0, args1, args0, named):
    """Every node runs the warm-up's forwards in lock step, so nodes whose warm-up steps would differ are
    refused at the pool check, naming the flag, before any of their all-reduces could diverge."""
    mport = free_master_port()
    f = Follower(mport, "-tp", "2", *COMMON, *args1, env=env1)
    r0 = node0_fails(mport, "-tp", "2", *COMMON, *args0, env=env0)
    rc1 = f.proc.wait(timeout=30)
    assert r0.returncode != 0
    assert named in r0.stderr, r0.stderr
    assert rc1 != 0
    assert named in f.text()


def test_different_tp_on_the_two_nodes_fails_at_start():
    mport = free_master_port()
    f = Follower(mport, "-tp", "4", *COMMON)
    r0 = node0_fails(mport, "-tp", "2", *COMMON)
    rc1 = f.proc.wait(timeout=30)
    assert r0.returncode != 0
    assert "node 1 has --tensor-parallel-size 4, node 0 has 2" in r0.stderr
    assert rc1 != 0
    assert "refused node 1: node 1 has --tensor-parallel-size 4, node 0 has 2" in f.text()


def test_follower_with_other_pool_fails_at_start():
    mport = free_master_port()
    f = Follower(mport, "-tp", "2", "--device", "cpu", "--max-model-len", "256", "--max-num-seqs", "4")
    r0 = node0_fails(mport, "-tp", "2", *COMMON)
    rc1 = f.proc.wait(timeout=30)
    assert r0.returncode != 0
    assert "node 1 has 256 --max-model-len, node 0 has 512" in r0.stderr
    assert rc1 != 0
    assert "node 1 has 256 --max-model-len, node 0 has 512" in f.text()


def test_follower_killed_mid_run_fails_node0_not_hangs():
    import http.client
    s, f = pair()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Hello", "temperature": 0, "max_tokens": 480, "ignore_eos": True, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        first = resp.readline()  # the generation is under way: a token has streamed
        assert first.startswith(b"data: ")
        f.proc.send_signal(signal.SIGKILL)
        rest = b""
        try:
            rest = resp.read()  # ends (error event or closed connection) instead of hanging
        except (OSError, http.client.HTTPException):
            pass
        rc0 = s.proc.wait(timeout=30)  # node 0 shuts down by itself
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        f.kill()
    assert rest.count(b"data: ") < 480  # the generation did not complete
    assert rc0 == 1
    log0 = log_of(s)
    assert "rank 1 (node 1 at 127.0.0.1:" in log0
    assert "closed the connection: it exited, crashed or aborted" in log0
    assert "; shutting down" in log0


def test_run_on_two_nodes_gives_one_process_tokens():
    # `dsv4 run` with the same flags: node 0 prints the generation, node 1 follows and exits 0
    base = ["--prompt-ids", "5,17,42,7", "--max-tokens", "8", "--show-ids", "--device", "cpu"]
    for k in ("0", "3"):
        one = subprocess.run([DSV4, "run", DEFAULT_MODEL, *base, "--spec", k], capture_output=True, text=True,
                             errors="replace", timeout=120, env=multinode_env())
        assert one.returncode == 0, one.stderr
        want = [ln for ln in one.stderr.splitlines() if ln.startswith("[")]
        mport = free_master_port()
        args = [DSV4, "run", DEFAULT_MODEL, *base, "--spec", k, "-tp", "2"]
        f = subprocess.Popen([*args, *node_flags(mport, 1, addr=None)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, errors="replace", env=multinode_env())
        try:
            r0 = subprocess.run([*args, *node_flags(mport, 0, addr=None)], capture_output=True, text=True,
                                errors="replace", timeout=120, env=multinode_env())
            out1, err1 = f.communicate(timeout=30)
        finally:
            if f.poll() is None:
                f.kill()
        assert r0.returncode == 0, r0.stderr
        assert want and [ln for ln in r0.stderr.splitlines() if ln.startswith("[")] == want
        assert f.returncode == 0, err1
        assert out1 == ""  # the follower prints no generation
        assert "node 1 following node 0 at 127.0.0.1:" in err1


def test_node0_failing_after_the_join_fails_the_follower():
    # both nodes load, then node 0 refuses the flags (no MTP block in a DSpark checkpoint): the
    # follower must not mistake that for a clean stop
    mport = free_master_port()
    bad = ("--speculative-config", '{"method":"mtp","num_speculative_tokens":1}')
    f = Follower(mport, "-tp", "2", *COMMON, *bad)
    r0 = node0_fails(mport, "-tp", "2", *COMMON, *bad)
    rc1 = f.proc.wait(timeout=30)
    assert r0.returncode != 0
    assert "has no MTP block" in r0.stderr
    assert rc1 == 1
    assert "rank 0 (node 0 at 127.0.0.1:" in f.text()
