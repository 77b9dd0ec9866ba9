#!/usr/bin/env bash
# First run on an H100 (nvidia-h100-x1): CUDA checks (sm_90 build), the op harness's bandwidth probe,
# and dsv4 perf step times at 8 and 16 layers with the roofline at this GPU's measured streaming read.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/smi.txt 2>&1; cat $O/smi.txt
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 12 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
( timeout 150 bin/test_cuda_graphs > $O/cuda_graphs.txt 2>&1; echo "test_cuda_graphs rc=$?" >> $O/cuda_graphs.txt )
( timeout 200 bin/dsv4-gpu-ops > $O/gpu_ops.txt 2>&1; echo "dsv4-gpu-ops rc=$?" >> $O/gpu_ops.txt )
tail -2 $O/engine_model_cuda.txt $O/equiv.txt $O/conformance.txt $O/cuda_graphs.txt $O/gpu_ops.txt; grep -E "^measured|^device" $O/gpu_ops.txt
for L in 8 16; do
  timeout 220 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda \
    --batch 1,2,4,8,16,32,64 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids > $O/perf_L$L.txt 2>&1
  echo "perf L=$L rc=$?" >> $O/perf_L$L.txt
  grep -E "^#|^ *[0-9]+ |rc=" $O/perf_L$L.txt | grep -v "^# kv" 
done
