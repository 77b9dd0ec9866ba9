"""Generation over HTTP on the embedded default model (spec/SERVING.md §3-§6):
response shapes, streaming == non-streaming, stops, usage, errors, the openai
SDK, concurrency. The default model has random weights, so tests compare the
server with itself (greedy runs, token counts from /tokenize), never with
made-up text."""
import concurrent.futures as cf
import json
import urllib.error
import urllib.request

import openai
import pytest
from conftest import post


def sse(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for raw in r.read().decode().split("\n\n"):
            if raw.startswith("data: "):
                events.append(raw[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


MSG = [{"role": "user", "content": "Write a haiku about the sea."}]


def chat(base, **kw):
    body = {"messages": MSG, "temperature": 0, "max_tokens": 12}
    body.update(kw)
    return post(base, "/v1/chat/completions", body)


def test_chat_shape_and_usage(default_server):
    b = default_server.base
    status, r = chat(b)
    assert status == 200, r
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    ch = r["choices"][0]
    assert ch["finish_reason"] == "length" and ch["message"]["role"] == "assistant"
    assert ch["message"]["tool_calls"] == [] and ch["message"]["reasoning"] is None
    assert isinstance(ch["message"]["content"], str) and ch["message"]["content"]
    status, tk = post(b, "/tokenize", {"messages": MSG})
    assert status == 200
    u = r["usage"]
    assert u["prompt_tokens"] == tk["count"] and u["completion_tokens"] == 12
    assert u["total_tokens"] == u["prompt_tokens"] + 12


def test_greedy_is_deterministic_and_stream_matches(default_server):
    b = default_server.base
    _, a = chat(b)
    _, a2 = chat(b)
    assert a["choices"][0]["message"]["content"] == a2["choices"][0]["message"]["content"]
    events = sse(b, "/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 12, "stream": True,
                                             "stream_options": {"include_usage": True}})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == a["choices"][0]["message"]["content"]
    final = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12
    assert len({e["id"] for e in events}) == 1


def test_stop_string_cuts_and_is_not_emitted(default_server):
    b = default_server.base
    _, full = chat(b, max_tokens=20)
    text = full["choices"][0]["message"]["content"]
    stop = text[len(text) // 2: len(text) // 2 + 3].strip() or text[-2:]
    cut = text[:text.index(stop)]
    _, r = chat(b, max_tokens=20, stop=[stop])
    ch = r["choices"][0]
    assert (ch["message"]["content"] or "") == cut
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == stop
    assert r["usage"]["completion_tokens"] <= 20
    events = sse(b, "/v1/chat/completions", {"messages": MSG, "temperature": 0, "max_tokens": 20, "stop": stop,
                                             "stream": True})
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == cut


def test_thinking_mode_goes_to_reasoning(default_server):
    _, r = chat(default_server.base, chat_template_kwargs={"thinking": True}, reasoning_effort="high")
    m = r["choices"][0]["message"]
    # random weights never close </think> in 12 tokens: everything is reasoning
    assert m["reasoning"] and m["content"] is None
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 12


def test_completions_and_echo(default_server):
    b = default_server.base
    status, r = post(b, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 5,
                                            "temperature": 0})
    assert status == 200 and r["object"] == "text_completion"
    assert r["usage"]["completion_tokens"] == 5
    _, e = post(b, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0,
                                       "echo": True})
    assert e["choices"][0]["text"] == "The capital of France is" + r["choices"][0]["text"]
    _, tk = post(b, "/tokenize", {"prompt": "The capital of France is"})
    _, ids = post(b, "/v1/completions", {"prompt": tk["tokens"], "max_tokens": 5, "temperature": 0})
    assert ids["choices"][0]["text"] == r["choices"][0]["text"]
    _, dt = post(b, "/detokenize", {"tokens": tk["tokens"][1:]})
    assert dt["prompt"] == "The capital of France is"


def test_bad_requests(default_server):
    b = default_server.base
    cases = [({"temperature": 5}, "temperature"), ({"n": 9}, "n"), ({"stop": [""]}, "stop"),
             ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "(0, 1]"), ({"top_p": "0.5"}, "(0, 1]"),
             ({"repetition_penalty": 0}, "(0, 2]"), ({"repetition_penalty": 2.5}, "(0, 2]"),
             ({"top_logprobs": 3}, "top_logprobs"),
             ({"reasoning_effort": "ludicrous"}, "reasoning_effort"),
             ({"messages": []}, "messages"), ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0]")]
    for extra, field in cases:
        status, r = chat(b, **extra)
        assert status == 400, (extra, r)
        assert field in (r["error"]["param"] or "") + r["error"]["message"], (extra, r)


