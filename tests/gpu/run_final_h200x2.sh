#!/usr/bin/env bash
# The issue-7 whole-model check of one commit on 2x H200, in one device call:
# (order: the checks first, side by side; then the timings alone on the GPUs)
#  1. all 43 layers of the 0731 config, dummy weights, TP=2: plain decode and DSpark verify (6 rows/request)
#     step times at batch 1..64 against the roofline, prefill throughput at 8K, 32K and 100K context;
#  2. correctness: every CUDA op vs the CPU op (one GPU), CPU == CUDA greedy tokens on the tiny checkpoints
#     (one GPU), and under TP=2 (run_tinytp_h200x2.sh when present, else the small dummy config), and two
#     `--nnodes 2` processes joined by NCCL (run_multinode_h200x2.sh);
#  3. serve, 43 layers TP=2: start to ready, first request after ready vs warm, 2N concurrent requests.
# Runs from a folder holding bin/ (dsv4, dsv4-gpu-conformance, test_device_equiv; -DDSV4_CUDA=ON), lib/,
# v4-0731/, configs/, models/ (tiny checkpoints). Output: $OUT. Env: SKIP_PERF, SKIP_CHECK, SKIP_SERVE.
set -uo pipefail
D=${DIR:-$(pwd)}
G=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
OUTD=${OUT:-/tmp/final-out}
mkdir -p "$OUTD"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "NCCL=${DSV4_NCCL_LIB:-}"; } \
  > "$OUTD/env.txt" 2>&1
cd "$D" || exit 1
[ -d models ] || { [ -f models.tar.xz ] && tar -xJf models.tar.xz; }  # the carry limit: models travel packed
if [ -z "${SKIP_CHECK:-}" ]; then
  # the correctness checks use tiny models (little GPU memory): run side by side, then report
  ( CUDA_VISIBLE_DEVICES=0 timeout 120 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 \
      > "$OUTD/conformance.txt" 2>&1; echo "conformance rc=$?" >> "$OUTD/conformance.txt" ) &
  ( CUDA_VISIBLE_DEVICES=0 SKIP_PERF=1 OUT="$OUTD/gpurun" timeout 150 bash "$G/run_gpurun_h200.sh" > /dev/null 2>&1 ) &
  ( SKIP_EQUIV=1 SKIP_CONF=1 OUT="$OUTD/tinytp" timeout 150 bash "$G/run_tinytp_h200x2.sh" > "$OUTD/tinytp.txt" 2>&1 ) &
  ( OUT="$OUTD/multinode" timeout 150 bash "$G/run_multinode_h200x2.sh" > /dev/null 2>&1 ) &
  wait
  tail -3 "$OUTD/conformance.txt"
  grep -hE "SAME|DIFFER|passed" "$OUTD/gpurun/tokens.txt" "$OUTD/gpurun/equiv.txt" 2>/dev/null
  grep -hE "^(PASS|FAIL)" "$OUTD/tinytp.txt"
  grep -h "PASS\|FAIL" "$OUTD/multinode/multinode.txt"
fi
if [ -z "${SKIP_PERF:-}" ]; then
  timeout ${PERF_TIMEOUT:-150} bin/dsv4 perf v4-0731 --load-format dummy --device cuda -tp 2 \
    --batch 1,2,4,8,16,32,64 --rows-per-seq 1,6 --context 4096 --warmup 2 --steps 5 \
    --prefill ${PREFILL:-8192,32768} 2>&1 | grep -v "CUDA graph for\|captured a graph" > "$OUTD/perf_tp2_43.txt"
  echo "perf rc=${PIPESTATUS[0]}" >> "$OUTD/perf_tp2_43.txt"
  grep -v INFO "$OUTD/perf_tp2_43.txt"
fi
if [ -z "${SKIP_SERVE:-}" ]; then
  PORT=${PORT:-8897}
  bin/dsv4 serve v4-0731 --load-format dummy --device cuda -tp 2 --port "$PORT" --max-model-len 1048576 \
    --max-num-seqs 32 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' \
    > "$OUTD/serve_tp2_43.log" 2>&1 &
  SP=$!
  timeout 150 python3 "$G/serve_concurrency.py" "$PORT" 8 48 2>&1 | tee "$OUTD/serve_concurrency.txt"
  echo "serve check rc=${PIPESTATUS[0]} (\"start to ready\" counts from the server's launch)"
  kill "$SP" 2>/dev/null; sleep 3; kill -9 "$SP" 2>/dev/null
  grep -hE "KV cache pool|ready:|ERROR|WARN|graphs" "$OUTD/serve_tp2_43.log" | head -12
fi
if [ -z "${SKIP_PERF:-}" ]; then
  # 100K alone (batch 1): the state for 64 slots of 100K context would not fit beside the weights
  timeout ${PERF_TIMEOUT:-150} bin/dsv4 perf v4-0731 --load-format dummy --device cuda -tp 2 --batch 1 \
    --rows-per-seq 1 --context 4096 --warmup 1 --steps 2 --prefill 102400 2>&1 \
    | grep -v "CUDA graph for\|captured a graph" > "$OUTD/perf_tp2_43_100k.txt"
  echo "perf rc=${PIPESTATUS[0]}" >> "$OUTD/perf_tp2_43_100k.txt"
  grep -E "prefill|rc=|rror" "$OUTD/perf_tp2_43_100k.txt"
fi
