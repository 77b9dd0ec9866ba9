#!/usr/bin/env python3
"""Random-request fuzz of a running dsv4 server (spec/SERVING.md §9 item 7).

Sends random chat and raw completion requests -- tools and tool_choice,
thinking on/off, stop strings and stop token ids, streaming with and without
usage, n > 1, logprobs, logit_bias pushing the model towards special tokens
(BOS, EOS, <think>, </think>, ｜DSML｜, place-holders), a few invalid
requests and a few clients that hang up mid-stream -- and checks every answer:

* no 5xx, ever; valid requests get 200, invalid ones a JSON error in OpenAI's
  shape (§3.8);
* bodies are valid JSON, streams are well-framed SSE ending in [DONE] (§3.5);
* every choice ends with a finish_reason; usage adds up; logprob records
  match completion_tokens;
* tool_calls arguments are JSON objects; streamed fragments concatenate to
  valid JSON;
* no BOS/EOS/pad/place-holder text anywhere, no </think> and no DSML in chat
  content or reasoning (§3.5 rules, §9 item 7);
* the server is alive and healthy at the end, /metrics counts no errors.

Soak use:  python3 tests/py/fuzz_server.py --base http://127.0.0.1:8888 --requests 10000
or let it start its own server:
           python3 tests/py/fuzz_server.py --model models/default --requests 2000 \\
               --serve-arg=--speculative-config --serve-arg='{"method":"dspark","num_speculative_tokens":3}'
tests/py/test_server_fuzz.py runs a short version (about 100 requests).
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}}}}},
]
PROMPTS = ["Hello", "What is 2+2?", "List three colours.", "Write a haiku about rain.",
           "Run `ls -la 2>&1` for me.", "What's the weather in Paris tomorrow?", "Question: why is the sky blue?",
           "Count: one, two, three,", "def fib(n):", "Translate 'good morning' into French."]
STOPS = ["e", "the", ".", "\n", ", ", "Question:", "two", "ab"]
SPECIAL_TEXTS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜place▁holder▁no▁380｜>"]


class Fuzzer:
    def __init__(self, base, tokenizer_path, seed=0, model_vocab=None, max_tokens=12):
        self.max_tokens = max_tokens
        u = urllib.parse.urlparse(base)
        self.host, self.port = u.hostname, u.port
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        tok = Tokenizer.from_file(tokenizer_path)
        ids = {t: tok.token_to_id(t) for t in
               ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<think>", "</think>", "｜DSML｜",
                "<｜place▁holder▁no▁380｜>", "<｜User｜>"]}
        self.special_ids = [i for i in ids.values() if i is not None and (model_vocab is None or i < model_vocab)]
        self.eos = ids["<｜end▁of▁sentence｜>"]
        self.stats = {"requests": 0, "ok": 0, "client_errors": 0, "streams": 0, "hangups": 0, "tool_calls": 0}
        self.failures = []

    # ---- request generation ----
    def _common(self, r, chat):
        b = {"max_tokens": r.randint(1, self.max_tokens)}
        if r.random() < 0.5:
            b["temperature"] = 0
        else:
            b["temperature"] = round(r.uniform(0.2, 1.5), 2)
            b["seed"] = r.randint(0, 1 << 30)
            if r.random() < 0.3:
                b["top_p"] = round(r.uniform(0.5, 1), 2)
            if r.random() < 0.2:
                b["top_k"] = r.randint(1, 50)
        if r.random() < 0.4:
            b["stop"] = r.sample(STOPS, r.randint(1, 3)) if r.random() < 0.7 else r.choice(STOPS)
        if r.random() < 0.15:
            b["include_stop_str_in_output"] = True
        if r.random() < 0.15:
            b["stop_token_ids"] = [r.choice(self.special_ids)]
        if r.random() < 0.4:
            b["logit_bias"] = {str(i): r.choice([3, 6, 10, 100]) for i in r.sample(self.special_ids, r.randint(1, 3))}
        if r.random() < 0.2:
            b["ignore_eos"] = True
        if r.random() < 0.1:
            b["min_tokens"] = r.randint(0, b["max_tokens"])
        if r.random() < 0.25:
            b["n"] = r.randint(2, 3 if self.max_tokens > 8 else 2)
        if r.random() < 0.3:
            if chat:
                b["logprobs"] = True
                b["top_logprobs"] = r.randint(0, 3)
            else:
                b["logprobs"] = r.randint(0, 3)
        if r.random() < 0.1:
            b["repetition_penalty"] = 1.05
        if r.random() < 0.5:
            b["stream"] = True
            if r.random() < 0.6:
                b["stream_options"] = {"include_usage": True, "continuous_usage_stats": r.random() < 0.3}
        return b

    def make_request(self, r):
        """(path, body, valid, hang_up)."""
        chat = r.random() < 0.65
        b = self._common(r, chat)
        if chat:
            path = "/v1/chat/completions"
            b["messages"] = [{"role": "user", "content": r.choice(PROMPTS)}]
            if r.random() < 0.2:
                b["messages"].insert(0, {"role": "system", "content": "You are terse."})
            if r.random() < 0.45:
                b["tools"] = TOOLS
                if r.random() < 0.3:
                    b["tool_choice"] = r.choice(["auto", "none"])
            mode = r.random()
            if mode < 0.35:
                b["chat_template_kwargs"] = {"thinking": True}
                if r.random() < 0.5:
                    b["reasoning_effort"] = r.choice(["low", "high", "max"])
            elif mode < 0.5:
                b["thinking"] = {"type": "disabled"}
        else:
            path = "/v1/completions"
            b["prompt"] = r.choice(PROMPTS)
            if r.random() < 0.15:
                b["echo"] = True
            if r.random() < 0.1:
                b["prompt_logprobs"] = r.randint(0, 3)
        valid = True
        if r.random() < 0.06:  # an invalid request: a 400, never a 5xx
            valid = False
            bad = r.choice([("n", 99), ("temperature", 7), ("stop", [""]), ("max_tokens", 0),
                            ("top_logprobs", 99) if chat else ("logprobs", 9),
                            ("logit_bias", {"x": 1}), ("stream", "yes")])
            b[bad[0]] = bad[1]
        hang_up = b.get("stream") and valid and r.random() < 0.05
        return path, b, valid, hang_up

    # ---- checks ----
    def fail(self, what, path, body, detail):
        with self.lock:
            self.failures.append(f"{what}: {path} {json.dumps(body, ensure_ascii=False)[:600]} -> {detail}")

    def check_text(self, where, text, chat):
        bad = [t for t in SPECIAL_TEXTS if t in text]
        if chat:
            bad += [t for t in ("</think>", "<think>", "｜DSML｜") if t in text]
        return f"{where} contains {bad}: {text!r}" if bad else None

    def check_args(self, args):
        try:
            v = json.loads(args)
        except ValueError:
            return f"tool arguments are not JSON: {args!r}"
        return None if isinstance(v, dict) else f"tool arguments are not an object: {args!r}"

    def check_usage(self, u, n_comp_expected=None):
        if not isinstance(u, dict):
            return f"usage missing: {u!r}"
        if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"] or u["prompt_tokens"] <= 0:
            return f"usage does not add up: {u}"
        if n_comp_expected is not None and u["completion_tokens"] != n_comp_expected:
            return f"completion_tokens {u['completion_tokens']} != {n_comp_expected} logprob records"
        return None

    def check_stop(self, body, choice_text, stop_reason):
        stops = body.get("stop")
        if stops is None or body.get("include_stop_str_in_output"):
            return None
        stops = [stops] if isinstance(stops, str) else stops
        if isinstance(stop_reason, str) and stop_reason not in stops:
            return f"stop_reason {stop_reason!r} is not one of the stops"
        hit = [s for s in stops if s in choice_text]
        # raw completions apply stops from the first character; chat content too (reasoning is separate)
        return f"text contains stop strings {hit}: {choice_text!r}" if hit else None

    def check_body(self, path, body, resp):
        chat = path.endswith("chat/completions")
        n = body.get("n", 1)
        ch = resp.get("choices")
        if not isinstance(ch, list) or sorted(c["index"] for c in ch) != list(range(n)):
            return f"choices malformed: {ch!r}"
        n_lp = 0
        for c in ch:
            if c.get("finish_reason") not in ("stop", "length", "tool_calls"):
                return f"finish_reason {c.get('finish_reason')!r}"
            if chat:
                m = c["message"]
                for k in ("content", "reasoning"):
                    if m.get(k) is not None:
                        e = self.check_text(k, m[k], True)
                        if e:
                            return e
                for tc in m.get("tool_calls") or []:
                    e = self.check_args(tc["function"]["arguments"])
                    if e:
                        return e
                    if not tc["id"].startswith("call_") or tc["type"] != "function":
                        return f"tool call malformed: {tc}"
                    self.stats["tool_calls"] += 1
                if c["finish_reason"] == "tool_calls" and not m.get("tool_calls"):
                    return "finish_reason tool_calls without tool_calls"
                e = self.check_stop(body, m.get("content") or "", c.get("stop_reason"))
                if e:
                    return e
                if body.get("logprobs"):
                    n_lp += len(c["logprobs"]["content"])
            else:
                text = c["text"]
                if body.get("echo"):
                    if not text.startswith(body["prompt"]):
                        return f"echo: text does not start with the prompt: {text!r}"
                    text = text[len(body["prompt"]):]
                e = self.check_text("text", text, False) or self.check_stop(body, text, c.get("stop_reason"))
                if e:
                    return e
                if "logprobs" in body:
                    lp = c["logprobs"]
                    if len(lp["tokens"]) != len(lp["token_logprobs"]) or len(lp["tokens"]) != len(lp["text_offset"]):
                        return f"legacy logprobs lists differ in length: {lp}"
                    n_lp += len(lp["tokens"])
                    if body.get("echo"):  # prompt tokens first, the first one null
                        if lp["token_logprobs"][0] is not None:
                            return "echo logprobs: the first prompt token has a logprob"
                        n_lp -= resp["usage"]["prompt_tokens"]
                if "prompt_logprobs" in body:
                    pl = c.get("prompt_logprobs")
                    if not isinstance(pl, list) or len(pl) != resp["usage"]["prompt_tokens"] or pl[0] is not None:
                        return "prompt_logprobs malformed: " + str(pl)[:200]
        has_lp = body.get("logprobs") if chat else "logprobs" in body
        return self.check_usage(resp.get("usage"), n_lp if has_lp else None)

    def check_stream(self, path, body, raw):
        chat = path.endswith("chat/completions")
        n = body.get("n", 1)
        if not raw.endswith("data: [DONE]\n\n"):
            return f"stream does not end with [DONE]: {raw[-200:]!r}"
        events = [e for e in raw.split("\n\n")[:-1] if not e.startswith(":")]
        chunks = []
        for e in events[:-1]:
            if not e.startswith("data: ") or "\n" in e:
                return f"bad SSE event: {e[:200]!r}"
            try:
                chunks.append(json.loads(e[6:]))
            except ValueError:
                return f"SSE data is not JSON: {e[:200]!r}"
        if events[-1] != "data: [DONE]":
            return "last event is not [DONE]"
        if any("error" in c for c in chunks):
            return f"error in stream: {[c for c in chunks if 'error' in c]}"
        ids = {c["id"] for c in chunks}
        if len(ids) != 1:
            return f"chunk ids differ: {ids}"
        text = {i: "" for i in range(n)}
        finals = {i: 0 for i in range(n)}
        args = {}
        n_lp = 0
        for c in chunks:
            for x in c["choices"]:
                i = x["index"]
                if chat:
                    d = x["delta"]
                    for k in ("content", "reasoning"):
                        if d.get(k):
                            e = self.check_text("delta." + k, d[k], True)
                            if e:
                                return e
                    text[i] += d.get("content") or ""
                    for tc in d.get("tool_calls") or []:
                        args.setdefault((i, tc["index"]), "")
                        args[(i, tc["index"])] += tc.get("function", {}).get("arguments", "")
                    if x.get("logprobs"):
                        n_lp += len(x["logprobs"]["content"])
                else:
                    text[i] += x["text"]
                    if x.get("logprobs"):
                        n_lp += len(x["logprobs"]["tokens"])
                        if body.get("echo") and x["logprobs"]["token_logprobs"][:1] == [None]:
                            n_lp -= len(x["logprobs"]["tokens"])  # the prompt part (first chunk)
                if x.get("finish_reason") is not None:
                    finals[i] += 1
                    if x["finish_reason"] not in ("stop", "length", "tool_calls"):
                        return f"finish_reason {x['finish_reason']!r}"
        if any(v != 1 for v in finals.values()):
            return f"final chunks per choice: {finals}"
        for t in text.values():
            if body.get("echo"):
                if not t.startswith(body["prompt"]):
                    return f"echo: streamed text does not start with the prompt: {t!r}"
                t = t[len(body["prompt"]):]
            e = self.check_text("streamed text", t, chat) or self.check_stop(body, t, None)
            if e:
                return e
        for a in args.values():
            e = self.check_args(a)
            if e:
                return e
        so = body.get("stream_options") or {}
        if so.get("include_usage"):
            last = chunks[-1]
            if last["choices"] != []:
                return "usage chunk has choices"
            has_lp = body.get("logprobs") if chat else "logprobs" in body
            e = self.check_usage(last.get("usage"), n_lp if has_lp else None)
            if e:
                return e
            if so.get("continuous_usage_stats") and not all("usage" in c for c in chunks):
                return "continuous_usage_stats: a chunk without usage"
        elif any("usage" in c for c in chunks):
            return "usage sent without include_usage"
        return None

    # ---- one request ----
    def one(self, seed):
        r = random.Random(seed)
        path, body, valid, hang_up = self.make_request(r)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            status = resp.status
            if hang_up and status == 200:
                resp.read(64)  # the first bytes, then hang up
                conn.close()
                with self.lock:
                    self.stats["hangups"] += 1
                return
            raw = resp.read().decode()
            ctype = resp.getheader("Content-Type", "")
        except Exception as e:  # noqa: BLE001 -- any transport failure is a finding
            self.fail("transport", path, body, repr(e))
            return
        finally:
            conn.close()
        with self.lock:
            self.stats["requests"] += 1
        if status >= 500:
            self.fail("5xx", path, body, f"{status} {raw[:300]}")
            return
        if not valid or status != 200:
            try:
                err = json.loads(raw)["error"]
                ok = isinstance(err["message"], str) and err["code"] == status and "type" in err
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                self.fail("error shape", path, body, f"{status} {raw[:300]}")
            elif valid:
                self.fail("valid request refused", path, body, f"{status} {raw[:300]}")
            elif status != 400:
                self.fail("invalid request not a 400", path, body, f"{status} {raw[:300]}")
            with self.lock:
                self.stats["client_errors"] += 1
            return
        if body.get("stream"):
            e = None if ctype.startswith("text/event-stream") else f"content type {ctype}"
            e = e or self.check_stream(path, body, raw)
            with self.lock:
                self.stats["streams"] += 1
        else:
            try:
                e = self.check_body(path, body, json.loads(raw))
            except (ValueError, KeyError, TypeError) as x:
                e = f"malformed body ({x!r}): {raw[:300]}"
        if e:
            self.fail("response", path, body, e)
        else:
            with self.lock:
                self.stats["ok"] += 1

    def health(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        errors = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                     if ln.startswith("vllm:request_success_total") and 'finished_reason="error"' in ln)
        return ok, errors

    def run(self, n_requests, concurrency=4):
        seeds = [self.rng.randrange(1 << 62) for _ in range(n_requests)]
        with ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(self.one, seeds))
        ok, errors = self.health()
        if not ok:
            self.failures.append("/health is not 200 after the fuzz")
        if errors:
            self.failures.append(f"/metrics counts {errors} requests finished with an engine error")
        return self.failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="URL of a running server (else --model starts one)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `dsv4 serve` argument (repeatable)")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the model's)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    server = None
    base = a.base
    if not base:
        sys.path.insert(0, HERE)
        from conftest import Server  # noqa: E402
        server = Server(a.model, "--max-model-len", "512", "--max-num-seqs", "8", *a.serve_arg, ready=True)
        base = server.base
    try:
        f = Fuzzer(base, a.tokenizer or os.path.join(a.model, "tokenizer.json"), a.seed)
        failures = f.run(a.requests, a.concurrency)
    finally:
        if server:
            server.stop()
    print(json.dumps(f.stats))
    for x in failures[:50]:
        print("FAIL", x)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
