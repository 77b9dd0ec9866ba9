"""The CPU backend's KV pool at serve level, sized as vLLM's CPU backend sizes its KV cache
(src/util/hostmem.h, engine/model_runner.c): VLLM_CPU_KVCACHE_SPACE (whole GiB) is read as
--kv-cache-memory-bytes, which wins over it; without either the pool is bounded by
--gpu-memory-utilization of the host memory available; max_model_len defaults to the model's
maximum (1048576 for the embedded model) and the start-up log states the pool in tokens and the
maximum concurrency at that length; a bound that cannot hold one max_model_len request refuses
to start with the length that would fit, and --max-model-len auto serves that length instead."""
import json
import os
import subprocess
import urllib.request

import pytest

from conftest import DEFAULT_MODEL, DSV4, free_port, mem_available


def log_of(server):
    server.log.seek(0)
    return server.log.read().decode(errors="replace")


def metric(base, name):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(name + "{"):
                return float(ln.split(" ")[-1])
    raise KeyError(name)


def models_max_len(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["max_model_len"]


COMMON = ["--device", "cpu", "--max-model-len", "512", "--max-num-seqs", "2"]


def test_env_space_equals_kv_cache_memory_bytes(server_factory):
    """VLLM_CPU_KVCACHE_SPACE=1 gives the pool --kv-cache-memory-bytes 1G gives (before: ignored,
    and the pool held every slot at max_model_len: a few pages); the flag wins over the variable."""
    env = server_factory(DEFAULT_MODEL, *COMMON, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready=True)
    flag = server_factory(DEFAULT_MODEL, *COMMON, "--kv-cache-memory-bytes", "1G", ready=True)
    won = server_factory(DEFAULT_MODEL, *COMMON, "--num-gpu-blocks-override", "5",
                         env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready=True)
    blocks = [metric(s.base, "dsv4:kv_cache_pool_blocks") for s in (env, flag, won)]
    assert blocks[0] == blocks[1] > 1000, blocks
    assert blocks[2] == 5, blocks
    assert "VLLM_CPU_KVCACHE_SPACE=1 GiB on the CPU" in log_of(env)


def test_env_space_bad_value_is_refused():
    e = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1.5")
    p = subprocess.run([DSV4, "serve", DEFAULT_MODEL, *COMMON, "--port", str(free_port())], capture_output=True,
                       timeout=120, env=e)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and "VLLM_CPU_KVCACHE_SPACE='1.5'" in err, err


def test_default_max_model_len_and_bounded_pool(server_factory):
    """No --max-model-len: the model's 1048576, and a pool bounded by host memory (72 slots at 1M
    tokens would be ~37 GiB on the embedded model; it used to be allocated whole, touched lazily)."""
    s = server_factory(DEFAULT_MODEL, "--device", "cpu", ready=True)
    assert models_max_len(s.base) == 1048576
    log = log_of(s)
    assert "maximum concurrency for 1048576-token requests" in log, log
    assert "KV cache: VLLM_CPU_KVCACHE_SPACE unset: the CPU pool may use" in log, log
    line = next(ln for ln in log.splitlines() if "KV cache pool:" in ln)
    pool_mib = float(line.split("pages of 256, ")[1].split(" MiB")[0])
    # at most --gpu-memory-utilization (0.9) of the memory there is now, plus what the pool took of it
    assert pool_mib * 2**20 <= 0.9 * (mem_available() + pool_mib * 2**20), line
    # a request still runs
    req = urllib.request.Request(s.base + "/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "Hi", "max_tokens": 4, "temperature": 0}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] >= 1


def test_one_request_that_does_not_fit_is_refused_then_auto_fits(server_factory):
    """A bound that holds less than one 1M-token request (~516 MiB of f32 rows on the embedded model):
    the server refuses to start with vLLM's message and the length that would fit, instead of
    starting with a pool the OOM killer finds later; --max-model-len auto serves that length."""
    avail = mem_available()
    util = 64 * 2**20 / avail  # ~64 MiB of the memory available now
    if util > 1:
        pytest.skip("less than 64 MiB of host memory available")
    p = subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--device", "cpu", "--max-num-seqs", "2",
                        "--gpu-memory-utilization", f"{util:.6f}", "--port", str(free_port())], capture_output=True,
                       timeout=120)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    assert "to serve at least one request of max_model_len 1048576" in err, err
    assert "estimated maximum model length is" in err, err
    assert "VLLM_CPU_KVCACHE_SPACE" in err and "--max-model-len" in err, err
    fit = int(err.split("estimated maximum model length is ")[1].split(".")[0])
    assert 0 < fit < 1048576, err
    s = server_factory(DEFAULT_MODEL, "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "auto",
                       "--gpu-memory-utilization", f"{util:.6f}", ready=True)
    got = models_max_len(s.base)
    assert 0 < got < 1048576 and got % 256 == 0, got
    assert "--max-model-len auto: the KV pool holds" in log_of(s)
    assert f"maximum concurrency for {got}-token requests: 1.00x" in log_of(s)


