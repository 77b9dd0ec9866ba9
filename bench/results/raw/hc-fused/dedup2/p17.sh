#!/usr/bin/env bash
# After hc_scale_pre (the pre weights, shared by k_hc_fin and k_hc_fused): CUDA checks and b1 steps.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 12 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -2 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -2 $O/conformance.txt
grep -E "hc_pre(_norm)? (y|post|comb)|hc_pre bit" $O/conformance.txt | head -12
timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
  --batch 1,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "^ *[0-9]+ " | tee $O/perf.txt
