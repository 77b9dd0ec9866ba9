#!/usr/bin/env bash
# DSpark context features kept on the device (dsv4_fwd_out.taps_dev) vs the host copy (DSV4_DSPARK_DEV_FEATS=0).
# 1: CUDA correctness (engine on the tiny checkpoints incl. DSpark, CPU == CUDA ops, conformance incl. the final
# k_hc_fused). 2: serve with DSpark k=5, 24 layers: per prefill step, step ms - target forward ms (the drafter's
# context path), and greedy texts (must match between the two).
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -2 $O/conformance.txt
n=0
for CFG in "DSV4_DSPARK_DEV_FEATS=0" "DSV4_DSPARK_DEV_FEATS=1" "DSV4_DSPARK_DEV_FEATS=0" "DSV4_DSPARK_DEV_FEATS=1"; do
  n=$((n+1))
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --max-num-seqs 16 \
     --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_$n.log 2>&1 &
  SP=$!
  for i in $(seq 360); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -5 $O/serve_$n.log; continue; }
  echo "== $CFG (run $n)"
  python3 - <<'PY'
import json, time, zlib, urllib.request
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"], r["choices"][0]["text"]
k = 0
for words in (2600, 2600, 500, 500, 20, 20):
    k += 1
    ms, u, txt = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 16)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens + 16, {ms:.1f} ms, text crc {zlib.crc32(txt.encode()):08x}", flush=True)
PY
  grep -h "step [0-9]*:" $O/serve_$n.log | awk '{for(i=1;i<=NF;i++){if($i=="rows")r=$(i-1); if($i=="forward")f=$(i+1); if($i=="step" && $(i+1)~/^[0-9.]+$/ && $(i+2)=="ms")s=$(i+1)}; if (r+0 >= 64) printf "  %s rows: forward %s ms, step %s ms, step-forward %.1f ms\n", r, f, s, s-f}'
  grep -h "spec\|accept" $O/serve_$n.log | tail -1
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