def test_tool_choice_and_response_format_values(default_server):
    """Values these fields cannot take are refused (400 naming the field), not
    served as if absent; the accepted ones still answer."""
    b = default_server.base
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for extra, field in [({"tool_choice": "sometimes", "tools": tools}, "tool_choice"),
                         ({"tool_choice": 3}, "tool_choice"),
                         ({"response_format": {"type": "xml"}}, "response_format"),
                         ({"response_format": {}}, "response_format")]:
        status, r = chat(b, max_tokens=1, **extra)
        assert status == 400 and r["error"]["param"] == field, (extra, r)
    status, r = chat(b, max_tokens=1, tools=tools, tool_choice={"type": "function", "function": {"name": "g"}})
    assert status == 400 and r["error"]["param"] == "tool_choice" and '"g"' in r["error"]["message"], r
    # required / named are enforced by constrained decoding (test_server_constrained.py)
    for extra in ({"tool_choice": "auto", "tools": tools}, {"tool_choice": "none", "tools": tools},
                  {"tool_choice": "required", "tools": tools},
                  {"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": tools},
                  {"tool_choice": None}, {"response_format": {"type": "text"}}):
        status, r = chat(b, max_tokens=1, **extra)
        assert status == 200, (extra, r)


def test_context_overflow_message(default_server):
    status, r = post(default_server.base, "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "word " * 600}], "max_tokens": 4})
    assert status == 400
    assert "maximum context length is 512 tokens" in r["error"]["message"]
    assert r["error"]["param"] == "messages"


def test_openai_sdk(default_server):
    c = openai.OpenAI(base_url=default_server.base + "/v1", api_key="none", max_retries=0)
    r = c.chat.completions.create(model="deepseek-v4-flash-dspark", messages=MSG, max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model="deepseek-v4-flash-dspark", messages=MSG, max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 6
    t = c.completions.create(model="deepseek-v4-flash-dspark", prompt="Once upon", max_tokens=4, temperature=0)
    assert t.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="deepseek-v4-flash-dspark", messages=MSG, temperature=9)


def test_concurrent_requests_equal_sequential(default_server):
    b = default_server.base
    prompts = [[{"role": "user", "content": f"Tell me fact number {i}."}] for i in range(6)]
    body = lambda m: {"messages": m, "temperature": 0, "max_tokens": 8}  # noqa: E731
    seq = [post(b, "/v1/chat/completions", body(m))[1]["choices"][0]["message"]["content"] for m in prompts]
    with cf.ThreadPoolExecutor(6) as ex:
        par = list(ex.map(lambda m: post(b, "/v1/chat/completions", body(m))[1]["choices"][0]["message"]["content"],
                          prompts))
    assert par == seq


def test_metrics_count_requests(default_server):
    b = default_server.base
    chat(b, max_tokens=3)
    with urllib.request.urlopen(b + "/metrics", timeout=30) as r:
        text = r.read().decode()
    gen = [ln for ln in text.splitlines() if ln.startswith("vllm:generation_tokens_total{")]
    assert gen and float(gen[0].split()[-1]) >= 3
    assert 'vllm:request_success_total{model_name="deepseek-v4-flash-dspark",engine="0",finished_reason="length"}' \
        in text
    assert "vllm:spec_decode_num_drafts_total" in text
