#!/usr/bin/env bash
# H100: requests after idle (the 30 % slow-down users saw with vLLM "on the first requests and after idle"):
# serve 12 layers, streamed 64-token requests back to back, then after 60 s and 20 s of idle.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
O=${OUT:-/tmp}
t0=$(date +%s.%N)
bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 12}' --device cuda --port 8899 \
  --max-model-len 16384 --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve.log 2>&1 &
SP=$!
python3 - 8899 $t0 ../tests/gpu <<'PY' 2>&1 | tee $O/idle.txt
import sys, time
sys.path.insert(0, sys.argv[3])
from serve_client import stream_completion, wait_ready
base = f"http://127.0.0.1:{sys.argv[1]}"
wait_ready(base, float(sys.argv[2]), 170)
def one(tag, i):
    ttft, total, chunks = stream_completion(base, i)
    print(f"{tag}: request {i}: TTFT {ttft*1000:.1f} ms, total {total*1000:.1f} ms for 64 tokens ({64/total:.1f} tok/s)", flush=True)
for i in range(4): one("after ready" if i == 0 else "back to back", i)
time.sleep(60)
for i in range(4, 7): one("after 60 s idle" if i == 4 else "back to back", i)
time.sleep(20)
for i in range(7, 9): one("after 20 s idle" if i == 7 else "back to back", i)
PY
kill $SP; sleep 2; kill -9 $SP 2>/dev/null; wait $SP 2>/dev/null
