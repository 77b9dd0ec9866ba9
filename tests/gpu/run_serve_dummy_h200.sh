#!/usr/bin/env bash
# Whole-model serving on one H200 with dummy weights (issue 7 "Whole-model
# runs" / "Measured"): time from start to ready, the first requests right
# after ready against warm ones, and `dsv4 perf` step times at real shapes.
# Runs from a folder holding bin/dsv4 (built with -DDSV4_CUDA=ON), lib/ (the
# .so files the GPU machine lacks) and v4-0731/ (the 0731 config.json plus
# tokenizer.json, tokenizer_config.json, encoding/). Output: $OUT.
# Env: LAYERS (num_hidden_layers override; all 43 do not fit one H200), PORT.
set -uo pipefail
D=${DIR:-$(pwd)}
export LD_LIBRARY_PATH="$D/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
OUTD=${OUT:-/tmp/serve-dummy-out}
mkdir -p "$OUTD"
L=${LAYERS:-24}
PORT=${PORT:-8899}
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 | tee "$OUTD/env.txt"
# 1. perf: bare target forward at real shapes (decode 1 row, verify 6 rows per request), prefill chunks
timeout 200 "$D/bin/dsv4" perf "$D/v4-0731" --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" \
  --device cuda --batch 1,2,4,8,16,32,64 --rows-per-seq 1,6 --context 4096 --steps 10 --prefill 8192 \
  2>&1 | tee "$OUTD/perf.txt"
# 2. serve: start to ready, then the first requests against warm ones
t0=$(date +%s.%N)
"$D/bin/dsv4" serve "$D/v4-0731" --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" \
  --device cuda --port $PORT --max-model-len 16384 --max-num-seqs 16 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > "$OUTD/serve.log" 2>&1 &
SP=$!
python3 - "$PORT" "$t0" <<'PY' 2>&1 | tee "$OUTD/requests.txt"
import json, sys, time, urllib.request
port, t0 = sys.argv[1], float(sys.argv[2])
base = f"http://127.0.0.1:{port}"
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception:
        pass
    if time.time() - t0 > 170: print("not ready after 170 s"); sys.exit(1)
    time.sleep(0.2)
print(f"start to ready: {time.time() - t0:.1f} s")
def one(i, n=64):
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time(); ttft = None; chunks = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                if ttft is None: ttft = time.time() - t
                chunks += 1
    total = time.time() - t
    return ttft, total, chunks
for i in range(8):
    ttft, total, chunks = one(i)
    print(f"request {i}: TTFT {ttft*1000:.1f} ms, total {total*1000:.1f} ms for 64 tokens "
          f"({64/total:.1f} tok/s, {chunks} chunks)")
with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
    for ln in r.read().decode().splitlines():
        if ln.startswith(("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                          "vllm:cache_config_info", "dsv4:kv_cache_pool_blocks")):
            print(ln)
PY
kill $SP; wait $SP 2>/dev/null
grep -E "KV cache pool|dummy weights|ready|backend|ERROR|WARN" "$OUTD/serve.log" | head -20 | tee -a "$OUTD/requests.txt"
