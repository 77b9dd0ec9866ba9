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
# PORT, OUT. Needs serve_lib.sh and serve_client.py next to it (tests/gpu/).
set -uo pipefail
# shellcheck source=tests/gpu/serve_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/serve_lib.sh" || exit 2
export DSV4_TP_TRACE=1 DSV4_TP_WATCHDOG_S=${DSV4_TP_WATCHDOG_S:-10}
BIN=${BIN:-$D/bin/dsv4}
OUTD=${OUT:-/tmp/tp2-serve-out}
mkdir -p "$OUTD"
L=${LAYERS:-8}
N=${N:-5}
PORT=${PORT:-8892}
{ echo "bin: $BIN"; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 \
  | tee "$OUTD/env.txt"
t0=$(date +%s.%N)
dummy_serve "$BIN" "$L" "$PORT" "$OUTD/serve.log" --device cuda -tp 2
python3 - "$PORT" "$t0" "$GPU_LIB_DIR" "$N" <<'PY' 2>&1 | tee "$OUTD/requests.txt"
import sys
import time
sys.path.insert(0, sys.argv[3])
from serve_client import stream_completion, wait_ready
port, t0, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[4])
base = f"http://127.0.0.1:{port}"
wait_ready(base, t0, 170)
for i in range(n):
    t = time.time()
    st = {}
    try:
        _, total, chunks = stream_completion(base, i, timeout=45, state=st)
        print(f"request {i}: {chunks} chunks in {total:.2f} s")
    except Exception as e:
        print(f"request {i}: FAILED after {time.time() - t:.1f} s with {st.get('chunks', 0)} chunks: {e}")
        break
PY
stop_serve "$SP"
echo "--- errors, watchdog, graph paths that disagree"
grep -E "ERROR|WARN|not finished|ran it" "$OUTD/serve.log" | head -40
echo "--- last jobs per rank"
grep "tp trace" "$OUTD/serve.log" | tail -12
