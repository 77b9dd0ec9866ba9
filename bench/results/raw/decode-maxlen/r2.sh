#!/usr/bin/env bash
# attention bounded by each row's own candidates: exactness (static vs position-sized), conformance, decode vs max_model_len
set -uo pipefail
cd "$(dirname "$0")"; D=$(pwd)
. ../tests/gpu/gpu_env.sh
rm -rf bin; tar -xJf bin.tar.xz
O=$OUT
( timeout 240 bin/dsv4-gpu-conformance --att-exact > $O/att_exact.txt 2>&1; echo "att-exact rc=$?" >> $O/att_exact.txt ) &
( timeout 200 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/att_exact.txt; grep -c "FAIL" $O/att_exact.txt; grep -B1 -A8 "shape-static" $O/att_exact.txt | head -40
tail -3 $O/conformance.txt
for ML in 8193 1048576; do
  timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
    --batch 1,4 --rows-per-seq 1,6 --context 4096 --max-model-len $ML --warmup 2 --steps 10 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > $O/perf_ml$ML.txt
  echo "== ml $ML rc=${PIPESTATUS[0]}"; grep -E "^ *[0-9]+ +[0-9]" $O/perf_ml$ML.txt | head
done
for ML in 131072; do
  timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
    --batch 16 --rows-per-seq 6 --context 4096 --max-model-len $ML --warmup 2 --steps 10 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > $O/perf16_ml$ML.txt
  echo "== b16 ml $ML rc=${PIPESTATUS[0]}"; grep -E "^ *[0-9]+ +[0-9]" $O/perf16_ml$ML.txt | head
done
