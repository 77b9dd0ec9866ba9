#!/usr/bin/env bash
# Why 8 x 6-row DSpark verify steps are ~4 ms slower (step - forward) with the features on the device: per-op host
# times of the eager forwards (drafter context path and drafts) with DSV4_CUDA_OP_PROFILE=1, both modes.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
for CFG in "DSV4_DSPARK_DEV_FEATS=0" "DSV4_DSPARK_DEV_FEATS=1"; do
  env $CFG DSV4_STEP_LOG=1 DSV4_CUDA_OP_PROFILE=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --max-num-seqs 16 \
     --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/prof_${CFG#*=}.log 2>&1 &
  SP=$!
  for i in $(seq 360); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  echo "== $CFG"
  python3 - <<'PY'
import json, time, urllib.request, concurrent.futures as cf
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return r
t = time.time()
with cf.ThreadPoolExecutor(8) as ex:
    res = list(ex.map(lambda i: req(f"batch {i}", 32), range(8)))
print(f"  8 concurrent x 32 tokens: {(time.time() - t) * 1e3:.1f} ms", flush=True)
PY
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
  gzip -f $O/prof_${CFG#*=}.log
done
