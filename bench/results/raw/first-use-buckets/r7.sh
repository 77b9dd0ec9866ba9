#!/usr/bin/env bash
# Which op carries a new row count's first-use cost? Run 1: no profiler, TTFT of prompts of several lengths,
# each twice (long: 10401, 9201 tokens; short: ~60-200 tokens). Run 2: DSV4_CUDA_OP_PROFILE=1 (every op
# synchronised and timed; one line per forward), the long prompts. DSV4_STEP_LOG=1, default warm-up, 24 layers.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; { [ -d bin ] || tar -xJf bin.tar.xz; }
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
n=0
for CFG in "X=0" "DSV4_CUDA_OP_PROFILE=1"; do
  n=$((n+1))
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching > $O/serve_r7_$n.log 2>&1 &
  SP=$!
  for i in $(seq 240); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  echo "== $CFG"
  PROF=$n python3 - <<'PY'
import json, time, urllib.request, os
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"]
k = 0
lens = (2600, 2600, 2300, 2300) if os.environ["PROF"] == "2" else (2600, 2600, 2300, 2300, 15, 15, 20, 20, 30, 30, 50, 50, 7, 7)
for words in lens:
    k += 1
    ms, u = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 1)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
PY
  grep -h "step [0-9]*:" $O/serve_r7_$n.log | grep -v "(0 prefill" | sed 's/INFO dsv4: //; s/^/    /'
  grep -h "op profile" $O/serve_r7_$n.log | grep -v "profile: [0-9] rows\|profile: [0-9][0-9] rows" | sed 's/INFO dsv4: //; s/^/    /'
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
