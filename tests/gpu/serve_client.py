"""Client side of the tests/gpu serving scripts (with serve_lib.sh): wait until
the server is ready, stream one completion and time it, print metric lines.
Standard library only (the GPU machine has no openai package)."""
import json
import sys
import time
import urllib.request


def wait_ready(base, t0, limit_s=170):
    """Poll /health until 200; print the seconds since t0, or exit 1 after limit_s."""
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if time.time() - t0 > limit_s:
            print(f"not ready after {limit_s} s")
            sys.exit(1)
        time.sleep(0.2)
    print(f"start to ready: {time.time() - t0:.1f} s")


def stream_completion(base, i, n=64, timeout=120, state=None):
    """Streamed /v1/completions "Request i: ..." of n tokens (temperature 0,
    ignore_eos): (seconds to the first chunk, total seconds, chunks). state (a
    dict, optional) holds "chunks" so far, for a caller that catches a failure."""
    state = {} if state is None else state
    state["chunks"] = 0
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time()
    ttft = None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                if ttft is None:
                    ttft = time.time() - t
                state["chunks"] += 1
    return ttft, time.time() - t, state["chunks"]


def print_metrics(base, prefixes):
    """Print the /metrics lines that start with one of prefixes (a tuple)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for ln in r.read().decode().splitlines():
            if ln.startswith(prefixes):
                print(ln)
