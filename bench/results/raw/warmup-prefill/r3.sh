#!/usr/bin/env bash
# Start-up prefill warm-up (DSV4_WARMUP_PREFILL): time to ready, TTFT of the first three ~7.5K-token prompts,
# then a 64-token decode twice, at the default --max-model-len (1048576), 24 layers, one H200.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; { [ -d bin ] || tar -xJf bin.tar.xz; }
# the default model's tokenizer and encoder (the dummy loader borrows them); its weights are not needed
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
for WP in 0 1 0 1; do
  t0=$(date +%s.%N)
  DSV4_WARMUP_PREFILL=$WP bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching > $O/serve_wp$WP.log 2>&1 &
  SP=$!
  for i in $(seq 240); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -3 $O/serve_wp$WP.log; continue; }
  t1=$(date +%s.%N)
  echo "== DSV4_WARMUP_PREFILL=$WP: start to ready (client view) $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
  python3 - <<'PY'
import json, time, urllib.request
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"]
for k in range(3):
    ms, u = req(" ".join(f"w{k}x{i % 997}" for i in range(2600)), 1)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms")
for k in range(2):
    ms, u = req(f"hello {k}", 64)
    print(f"  decode {k}: {u['completion_tokens']} tokens in {ms:.1f} ms")
PY
  grep -h "ready\|warm-up\|graphs" $O/serve_wp$WP.log | head -4
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
