"""Several tensor-parallel ranks per node (issue 7, src/parallel/multinode.h): `-tp` is the total over
`--nnodes` (vLLM's meaning: `--tensor-parallel-size 4 --nnodes 2` is 2 nodes x 2 ranks), so two
processes with `--nnodes 2 -tp 4 --device cpu` run 2 CPU ranks each, joined by the TCP communicator.

The tiny checkpoints have o_groups 2, which TP = 4 does not divide (refused before loading), so the
model here is the real 0731 config shrunk to sizes TP = 4 divides, with dummy weights (each rank fills
exactly its slice, tp_shard.c): greedy ids of two `dsv4 run` processes equal one process with -tp 4
and TP = 1, speculation off and DSpark k = 3; the same over HTTP with `dsv4 serve` (node 0 serves).
Refusals: -tp not a multiple of --nnodes (node 0, before waiting), and nodes started with different
-tp or different --max-tokens (the rendezvous / the pool check name the field). Every wait has a
timeout."""
import json
import os
import subprocess
import urllib.request

from conftest import DSV4, ROOT, Server, free_master_port, free_port, mem_available, multinode_env, node_flags

CFG = os.path.join(ROOT, "configs", "deepseek-v4-flash-0731")
OV = json.dumps({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128,
                 "q_lora_rank": 128, "o_groups": 4, "o_lora_rank": 128, "moe_intermediate_size": 256,
                 "n_routed_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4,
                 "index_topk": 4, "vocab_size": 1024, "num_hash_layers": 2, "dspark_noise_token_id": 1000,
                 "dspark_markov_rank": 32})
DUMMY = ("--load-format", "dummy", "--hf-overrides", OV, "--device", "cpu")
RUN = (DSV4, "run", CFG, *DUMMY, "--prompt-ids", "5,17,42,7", "--max-tokens", "8", "--show-ids")


def free_triple():
    """A master port whose next two ports (the two TCP groups) are free too."""
    return free_master_port(2)


def ids_of(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("[")]


