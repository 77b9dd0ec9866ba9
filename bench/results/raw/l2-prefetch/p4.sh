#!/usr/bin/env bash
# does the L2 prefetch land? ncu (eager, caches not flushed) of the weight kernels with the prefetch off / on
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
O=${OUT:-/tmp}; cp ../tools/ncu_agg.py /tmp/agg.py
for V in "DSV4_CUDA_L2_PREFETCH=0" "DSV4_CUDA_L2_PREFETCH_BLOCKS=132" "DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_SIDE=0"; do
  tag=$(echo "$V" | tr -c 'A-Za-z0-9\n' '_' | cut -c1-60)
  env $V timeout 120 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name 'regex:k_fp8_small|k_rows_mma2|k_l2_prefetch|k_embed|k_bf16_gemv' --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda \
    --enforce-eager --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_$tag.csv 2> $O/ncu_$tag.err
  echo "== $V rc=$?"; tail -2 $O/ncu_$tag.err
  python3 /tmp/agg.py $O/ncu_$tag.csv 12 void > $O/agg_$tag.txt 2>&1; head -12 $O/agg_$tag.txt
  python3 /tmp/agg.py $O/ncu_$tag.csv 12 k_l2 | grep -A12 "launches of" | head -8
done
