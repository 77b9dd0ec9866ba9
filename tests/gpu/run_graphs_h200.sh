#!/usr/bin/env bash
# CUDA graphs (issue 7) on the GPU: graph replay vs eager logits on the tiny
# checkpoints (test_cuda_graphs), greedy tokens with and without graphs, then
# `dsv4 perf` eager vs graphs on dummy real-shape weights.
# Runs from a folder holding bin/{dsv4,test_cuda_graphs} (built with
# -DDSV4_CUDA=ON), lib/ (the .so files the GPU machine lacks), models/tiny-*,
# configs/. Output: $OUT or /tmp/graphs-out. Env: PERF_ARGS, DUMMY_LAYERS.
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
BIN=$D/bin/dsv4
OUTD=${OUT:-/tmp/graphs-out}
mkdir -p "$OUTD"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv 2>/dev/null; } 2>&1 | tee "$OUTD/env.txt"
timeout 120 "$D/bin/test_cuda_graphs" "$D/models/tiny-flash" "$D/models/tiny-dspark" 2>&1 | tee "$OUTD/equal.txt"
fail=${PIPESTATUS[0]}
# real shapes (dummy weights, 4 layers) at three state capacities
for ml in 80 4096 65536; do
  DSV4_TEST_DUMMY_LAYERS=4 DSV4_TEST_MAX_LEN=$ml timeout 100 "$D/bin/test_cuda_graphs" "$D/configs/deepseek-v4-flash" \
    2>&1 | grep -v "INFO dsv4: \(device\|--hf\|dummy\|KV\)" || fail=1
done 2>&1 | tee -a "$OUTD/equal.txt"
P=5,17,42,7,99,3,250,11,64,8
for m in tiny-flash tiny-dspark; do
  k=1; [ "$m" = tiny-dspark ] && k=5
  for spec in 0 $k; do
    a=$(timeout 60 "$BIN" run "$D/models/$m" --prompt-ids $P --max-tokens 24 --device cuda --spec $spec --enforce-eager 2>/dev/null | tr -d '\n')
    b=$(timeout 60 "$BIN" run "$D/models/$m" --prompt-ids $P --max-tokens 24 --device cuda --spec $spec 2>"$OUTD/run_${m}_$spec.err" | tr -d '\n')
    [ -n "$a" ] && [ "$a" = "$b" ] && r=SAME || r=DIFFER
    echo "$m spec=$spec eager vs graphs: $r"; echo "  eager : $a"; echo "  graphs: $b"
  done
done 2>&1 | tee "$OUTD/tokens.txt"
L=${DUMMY_LAYERS:-8}
for g in --enforce-eager "" ; do
  echo "== ${g:-graphs (default)}"
  timeout ${PERF_TIMEOUT:-100} "$BIN" perf "$D/configs/deepseek-v4-flash" --load-format dummy \
    --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda $g \
    ${PERF_ARGS:---batch 1,8,64 --rows-per-seq 1 --context 4096 --steps 10 --warmup 2} 2>&1
done | tee "$OUTD/perf_dummy.txt"
for g in --enforce-eager "" ; do
  echo "== ${g:-graphs (default)}"
  timeout 60 "$BIN" perf "$D/models/tiny-dspark" --device cuda $g --batch 1,8,64 --rows-per-seq 1,6 --context 512 \
    --steps 10 --warmup 2 2>&1
done | tee "$OUTD/perf_tiny.txt"
exit $fail
