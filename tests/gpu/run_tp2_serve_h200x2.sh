#!/usr/bin/env bash
# The TP=2 serving hang on 2x H200 (bench/results/2026-11-30-tp2-hang-analysis.md):
# `dsv4 serve -tp 2 --device cuda` with DSpark k=5 served the first streamed
# request and never the second. This serves N requests "Request i: write a long
# story about GPUs." (64 tokens, temperature 0, ignore_eos, streamed), each with
# a client timeout, with the TP runner's trace (every job of every rank: rows,
# time, graph path, collectives) and its watchdog (a step still running after
# DSV4_TP_WATCHDOG_S seconds is logged with each rank's state), then prints the
# requests' outcome and the log lines that decide the question.
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), lib/ and v4-0731/ (as
# run_serve_dummy_h200.sh). Env: BIN (default bin/dsv4: run it once with this
# branch's binary and once with the old one to compare), LAYERS (8), N (5),
# PORT, OUT.
set -uo pipefail
D=${DIR:-$(pwd)}
export LD_LIBRARY_PATH="$D/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
export DSV4_TP_TRACE=1 DSV4_TP_WATCHDOG_S=${DSV4_TP_WATCHDOG_S:-10}
BIN=${BIN:-$D/bin/dsv4}
OUTD=${OUT:-/tmp/tp2-serve-out}
mkdir -p "$OUTD"
L=${LAYERS:-8}
N=${N:-5}
PORT=${PORT:-8892}
{ echo "bin: $BIN"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 \
  | tee "$OUTD/env.txt"
"$BIN" serve "$D/v4-0731" --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda -tp 2 \
  --port "$PORT" --max-model-len 16384 --max-num-seqs 16 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > "$OUTD/serve.log" 2>&1 &
SP=$!
python3 - "$PORT" "$N" <<'PY' 2>&1 | tee "$OUTD/requests.txt"
import json, sys, time, urllib.request
port, n = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
t0 = time.time()
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception:
        pass
    if time.time() - t0 > 170: print("not ready after 170 s"); sys.exit(1)
    time.sleep(0.2)
print(f"start to ready: {time.time() - t0:.1f} s")
for i in range(n):
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time(); chunks = 0
    try:
        with urllib.request.urlopen(req, timeout=45) as r:
            for line in r:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"): chunks += 1
        print(f"request {i}: {chunks} chunks in {time.time() - t:.2f} s")
    except Exception as e:
        print(f"request {i}: FAILED after {time.time() - t:.1f} s with {chunks} chunks: {e}")
        break
PY
kill "$SP" 2>/dev/null; sleep 3; kill -9 "$SP" 2>/dev/null
echo "--- errors, watchdog, graph paths that disagree"
grep -E "ERROR|WARN|not finished|ran it" "$OUTD/serve.log" | head -40
echo "--- last jobs per rank"
grep "tp trace" "$OUTD/serve.log" | tail -12
