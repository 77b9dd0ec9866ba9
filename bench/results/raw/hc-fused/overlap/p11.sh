#!/usr/bin/env bash
# k_hc_fused (hc_pre / hc_pre_norm / hc_head in one launch below 16 rows) vs DSV4_CUDA_HC_FUSED=0 (the 2-3 kernels
# before). 1: correctness on CUDA (engine on the tiny checkpoints, CPU == CUDA ops, op conformance at Flash shapes
# with 4, 12 and 48 rows; the Sinkhorn warp overlapping y). 2: op stamps at batch 1. 3: graph step times, 24 layers.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 12 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -3 $O/conformance.txt; grep -c FAIL $O/conformance.txt
grep -i "hc_" $O/conformance.txt | head -24
for F in 1 0; do
  echo "== DSV4_CUDA_HC_FUSED=$F"
  for R in 1 6; do
    DSV4_CUDA_HC_FUSED=$F DSV4_CUDA_OP_PROFILE=2 timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
      --device cuda --batch 1 --rows-per-seq $R --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "op stamps" | tail -1 | cut -c1-400
  done
done
for F in 1 0 1 0; do
  echo "== perf DSV4_CUDA_HC_FUSED=$F"
  DSV4_CUDA_HC_FUSED=$F timeout 150 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
    --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -v "CUDA graph for\|captured a graph\|INFO" | grep -E "^ *[0-9]+ " | tee -a $O/perf_$F.txt
done
for F in 1 0; do
  DSV4_CUDA_HC_FUSED=$F timeout 120 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
    --kernel-name 'regex:k_hc_(fused|part_s|fin)' --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda --enforce-eager \
    --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_f$F.csv 2> $O/ncu_f$F.err
  echo "== ncu fused=$F rc=$?"
done
