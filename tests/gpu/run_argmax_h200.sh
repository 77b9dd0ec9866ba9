#!/usr/bin/env bash
# Greedy ids on the device (issue 7, backend logit_top) on one H200, in one
# call: the conformance harness (every CUDA op vs the CPU reference, logit_top
# included, + the logit_top timing), test_device_equiv (CPU == CUDA logits on
# the tiny checkpoints; forward_ids == host argmax of each backend's logits),
# `dsv4 run` greedy tokens CPU vs CUDA with the ids path on and off
# (DSV4_DEVICE_ARGMAX=0), and `dsv4 perf` on the real 0731 shapes (8 layers,
# dummy weights) timing each step with full logits and with ids only.
# Runs from a folder holding bin/{dsv4,dsv4-gpu-conformance,test_device_equiv}
# (built elsewhere with -DDSV4_CUDA=ON), lib/ (.so files the GPU machine
# lacks), v4-0731/ (config.json) and models/tiny-{flash,dspark}.
# Output: $OUT (or /tmp/argmax-out).
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
O=${OUT:-/tmp/argmax-out}
mkdir -p "$O"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>/dev/null; } \
  > "$O/env.txt" 2>&1
t0=$(date +%s)
timeout 60 "$D/bin/dsv4-gpu-conformance" --flash-rows 4 --flash-rows 48 --no-perf > "$O/conformance.txt" 2>&1
echo "conformance rc=$? $(( $(date +%s) - t0 )) s" >> "$O/env.txt"
timeout 60 "$D/bin/test_device_equiv" "$D/models/tiny-flash" "$D/models/tiny-dspark" > "$O/equiv.txt" 2>&1
echo "equiv rc=$? $(( $(date +%s) - t0 )) s" >> "$O/env.txt"
P=5,17,42,7,99,3,250,11,64,8
for m in tiny-flash:0 tiny-dspark:5; do
  n=${m%%:*}; k=${m##*:}
  a=$(timeout 30 "$D/bin/dsv4" run "$D/models/$n" --prompt-ids $P --max-tokens 24 --device cpu --kv-cache-dtype ${KV:-f32} --spec $k 2>/dev/null | tr -d '\n')
  b=$(timeout 30 "$D/bin/dsv4" run "$D/models/$n" --prompt-ids $P --max-tokens 24 --device cuda --kv-cache-dtype ${KV:-f32} --spec $k 2>/dev/null | tr -d '\n')
  c=$(DSV4_DEVICE_ARGMAX=0 timeout 30 "$D/bin/dsv4" run "$D/models/$n" --prompt-ids $P --max-tokens 24 --device cuda --kv-cache-dtype ${KV:-f32} \
      --spec $k 2>/dev/null | tr -d '\n')
  r=DIFFER; [ -n "$a" ] && [ "$a" = "$b" ] && [ "$b" = "$c" ] && r=SAME
  printf '%s spec=%s: %s\n  cpu            : %s\n  cuda ids       : %s\n  cuda full rows : %s\n' "$n" "$k" "$r" "$a" "$b" "$c"
done > "$O/tokens.txt" 2>&1
echo "tokens $(( $(date +%s) - t0 )) s" >> "$O/env.txt"
timeout 120 "$D/bin/dsv4" perf "$D/v4-0731" --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' \
  --device cuda --batch 1,8,64 --rows-per-seq 1,6 --context 4096 --steps 5 > "$O/perf.txt" 2>&1
echo "perf rc=$? $(( $(date +%s) - t0 )) s" >> "$O/env.txt"
