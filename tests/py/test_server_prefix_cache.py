"""Automatic prefix caching through the server (SERVING.md §8.7, vLLM
--enable-prefix-caching, on by default): the same request again reuses the
kept prompt state (usage.prompt_tokens_details.cached_tokens > 0), gives the
same greedy output as a server with --no-enable-prefix-caching, and the
vllm:prefix_cache_* / prompt_tokens_cached counters move; with the flag off
nothing is cached or counted. The first request of a fresh server reports 0
cached tokens (the warm-up generation leaves nothing in the cache)."""
import json
import urllib.request

from conftest import DEFAULT_MODEL

MODEL_LABEL = '{model_name="deepseek-v4-flash-dspark",engine="0"}'
PROMPT = ("Here is a long shared context about the seasons. Spring brings rain and new leaves, summer is warm "
          "and long, autumn turns the leaves red and gold, and winter is cold and quiet. ") * 2


def chat(base, content, n=8):
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": n}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {ln.split(" ")[0]: float(ln.split(" ")[-1]) for ln in text.splitlines()
            if ln.startswith("vllm:") and not ln.startswith("#")}


def test_prefix_cache_hit_and_off(server_factory):
    on = server_factory(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "2", ready=True)
    off = server_factory(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "2",
                         "--no-enable-prefix-caching", ready=True)
    m0 = metrics(on.base)
    cold = chat(on.base, PROMPT)
    warm = chat(on.base, PROMPT)
    n_prompt = cold["usage"]["prompt_tokens"]
    assert n_prompt > 40
    c_cold = cold["usage"]["prompt_tokens_details"]["cached_tokens"]
    c_warm = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    # a fresh server's first request: nothing cached (the warm-up's BOS is not kept)
    assert c_cold == 0
    assert c_warm == n_prompt - 1  # all but the last prompt token, whose logits start the output
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    m1 = metrics(on.base)
    q = "vllm:prefix_cache_queries_total" + MODEL_LABEL
    h = "vllm:prefix_cache_hits_total" + MODEL_LABEL
    c = "vllm:prompt_tokens_cached_total" + MODEL_LABEL
    assert m1[q] - m0[q] == 2 * n_prompt
    assert m1[h] - m0[h] == c_cold + c_warm
    assert m1[c] - m0[c] == c_cold + c_warm

    a = chat(off.base, PROMPT)
    b = chat(off.base, PROMPT)
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert a["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    assert b["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    m = metrics(off.base)
    assert m[q] == 0 and m[h] == 0 and m[c] == 0
