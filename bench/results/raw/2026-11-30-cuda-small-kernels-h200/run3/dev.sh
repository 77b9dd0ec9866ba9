#!/usr/bin/env bash
set -u
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0
{ echo "commit: $(cat .commit)"; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv; which ncu; } > $OUT/env.txt 2>&1
t0=$(date +%s)
timeout 100 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $OUT/conformance_after.txt 2>&1; echo "conf after rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/env.txt
SKIP_PERF=1 OUT=$OUT/gr DIR=$D timeout 50 bash tests/gpu/run_gpurun_h200.sh > $OUT/gpurun.txt 2>&1; echo "gpurun rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/env.txt
rm -rf $OUT/gr
PA='--load-format dummy --device cuda --batch 1,8 --rows-per-seq 1,6 --context 4096 --steps 5 --prefill 4096'
timeout 55 bin/dsv4 perf v4-0731 --hf-overrides '{"num_hidden_layers": 8}' $PA > $OUT/perf_after.txt 2>&1; echo "perf after rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/env.txt
F='regex:^(k_hc|k_route|k_rmsnorm|k_qat_fp8|k_win_store|k_cmp_ring|k_rope)'
timeout 70 ncu --clock-control none --metrics gpu__time_duration.sum --kernel-name "$F" --csv --print-units base \
  bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda --enforce-eager \
  --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --prefill 4096 > $OUT/ncu_b1.csv 2> $OUT/ncu_b1.err; echo "ncu rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/env.txt
cat $OUT/env.txt
