#!/usr/bin/env bash
# 1: CUDA correctness of this tree (engine on the tiny checkpoints, CPU == CUDA ops). 2: DSV4_CUDA_OP_PROFILE=2 with
# buf_gather_rows stamped. 3: --enforce-eager first-request penalty: dsv4-old (8c5dd2a: no warm-up without graphs)
# vs dsv4 (this tree: the graph sizes' shapes and the prefill buckets run once, eagerly, at start).
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt
DSV4_CUDA_OP_PROFILE=2 timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
  --device cuda --batch 1 --rows-per-seq 1 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "op stamps|^1 +1 " | tail -2
n=0
for BIN in dsv4-old dsv4; do
  n=$((n+1))
  t0=$(date +%s.%N)
  DSV4_STEP_LOG=1 bin/$BIN serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
     --device cuda --port 8899 --no-enable-prefix-caching --enforce-eager --max-num-seqs 64 > $O/serve_eager_$n.log 2>&1 &
  SP=$!
  for i in $(seq 480); do curl -sf localhost:8899/v1/models >/dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 0.25; done
  echo "== $BIN --enforce-eager: start to ready (client view) $(python3 -c "print(f'{$(date +%s.%N)-$t0:.2f}')") s"
  python3 - <<'PY'
import json, time, zlib, urllib.request, concurrent.futures as cf
MID = json.load(urllib.request.urlopen("http://localhost:8899/v1/models"))["data"][0]["id"]
def req(prompt, n):
    body = json.dumps({"model": MID, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://localhost:8899/v1/completions", body,
                                         {"Content-Type": "application/json"}), timeout=120))
    return (time.time() - t) * 1e3, r["usage"], r["choices"][0]["text"]
k = 0
for words in (2600, 2600, 1500, 1500, 15, 15, 20, 20, 50, 50, 500, 500):
    k += 1
    ms, u, _ = req(" ".join(f"w{k}x{i % 997}" for i in range(words)), 1)
    print(f"  prompt {k}: {u['prompt_tokens']} tokens, TTFT {ms:.1f} ms", flush=True)
for k in range(3):
    ms, u, txt = req(f"hello {k}", 64)
    print(f"  decode {k}: {u['completion_tokens']} tokens in {ms:.1f} ms, text crc {zlib.crc32(txt.encode()):08x}", flush=True)
for rnd in range(2):
    t = time.time()
    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda i: req(f"batch {rnd} {i}", 32), range(8)))
    print(f"  8 concurrent x 32 tokens, round {rnd}: {(time.time() - t) * 1e3:.1f} ms", flush=True)
PY
  grep -h "ready\|warm-up at start\|graphs" $O/serve_eager_$n.log | sed 's/^/    /' | head -3
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; sleep 1
done
