#!/usr/bin/env bash
# CUDA graphs captured at start (issue 7) on 2x H200, dummy weights of the real
# config with LAYERS layers, DSpark k=5 (random weights: every verify step is
# k+1 = 6 rows per request): for TP=1 (GPU 0) and TP=2, serve; the log must show
# the capture before "ready" (how many graphs, how long) and no capture after
# it. Requests after ready: 1 (the first, timed), 1 again (warm), then 3 and 8
# concurrent, then 1 more warm; 32 tokens each, temperature 0, streamed.
# At shutdown the runner logs how many forwards replayed a graph / ran eagerly.
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), lib/ and v4-0731/ (as
# run_serve_dummy_h200.sh). Env: LAYERS (8), TPS ("1 2"), OUT, PORT, BIN (default bin/dsv4:
# an older binary shows the per-shape capture at request time), EXTRA (more serve flags, e.g.
# --enforce-eager).
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
OUTD=${OUT:-/tmp/graphwarm-out}
mkdir -p "$OUTD"
L=${LAYERS:-8}
PORT=${PORT:-8893}
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 | tee "$OUTD/env.txt"
for TP in ${TPS:-1 2}; do
  LOG="$OUTD/serve-tp$TP.log"
  if [ "$TP" = 1 ]; then VIS=0; else VIS=0,1; fi
  t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=$VIS "${BIN:-$D/bin/dsv4}" serve "$D/v4-0731" --load-format dummy \
    --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda -tp "$TP" --port "$PORT" --max-model-len 16384 \
    --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' ${EXTRA:-} > "$LOG" 2>&1 &
  SP=$!
  python3 - "$PORT" "$t0" "$TP" <<'PY' 2>&1 | tee "$OUTD/requests-tp$TP.txt"
import json, sys, time, threading, urllib.request
port, t0, tp = sys.argv[1], float(sys.argv[2]), sys.argv[3]
base = f"http://127.0.0.1:{port}"
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception:
        pass
    if time.time() - t0 > 60: print("not ready after 60 s"); sys.exit(1)
    time.sleep(0.2)
print(f"TP={tp}: start to ready: {time.time() - t0:.1f} s")
def one(i, n, res):
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time(); ttft = None; chunks = 0
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            for line in r:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    if ttft is None: ttft = time.time() - t
                    chunks += 1
        res[i] = (ttft, time.time() - t, chunks)
    except Exception as e:
        res[i] = (None, time.time() - t, f"FAILED {e}")
def batch(name, c, n=32):
    res = {}
    th = [threading.Thread(target=one, args=(i, n, res)) for i in range(c)]
    t = time.time()
    for x in th: x.start()
    for x in th: x.join()
    wall = time.time() - t
    ttfts = [r[0] * 1000 for r in res.values() if r[0] is not None]
    print(f"TP={tp} {name}: {c} concurrent x {n} tokens: wall {wall*1000:.0f} ms, "
          f"TTFT ms {['%.1f' % x for x in ttfts]}, totals ms {['%.0f' % (r[1]*1000) for r in res.values()]}, "
          f"chunks {[r[2] for r in res.values()]}")
batch("first after ready", 1)
batch("warm", 1)
batch("batch 3", 3)
batch("batch 8", 8)
batch("warm again", 1)
PY
  kill "$SP" 2>/dev/null
  for i in $(seq 1 30); do kill -0 "$SP" 2>/dev/null || break; sleep 1; done
  kill -9 "$SP" 2>/dev/null
  echo "--- TP=$TP: capture at start / after ready ($LOG)"
  grep -E "CUDA graphs: captured|ready:|graph replays|ERROR|WARN" "$LOG" | grep -v "tp trace" | head -20
  RL=$(grep -n "ready: serving" "$LOG" | head -1 | cut -d: -f1)
  if [ -n "$RL" ]; then
    echo "graph captures before ready: $(head -n "$RL" "$LOG" | grep -c 'captured a graph')," \
         "after ready: $(tail -n +"$RL" "$LOG" | grep -c 'captured a graph')"
  fi
done
