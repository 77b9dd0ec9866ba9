#!/usr/bin/env bash
# Is the first long prompt's residual per new prompt shape? Default warm-up, DSV4_STEP_LOG=1; prompts of
# several lengths, each length twice (different words, same token count), in order A A B B C C A.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; { [ -d bin ] || tar -xJf bin.tar.xz; }
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
for n in 1 2; do
  DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching > $O/serve_r5_$n.log 2>&1 &
  SP=$!
  for i in $(seq 240); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  echo "== run $n"
  python3 - <<'PY'
import json, time, urllib.request
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"]
k = 0
for words in (2600, 2600, 2300, 2300, 1500, 1500, 3400, 3400, 2600):
    k += 1
    ms, u = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 1)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
PY
  grep -h "step [0-9]*:" $O/serve_r5_$n.log | grep -v "(0 prefill" | sed 's/^/    /'
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
