#!/usr/bin/env bash
# First-use cost with DSpark speculation on (k=5, --max-num-seqs 16): the drafter's own GEMM shapes. Prompts of
# several lengths each twice, max_tokens 16 (prefill + drafter + verify steps); DSV4_STEP_LOG=1; default vs
# DSV4_CUDA_LT_BUCKET=0. 24 layers, one H200.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}; tar -xJf models.tar.xz; ( DSV4_TEST_DEVICE=cuda timeout 100 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "rc=$?" >> $O/engine_model_cuda.txt ); tail -2 $O/engine_model_cuda.txt
n=0
for CFG in "X=0"; do
  n=$((n+1))
  t0=$(date +%s.%N)
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --max-num-seqs 16 \
     --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_r12_$n.log 2>&1 &
  SP=$!
  for i in $(seq 360); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -5 $O/serve_r12_$n.log; continue; }
  echo "== $CFG: start to ready (client view) $(python3 -c "print(f'{$(date +%s.%N)-$t0:.2f}')") s"
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
for words in (2600, 2600, 2300, 2300, 20, 20, 50, 50, 500, 500):
    k += 1
    ms, u = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 16)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens + 16, {ms:.1f} ms", flush=True)
PY
  grep -h "ready\|graphs" $O/serve_r12_$n.log | head -2
  grep -h "step [0-9]*:" $O/serve_r12_$n.log | grep -v " 4 rows" | sed -E 's/.*step ([0-9]+): ([0-9]+) rows \(([0-9]+) prefill.*forward ([0-9.]+) ms, step ([0-9.]+) ms/\1:\2\/\3 f\4 s\5/' | paste -sd' ' | fold -w 1500
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
