"""Short `dsv4 bench` runs of every mode against our own server.

Starts `dsv4 serve` on the embedded default model (or uses
DSV4_BENCH_SMOKE_URL=http://host:port when set, e.g. a `--load-format dummy`
server on a GPU machine) and checks that each mode's CSV and PNG are
produced and well-formed. Until the engine generates, /health answers 503
"not implemented" and these tests skip with that reason; no numbers are
asserted, only that the measurement completes and is honest (tokens from
usage, every soak response classified).
"""
import csv
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import DSV4

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Tiny budgets: the embedded default decodes at about a token per second on a
# shared CPU, so each mode sends a handful of requests of a few tokens.
MODES = {
    "decode": ["--repeats", "1", "--only", "count", "--max-tokens", "4"],
    "concurrency": ["--levels", "1", "2", "--pattern", "static", "--max-tokens", "4"],
    "prefill": ["--sizes", "64"],
    "spec": ["--repeats", "1", "--only", "count", "--max-tokens", "4"],
    "soak": ["--workers", "2", "--duration-s", "60", "--max-requests", "4", "--window-s", "5",
             "--max-tokens", "4", "--long-context-tokens", "100"],
}


def ready(base, wait_s):
    """None when /health is 200; else the reason it is not (after wait_s)."""
    deadline = time.time() + wait_s
    why = "no answer"
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5):
                return None
        except urllib.error.HTTPError as e:
            why = f"/health {e.code}: {e.read()[:200].decode('utf-8', 'replace')}"
            if b"not implemented" in why.encode():
                return why
        except OSError as e:
            why = str(e)
        time.sleep(0.5)
    return why


@pytest.fixture(scope="module")
def own_base(request):
    url = os.environ.get("DSV4_BENCH_SMOKE_URL")
    if url:
        return url.rstrip("/")
    if not os.path.exists(DSV4):
        pytest.skip("build/dsv4 not built")
    from conftest import Server
    try:
        s = Server()
    except RuntimeError as e:
        pytest.skip(f"dsv4 serve did not start: {e}")
    request.addfinalizer(s.stop)
    why = ready(s.base, 120)
    if why:
        pytest.skip(f"our server cannot generate yet ({why})")
    return s.base


@pytest.mark.parametrize("mode", list(MODES))
def test_mode_against_own_server(own_base, mode, tmp_path):
    out = str(tmp_path / mode)
    r = subprocess.run([DSV4, "bench", mode, "--base-url", own_base, "--out", out, "--warmup", "1",
                        "--warmup-max-tokens", "2", *MODES[mode]], capture_output=True, text=True, timeout=300)
    if mode == "spec" and "has no vllm:spec_decode" in r.stderr:
        # A known gap of the server, not of the benchmark: SERVING.md §3.9 requires the
        # counters (value 0 when speculation is off).
        pytest.xfail("/metrics lacks the vllm:spec_decode_* counters (SERVING.md §3.9)")
    # soak may legitimately exit 1 on a random-weight model (its outputs loop); the files must exist.
    assert r.returncode in ((0, 1) if mode == "soak" else (0,)), r.stdout[-2000:] + r.stderr[-2000:]
    with open(os.path.join(out, f"{mode}.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC
    with open(os.path.join(out, f"{mode}.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows
    if mode == "decode":
        assert all(int(x["tokens"]) > 0 for x in rows)
    if mode == "prefill":
        assert all(int(x["prompt_tokens"]) > 0 and float(x["ttft_s"]) > 0 for x in rows)
