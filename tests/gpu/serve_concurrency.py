#!/usr/bin/env python3
"""Concurrency check against a running dsv4 server (issue 7 whole-model runs; the
"garbled output under concurrency" users saw with vLLM).

Sends one greedy request alone (the reference), then the same request N times at once
mixed with N other prompts, and reports whether each concurrent copy's text equals
the reference, plus start-to-first-token and total time of the first request after
ready vs a warm one. Batched arithmetic may legitimately differ from batch-1
arithmetic in the last bits (different kernels per batch size), so a difference is
reported with the first differing character, not hidden; all requests must finish.

usage: serve_concurrency.py PORT [N] [MAX_TOKENS]   (exit 1 if a request fails)
"""
import concurrent.futures as cf
import json
import os
import sys
import time
import urllib.request

port = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 48
base = f"http://127.0.0.1:{port}"


def ask(prompt):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time()
    ttft, text = None, []
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ch = json.loads(line[6:])
            if ch.get("choices"):
                piece = ch["choices"][0].get("text") or ""
                if ttft is None and piece:  # the first chunk that carries text
                    ttft = time.time() - t
                text.append(piece)
    return "".join(text), ttft or 0.0, time.time() - t


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import wait_ready  # noqa: E402  (tests/gpu/serve_client.py)

wait_ready(base, time.time(), limit_s=240)
with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
    MODEL = json.loads(r.read())["data"][0]["id"]
P = "Explain in detail how a GPU schedules warps."
ref, ttft1, tot1 = ask(P)
print(f"first request after ready: TTFT {ttft1 * 1000:.1f} ms, total {tot1 * 1000:.1f} ms for {max_tokens} tokens")
# warm: a different prompt of the same shape (the same one would hit the prefix cache)
_, ttft2, tot2 = ask(P.replace("Explain", "Describe"))
print(f"another request warm:      TTFT {ttft2 * 1000:.1f} ms, total {tot2 * 1000:.1f} ms "
      f"(first/warm total {tot1 / tot2:.2f}x)")
prompts = [P] * n + [f"Other request {i}: a poem about memory bandwidth." for i in range(n)]
fails = 0
t = time.time()
with cf.ThreadPoolExecutor(len(prompts)) as ex:
    futs = [ex.submit(ask, p) for p in prompts]
    res = []
    for f in futs:
        try:
            res.append(f.result())
        except Exception as e:  # a failed request is a failure of the check
            res.append(None)
            fails += 1
            print(f"request FAILED: {e}")
wall = time.time() - t
same = sum(1 for r in res[:n] if r and r[0] == ref)
print(f"{2 * n} concurrent requests: {2 * n - fails} finished in {wall:.2f} s; "
      f"{same}/{n} copies of the reference prompt equal to it alone")


def first_diff(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


for i, r in enumerate(res[:n]):
    if r and r[0] != ref:
        print(f"  copy {i}: first difference at character {first_diff(r[0], ref)}")
# Separate the causes of a difference: the copies were served with the prompt in the
# prefix cache (the reference was not), in a batch of 2N (the reference ran alone).
texts = [r[0] for r in res[:n] if r]
print(f"distinct texts among the {len(texts)} copies: {len(set(texts))}")
again, _, _ = ask(P)  # alone again, now with the prompt in the prefix cache
print(f"the reference prompt alone again (prefix-cache hit): "
      f"{'equal to' if again == ref else 'differs from'} the first answer"
      + ("" if again == ref else f" at character {first_diff(again, ref)}")
      + f"; {sum(1 for t in texts if t == again)}/{len(texts)} copies equal to it")
sys.exit(1 if fails else 0)
