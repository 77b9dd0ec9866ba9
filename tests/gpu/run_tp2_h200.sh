#!/usr/bin/env bash
# Tensor parallelism over 2 GPUs in one process (issue 7 "Parallelism" and
# "Whole-model runs"), on the 2x H200 machine (kind nvidia-h200-x2):
#  1. the tiny checkpoints: `dsv4 run --device cuda -tp 2` against --device cpu (TP = 1), speculation off/on;
#  2. a small dummy model whose TP = 2 slices fit the CUDA tiles: the same comparison, graphs and eager;
#  3. the real 0731 config, all 43 layers, dummy weights: `dsv4 perf -tp 2` step times;
#  4. `dsv4 serve -tp 2` on it: start to ready, the first requests against warm ones.
# Every TP run has DSV4_TP_CHECK_RANKS=1: each step fails unless both ranks' logits are bit-identical.
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), lib/ (the .so files the GPU machine lacks),
# models/tiny-flash, models/tiny-dspark, v4-0731/ (config + tokenizer) and configs/deepseek-v4-flash-0731.
# Output: $OUT (or /tmp/tp2-out). Env: SKIP_TINY, SKIP_PERF, SKIP_SERVE, PERF_ARGS, PORT.
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
export DSV4_TP_CHECK_RANKS=1
BIN=${BIN:-$D/bin/dsv4}
OUTD=${OUT:-/tmp/tp2-out}
mkdir -p "$OUTD"
R=/tmp/tp2-runs
mkdir -p "$R"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u; echo "DSV4_NCCL_LIB=${DSV4_NCCL_LIB:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; } 2>&1 | tee "$OUTD/env.txt"
fail=0
P=5,17,42,7,99,3,250,11,64,8
# $1 label, $2 model dir, $3 spec k, then extra args for both runs; cuda runs with -tp 2
compare() {
  local label=$1 dir=$2 k=$3; shift 3
  timeout 60 "$BIN" run "$dir" --prompt-ids $P --max-tokens ${MAX_TOKENS:-24} --device cpu --kv-cache-dtype ${KV:-f32} --spec $k --show-ids "$@" \
    > "$R/$label.cpu.out" 2> "$R/$label.cpu.err"; echo "rc=$?" >> "$R/$label.cpu.err"
  timeout 60 "$BIN" run "$dir" --prompt-ids $P --max-tokens ${MAX_TOKENS:-24} --device cuda -tp 2 --kv-cache-dtype ${KV:-f32} --spec $k --show-ids "$@" \
    > "$R/$label.tp2.out" 2> "$R/$label.tp2.err"; echo "rc=$?" >> "$R/$label.tp2.err"
  local a b
  # the generated ids ([id] per token on stderr; log lines may interrupt them)
  a=$(grep -av '^prompt ids' "$R/$label.cpu.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  b=$(grep -av '^prompt ids' "$R/$label.tp2.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  if [ -n "$a" ] && [ "$a" = "$b" ]; then r=SAME; else r=DIFFER; fail=1; fi
  echo "$label spec=$k: $r"; echo "  cpu tp1 : $a"; echo "  cuda tp2: $b"
  grep -hE "tok/s|acceptance|rc=|dsv4 run:|graph.*captured|failed|ERROR" "$R/$label.tp2.err" | sort | uniq -c | head -12 | sed 's/^/  tp2| /'
}
OV='{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128, "moe_intermediate_size": 256, "n_routed_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4, "index_topk": 4, "vocab_size": 1024, "num_hash_layers": 2, "dspark_noise_token_id": 1000, "dspark_markov_rank": 32}'
if [ -z "${SKIP_TINY:-}" ]; then
  # shrunk 0731 config whose TP = 2 slices fit the CUDA tiles (o_lora_rank 128, moe_intermediate_size 256)
  {
    for spec in 0 5; do
      compare "small-dummy_k$spec" "$D/configs/deepseek-v4-flash-0731" $spec --load-format dummy --hf-overrides "$OV"
    done
    compare "small-dummy-eager_k5" "$D/configs/deepseek-v4-flash-0731" 5 --load-format dummy --hf-overrides "$OV" \
      --enforce-eager
  } 2>&1 | tee "$OUTD/tokens.txt"
fi
if [ -z "${SKIP_PERF:-}" ]; then
  timeout ${PERF_TIMEOUT:-150} "$BIN" perf "$D/v4-0731" --load-format dummy --device cuda -tp 2 \
    ${PERF_ARGS:---batch 1,8,64 --rows-per-seq 1,6 --context 4096 --prefill 8192 --warmup 2 --steps 5} \
    2>&1 | grep -v "^.*INFO dsv4: forward: CUDA graph" | tee "$OUTD/perf_tp2.txt"
fi
if [ -z "${SKIP_SERVE:-}" ]; then
  PORT=${PORT:-8899}
  t0=$(date +%s.%N)
  "$BIN" serve "$D/v4-0731" --load-format dummy --device cuda -tp 2 --port $PORT --max-model-len 16384 \
    --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > "$OUTD/serve_tp2.log" 2>&1 &
  SP=$!
  python3 - "$PORT" "$t0" <<'PY' 2>&1 | tee "$OUTD/requests_tp2.txt"
import json, sys, time, urllib.request
port, t0 = sys.argv[1], float(sys.argv[2])
base = f"http://127.0.0.1:{port}"
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200: break
    except Exception:
        pass
    if time.time() - t0 > 90: print("not ready after 90 s"); sys.exit(1)
    time.sleep(0.2)
print(f"start to ready: {time.time() - t0:.1f} s")
def one(i, n=64):
    body = {"model": "deepseek-v4-flash-dspark", "prompt": f"Request {i}: write a long story about GPUs.",
            "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.time(); ttft = None; chunks = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                if ttft is None: ttft = time.time() - t
                chunks += 1
    return ttft, time.time() - t, chunks
for i in range(6):
    ttft, total, chunks = one(i)
    print(f"request {i}: TTFT {ttft*1000:.1f} ms, total {total*1000:.1f} ms for 64 tokens "
          f"({64/total:.1f} tok/s, {chunks} chunks)")
with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
    for ln in r.read().decode().splitlines():
        if ln.startswith(("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                          "dsv4:kv_cache_pool_blocks")):
            print(ln)
PY
  kill $SP; wait $SP 2>/dev/null
  grep -E "KV cache pool|dummy weights|ready|backend|tensor parallel|ERROR|WARN" "$OUTD/serve_tp2.log" | head -20 \
    | tee -a "$OUTD/requests_tp2.txt"
fi
if [ -z "${SKIP_ONESHOT:-}" ]; then
  # the collective alone (NCCL vs the NVLink one-shot kernel), then whole steps with the one-shot path
  DSV4_TP_ONESHOT=1 timeout ${PERF_TIMEOUT:-150} "$BIN" perf "$D/v4-0731" --load-format dummy --device cuda -tp 2 \
    --all-reduce-bench --batch 1,8,64 --rows-per-seq 1,6 --context 4096 --warmup 2 --steps 5 \
    2>&1 | grep -v "INFO dsv4: forward: CUDA graph" | tee "$OUTD/perf_tp2_oneshot.txt"
fi
if [ -z "${SKIP_TINY:-}" ]; then
  {
    for m in tiny-flash tiny-dspark; do
      k=1; [ "$m" = tiny-dspark ] && k=5
      for spec in 0 $k; do compare "${m}_k$spec" "$D/models/$m" $spec; done
    done
  } 2>&1 | tee -a "$OUTD/tokens.txt"
fi
grep -q DIFFER "$OUTD/tokens.txt" 2>/dev/null && fail=1
tar -czf "$OUTD/runs.tgz" -C /tmp tp2-runs 2>/dev/null
exit $fail
