"""logprobs, top_logprobs and n over HTTP on the embedded default model
(spec/SERVING.md §3.3, §3.4, §3.6, §7.2). The default model has random
weights, so the server is checked against itself: the chat and completions
endpoints report the same raw log-probabilities for the same prompt ids,
greedy tokens are the top-1, distributions are sub-normalised, choices of a
greedy n>1 request are identical, seeded n>1 requests reproduce."""
import json
import math
import urllib.error
import urllib.request

import openai
from conftest import post

MSG = [{"role": "user", "content": "Name three colours."}]


def sse(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [raw[6:] for raw in r.read().decode().split("\n\n") if raw.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def chat(base, **kw):
    body = {"messages": MSG, "temperature": 0, "max_tokens": 6, "logprobs": True, "top_logprobs": 5}
    body.update(kw)
    status, r = post(base, "/v1/chat/completions", body)
    assert status == 200, r
    return r


def check_entry(e, n_top):
    assert isinstance(e["token"], str) and isinstance(e["logprob"], float) and e["logprob"] <= 0
    assert isinstance(e["bytes"], list) and all(isinstance(b, int) and 0 <= b < 256 for b in e["bytes"])
    if e["bytes"] and "\ufffd" not in e["token"]:
        assert bytes(e["bytes"]).decode() == e["token"]
    tops = e["top_logprobs"]
    assert len(tops) == n_top
    lps = [t["logprob"] for t in tops]
    assert lps == sorted(lps, reverse=True)
    assert sum(math.exp(x) for x in lps) <= 1 + 1e-5
    # the sampled token is at most as likely as the top-1, and is listed when it beats the last entry
    if n_top:
        assert e["logprob"] <= lps[0] + 1e-6


def test_chat_logprobs_shape_greedy_top1(default_server):
    r = chat(default_server.base)
    ch = r["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 6
    for e in content:
        check_entry(e, 5)
        # temperature 0: the sampled token is the top-1 of the raw distribution
        assert e["token"] == e["top_logprobs"][0]["token"] and e["bytes"] == e["top_logprobs"][0]["bytes"]
        assert abs(e["logprob"] - e["top_logprobs"][0]["logprob"]) < 1e-6
    text = b"".join(bytes(e["bytes"]) for e in content).decode("utf-8", "replace")
    assert text.startswith(ch["message"]["content"])
    # without top_logprobs: only the sampled tokens, the same values
    r0 = chat(default_server.base, top_logprobs=0)
    c0 = r0["choices"][0]["logprobs"]["content"]
    assert [e["top_logprobs"] for e in c0] == [[]] * 6
    assert [(e["token"], e["logprob"]) for e in c0] == [(e["token"], e["logprob"]) for e in content]
    # not asked -> null
    assert chat(default_server.base, logprobs=False, top_logprobs=None)["choices"][0]["logprobs"] is None


def test_logprobs_are_raw_and_include_reasoning(default_server):
    b = default_server.base
    g = chat(b)["choices"][0]["logprobs"]["content"]
    # sampling with penalties changes the tokens, never how a given token is scored (§7.2: raw logits);
    # the first token has the same prefix, so its record is identical
    s = chat(b, temperature=1.5, seed=3, presence_penalty=2, top_logprobs=5)["choices"][0]["logprobs"]["content"]
    assert s[0]["top_logprobs"] == g[0]["top_logprobs"]
    t = chat(b, chat_template_kwargs={"thinking": True}, reasoning_effort="high")
    assert t["choices"][0]["message"]["content"] is None  # random weights: all 6 tokens are reasoning
    assert len(t["choices"][0]["logprobs"]["content"]) == 6


def test_chat_and_completions_agree(default_server):
    b = default_server.base
    r = chat(b, max_tokens=5)
    _, tk = post(b, "/tokenize", {"messages": MSG})
    status, c = post(b, "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 5, "temperature": 0,
                                            "logprobs": 3})
    assert status == 200, c
    lp = c["choices"][0]["logprobs"]
    content = r["choices"][0]["logprobs"]["content"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert lp["tokens"] == [e["token"] for e in content]
    for e, x, tops in zip(content, lp["token_logprobs"], lp["top_logprobs"]):
        assert abs(e["logprob"] - x) < 1e-4
        assert 3 <= len(tops) <= 4 and e["token"] in tops
        for t in e["top_logprobs"][:3]:
            assert abs(tops[t["token"]] - t["logprob"]) < 1e-4
    offs = lp["text_offset"]
    assert offs[0] == 0 and all(offs[i + 1] == offs[i] + len(lp["tokens"][i]) for i in range(4))
    # logprobs: 0 -> sampled tokens only; absent -> null; > 5 refused (echo+logprobs is served:
    # prompt logprobs, tests/py/test_server_completions.py)
    _, z = post(b, "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 2, "temperature": 0, "logprobs": 0})
    assert [list(d) for d in z["choices"][0]["logprobs"]["top_logprobs"]] == [[t] for t in lp["tokens"][:2]]
    _, nn = post(b, "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 2, "temperature": 0})
    assert nn["choices"][0]["logprobs"] is None
    for extra, field in [({"logprobs": 6}, "logprobs")]:
        status, e = post(b, "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
        assert status == 400 and e["error"]["param"] == field, e


def test_streaming_logprobs_match(default_server):
    b = default_server.base
    full = chat(b, max_tokens=8)
    events = sse(b, "/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 8, "logprobs": True,
                                             "top_logprobs": 2, "stream": True})
    got = []
    for e in events:
        lp = e["choices"][0]["logprobs"]
        if lp is not None:
            # a chunk carrying logprobs carries text or ends the choice
            assert e["choices"][0]["delta"].get("content") or e["choices"][0]["finish_reason"]
            got += lp["content"]
    ref = full["choices"][0]["logprobs"]["content"]
    assert [(x["token"], x["logprob"]) for x in got] == [(x["token"], x["logprob"]) for x in ref]
    assert [x["top_logprobs"] for x in got] == [x["top_logprobs"][:2] for x in ref]
    cev = sse(b, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                     "logprobs": 2, "stream": True})
    toks, offs = [], []
    for e in cev:
        lp = e["choices"][0]["logprobs"]
        if lp:
            toks += lp["tokens"]
            offs += lp["text_offset"]
    _, c = post(b, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                       "logprobs": 2})
    assert toks == c["choices"][0]["logprobs"]["tokens"] and offs == c["choices"][0]["logprobs"]["text_offset"]


def test_n_greedy_identical_and_usage(default_server):
    b = default_server.base
    one = chat(b, max_tokens=5, logprobs=False, top_logprobs=None)
    r = chat(b, max_tokens=5, n=3, logprobs=False, top_logprobs=None)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    texts = {c["message"]["content"] for c in r["choices"]}
    assert texts == {one["choices"][0]["message"]["content"]}
    assert r["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert r["usage"]["completion_tokens"] == 15
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 15


def test_n_seeded_reproducible_and_streamed(default_server):
    b = default_server.base
    body = dict(max_tokens=5, n=2, temperature=1.0, seed=11, logprobs=False, top_logprobs=None)
    a, a2 = chat(b, **body), chat(b, **body)
    assert [c["message"]["content"] for c in a["choices"]] == [c["message"]["content"] for c in a2["choices"]]
    # choice i uses seed + i: choice 1 of seed 11 is choice 0 of seed 12
    s12 = chat(b, max_tokens=5, temperature=1.0, seed=12, logprobs=False, top_logprobs=None)
    assert a["choices"][1]["message"]["content"] == s12["choices"][0]["message"]["content"]
    events = sse(b, "/v1/chat/completions", {"messages": MSG, "max_tokens": 5, "n": 2, "temperature": 1.0,
                                             "seed": 11, "stream": True, "stream_options": {"include_usage": True}})
    text = ["", ""]
    finals = []
    for e in events:
        if not e["choices"]:
            continue
        ch = e["choices"][0]
        text[ch["index"]] += ch["delta"].get("content") or ""
        if ch["finish_reason"]:
            finals.append(ch["index"])
    assert text == [c["message"]["content"] for c in a["choices"]]
    assert sorted(finals) == [0, 1]
    assert events[-1]["usage"]["completion_tokens"] == a["usage"]["completion_tokens"] == 10
    # n on completions too
    status, c = post(b, "/v1/completions", {"prompt": "Once upon", "max_tokens": 3, "temperature": 0, "n": 2})
    assert status == 200 and [x["index"] for x in c["choices"]] == [0, 1]
    assert c["choices"][0]["text"] == c["choices"][1]["text"] and c["usage"]["completion_tokens"] == 6
    status, e = post(b, "/v1/chat/completions", {"messages": MSG, "n": 9})
    assert status == 400 and e["error"]["param"] == "n"


def test_openai_sdk_parses_logprobs(default_server):
    c = openai.OpenAI(base_url=default_server.base + "/v1", api_key="none", max_retries=0)
    r = c.chat.completions.create(model="deepseek-v4-flash-dspark", messages=MSG, max_tokens=4, temperature=0,
                                  logprobs=True, top_logprobs=3, n=2)
    assert len(r.choices) == 2
    lp = r.choices[1].logprobs.content
    assert len(lp) == 4 and len(lp[0].top_logprobs) == 3 and lp[0].token == lp[0].top_logprobs[0].token
    assert isinstance(lp[0].bytes, list) and lp[0].logprob <= 0
    t = c.completions.create(model="deepseek-v4-flash-dspark", prompt="Once upon", max_tokens=3, temperature=0,
                             logprobs=2)
    assert len(t.choices[0].logprobs.tokens) == 3 and len(t.choices[0].logprobs.top_logprobs[0]) >= 2
    chunks = list(c.chat.completions.create(model="deepseek-v4-flash-dspark", messages=MSG, max_tokens=4,
                                            temperature=0, logprobs=True, stream=True))
    streamed = [x.token for ch in chunks if ch.choices and ch.choices[0].logprobs
                for x in ch.choices[0].logprobs.content]
    assert streamed == [x.token for x in r.choices[0].logprobs.content]


def test_logprobs_under_speculation(default_server):
    """Tokens emitted by verify steps report the raw target log-probabilities of their own row: the
    speculative server agrees with the plain one. (The default model's random drafter is never accepted,
    so here every step emits the correction token of row 0; accepted drafts and the bonus row are
    covered by tests/unit/test_engine.c test_logprobs with the toy model.)"""
    from conftest import DEFAULT_MODEL, Server
    spec = Server(DEFAULT_MODEL, "--max-model-len", "512", "--max-num-seqs", "4", "--speculative-config",
                  '{"method":"dspark","num_speculative_tokens":5}', ready=True)
    try:
        a = chat(default_server.base, max_tokens=10, top_logprobs=3)["choices"][0]["logprobs"]["content"]
        b = chat(spec.base, max_tokens=10, top_logprobs=3)["choices"][0]["logprobs"]["content"]
        assert [x["token"] for x in b] == [x["token"] for x in a]
        for x, y in zip(a, b):
            assert abs(x["logprob"] - y["logprob"]) < 1e-3
            assert [t["token"] for t in x["top_logprobs"]] == [t["token"] for t in y["top_logprobs"]]
        events = sse(spec.base, "/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 10,
                                                         "logprobs": True, "stream": True})
        got = [x for e in events if e["choices"] and e["choices"][0]["logprobs"]
               for x in e["choices"][0]["logprobs"]["content"]]
        assert [x["token"] for x in got] == [x["token"] for x in b]
        with urllib.request.urlopen(spec.base + "/metrics", timeout=30) as r:
            drafts = [ln for ln in r.read().decode().splitlines()
                      if ln.startswith("vllm:spec_decode_num_drafts_total{")]
        assert drafts and float(drafts[0].split()[-1]) > 0  # verify steps happened
    finally:
        spec.stop()


def stream_chunks(events):
    """Per choice index: the (content, logprob tokens) of each chunk, in order."""
    out = {}
    for e in events:
        for ch in e["choices"]:
            lp = ch["logprobs"]
            out.setdefault(ch["index"], []).append(
                (ch["delta"].get("content"), [x["token"] for x in (lp["content"] if lp else [])]))
    return out


def test_n_streaming_logprobs_travel_with_their_text(default_server):
    """With n > 1, every choice's chunks carry the logprobs of the tokens whose text
    they carry, exactly as a single greedy stream does (no chunk's logprobs lag
    behind into the next chunk)."""
    b = default_server.base
    body = {"messages": MSG, "temperature": 0, "max_tokens": 6, "logprobs": True, "top_logprobs": 1,
            "stream": True}
    one = stream_chunks(sse(b, "/v1/chat/completions", body))[0]
    assert sum(len(t) for _, t in one) == 6
    many = stream_chunks(sse(b, "/v1/chat/completions", dict(body, n=3)))
    assert sorted(many) == [0, 1, 2]
    for i in range(3):
        assert many[i] == one, i
