#!/usr/bin/env bash
# ncu: k_hc_fused vs the kernels before (k_hc_part_s, k_hc_fin, k_rmsnorm*), batch 1, 4 layers eager; stall reasons of k_hc_fused
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
O=${OUT:-/tmp}
for F in 1 0; do
  DSV4_CUDA_HC_FUSED=$F timeout 120 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name 'regex:k_hc|k_rmsnorm' --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda --enforce-eager \
    --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_f$F.csv 2> $O/ncu_f$F.err
  echo "== ncu fused=$F rc=$?"
  python3 - $O/ncu_f$F.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value")
t = collections.defaultdict(list)
for r in rows[1:]:
    if r[mi] == "gpu__time_duration.sum": t[r[ki].split("(")[0].split("<")[0]].append(float(r[vi]))
for k, v in t.items(): print(f"  {k:30s} n={len(v):3d} mean {sum(v)/len(v)/1e3:7.2f} us  min {min(v)/1e3:7.2f}")
PY
done
DSV4_CUDA_HC_FUSED=1 timeout 120 ncu --clock-control none --cache-control none --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section MemoryWorkloadAnalysis --kernel-name 'regex:k_hc_fused' --launch-skip 4 --launch-count 1 \
  bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda --enforce-eager \
  --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_stall.txt 2>&1
echo "== stall rc=$?"; grep -E "Stall|Duration|Warp Cycles|Active Warps|Issued|Eligible|Memory Throughput|L2 Hit|Block Size|Grid Size" $O/ncu_stall.txt | head -40
