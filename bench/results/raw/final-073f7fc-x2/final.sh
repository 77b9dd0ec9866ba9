#!/usr/bin/env bash
# Final check of merged main on 2x H200: TP2 whole model first (most important), then correctness, then serve.
set -uo pipefail
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nd=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null); [ -n "$nd" ] && export DSV4_NCCL_LIB="$nd/lib/libnccl.so.2"
{ cat .commit; date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "NCCL=$DSV4_NCCL_LIB"; } > $OUT/env.txt 2>&1
# 1. 43 layers, TP=2, dummy weights: step times + chunked prefill
timeout 150 bin/dsv4 perf v4-0731 --load-format dummy --device cuda -tp 2 --batch 1,2,4,8,16,32,64 --rows-per-seq 1,6 \
  --context 4096 --warmup 2 --steps 5 --prefill 8192,32768 2>&1 | grep -v "INFO dsv4: forward: CUDA graph\|captured a graph" > $OUT/perf_tp2_43.txt
echo "perf rc=${PIPESTATUS[0]}" >> $OUT/perf_tp2_43.txt; grep -v INFO $OUT/perf_tp2_43.txt
# 2. TP2 token equality on the small dummy config + single-GPU conformance / tiny tokens
SKIP_PERF=1 SKIP_SERVE=1 OUT=$OUT/tp2 timeout 100 bash run_tp2_h200.sh > /dev/null 2>&1; grep -h "spec=" $OUT/tp2/tokens.txt
timeout 60 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $OUT/conformance.txt 2>&1; echo "conformance rc=$?" | tee -a $OUT/conformance.txt
SKIP_PERF=1 OUT=$OUT/gpurun timeout 90 bash run_gpurun_h200.sh > /dev/null 2>&1; grep -hE "SAME|DIFFER|passed" $OUT/gpurun/tokens.txt $OUT/gpurun/equiv.txt
# 3. serve TP2: start to ready, first request vs warm
SKIP_TINY=1 SKIP_PERF=1 OUT=$OUT/serve timeout 120 bash run_tp2_h200.sh > /dev/null 2>&1; cat $OUT/serve/requests_tp2.txt 2>/dev/null | head -12
grep -h "KV cache pool" $OUT/serve/serve_tp2.log | head -2