def two_runs(args0, args1, timeout=120):
    """node 1 in the background, node 0 in the foreground; (node 0, node 1 returncode, node 1 stderr)."""
    mport = free_triple()
    f = subprocess.Popen([*args1, *node_flags(mport, 1)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=multinode_env())
    try:
        r0 = subprocess.run([*args0, *node_flags(mport, 0)], capture_output=True, text=True, errors="replace",
                            timeout=timeout, env=multinode_env())
        out1, err1 = f.communicate(timeout=40)
    finally:
        if f.poll() is None:
            f.kill()
            f.wait(timeout=10)
    return r0, f.returncode, out1, err1


def test_run_two_nodes_of_two_ranks_give_one_process_tokens():
    for k in ("0", "3"):
        want = {}
        for tp in ("1", "4"):
            r = subprocess.run([*RUN, "--spec", k, "-tp", tp], capture_output=True, text=True, errors="replace",
                               timeout=120, env=dict(multinode_env(), DSV4_TP_CHECK_RANKS="1"))
            assert r.returncode == 0, r.stderr
            want[tp] = ids_of(r.stderr)
        assert want["1"] and want["1"] == want["4"]
        args = (*RUN, "--spec", k, "-tp", "4")
        r0, rc1, out1, err1 = two_runs(args, args)
        assert r0.returncode == 0, r0.stderr
        assert ids_of(r0.stderr) == want["4"], (k, r0.stderr)
        assert rc1 == 0, err1
        assert out1 == ""  # the follower prints no generation
        assert "tcp communicator up (4 ranks, 2 per node: ranks 0..1 here), step plans over tcp" in r0.stderr
        assert "node 1 following node 0 at 127.0.0.1:" in err1 and "(ranks 2..3 here)" in err1
        assert "node 1: node 0 quit; exiting" in err1


def test_serve_two_nodes_of_two_ranks_gives_one_process_text():
    spec = ("--speculative-config", '{"method":"dspark","num_speculative_tokens":3}')
    common = (CFG, *DUMMY, "--max-model-len", "256", "--max-num-seqs", "2", *spec)
    body = {"prompt": [5, 17, 42, 7, 300, 12], "temperature": 0, "max_tokens": 10, "ignore_eos": True}

    def complete(base):
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    one = Server(*common, env=multinode_env(), ready=True)
    try:
        want = complete(one.base)
    finally:
        one.stop()
    mport = free_triple()
    f = subprocess.Popen([DSV4, "serve", *common, "-tp", "4", *node_flags(mport, 1), "--port", str(free_port())],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                         env=multinode_env())
    try:
        s = Server(*common, "-tp", "4", *node_flags(mport, 0), env=multinode_env(), ready=True)
        try:
            got = complete(s.base)
        finally:
            rc0 = s.stop()
        out1, _ = f.communicate(timeout=40)
    finally:
        if f.poll() is None:
            f.kill()
            f.wait(timeout=10)
    assert want["usage"]["completion_tokens"] == got["usage"]["completion_tokens"] == 10
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert rc0 == 0
    assert f.returncode == 0, out1
    s.log.seek(0)
    log0 = s.log.read().decode(errors="replace")
    assert "cpu backend, tensor parallel 4" in log0 and "speculation dspark k=3" in log0
    assert "(ranks 2..3 here)" in out1


def test_tp_not_a_multiple_of_nnodes_is_refused_before_waiting():
    r = subprocess.run([*RUN, "-tp", "3", *node_flags(free_triple(), 0, addr=None)], capture_output=True, text=True,
                       timeout=30, env=multinode_env())
    assert r.returncode == 2
    assert "--tensor-parallel-size 3 with --nnodes 2" in r.stderr and "give a multiple of 2" in r.stderr


def test_nodes_with_different_flags_fail_at_start_naming_the_field():
    # -tp 4 on node 0, -tp 2 on node 1: the rendezvous names the field on both nodes
    r0, rc1, _, err1 = two_runs((*RUN, "-tp", "4"), (*RUN, "-tp", "2"), timeout=60)
    assert r0.returncode != 0 and rc1 != 0
    assert "node 1 has --tensor-parallel-size 2, node 0 has 4" in r0.stderr
    assert "node 1 has --tensor-parallel-size 2, node 0 has 4" in err1
    # another --max-tokens sizes another state: the pool check after loading names it
    other = [a if a != "8" else "20" for a in RUN]
    r0, rc1, _, err1 = two_runs((*RUN, "-tp", "4"), (*other, "-tp", "4"), timeout=60)
    assert r0.returncode != 0 and rc1 != 0
    assert "--max-model-len" in r0.stderr and "node 1 has" in r0.stderr, r0.stderr
    assert "--max-model-len" in err1, err1
    assert "--max-tokens" in r0.stderr, r0.stderr  # the flag dsv4 run's user gave (before: only --max-model-len)


def test_follower_killed_mid_run_fails_node0_naming_its_rank_and_node():
    # node 1 (ranks 2, 3) dies during a generation: node 0's step fails naming rank 2 on node 1 (the
    # star's first read from it), and node 0 shuts down with status 1 instead of hanging
    import http.client
    import signal
    common = (CFG, *DUMMY, "--max-model-len", "512", "--max-num-seqs", "2")
    mport = free_triple()
    f = subprocess.Popen([DSV4, "serve", *common, "-tp", "4", *node_flags(mport, 1), "--port", str(free_port())],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=multinode_env())
    s = None
    try:
        s = Server(*common, "-tp", "4", *node_flags(mport, 0), env=multinode_env(), ready=True)
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": [5, 17, 42], "temperature": 0, "max_tokens": 480, "ignore_eos": True, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.readline().startswith(b"data: ")  # under way
        f.send_signal(signal.SIGKILL)
        rest = b""
        try:
            rest = resp.read()
        except (OSError, http.client.HTTPException):
            pass
        rc0 = s.proc.wait(timeout=30)
    finally:
        if s and s.proc.poll() is None:
            s.proc.kill()
        if f.poll() is None:
            f.kill()
            f.wait(timeout=10)
    assert rest.count(b"data: ") < 480
    assert rc0 == 1
    s.log.seek(0)
    log0 = s.log.read().decode(errors="replace")
    assert "(node 1 at 127.0.0.1:" in log0 and "closed the connection: it exited, crashed or aborted" in log0
    assert "; shutting down" in log0


def test_follower_refuses_tp_not_a_multiple_of_nnodes_without_waiting():
    """-tp 3 --nnodes 2 is refused on node 1 too, at once (before: node 1 waited DSV4_RDV_TIMEOUT_S for
    a node 0 that had refused the same flags, then blamed the connection)."""
    mn = (*node_flags(free_triple(), 1), "-tp", "3")
    for cmd in ([*RUN, *mn], [DSV4, "serve", CFG, *DUMMY, *mn, "--port", str(free_port())]):
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=60, env=multinode_env())
        assert r.returncode == 2, r.stderr
        assert "--tensor-parallel-size 3 with --nnodes 2" in r.stderr and "give a multiple of 2" in r.stderr, r.stderr
        assert "rendezvous" not in r.stderr, r.stderr


def test_per_slot_pool_larger_than_host_memory_is_refused():
    """Several nodes size their pools per slot (not by memory): 72 slots x 1048576 tokens of this config are
    36.6 GiB for the 2 ranks of a node. Where that exceeds the host memory available, both nodes refuse at start
    naming VLLM_CPU_KVCACHE_SPACE (before: they started with a lazily touched pool the OOM killer would find)."""
    if mem_available() > 36 * (1 << 30):
        import pytest
        pytest.skip("this host holds the pool")
    args = (DSV4, "serve", CFG, *DUMMY, "--max-model-len", "1048576", "-tp", "4")
    r0, rc1, _, err1 = two_runs((*args, "--port", str(free_port())), (*args, "--port", str(free_port())), timeout=60)
    for rc, err in ((r0.returncode, r0.stderr), (rc1, err1)):
        assert rc != 0, err
        assert "KV cache: every slot at max_model_len 1048576 takes 294912 pages" in err, err
        assert "for 2 rank(s) here" in err and "VLLM_CPU_KVCACHE_SPACE" in err, err
    assert "dsv4 serve: node 1: rank " in err1 and "node 1: node 1:" not in err1, err1  # the node named once


def test_hf_overrides_logged_once_per_process():
    """Every rank loads the config: the '--hf-overrides ... applied over' line is said once (before: once per
    rank and once for the service, 4 lines for -tp 4 in one process, each a whole JSON)."""
    r = subprocess.run([*RUN, "-tp", "4"], capture_output=True, text=True, errors="replace", timeout=120,
                       env=multinode_env())
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("--hf-overrides {") == 1, r.stderr
