#!/usr/bin/env bash
# TTFT of an ~8K-token prompt (max_tokens 1) against --max-model-len: does prefill wall time grow with max_model_len?
cd "$(dirname "$0")/.." && . ../tests/gpu/gpu_env.sh && { [ -d bin ] || tar -xJf bin.tar.xz; }
for M in 16384 1048576; do
  ${BIN:-bin/dsv4} serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda --port 8899 \
     --max-model-len $M --no-enable-prefix-caching > /tmp/s_$M.log 2>&1 &
  SP=$!
  for i in $(seq 60); do curl -sf localhost:8899/v1/models >/dev/null && break; sleep 1; done
  python3 - $M <<'PY'
import json, sys, time, urllib.request
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(n, tag):
    body = json.dumps({"model": MID, "prompt": " ".join(f"w{tag}{i % 997}" for i in range(n)), "max_tokens": 1,
                       "temperature": 0}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"]["prompt_tokens"]
for k in range(3):
    ms, pt = req(2600, k)
    print(f"max_model_len {sys.argv[1]}: request {k}: {pt} prompt tokens, {ms:.1f} ms")
PY
  grep -h "KV cache pool" /tmp/s_$M.log
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null
done
