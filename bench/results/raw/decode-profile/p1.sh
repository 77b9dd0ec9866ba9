#!/usr/bin/env bash
# profile of the batch-1 decode / 6-row verify step: graph step times (8 and 24 layers) and an ncu per-kernel
# breakdown (time and DRAM bytes read) of one eager step at 8 layers
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
O=${OUT:-/tmp}; cp ../tools/ncu_agg.py /tmp/agg.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
for L in 8 24; do
  timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda \
    --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > $O/perf_L$L.txt
  echo "== perf L$L rc=${PIPESTATUS[0]}"; grep -vE "^\s*$" $O/perf_L$L.txt | tail -9
done
F='regex:^(?!k_fill|k_repack)'
for R in 1 6; do
  timeout 120 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name "$F" --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda --enforce-eager \
    --batch 1 --rows-per-seq $R --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_r$R.csv 2> $O/ncu_r$R.err
  echo "== ncu rows $R rc=$?"
  python3 /tmp/agg.py $O/ncu_r$R.csv 40 k_fp8_small > $O/ncuagg_r$R.txt 2>&1
  python3 /tmp/agg.py $O/ncu_r$R.csv 40 k_ > $O/ncuall_r$R.txt 2>&1
  head -44 $O/ncuagg_r$R.txt
done
gzip -f $O/ncu_r*.csv
