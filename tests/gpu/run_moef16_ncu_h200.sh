#!/usr/bin/env bash
# moef16 call 2: ncu sections of one gate/up and one down k_moe_gemm (8K prefill chunk), FP16 form vs FP8
# form (DSV4_CUDA_MOE_F16=1/0), and the 8K prefill of `dsv4 perf` repeated (new/old alternating) for noise.
set -uo pipefail
D=$(pwd)
G=$(cd "$(dirname "$0")" && pwd)
. "$G/gpu_env.sh"
O=${OUT:-/tmp/moef16-ncu}
mkdir -p "$O"
[ -d bin ] || tar -xJf bin.tar.xz
T0=$(date +%s)
t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
PO='{"num_hidden_layers": 3}'
for v in 1 0; do
  DSV4_CUDA_MOE_F16=$v timeout 100 ncu --clock-control none --kernel-name regex:k_moe_gemm --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section InstructionStats \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$PO" --device cuda --enforce-eager --batch 1 \
    --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --prefill 8192 > "$O/ncu_f16_$v.txt" 2>&1
  t "ncu f16=$v rc=$?"
  grep -E "k_moe_gemm|Duration|Executed Ipc Active|Issue Slots Busy|Eligible Warps Per|No Eligible|Executed Instructions  |Registers Per|Achieved Occupancy|Compute \(SM\) Throughput" "$O/ncu_f16_$v.txt" | cut -c1-110
done
PO8='{"num_hidden_layers": 8}'
for r in 1 2; do for v in 1 0; do
  DSV4_CUDA_MOE_F16=$v timeout 40 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$PO8" --device cuda \
    --batch 1 --rows-per-seq 1 --context 4096 --steps 2 --warmup 1 --prefill 8192 2>&1 | grep -E "^prefill" > "$O/prefill_r${r}_f16_$v.txt"
  t "prefill rep $r f16=$v: $(cut -c1-80 "$O/prefill_r${r}_f16_$v.txt")"
done; done
cd "$O" && gzip -f ncu_*.txt; true
