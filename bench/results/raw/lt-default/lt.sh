set -uo pipefail
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0
timeout 120 bin/dsv4-gpu-ops --prefill-check > $OUT/prefill_check.txt 2>&1; echo "prefill-check rc=$?"
grep -E "passed|failed|FAIL|cublasLt" $OUT/prefill_check.txt | head -30
O='{"num_hidden_layers": 8}'
for lt in 0 1; do
  DSV4_CUDA_FP8_LT=$lt timeout 90 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$O" --device cuda --kv-cache-dtype f32 \
    --batch 1,64 --rows-per-seq 1,6 --context 4096 --warmup 2 --steps 5 --prefill 8192,32768 2>&1 | grep -v "INFO\|CUDA graph for\|captured a graph" > $OUT/perf_lt$lt.txt
  echo "== DSV4_CUDA_FP8_LT=$lt"; grep -E "^ *1 |^ *64 |prefill" $OUT/perf_lt$lt.txt
done
unset DSV4_CUDA_FP8_LT
timeout 90 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$O" --device cuda --batch 1 --rows-per-seq 1 --context 4096 --warmup 1 --steps 2 --prefill 8192 2>&1 | grep -E "prefill" | sed 's/^/default (unset, fp8 rows): /'
