#!/usr/bin/env bash
# FP16-mma expert kernels (issue 7, branch moef16) on one H200, in one device call:
#  1. dsv4-gpu-ops --moe --perf: the FP16 form == the FP8 form bit for bit (k_fp4 at decode sizes, every
#     grouped-GEMM tile shape), then both timed (decode 1..64 rows, prefill 256..8192 tokens);
#  2. dsv4 perf (8 layers, decode batch 1/8/64 x rows 1/6, prefill 8192): bin/dsv4-base (cuda_moe.cu of
#     9fb5884), this build with DSV4_CUDA_MOE_F16=0 (old kernels), this build as is;
#  3. in parallel: backend conformance, CPU == CUDA greedy tokens (run_gpurun_h200.sh, f32 rows),
#     dsv4-gpu-ops --prefill-check (every GEMM shape vs k_fp4 and the reference).
# Runs from a folder holding bin.tar.xz (or bin/), lib/, v4-0731/, models.tar.xz. Output: $OUT.
set -uo pipefail
D=$(pwd)
G=$(cd "$(dirname "$0")" && pwd)
. "$G/gpu_env.sh"
O=${OUT:-/tmp/moef16-out}
mkdir -p "$O"
[ -d bin ] || tar -xJf bin.tar.xz
[ -d models ] || tar -xJf models.tar.xz
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv; } > "$O/env.txt" 2>&1
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ -z "${SKIP_OPS:-}" ]; then
  timeout 80 bin/dsv4-gpu-ops --moe --perf > "$O/ops_moe.txt" 2>&1; t "gpu-ops --moe --perf rc=$?"
  grep -E "^(ok|FAIL)|correctness|^moe_fp4|^moe_pf.*(default|k_fp4)" "$O/ops_moe.txt" | cut -c1-120
fi
PO='{"num_hidden_layers": 8}'
for v in ${PERF_VARIANTS:-new old base}; do
  B=bin/dsv4; E=""
  [ $v = base ] && B=bin/dsv4-base
  [ $v = old ] && E="DSV4_CUDA_MOE_F16=0"
  env $E timeout 50 $B perf v4-0731 --load-format dummy --hf-overrides "$PO" --device cuda --batch 1,8,64 \
    --rows-per-seq 1,6 --context 4096 --steps 5 --warmup 2 --prefill 8192 2>&1 \
    | grep -v "INFO\|captured a graph\|CUDA graph for" > "$O/perf_$v.txt"
  t "perf $v rc=${PIPESTATUS[0]}"; grep -E "^ *(1|8|64) |prefill" "$O/perf_$v.txt" | cut -c1-110
done
if [ -z "${SKIP_CHECK:-}" ]; then
  ( timeout 110 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > "$O/conformance.txt" 2>&1
    echo "conformance rc=$?" >> "$O/conformance.txt" ) &
  ( KVS=f32 SKIP_PERF=1 OUT="$O/gpurun" timeout 110 bash "$G/run_gpurun_h200.sh" > "$O/gpurun.txt" 2>&1
    echo "gpurun rc=$?" >> "$O/gpurun.txt" ) &
  ( timeout 110 bin/dsv4-gpu-ops --prefill-check > "$O/prefill_check.txt" 2>&1
    echo "prefill-check rc=$?" >> "$O/prefill_check.txt" ) &
  wait; t "checks done"
  grep -E "summary|rc=" "$O/conformance.txt"; grep -E "FAIL|passed|rc=" "$O/prefill_check.txt"
  grep -hE "SAME|DIFFER|passed|rc=" "$O/gpurun.txt" "$O/gpurun/"*.txt 2>/dev/null | sort | uniq -c | head -20
fi
cd "$O" && tar -czf gpurun.tgz gpurun gpurun.txt 2>/dev/null && rm -rf gpurun gpurun.txt
gzip -f ops_moe.txt conformance.txt prefill_check.txt 2>/dev/null; true
