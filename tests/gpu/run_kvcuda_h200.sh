#!/usr/bin/env bash
# --kv-cache-dtype on the CUDA backend (issue 7 + the state pool), one device
# call: (1) the attention-state conformance layouts with f32 / bf16 /
# fp8_ds_mla rows, CUDA vs the CPU codec (dsv4-gpu-conformance
# --layouts-only); (2) CPU == CUDA greedy tokens on the tiny checkpoints with
# each KV dtype (run_gpurun_h200.sh, perf skipped); (3) `dsv4 perf` on the
# real config (dummy weights, LAYERS layers) at batch 1 and 64, contexts 4096
# and 32768, per KV dtype; (4) the KV pool the serve start log reports per
# KV dtype at one --kv-cache-memory-bytes budget (KV_BYTES, default 16G; server
# killed once the log line is out).
# Runs from a folder holding bin/dsv4, bin/dsv4-gpu-conformance, lib/,
# models/tiny-{flash,dspark}, v4-0731/. Output: $OUT.
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
OUTD=${OUT:-/tmp/kvcuda-out}
mkdir -p "$OUTD"
L=${LAYERS:-8}
t0=$(date +%s)
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$OUTD/env.txt" 2>&1
timeout ${CONF_TIMEOUT:-60} "$D/bin/dsv4-gpu-conformance" --layouts-only > "$OUTD/conformance.txt" 2>&1
echo "conformance rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUTD/env.txt"
DIR="$D" OUT="$OUTD" SKIP_PERF=1 KVS="${KVS:-f32 bf16 fp8_ds_mla}" MAX_TOKENS=${MAX_TOKENS:-16} \
  timeout ${TOK_TIMEOUT:-60} bash "$D/run_gpurun_h200.sh" > /dev/null 2>&1
echo "tokens rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUTD/env.txt"
for ctx in ${CTXS:-4096 32768}; do
  for kv in ${PERF_KVS:-f32 bf16 fp8_ds_mla}; do
    timeout ${PERF_TIMEOUT:-40} "$D/bin/dsv4" perf "$D/v4-0731" --load-format dummy \
      --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda --kv-cache-dtype $kv \
      --batch 1,64 --rows-per-seq 1 --context $ctx --steps ${STEPS:-5} --warmup 2 >> "$OUTD/perf.txt" 2>&1
    echo "perf ctx $ctx kv $kv rc=$? at $(( $(date +%s) - t0 )) s" >> "$OUTD/env.txt"
  done
done
for kv in ${SERVE_KVS:-f32 bf16 fp8_ds_mla}; do
  "$D/bin/dsv4" serve "$D/v4-0731" --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" \
    --device cuda --port ${PORT:-8897} --max-model-len 32768 --max-num-seqs 64 --enforce-eager --kv-cache-dtype $kv \
    --kv-cache-memory-bytes ${KV_BYTES:-16G} \
    > "$OUTD/serve_$kv.log" 2>&1 &
  sp=$!
  for i in $(seq 1 ${SERVE_WAIT:-60}); do
    grep -q "KV pool" "$OUTD/serve_$kv.log" 2>/dev/null && break
    kill -0 $sp 2>/dev/null || break
    sleep 0.5
  done
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  { echo "== serve --kv-cache-dtype $kv"; grep -iE "KV pool|kv cache|pool" "$OUTD/serve_$kv.log" | head -5; } >> "$OUTD/serve.txt"
  rm -f "$OUTD/serve_$kv.log"
  echo "serve kv $kv at $(( $(date +%s) - t0 )) s" >> "$OUTD/env.txt"
done
