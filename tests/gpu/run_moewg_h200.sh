#!/usr/bin/env bash
# Warpgroup-MMA grouped expert GEMM (issue 7, branch moewg) on one H200, in one device call:
#  1. dsv4-gpu-ops --moe-wg --perf: k_moe_wg (DSV4_CUDA_MOE_WG=1..6, cuda_moe.cu moe_wg_variant) vs
#     k_moe_gemm (=0) by normalised error and vs the reference on sampled rows, n = 64..8192; then the
#     whole MoE op timed with each at 256..8192 tokens (graph replay);
#     if any check fails: the small cases again under compute-sanitizer (memcheck);
#  2. dsv4-gpu-ops --prefill-check with DSV4_CUDA_MOE_WG = 3, 6 (the default path at 4096/8192 tokens vs the
#     reference and the decode kernels);
#  3. dsv4 perf, 8 layers, one 8192-token prefill chunk, with DSV4_CUDA_MOE_WG = 0..6 (0, 3, 6 twice).
# Runs from a folder holding bin.tar.xz (or bin/), lib/, v4-0731/. Output: $OUT.
set -uo pipefail
D=$(pwd)
G=$(cd "$(dirname "$0")" && pwd)
. "$G/gpu_env.sh"
O=${OUT:-/tmp/moewg-out}
mkdir -p "$O"
[ -d bin ] || tar -xJf bin.tar.xz
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv; } > "$O/env.txt" 2>&1
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout ${OPS_T:-90} bin/dsv4-gpu-ops --moe-wg --perf > "$O/ops_wg.txt" 2>&1; rc=$?; t "gpu-ops --moe-wg --perf rc=$rc"
grep -E "correctness|^moe_pf" "$O/ops_wg.txt" | cut -c1-125
grep -E "^(ok|FAIL).*n=8192" "$O/ops_wg.txt" | cut -c1-125
grep -E "^FAIL" "$O/ops_wg.txt" | grep -v "n=8192" | cut -c1-125
if grep -qE "FAIL.*ref rows|NON-FINITE" "$O/ops_wg.txt"; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$CS" ] && timeout 60 "$CS" --tool memcheck bin/dsv4-gpu-ops --moe-wg --tiny > "$O/sanitizer.txt" 2>&1
  t "sanitizer rc=$?"; grep -E "ERROR SUMMARY|Invalid|^(ok|FAIL)" "$O/sanitizer.txt" | head -12
fi
for v in ${CHECK_VARIANTS:-3 6}; do
  DSV4_CUDA_MOE_WG=$v timeout 60 bin/dsv4-gpu-ops --prefill-check > "$O/prefill_check$v.txt" 2>&1
  t "prefill-check (DSV4_CUDA_MOE_WG=$v) rc=$?"; grep -E "FAIL|moe_prefill.*(8192|4096)|passed" "$O/prefill_check$v.txt" | cut -c1-150
done
PO='{"num_hidden_layers": 8}'
for v in ${PERF_VARIANTS:-0 1 2 3 4 5 6 0 3 6}; do
  DSV4_CUDA_MOE_WG=$v timeout 40 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$PO" --device cuda \
    --batch 1 --rows-per-seq 1 --context 4096 --steps 2 --warmup 1 --prefill 8192 2>&1 \
    | grep -v "INFO\|captured a graph\|CUDA graph for" >> "$O/perf_wg$v.txt"
  t "perf wg=$v rc=${PIPESTATUS[0]}"; grep -E "prefill" "$O/perf_wg$v.txt" | tail -1 | cut -c1-150
done
cd "$O" && tar -czf perf.tgz perf_wg*.txt && rm -f perf_wg*.txt; gzip -f ops_wg.txt prefill_check*.txt sanitizer.txt 2>/dev/null; true