def test_concurrency_counts_whole_pages_and_zero_space_is_named(server_factory):
    """The start line's maximum concurrency is vLLM's (get_max_concurrency_for_kv_cache_config):
    pool pages / pages one max_model_len request holds. 3 pages of 256 at max_model_len 100 serve
    3 requests (before: 768 / 100 = 7.68x). VLLM_CPU_KVCACHE_SPACE=0 is vLLM's "unset" and the log
    says it was 0 (before: "unset")."""
    s = server_factory(DEFAULT_MODEL, "--device", "cpu", "--max-model-len", "100", "--max-num-seqs", "2",
                       "--num-gpu-blocks-override", "3", ready=True)
    assert "maximum concurrency for 100-token requests: 3.00x" in log_of(s), log_of(s)
    z = server_factory(DEFAULT_MODEL, *COMMON, env={"VLLM_CPU_KVCACHE_SPACE": "0"}, ready=True)
    assert "KV cache: VLLM_CPU_KVCACHE_SPACE=0 (as unset, vLLM): the CPU pool may use" in log_of(z), log_of(z)


def refusal(*args):
    p = subprocess.run([DSV4, "serve", DEFAULT_MODEL, "--device", "cpu", *args, "--port", str(free_port())],
                       capture_output=True, timeout=120, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE=""))
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0, err
    return err


def test_refusals_say_what_fits_and_what_to_do():
    """A pool that holds no page at all is vLLM's "No available memory for the cache blocks", and does
    not send the user to --max-model-len auto, which had just been given (before: "the estimated maximum
    model length is 0 ... give --max-model-len auto"). A pool set outright that is too small for one
    request states the estimated maximum model length, as the memory-bounded refusal does, and names auto."""
    err = refusal("--gpu-memory-utilization", "0.0001", "--max-model-len", "auto")
    assert "no available memory for the cache blocks" in err and "0.0001 of" in err, err
    assert "--max-model-len auto" not in err and "estimated maximum model length is 0" not in err, err
    err = refusal("--num-gpu-blocks-override", "2")
    assert "the estimated maximum model length is 512." in err, err
    assert "give --max-model-len auto" in err, err
    # an override larger than host memory (13 TB here) is refused naming the flag (before: "state layer 1: cpu:
    # buf_alloc: ... bytes", or, below the allocator's limit, a pool that the OOM killer finds out)
    err = refusal("--num-gpu-blocks-override", "100000000")
    assert "--num-gpu-blocks-override 100000000 pages of 256 tokens need" in err and "give at most" in err, err


def test_sizing_lines_once_per_process_with_tp(server_factory):
    """-tp 2 on the CPU: the ranks size their pools alike; the sizing is logged once (before: once per rank)."""
    s = server_factory(DEFAULT_MODEL, *COMMON, "-tp", "2", ready=True)
    log = log_of(s)
    assert log.count("KV cache: VLLM_CPU_KVCACHE_SPACE unset: the CPU pool may use") == 1, log
    assert "/ 2 rank(s)" in log, log
