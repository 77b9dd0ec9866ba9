#!/usr/bin/env bash
# in-graph per-op times with DSV4_CUDA_OP_PROFILE=2 (stamp kernels after each op), batch 1, plain and 6-row verify
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
O=${OUT:-/tmp}
for L in 8 24; do for R in 1 6; do for M in 0 2; do
  DSV4_CUDA_OP_PROFILE=$M timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" \
    --device cuda --batch 1 --rows-per-seq $R --context 4096 --warmup 3 --steps 20 --logits ids > $O/st_L${L}_r${R}_m$M.txt 2>&1
  echo "== L$L rows $R profile=$M rc=$? $(grep -E '^1 +[16] ' $O/st_L${L}_r${R}_m$M.txt | awk '{print $4" ms "$8"x"}')"
  [ $M = 2 ] && grep "op stamps" $O/st_L${L}_r${R}_m$M.txt | tail -1 | sed 's/.*op stamps/op stamps/' | tr ';' '\n' | head -40
done; done; done
