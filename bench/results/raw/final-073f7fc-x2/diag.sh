#!/usr/bin/env bash
set -uo pipefail
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nd=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null); [ -n "$nd" ] && export DSV4_NCCL_LIB="$nd/lib/libnccl.so.2"
cat > /tmp/req.py <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]; base = f"http://127.0.0.1:{port}"; t0 = time.time()
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception: pass
    if time.time() - t0 > 60: print("not ready", flush=True); sys.exit(1)
    time.sleep(0.2)
print(f"ready {time.time()-t0:.1f} s", flush=True)
for i in range(5):
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time(); n = 0
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            for line in r:
                if line.startswith(b"data: "): n += 1
        print(f"request {i}: {n} chunks {time.time()-t:.2f} s", flush=True)
    except Exception as e:
        print(f"request {i}: FAILED after {time.time()-t:.1f} s: {e!r}", flush=True)
PY
for tp in 1 2; do
  echo "=== tp $tp"
  bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda -tp $tp --port 889$tp \
    --max-model-len 16384 --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $OUT/serve_tp$tp.log 2>&1 &
  SP=$!
  timeout 150 python3 /tmp/req.py 889$tp
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null
  grep -v "captured\|CUDA graph for" $OUT/serve_tp$tp.log | tail -15
done
