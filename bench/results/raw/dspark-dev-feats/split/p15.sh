#!/usr/bin/env bash
# Final: device features only for forwards of >= 512 rows (prefill chunks); decode / verify steps keep the host
# copy. Default vs DSV4_DSPARK_DEV_FEATS=0, alternating; DSpark k=5, 24 layers: prefill chunks (step - forward) and
# 8 concurrent requests (48-row verify steps), texts. Plus the CUDA checks.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt
n=0
for CFG in "DSV4_DSPARK_DEV_FEATS=0" "X=default" "DSV4_DSPARK_DEV_FEATS=0" "X=default"; do
  n=$((n+1))
  env $CFG DSV4_STEP_LOG=1 bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --max-num-seqs 16 \
     --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_$n.log 2>&1 &
  SP=$!
  for i in $(seq 360); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  kill -0 $SP 2>/dev/null || { echo "server exited:"; tail -5 $O/serve_$n.log; continue; }
  echo "== $CFG (run $n)"
  python3 - <<'PY'
import json, time, zlib, urllib.request, concurrent.futures as cf
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"], r["choices"][0]["text"]
for k, words in enumerate((2600, 2600, 500)):
    ms, u, txt = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 16)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens + 16, {ms:.1f} ms, text crc {zlib.crc32(txt.encode()):08x}", flush=True)
for rnd in range(2):
    t = time.time()
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda i: req(f"batch {rnd} {i}", 32), range(8)))
    print(f"  8 concurrent x 32 tokens: {(time.time() - t) * 1e3:.1f} ms, crcs {' '.join(f'{zlib.crc32(r[2].encode()):08x}' for r in res)}", flush=True)
PY
  grep -h "step [0-9]*:" $O/serve_$n.log | awk '{for(i=1;i<=NF;i++){if($i=="rows")r=$(i-1); if($i=="forward")fw=$(i+1); if($i=="step" && $(i+1)~/^[0-9.]+$/ && $(i+2)=="ms")s=$(i+1)}; if (r=="8192"||r=="2209"||r=="2001"||r=="48"){n[r]++; F[r]+=fw; S[r]+=s}} END {for (k in n) printf "  %s rows: n=%d forward %.2f step %.2f step-forward %.2f ms\n", k, n[k], F[k]/n[k], S[k]/n[k], (S[k]-F[k])/n[k]}' | sort -n -k1
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
