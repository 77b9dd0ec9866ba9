"""The KV state pool through the server (issue 5): the start-up log states
the pool like vLLM ("KV cache pool: N tokens (P pages of B), maximum
concurrency ..."), /metrics carries vllm:cache_config_info and a real
vllm:kv_cache_usage_perc; a pool too small for three concurrent requests
preempts (vllm:num_preemptions_total moves) and every greedy output still
equals the same request run alone on a server with an ample pool; and a pool
that cannot hold one max_model_len request is refused at start, as vLLM does."""
import json
import threading
import urllib.request

import pytest

from conftest import DEFAULT_MODEL

LABEL = '{model_name="deepseek-v4-flash-dspark",engine="0"}'
TOPICS = ["the seasons and the weather", "rivers, lakes and the sea", "mountains, forests and valleys"]


def prompt(i):
    return (f"Write a long story about {TOPICS[i]}. " + "It should be detailed, calm and slow. " * 8)


def complete(base, text, n):
    body = {"prompt": text, "temperature": 0, "max_tokens": n, "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def metrics_text(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return r.read().decode()


def value(text, name):
    for ln in text.splitlines():
        if ln.startswith(name + LABEL + " "):
            return float(ln.split(" ")[-1])
    raise KeyError(name)


def log_of(server):
    server.log.seek(0)
    return server.log.read().decode(errors="replace")


COMMON = ["--max-model-len", "256", "--max-num-seqs", "3", "--block-size", "128"]
NGEN = 60


def test_pool_preemption_matches_solo(server_factory):
    ample = server_factory(DEFAULT_MODEL, *COMMON, "--no-enable-prefix-caching", ready=True)
    solo = [complete(ample.base, prompt(i), NGEN) for i in range(3)]
    for s in solo:
        # each request crosses the 128-token page boundary while generating
        assert 64 < s["usage"]["prompt_tokens"] < 128 < s["usage"]["prompt_tokens"] + NGEN
        assert s["usage"]["completion_tokens"] == NGEN
    assert value(metrics_text(ample.base), "vllm:num_preemptions_total") == 0

    small = server_factory(DEFAULT_MODEL, *COMMON, "--num-gpu-blocks-override", "2", ready=True)
    assert "KV cache pool: 256 tokens (2 pages of 128" in log_of(small)
    assert "maximum concurrency for 256-token requests: 1.00x" in log_of(small)
    got = [None] * 3

    def worker(i):
        got[i] = complete(small.base, prompt(i), NGEN)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert got[i]["choices"][0]["text"] == solo[i]["choices"][0]["text"], i
        assert got[i]["usage"]["completion_tokens"] == NGEN
    m = metrics_text(small.base)
    assert value(m, "vllm:num_preemptions_total") > 0
    assert value(m, "vllm:kv_cache_usage_perc") == 0  # nothing running: cached histories count as free
    assert ('vllm:cache_config_info{model_name="deepseek-v4-flash-dspark",engine="0",block_size="128",'
            'num_gpu_blocks="2",cache_dtype="auto",enable_prefix_caching="True"') in m


def test_pool_smaller_than_one_request_is_refused(server_factory):
    with pytest.raises(RuntimeError) as e:
        server_factory(DEFAULT_MODEL, *COMMON, "--num-gpu-blocks-override", "1", ready=True)
    assert "KV cache pool needs 2 pages of 128 tokens" in str(e.value)
    assert "--max-model-len to at most 128" in str(e.value)


def test_pool_fp8_ds_mla_storage(server_factory):
    """--kv-cache-dtype fp8_ds_mla stores window and compressed rows as 584-byte-style records
    (src/model/kvcodec.h): the server serves with it, the pool holds more pages in the same
    budget than with f32 rows, and cache_config_info names the dtype."""
    budget = ["--kv-cache-memory-bytes", "2M"]
    f32 = server_factory(DEFAULT_MODEL, *COMMON, *budget, ready=True)
    fp8 = server_factory(DEFAULT_MODEL, *COMMON, *budget, "--kv-cache-dtype", "fp8_ds_mla", ready=True)
    blocks = []
    for s in (f32, fp8):
        r = complete(s.base, prompt(0), 8)
        assert r["usage"]["completion_tokens"] == 8
        m = metrics_text(s.base)
        blocks.append(int(value(m, "dsv4:kv_cache_pool_blocks")))
    assert blocks[1] > blocks[0] > 0
    assert 'cache_dtype="fp8_ds_mla"' in metrics_text(fp8.base)
    assert "kv dtype fp8_ds_mla" in log_of(fp8)


def test_kv_auto_follows_the_backend_taken(server_factory):
    """`--kv-cache-dtype auto` (the default) is fp8_ds_mla on the GPU and f32 on the CPU
    (kvcodec.h, --help). With `--device auto` the rows must follow the backend the server
    actually took: a CUDA build on a machine whose GPU does not answer falls back to the CPU
    backend, and used to get the GPU's fp8_ds_mla rows anyway (seen on the CI box: nvcc, no driver)."""
    s = server_factory(DEFAULT_MODEL, "--device", "auto", "--max-model-len", "256", "--max-num-seqs", "2", ready=True)
    log = log_of(s)
    model_line = next(ln for ln in log.splitlines() if "tensor parallel" in ln and "kv dtype" in ln)
    if "cpu backend" in model_line:
        assert "kv dtype f32" in model_line, model_line
    else:
        assert "kv dtype fp8_ds_mla" in model_line, model_line
