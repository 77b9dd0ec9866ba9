"""lm-evaluation-harness against `dsv4 serve` (issue 6, "tested with real
clients"): the `local-chat-completions` model type, which sends the task's
`until` strings (plus the EOS text) as `stop` on every request, runs a tiny
local generate_until task (tests/fixtures/lmeval/) against the embedded
default model.

The default model has random weights, so accuracy is meaningless and never
asserted. What is asserted: every request completes (exactly one server
request per document, so no retries hid a failure), lm-eval parses every
response (one string per document, equal to the server's content), and the
stop strings were honoured: no response contains one, and each response is
the same request's output *without* stops cut at the earliest stop match
(greedy decoding makes that run the reference).
"""
import contextvars
import json
import os
import urllib.request

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "lmeval")
TASK = "dsv4_tiny_qa"
MODEL = "deepseek-v4-flash-dspark"
EOS = "<｜end▁of▁sentence｜>"


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def finished_requests(base):
    """Sum of vllm:request_success_total over finish reasons."""
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("vllm:request_success_total{"))


def cut_at_stops(text, stops):
    """`text` up to the earliest occurrence of any stop string, and whether one matched."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


_REFS = {}


def reference(base, payload):
    """Content of `payload` sent without its stops (cached: both tests send the same prompts)."""
    body = {k: v for k, v in payload.items() if k != "stop"}
    key = json.dumps(body, sort_keys=True)
    if key not in _REFS:
        r = post(base, "/v1/chat/completions", body)
        assert r["choices"][0]["finish_reason"] == "length", r  # 8 tokens, no EOS: the full run
        _REFS[key] = r["choices"][0]["message"]["content"] or ""
    return _REFS[key]


@pytest.fixture(scope="module")
def lmeval_server():
    # conftest's Server, started here (not via server_factory) so that the
    # module-scoped fixture can share it between the tests of this file
    from conftest import DEFAULT_MODEL, Server
    # OMP_WAIT_POLICY=passive: OpenMP threads sleep at barriers instead of
    # spinning, which on a shared 2-core machine costs several times the CPU
    # time of a decode step and changes no result.
    s = Server(DEFAULT_MODEL, "--max-model-len", "256", "--max-num-seqs", "4", ready=True,
               env={"OMP_WAIT_POLICY": "passive"})
    yield s
    s.stop()


@pytest.mark.parametrize("num_concurrent", [1, 3], ids=["sequential", "concurrent"])
def test_lmeval_generate_until_with_stops(lmeval_server, num_concurrent, monkeypatch, tmp_path):
    # No network: datasets' built-in "json" builder reads the local file; the
    # caches go to the test's temporary directory.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.chdir(FIXTURES)  # the YAML names its data file relative to here
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalChatCompletion
    from lm_eval.tasks import TaskManager

    # Record each request lm-eval sends with the response it parses, through
    # its own hooks. Both run in the same context: one after the other on the
    # sequential (requests) path, inside one asyncio task per request on the
    # concurrent (aiohttp) path, where responses arrive out of order; a
    # ContextVar pairs them on both.
    pairs, current = [], contextvars.ContextVar("payload")
    orig_payload, orig_parse = LocalChatCompletion._create_payload, LocalChatCompletion.parse_generations

    def create_payload(self, *a, **kw):
        p = orig_payload(self, *a, **kw)
        current.set(json.loads(json.dumps(p)))
        return p

    def parse_generations(self, outputs, **kw):
        pairs.append((current.get(), outputs))
        return orig_parse(self, outputs, **kw)

    monkeypatch.setattr(LocalChatCompletion, "_create_payload", create_payload)
    monkeypatch.setattr(LocalChatCompletion, "parse_generations", parse_generations)

    with open(os.path.join(FIXTURES, "tiny_qa.jsonl")) as f:
        n_docs = sum(1 for ln in f if ln.strip())
    base = lmeval_server.base
    before = finished_requests(base)
    out = simple_evaluate(
        model="local-chat-completions",
        model_args={"model": MODEL, "base_url": base + "/v1/chat/completions", "tokenizer_backend": None,
                    "num_concurrent": num_concurrent, "max_retries": 1, "timeout": 300, "eos_string": EOS},
        tasks=[TASK], task_manager=TaskManager(include_path=FIXTURES, include_defaults=False),
        apply_chat_template=True, log_samples=True, bootstrap_iters=0)
    # every request reached the server and finished, once (max_retries=1: no retry hid an error)
    assert finished_requests(base) - before == n_docs
    assert len(pairs) == n_docs

    samples = out["samples"][TASK]
    assert len(samples) == n_docs
    assert "exact_match,none" in out["results"][TASK]  # lm-eval scored it (the value is meaningless)
    until = ["e", "\n\n", "."]  # the task's generation_kwargs
    n_cut = 0
    for p, r in pairs:
        # what lm-eval sent: the chat messages, greedy, the task's stops (+ the
        # EOS text on the sequential path, which passes it)
        assert p["model"] == MODEL and p["temperature"] == 0 and p["max_tokens"] == 8
        assert p["stop"][:3] == until and set(p["stop"][3:]) <= {EOS}, p["stop"]
        assert p["messages"][-1]["role"] == "user"
        # what came back: a well-formed completion whose content honours the stops
        ch = r["choices"][0]
        assert r["object"] == "chat.completion" and ch["finish_reason"] in ("stop", "length"), r
        # chat mode: a string, or null when nothing precedes the first stop
        # (SERVING.md §3.6: content is null when there is none; lm-eval then
        # files its placeholder answer, with a warning)
        content = ch["message"]["content"]
        assert content is None or isinstance(content, str), r
        content = content or ""
        for stop in p["stop"]:
            assert stop not in content, (stop, r)
        # reference: the same request without stops (greedy), cut at the earliest match
        full = reference(base, p)
        want, matched = cut_at_stops(full, p["stop"])
        assert content == want, (p["messages"], full, r)
        assert (ch["finish_reason"] == "stop") == matched, (full, r)
        assert ch["stop_reason"] == (min((full.find(x), x) for x in p["stop"] if x in full)[1] if matched else None)
        n_cut += matched
    # lm-eval's parsed responses are exactly the server's contents
    from lm_eval.models.api_models import LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER as NONE
    assert sorted(s["resps"][0][0] for s in samples) == \
        sorted(r["choices"][0]["message"]["content"] or NONE for _, r in pairs)
    # the stops did fire on this model (else the test would not exercise them)
    assert n_cut >= 1
