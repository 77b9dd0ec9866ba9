"""/v1/completions details that follow vLLM (spec/SERVING.md §3.5, §3.6, §4.5):
skip_special_tokens, token-id prompts used as given, per-chunk usage
(stream_options.continuous_usage_stats) and prompt logprobs (echo + logprobs,
prompt_logprobs). Expected texts come from the `tokenizers` library decoding
the same ids, which is what vLLM's fast detokenizer does."""
import json
import os
import urllib.error
import urllib.request

import pytest
from tokenizers import Tokenizer

from conftest import DEFAULT_MODEL, post

TOK = Tokenizer.from_file(os.path.join(DEFAULT_MODEL, "tokenizer.json"))
PH = TOK.token_to_id("<｜place▁holder▁no▁380｜>")  # added token flagged "special": true
THINK_CLOSE = TOK.token_to_id("</think>")          # added token flagged "special": false
BOS = TOK.token_to_id("<｜begin▁of▁sentence｜>")


def stream(base, path, body):
    """The SSE events of a streamed request, parsed (checks the framing)."""
    req = urllib.request.Request(base + path, data=json.dumps(dict(body, stream=True)).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e and not e.startswith(":")]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def forced(token_id, **extra):
    """A completion whose every token is token_id (logit_bias +100 on it)."""
    return dict({"prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                 "logit_bias": {str(token_id): 100}}, **extra)


@pytest.mark.parametrize("skip", [None, True, False])
def test_skip_special_tokens_completions(default_server, skip):
    extra = {} if skip is None else {"skip_special_tokens": skip}
    want = TOK.decode([PH] * 3, skip_special_tokens=skip is not False)
    st, body = post(default_server.base, "/v1/completions", forced(PH, **extra))
    assert st == 200, body
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["text"] == want
    chunks = stream(default_server.base, "/v1/completions", forced(PH, **extra))
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want


def test_non_special_added_tokens_kept(default_server):
    # </think> is an added token but not flagged special: vLLM keeps its text (§3.6)
    st, body = post(default_server.base, "/v1/completions", forced(THINK_CLOSE))
    assert st == 200, body
    assert body["choices"][0]["text"] == TOK.decode([THINK_CLOSE] * 3, skip_special_tokens=True) == "</think>" * 3


def test_chat_never_shows_special_tokens(default_server):
    # §4.5: chat output carries no special-token text whatever skip_special_tokens says
    for skip in (True, False):
        st, body = post(default_server.base, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
                         "ignore_eos": True, "logit_bias": {str(PH): 100}, "skip_special_tokens": skip})
        assert st == 200, body
        assert "place" not in (body["choices"][0]["message"]["content"] or "")


def test_special_token_flags_validated(default_server):
    for field in ("skip_special_tokens", "spaces_between_special_tokens"):
        st, body = post(default_server.base, "/v1/completions", {"prompt": "x", "max_tokens": 1, field: "no"})
        assert st == 400 and body["error"]["param"] == field


def test_token_id_prompt_used_as_given(default_server):
    # vLLM passes prompt_token_ids to the engine unchanged: no BOS is added (§3.6 note)
    ids = TOK.encode("Hello world", add_special_tokens=False).ids
    st, body = post(default_server.base, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
    assert st == 200, body
    assert body["usage"]["prompt_tokens"] == len(ids)
    st, body = post(default_server.base, "/v1/completions", {"prompt": [BOS] + ids, "max_tokens": 1})
    assert body["usage"]["prompt_tokens"] == len(ids) + 1
    # text prompts still get BOS (and only one)
    st, body = post(default_server.base, "/v1/completions", {"prompt": "Hello world", "max_tokens": 1})
    assert body["usage"]["prompt_tokens"] == len(ids) + 1


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Count: one, two,", "max_tokens": 4, "n": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 4}),
])
def test_continuous_usage_stats(default_server, path, body):
    body = dict(body, temperature=0, ignore_eos=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = stream(default_server.base, path, body)
    assert all("usage" in c for c in chunks)
    prompt = chunks[0]["usage"]["prompt_tokens"]
    for c in chunks:
        u = c["usage"]
        assert u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"]
    # vLLM counts per choice in the choice chunks, up to its 4 tokens: from 0 in chat (the role chunk), from
    # the first token in completions (no empty first chunk there)
    for i in range(body.get("n", 1)):
        comp = [c["usage"]["completion_tokens"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert comp == sorted(comp) and comp[-1] == 4
        assert comp[0] == (0 if "chat" in path else 1)
    # the final usage chunk sums the choices
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4 * body.get("n", 1)
    # without include_usage nothing is added (vLLM requires both)
    body["stream_options"] = {"continuous_usage_stats": True}
    assert all("usage" not in c for c in stream(default_server.base, path, body))


LONG = "The quick brown fox jumps over the lazy dog. " * 12  # > 64 tokens: several prefill chunks


@pytest.mark.parametrize("text", ["Hello world, how are", LONG])
def test_echo_logprobs_match_generation_logprobs(default_server, text):
    """echo + logprobs (vLLM): the prompt tokens' logprobs come first, the first one null.
    The prompt logprob of a token equals the logprob the same token got when it was
    generated from the same context (same logits row), here for the greedy token g."""
    base = default_server.base
    g = TOK.encode(" you", add_special_tokens=False).ids[0]
    # logit_bias forces g; logprobs are of the raw logits (before the bias, §7.2)
    st, gen = post(base, "/v1/completions", {"prompt": text, "max_tokens": 1, "temperature": 0, "logprobs": 2,
                                             "logit_bias": {str(g): 100}})
    assert st == 200, gen
    assert gen["choices"][0]["logprobs"]["tokens"][0] == TOK.decode([g])
    g_lp = gen["choices"][0]["logprobs"]["token_logprobs"][0]
    ids = [BOS] + TOK.encode(text, add_special_tokens=False).ids
    st, body = post(base, "/v1/completions", {"prompt": ids + [g], "max_tokens": 2, "temperature": 0,
                                              "echo": True, "logprobs": 2})
    assert st == 200, body
    c = body["choices"][0]
    lp = c["logprobs"]
    n = len(ids) + 1
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + 2
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][:n] == [TOK.decode([i], skip_special_tokens=False) for i in ids + [g]]
    assert lp["token_logprobs"][n - 1] == pytest.approx(g_lp, abs=1e-4)
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(t) >= 1 for t in lp["top_logprobs"][1:])  # up to 2 alternatives + the token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert c["text"].startswith(TOK.decode(ids + [g], skip_special_tokens=True))
    # text_offset indexes the returned text: the skipped BOS adds no characters, and
    # every other token's string starts at its offset
    for t, off in zip(lp["tokens"], lp["text_offset"]):
        if t != TOK.decode([BOS], skip_special_tokens=False) and "\ufffd" not in t:
            assert c["text"][off:off + len(t)] == t, (t, off)
    assert body["usage"]["completion_tokens"] == 2
    # streaming: the first chunk carries the prompt part
    chunks = stream(base, "/v1/completions", {"prompt": ids + [g], "max_tokens": 2, "temperature": 0, "echo": True,
                                              "logprobs": 2})
    first = chunks[0]["choices"][0]["logprobs"]
    assert first["tokens"] == lp["tokens"][:n] and first["token_logprobs"] == lp["token_logprobs"][:n]
    streamed = [t for ch in chunks[1:] for x in ch["choices"] if x.get("logprobs") for t in x["logprobs"]["tokens"]]
    assert streamed == lp["tokens"][n:]


def test_prompt_logprobs_vllm_form(default_server):
    ids = [BOS] + TOK.encode(LONG, add_special_tokens=False).ids
    st, body = post(default_server.base, "/v1/completions",
                    {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 3, "n": 2})
    assert st == 200, body
    st, ref = post(default_server.base, "/v1/completions",
                   {"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 3})
    for c in body["choices"]:
        pl = c["prompt_logprobs"]
        assert len(pl) == len(ids) and pl[0] is None
        for i in range(1, len(ids)):
            d = pl[i]
            assert str(ids[i]) in d and 3 <= len(d) <= 4
            mine = d[str(ids[i])]
            assert mine["logprob"] == pytest.approx(ref["choices"][0]["logprobs"]["token_logprobs"][i], abs=1e-5)
            ranks = sorted(v["rank"] for k, v in d.items() if k != str(ids[i]) or v["rank"] <= 3)
            assert ranks[:3] == [1, 2, 3]
            best = max(d.values(), key=lambda v: v["logprob"])
            assert best["rank"] == 1 and mine["rank"] >= 1
            assert (mine["rank"] == 1) == (mine["logprob"] >= best["logprob"])
    assert body["choices"][0]["prompt_logprobs"] == body["choices"][1]["prompt_logprobs"]


def test_prompt_logprobs_refusals(default_server):
    st, body = post(default_server.base, "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1})
    assert st == 400 and body["error"]["param"] == "prompt_logprobs"
    st, body = post(default_server.base, "/v1/completions", {"prompt": "x", "prompt_logprobs": 21})
    assert st == 400 and body["error"]["param"] == "prompt_logprobs"


def test_prompt_logprobs_length_cap(server_factory):
    """Prompt log-probabilities list every prompt token: refused (400, clear message) beyond
    32768 prompt tokens; a server whose context allows it is needed to get past the context check."""
    s = server_factory(DEFAULT_MODEL, "--max-model-len", "33000", "--max-num-seqs", "1", ready=True)
    ids = [BOS] + [100] * 32768
    for extra, param in (({"echo": True, "logprobs": 1}, "echo"), ({"prompt_logprobs": 0}, "prompt_logprobs")):
        st, body = post(s.base, "/v1/completions", dict({"prompt": ids, "max_tokens": 1}, **extra))
        assert st == 400 and body["error"]["param"] == param
        assert "limited to prompts of 32768 tokens" in body["error"]["message"] and "32769" in body["error"]["message"]


def test_completion_stream_opens_with_the_first_token(default_server):
    """No empty first chunk (vLLM sends none): the first chunk carries the first token's text, so a client
    that times chunks (vLLM's `bench serve` counts any chunk with choices as the first token) measures the
    prefill as TTFT, not as the first inter-token gap. An echoed prompt still opens the stream."""
    body = {"prompt": "Count: one, two,", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    chunks = stream(default_server.base, "/v1/completions", body)
    assert chunks[0]["choices"][0]["text"] != ""
    assert all(c["choices"][0]["text"] != "" or c["choices"][0]["finish_reason"] for c in chunks if c["choices"])
    chunks = stream(default_server.base, "/v1/completions", dict(body, echo=True))
    assert chunks[0]["choices"][0]["text"] == "Count: one, two,"
