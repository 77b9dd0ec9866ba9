#!/usr/bin/env bash
# Where the first long prompt's residual first-use cost sits: DSV4_STEP_LOG=1 (one line per engine step:
# rows, forward ms, step ms), prefill warm-up off (0) and default (1), each twice; the TTFT of three
# 10401-token prompts (chunks 8192 + 2209), then a 64-token decode twice; 24 layers, one H200, --max-model-len 1M.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; { [ -d bin ] || tar -xJf bin.tar.xz; }
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
n=0
for WP in 0 1 0 1; do
  n=$((n+1))
  t0=$(date +%s.%N)
  DSV4_STEP_LOG=1 DSV4_WARMUP_PREFILL=$WP bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching > $O/serve_r4_$n.log 2>&1 &
  SP=$!
  for i in $(seq 240); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -3 $O/serve_r4_$n.log; continue; }
  t1=$(date +%s.%N)
  echo "== run $n DSV4_WARMUP_PREFILL=$WP: start to ready (client view) $(python3 -c "print(f'{$t1-$t0:.2f}')") s"
  IDLE=$([ $n = 4 ] && echo 45) python3 - <<'PY'
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
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
for k in range(2):
    ms, u = req(f"hello {k}", 64)
    print(f"  decode {k}: {u['completion_tokens']} tokens in {ms:.1f} ms", flush=True)
import os
if os.environ.get("IDLE"):
    for k in range(2):
        time.sleep(int(os.environ["IDLE"]))
        ms, u = req(" ".join(f"i{k}x{i % 997}" for i in range(2600)), 1)
        print(f"  after {os.environ['IDLE']} s idle: prompt {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
        ms, u = req(f"idle {k}", 64)
        print(f"  after it: decode {u['completion_tokens']} tokens in {ms:.1f} ms", flush=True)
PY
  grep -h "ready\|warm-up\|graphs" $O/serve_r4_$n.log | head -3
  echo "  prefill step lines:"
  grep -h "step [0-9]*:" $O/serve_r4_$n.log | grep -v "(0 prefill" | sed 's/^/    /'
  echo "  decode steps: $(grep -h "step [0-9]*:" $O/serve_r4_$n.log | grep "(0 prefill" | awk '{for(i=1;i<=NF;i++) if($i=="forward") {s+=$(i+1); n++; if($(i+1)>m) m=$(i+1)}} END {printf "%d, forward mean %.2f ms, max %.2f ms", n, s/n, m}')"
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
