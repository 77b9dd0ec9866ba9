#!/usr/bin/env bash
# Whole-model serving on one H200 with dummy weights (issue 7 "Whole-model
# runs" / "Measured"): time from start to ready, the first requests right
# after ready against warm ones, and `dsv4 perf` step times at real shapes.
# Runs from a folder holding bin/dsv4 (built with -DDSV4_CUDA=ON), lib/ (the
# .so files the GPU machine lacks) and v4-0731/ (the 0731 config.json plus
# tokenizer.json, tokenizer_config.json, encoding/). Output: $OUT.
# Env: LAYERS (num_hidden_layers override; all 43 do not fit one H200), PORT.
# Needs serve_lib.sh and serve_client.py next to it (tests/gpu/).
set -uo pipefail
# shellcheck source=tests/gpu/serve_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/serve_lib.sh" || exit 2
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
dummy_serve "$D/bin/dsv4" "$L" "$PORT" "$OUTD/serve.log" --device cuda
python3 - "$PORT" "$t0" "$GPU_LIB_DIR" <<'PY' 2>&1 | tee "$OUTD/requests.txt"
import sys
sys.path.insert(0, sys.argv[3])
from serve_client import print_metrics, stream_completion, wait_ready
port, t0 = sys.argv[1], float(sys.argv[2])
base = f"http://127.0.0.1:{port}"
wait_ready(base, t0, 170)
for i in range(8):
    ttft, total, chunks = stream_completion(base, i)
    print(f"request {i}: TTFT {ttft*1000:.1f} ms, total {total*1000:.1f} ms for 64 tokens "
          f"({64/total:.1f} tok/s, {chunks} chunks)")
print_metrics(base, ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:cache_config_info", "dsv4:kv_cache_pool_blocks"))
PY
stop_serve "$SP"
grep -E "KV cache pool|dummy weights|ready|backend|ERROR|WARN" "$OUTD/serve.log" | head -20 | tee -a "$OUTD/requests.txt"
