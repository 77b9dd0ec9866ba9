#!/usr/bin/env bash
# cuBLASLt algorithms per power-of-two row bucket + warm-up of every bucket (default) vs DSV4_CUDA_LT_BUCKET=0
# (the old GEMM calls). 1: correctness on the tiny checkpoints (engine tests on CUDA, CPU == CUDA logits,
# op conformance). 2: serve, TTFT of prompts of several lengths each twice, step log. 3: perf, decode / verify / 8K prefill.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 200 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 --flash-rows 300 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -3 $O/conformance.txt; grep -c FAIL $O/conformance.txt
n=0
for CFG in "X=0" "DSV4_CUDA_LT_BUCKET=0"; do
  n=$((n+1))
  t0=$(date +%s.%N)
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching > $O/serve_r8_$n.log 2>&1 &
  SP=$!
  for i in $(seq 240); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
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
for words in (2600, 2600, 2300, 2300, 1500, 1500, 15, 15, 20, 20, 30, 30, 50, 50, 7, 7, 500, 500):
    k += 1
    ms, u = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 1)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
for k in range(2):
    ms, u = req(f"hello {k}", 64)
    print(f"  decode {k}: {u['completion_tokens']} tokens in {ms:.1f} ms", flush=True)
PY
  grep -h "ready\|graphs" $O/serve_r8_$n.log | head -2
  grep -h "step [0-9]*:" $O/serve_r8_$n.log | grep -v "(0 prefill" | sed 's/INFO dsv4: //; s/^/    /'
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
for CFG in "X=0" "DSV4_CUDA_LT_BUCKET=0"; do
  env $CFG timeout 150 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
    --batch 1,8,64 --rows-per-seq 1,6 --context 4096 --warmup 2 --steps 5 --logits ids --prefill 8192 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > "$O/perf_${CFG%%=*}.txt"
  echo "== perf $CFG rc=${PIPESTATUS[0]}"; grep -vE "^\s*$" "$O/perf_${CFG%%=*}.txt" | tail -14
done
