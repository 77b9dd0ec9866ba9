set -uo pipefail
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0
O='{"num_hidden_layers": 8}'
for m in 8 12 16 1000; do
  echo "== DSV4_CUDA_MOE_GEMM_MIN=$m"
  DSV4_CUDA_MOE_GEMM_MIN=$m timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$O" --device cuda --kv-cache-dtype f32 \
    --batch 16,32,48,64 --rows-per-seq 6 --context 4096 --warmup 2 --steps 5 2>&1 | grep -E " ids$"
done
