#!/usr/bin/env bash
# The issue-7 checks that fit ONE H200 (when the two-GPU machine is not lent), in one device call:
#  1. correctness: every CUDA op vs the CPU op, CPU == CUDA greedy tokens on the tiny checkpoints (f32 rows),
#     teacher-forced logits (run_gpurun_h200.sh);
#  2. prefill throughput at 8K context against the layer count (does the per-layer cost stay flat from 8 to
#     LBIG layers?) and KV-row dtype (f32 vs fp8_ds_mla: the prefill regression of 2026-12-01-merged-tp2);
#     decode at batch 1 and 64 beside it;
#  3. serve LBIG layers on one GPU at --max-model-len 1048576: the memory-capped pool, start to ready, first
#     request after ready vs warm, 2N concurrent requests (serve_concurrency.py).
# Runs from a folder holding bin/ (dsv4, dsv4-gpu-conformance, test_device_equiv; -DDSV4_CUDA=ON), lib/,
# v4-0731/, configs/, models/ or models.tar.xz. Output: $OUT. Env: SKIP_CHECK, SKIP_PERF, SKIP_SERVE,
# LAYERS (perf layer counts, default "8 24"), LBIG (serve layers, default 24), KVS_PERF (default "fp8_ds_mla f32"),
# PREFILL (prompt lengths, default 8192), SERVE_EXTRA (more `dsv4 serve` flags, e.g. --gpu-memory-utilization 0.98;
# the GPU memory in use is sampled every 0.5 s while the server runs and its peak printed). bin/ and models/ may travel as bin.tar.xz / models.tar.xz.
set -uo pipefail
D=${DIR:-$(pwd)}
G=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
OUTD=${OUT:-/tmp/single-out}
mkdir -p "$OUTD"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; } > "$OUTD/env.txt" 2>&1
cd "$D" || exit 1
[ -d models ] || { [ -f models.tar.xz ] && tar -xJf models.tar.xz; }  # the carry limit: these travel packed
[ -d bin ] || { [ -f bin.tar.xz ] && tar -xJf bin.tar.xz; }
LBIG=${LBIG:-24}
if [ -z "${SKIP_CHECK:-}" ]; then
  ( timeout 120 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 \
      > "$OUTD/conformance.txt" 2>&1; echo "conformance rc=$?" >> "$OUTD/conformance.txt" ) &
  ( KVS=f32 SKIP_PERF=1 OUT="$OUTD/gpurun" timeout 150 bash "$G/run_gpurun_h200.sh" > "$OUTD/gpurun.txt" 2>&1 ) &
  # the engine's "batched == single" tests (plain, DSpark, MTP, chunked prefill) on the CUDA backend
  ( [ -x bin/test_engine_model ] && DSV4_TEST_DEVICE=cuda timeout 150 bin/test_engine_model \
      > "$OUTD/engine_model_cuda.txt" 2>&1; echo "test_engine_model (cuda) rc=$?" >> "$OUTD/engine_model_cuda.txt" ) &
  wait
  tail -2 "$OUTD/engine_model_cuda.txt"
  tail -3 "$OUTD/conformance.txt"
  grep -hE "SAME|DIFFER|passed" "$OUTD/gpurun/tokens.txt" "$OUTD/gpurun/equiv.txt" 2>/dev/null
fi
if [ -z "${SKIP_PERF:-}" ]; then
  for L in ${LAYERS:-8 24}; do
    for kv in ${KVS_PERF:-fp8_ds_mla f32}; do
      f="$OUTD/perf_L${L}_$kv.txt"
      timeout 120 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" \
        --device cuda --kv-cache-dtype "$kv" --batch 1,64 --rows-per-seq 1 --context 4096 --warmup 2 --steps 5 \
        --prefill "${PREFILL:-8192}" 2>&1 | grep -v "CUDA graph for\|captured a graph\|INFO" > "$f"
      echo "== L=$L kv=$kv rc=${PIPESTATUS[0]}"; grep -E "^ *1 |^ *64 |prefill|rror" "$f"
    done
  done
fi
if [ -z "${SKIP_SERVE:-}" ]; then
  PORT=${PORT:-8897}
  bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $LBIG}" --device cuda \
    --port "$PORT" --max-model-len 1048576 --max-num-seqs 32 \
    --speculative-config '{"method":"dspark","num_speculative_tokens":5}' ${SERVE_EXTRA:-} > "$OUTD/serve_L$LBIG.log" 2>&1 &
  SP=$!
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 500 > "$OUTD/serve_mem.csv" 2>/dev/null &
  MP=$!
  timeout 150 python3 "$G/serve_concurrency.py" "$PORT" 8 48 2>&1 | tee "$OUTD/serve_concurrency.txt"
  echo "serve check rc=${PIPESTATUS[0]} (\"start to ready\" counts from the server's launch)"
  kill "$SP" 2>/dev/null; sleep 3; kill -9 "$SP" 2>/dev/null; kill "$MP" 2>/dev/null
  sort -n "$OUTD/serve_mem.csv" | tail -1 | awk -F, '{print "serve: peak GPU memory in use " $1 " of " $2 " MiB"}'
  grep -hE "KV cache pool|ready:|ERROR|WARN|graphs|concurrency" "$OUTD/serve_L$LBIG.log" | head -12
fi
# only a few files come back from the device tool: pack the outputs into one archive
if [ -n "${PACK:-1}" ] && [ "${PACK:-1}" != 0 ]; then
  tgz=$(mktemp /tmp/single-results.XXXXXX)
  (cd "$OUTD" && tar -czf "$tgz" . && rm -rf ./* && mv "$tgz" single-results.tar.gz)
fi
