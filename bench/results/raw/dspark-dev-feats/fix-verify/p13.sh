#!/usr/bin/env bash
# After review fixes: buf_gather_rows copies runs of consecutive rows in one cudaMemcpyAsync (forward's logit rows,
# the taps copy after a graph replay, the drafter's gathers); hc_fused_fits shared by hc_run and hc_pre_norm;
# graph rows plan skips k+1 > 16. 1: CUDA correctness. 2: graph step times (24 layers). 3: serve with DSpark k=5:
# decode/verify steps after a prompt (step log), greedy texts.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -2 $O/conformance.txt
timeout 150 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
  --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "^ *[0-9]+ " | tee $O/perf.txt
for CFG in "DSV4_DSPARK_DEV_FEATS=0" "DSV4_DSPARK_DEV_FEATS=1"; do
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --max-num-seqs 16 \
     --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_${CFG#*=}.log 2>&1 &
  SP=$!
  for i in $(seq 360); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -5 $O/serve_${CFG#*=}.log; continue; }
  echo "== $CFG"
  python3 - <<'PY'
import json, time, zlib, urllib.request, concurrent.futures as cf
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"], r["choices"][0]["text"]
for k in range(2):
    ms, u, txt = req(f"hello {k}", 64)
    print(f"  decode {k}: {u['completion_tokens']} tokens in {ms:.1f} ms, text crc {zlib.crc32(txt.encode()):08x}", flush=True)
t = time.time()
with cf.ThreadPoolExecutor(8) as ex:
    res = list(ex.map(lambda i: req(f"batch {i}", 32), range(8)))
print(f"  8 concurrent x 32 tokens: {(time.time() - t) * 1e3:.1f} ms, crcs {' '.join(f'{zlib.crc32(r[2].encode()):08x}' for r in res)}", flush=True)
PY
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
