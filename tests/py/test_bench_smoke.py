"""Smoke runs of every `dsv4 bench` mode against a fake OpenAI-compatible server.

The fake server (below) runs on 127.0.0.1 at a random port and serves
/v1/models, /v1/chat/completions (streaming and not, with usage) and /metrics
with the spec-decode counters of spec/SERVING.md §3.9. It sends FOUR tokens
per SSE chunk, like a speculative engine emitting several tokens per step,
so a benchmark that counted chunks would report a quarter of the real
token count; the checks below require the usage count. Every run is a
second or two: tiny budgets, a small per-token delay.

test_bench_own_server.py runs the same modes against `dsv4 serve`.
"""
import csv
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from dsv4bench import cli  # noqa: E402

TOKENS = 24          # completion tokens per answer (unless max_tokens is smaller)
PER_CHUNK = 4        # tokens per SSE chunk = accepted run + bonus of one step
K = 5                # draft length per step
DELAY = 0.0004       # seconds per token
MAX_MODEL_LEN = 20000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Fake:
    def __init__(self, api_key=None, cold=0, bad=False, hang=None):
        self.lock = threading.Lock()
        self.api_key = api_key
        self.cold = cold          # the first `cold` chat requests take 0.3 s longer
        self.bad = bad            # answer some soak prompts with loops / leaks
        self.hang = hang          # requests whose last message contains this take 5 s
        self.requests = 0
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "gen": 0, "prompt": 0,
                  "pos": [0] * K}

    def metrics(self):
        c = self.c
        lab = 'model_name="fake-model",engine="0"'
        lines = [f"vllm:num_requests_running{{{lab}}} 0",
                 f"vllm:prompt_tokens_total{{{lab}}} {c['prompt']}",
                 f"vllm:generation_tokens_total{{{lab}}} {c['gen']}",
                 f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['drafts']}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['draft_tokens']}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted']}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
                  for i, v in enumerate(c["pos"])]
        return "# TYPE vllm:spec_decode_num_drafts_total counter\n" + "\n".join(lines) + "\n"

    def answer(self, body):
        """(content, reasoning, tool_calls, finish_reason, n_tokens, prompt_tokens)."""
        text = json.dumps(body["messages"])
        prompt_tokens = len(text) // 4 + 5
        n = min(TOKENS, int(body.get("max_tokens") or TOKENS))
        user = body["messages"][-1].get("content") or ""
        words = [f"w{i}x{len(user) % 97}" for i in range(n)]
        content, reasoning, tools, finish = " ".join(words), None, [], "stop" if n == TOKENS else "length"
        if body.get("response_format", {}).get("type") == "json_object":
            content = json.dumps({"items": words})
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            tools = [{"id": "call_" + "0" * 24, "type": "function",
                      "function": {"name": name, "arguments": json.dumps({"command": "ls 2>&1"})}}]
            content, finish = None, "tool_calls"
        if (body.get("chat_template_kwargs") or {}).get("thinking"):
            reasoning = "thinking " + " ".join(words[: n // 2])
        if self.bad and "umbrella" in user:
            content = "again and again " * 60
        if self.bad and "sky is blue" in user:
            content = "Sure<｜end▁of▁sentence｜>"
        return content, reasoning, tools, finish, n, prompt_tokens

    def count(self, n, prompt_tokens):
        with self.lock:
            self.requests += 1
            slow = self.requests <= self.cold
            c = self.c
            c["prompt"] += prompt_tokens
            c["gen"] += n
            for s in range(0, n, PER_CHUNK):
                acc = min(PER_CHUNK, n - s) - 1   # the step's bonus token is not a draft
                c["drafts"] += 1
                c["draft_tokens"] += K
                c["accepted"] += acc
                for i in range(acc):
                    c["pos"][i] += 1
        return slow


def make_handler(fake):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send_json(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorised(self):
            if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                self.send_json(401, {"error": {"message": "bad key", "type": "AuthenticationError"}})
                return False
            return True

        def do_GET(self):
            if not self.authorised():
                return
            if self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": "fake-model", "object": "model", "max_model_len": MAX_MODEL_LEN}]})
            elif self.path == "/metrics":
                data = fake.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.send_json(404, {"error": {"message": "no route"}})

        def do_POST(self):
            if not self.authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions" or body.get("model") != "fake-model":
                return self.send_json(404, {"error": {"message": "unknown model or route"}})
            content, reasoning, tools, finish, n, pt = fake.answer(body)
            if pt + 1 > MAX_MODEL_LEN:
                return self.send_json(400, {"error": {"message": "maximum context length is "
                                                      f"{MAX_MODEL_LEN} tokens", "code": 400}})
            slow = fake.count(n, pt)
            if fake.hang and fake.hang in (body["messages"][-1].get("content") or ""):
                time.sleep(5)
            delay = DELAY
            if slow:
                time.sleep(0.3)
            usage = {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}
            if not body.get("stream"):
                time.sleep(delay * n)
                return self.send_json(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "model": "fake-model",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                         "reasoning": reasoning, "tool_calls": tools},
                                 "finish_reason": finish}], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def ev(obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            def chunk(delta, fr=None):
                ev({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": fr}]})

            chunk({"role": "assistant", "content": ""})
            self.wfile.write(b": keep-alive\n\n")
            if reasoning:
                chunk({"reasoning": reasoning})
            if tools:
                t = tools[0]
                time.sleep(delay * n)
                chunk({"tool_calls": [{"index": 0, "id": t["id"], "type": "function",
                                       "function": {"name": t["function"]["name"], "arguments": ""}}]})
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": t["function"]["arguments"]}}]})
            elif content is not None:
                # PER_CHUNK tokens' worth of text per event; the content is split
                # into n/PER_CHUNK pieces whatever its shape.
                steps = max(1, (n + PER_CHUNK - 1) // PER_CHUNK)
                size = (len(content) + steps - 1) // steps
                for s in range(steps):
                    time.sleep(delay * PER_CHUNK)
                    piece = content[s * size:(s + 1) * size]
                    if piece:
                        chunk({"content": piece})
            chunk({}, finish)
            ev({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model",
                "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return H


@pytest.fixture
def fake_server():
    servers = []

    def start(**kw):
        fake = Fake(**kw)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(fake))
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        fake.base = f"http://127.0.0.1:{httpd.server_address[1]}"
        return fake

    yield start
    for h in servers:
        h.shutdown()
        h.server_close()


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, f"{path} has no rows"
    return rows


def check_outputs(out, mode, capsys=None):
    for name in (f"{mode}.csv", f"{mode}.png", "meta.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    with open(os.path.join(out, f"{mode}.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["model"] == "fake-model" and meta["mode"] == mode
    return read_csv(os.path.join(out, f"{mode}.csv"))


def bench(fake, tmp_path, mode, *extra):
    out = str(tmp_path / mode)
    rc = cli.main([mode, "--base-url", fake.base, "--out", out, "--warmup", "2", *extra])
    return rc, out


def test_decode_counts_usage_tokens_not_chunks(fake_server, tmp_path, capsys):
    fake = fake_server()
    rc, out = bench(fake, tmp_path, "decode", "--repeats", "2")
    assert rc == 0
    summary = check_outputs(out, "decode")
    assert [r["prompt"] for r in summary] == ["count", "multiplication", "json", "bst", "sql", "narrative"]
    runs = read_csv(os.path.join(out, "decode_runs.csv"))
    assert len(runs) == 12
    for r in runs:
        assert int(r["completion_tokens"]) == TOKENS      # usage, not words or chunks
        tok_s, wall = float(r["tok_s"]), float(r["wall_s"])
        assert tok_s == pytest.approx(TOKENS / wall, rel=1e-3)
    for s in summary:
        assert float(s["best_tok_s"]) >= float(s["median_tok_s"])
        assert int(s["tokens"]) == TOKENS and float(s["seconds"]) > 0
    text = capsys.readouterr().out
    assert "warmup: 2 requests" in text and "tok/s" in text and "seconds" in text


def test_concurrency_static_and_staggered(fake_server, tmp_path):
    fake = fake_server()
    rc, out = bench(fake, tmp_path, "concurrency", "--levels", "1", "2", "4", "--stagger-s", "0.01",
                    "--max-tokens", "64")
    assert rc == 0
    rows = check_outputs(out, "concurrency")
    assert [(r["pattern"], int(r["concurrency"])) for r in rows] == [
        ("static", 1), ("static", 2), ("static", 4), ("staggered", 1), ("staggered", 2), ("staggered", 4)]
    for r in rows:
        assert int(r["errors"]) == 0
        assert int(r["total_tokens"]) == TOKENS * int(r["concurrency"])
        assert float(r["agg_tok_s"]) == pytest.approx(int(r["total_tokens"]) / float(r["span_s"]), rel=1e-3)
        for col in ("ttft_p50_s", "ttft_p99_s", "itl_chunk_p50_ms", "tpot_p50_ms"):
            assert float(r[col]) >= 0
    streams = read_csv(os.path.join(out, "concurrency_streams.csv"))
    assert len(streams) == 14
    for s in streams:
        # Chunks carried PER_CHUNK tokens each: the token count is usage's, 4x the chunks.
        assert int(s["completion_tokens"]) == TOKENS
        assert int(s["chunks"]) == TOKENS // PER_CHUNK
    staggered = [float(s["start_s"]) for s in streams if s["pattern"] == "staggered" and s["concurrency"] == "4"]
    assert max(staggered) >= 0.03 - 0.005


def test_prefill_caps_at_max_model_len(fake_server, tmp_path):
    fake = fake_server()
    rc, out = bench(fake, tmp_path, "prefill", "--sizes", "2000", "8000", "100000")
    assert rc == 0
    rows = check_outputs(out, "prefill")
    assert [int(r["target_tokens"]) for r in rows] == [2000, 8000, 100000]
    for r in rows[:2]:
        assert int(r["prompt_tokens"]) == pytest.approx(int(r["target_tokens"]), rel=0.05)
        assert r["capped"] == ""
    assert rows[2]["capped"] == f"at max_model_len {MAX_MODEL_LEN}"
    assert MAX_MODEL_LEN * 0.9 < int(rows[2]["prompt_tokens"]) < MAX_MODEL_LEN
    for r in rows:
        assert float(r["prefill_tok_s"]) == pytest.approx(int(r["prompt_tokens"]) / float(r["ttft_s"]), rel=1e-3)


def test_spec_metrics_deltas(fake_server, tmp_path):
    fake = fake_server()
    rc, out = bench(fake, tmp_path, "spec", "--repeats", "1", "--only", "count", "sql")
    assert rc == 0
    rows = check_outputs(out, "spec")
    assert [r["prompt"] for r in rows] == ["count", "sql", "ALL"]
    steps = TOKENS // PER_CHUNK
    for r in rows:
        n = 2 if r["prompt"] == "ALL" else 1
        # Derived from the fake's definition: each step drafts K, accepts PER_CHUNK-1.
        assert float(r["drafts"]) == steps * n
        assert float(r["acceptance_rate"]) == pytest.approx((PER_CHUNK - 1) / K)
        assert float(r["mean_accept_len"]) == pytest.approx(PER_CHUNK)
        assert [float(x) for x in r["per_pos"].split()] == [1.0] * (PER_CHUNK - 1) + [0.0] * (K - PER_CHUNK + 1)
        assert float(r["steps_s"]) > 0
        assert float(r["usage_tok_per_draft"]) == pytest.approx(PER_CHUNK)


def test_soak_clean_run_reports_zero_of_each(fake_server, tmp_path, capsys):
    fake = fake_server()
    t0 = time.time()
    rc, out = bench(fake, tmp_path, "soak", "--workers", "3", "--duration-s", "1", "--max-requests", "5000",
                    "--window-s", "0.25", "--long-context-tokens", "1500")
    assert time.time() - t0 < 10  # bounded by --duration-s (plus warm-up and in-flight requests)
    text = capsys.readouterr().out
    assert rc == 0, text
    windows = check_outputs(out, "soak")
    assert len(windows) >= 4
    reqs = read_csv(os.path.join(out, "soak_requests.csv"))
    assert len(reqs) >= 12
    assert {r["stream"] for r in reqs} == {"0", "1"}
    assert all(r["labels"] == "" for r in reqs)
    assert {r["kind"] for r in reqs} >= {"tool_call", "prose", "reasoning"}
    classes = read_csv(os.path.join(out, "soak_classes.csv"))
    assert [(c["class"], c["responses"]) for c in classes] == [
        ("error", "0"), ("empty", "0"), ("loop", "0"), ("cjk_drift", "0"), ("leak", "0"),
        ("bad_json", "0"), ("bad_tool_args", "0")]
    assert "CLEAN" in text
    assert sum(float(w["tok_s"]) * (float(w["end_s"]) - float(w["start_s"])) for w in windows[:-1]) > 0


def test_soak_counts_unhealthy_responses(fake_server, tmp_path):
    fake = fake_server(bad=True)
    rc, out = bench(fake, tmp_path, "soak", "--workers", "2", "--duration-s", "30", "--max-requests", "40",
                    "--window-s", "1", "--long-context-tokens", "500", "--seed", "3")
    assert rc == 1
    reqs = read_csv(os.path.join(out, "soak_requests.csv"))
    assert len(reqs) == 40
    for r in reqs:
        if r["entry"] == "prose_explain":
            assert r["labels"] == "leak:content"
        elif r["entry"] == "tool_weather":
            assert r["labels"] == "loop:content"  # a tool call beside looping visible text
        else:
            assert r["labels"] == ""
    classes = {c["class"].strip(): int(c["responses"]) for c in read_csv(os.path.join(out, "soak_classes.csv"))}
    assert classes["leak"] == sum(1 for r in reqs if r["entry"] == "prose_explain") > 0
    assert classes["loop"] == sum(1 for r in reqs if r["entry"] == "tool_weather") > 0
    assert classes["error"] == classes["empty"] == classes["cjk_drift"] == 0


def test_soak_is_bounded_in_time(fake_server, tmp_path, capsys):
    fake = fake_server(hang="Kyoto")
    t0 = time.time()
    rc, out = bench(fake, tmp_path, "soak", "--workers", "4", "--duration-s", "0.5", "--grace-s", "0.5",
                    "--window-s", "0.25", "--long-context-tokens", "300", "--seed", "1")
    assert time.time() - t0 < 4.5  # the 5 s requests were not waited for
    assert rc == 1
    assert "after the deadline; counted as errors" in capsys.readouterr().out
    classes = {c["class"].strip(): int(c["responses"]) for c in read_csv(os.path.join(out, "soak_classes.csv"))}
    assert classes["error"] == classes["error:abandoned"] >= 1
    reqs = read_csv(os.path.join(out, "soak_requests.csv"))
    assert all(r["entry"] != "json_plan" for r in reqs)


def test_cold_server_is_reported(fake_server, tmp_path, capsys):
    fake = fake_server(cold=1)
    rc, out = bench(fake, tmp_path, "decode", "--repeats", "1", "--only", "count")
    assert rc == 0
    assert "COLD SERVER" in capsys.readouterr().out
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert meta["warmup"]["cold"] is True and meta["warmup"]["ratio"] > 2


def test_api_key_and_unreachable_server(fake_server, tmp_path, capsys):
    fake = fake_server(api_key="sk-test")
    assert cli.main(["decode", "--base-url", fake.base, "--out", str(tmp_path / "a")]) == 2
    assert "401" in capsys.readouterr().err
    rc = cli.main(["decode", "--base-url", fake.base + "/v1", "--api-key", "sk-test", "--out",
                   str(tmp_path / "b"), "--warmup", "0", "--repeats", "1", "--only", "narrative"])
    assert rc == 0
    assert "skipped" in capsys.readouterr().out
    assert cli.main(["decode", "--base-url", "http://127.0.0.1:1", "--out", str(tmp_path / "c")]) == 2
    assert "cannot use http://127.0.0.1:1" in capsys.readouterr().err


def test_dsv4_bench_passes_arguments_through(fake_server, tmp_path):
    dsv4 = os.path.join(ROOT, "build", "dsv4")
    if not os.path.exists(dsv4):
        pytest.skip("build/dsv4 not built")
    r = subprocess.run([dsv4, "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "decode" in r.stdout and "soak" in r.stdout
    fake = fake_server()
    out = str(tmp_path / "via-dsv4")
    r = subprocess.run([dsv4, "bench", "decode", "--base-url", fake.base, "--out", out, "--warmup", "1",
                        "--repeats", "1", "--only", "bst"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = check_outputs(out, "decode")
    assert rows[0]["prompt"] == "bst" and int(rows[0]["tokens"]) == TOKENS
