#!/usr/bin/env bash
# Decode fusions (issue 7) on one H200 (or H100), in one device call:
#  hc_post folded into the next hc_pre_norm (hc_post_pre_norm, DSV4_CUDA_HC_POSTFUSE) and the shared expert's
#  swiglu + add folded into its w2 (linear_swiglu_add, DSV4_CUDA_SHARED_FUSE). Both are off by default until
#  this has run (cuda_internal.cuh CU_*_DEFAULT).
#  1. with both on: CPU == CUDA greedy tokens on the tiny checkpoints (test_engine_model), CPU == CUDA ops
#     (test_device_equiv), op conformance at Flash shapes incl. the exact fused == unfused checks
#     ("hc_post_pre_norm ... (exact)", "linear_swiglu_add (exact)" lines);
#  2. graph step times, 24 layers, batch 1/2/8 x rows 1/6, both on vs both off (the kernels before, same bits),
#     alternating.
# Runs from a folder holding bin.tar.xz (or bin/), lib/, v4-0731/, models.tar.xz (+ models-lite.tar.xz for
# the real-vocabulary tokenizer). Output: $OUT.
set -uo pipefail
D=$(pwd)
G=$(cd "$(dirname "$0")" && pwd)
. "$G/gpu_env.sh"
O=${OUT:-/tmp/fusions-out}
mkdir -p "$O"
[ -d bin ] || tar -xJf bin.tar.xz
[ -d models ] || tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || [ ! -f models-lite.tar.xz ] || tar -xJf models-lite.tar.xz -C ..
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$O/env.txt"
export DSV4_CUDA_HC_POSTFUSE=1 DSV4_CUDA_SHARED_FUSE=1
( DSV4_TEST_DEVICE=cuda timeout 220 bin/test_engine_model > "$O/engine_model_cuda.txt" 2>&1; echo "test_engine_model (cuda) rc=$?" >> "$O/engine_model_cuda.txt" ) &
( timeout 220 bin/test_device_equiv > "$O/equiv.txt" 2>&1; echo "test_device_equiv rc=$?" >> "$O/equiv.txt" ) &
( timeout 250 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > "$O/conformance.txt" 2>&1; echo "conformance rc=$?" >> "$O/conformance.txt" ) &
wait
tail -2 "$O/engine_model_cuda.txt"; tail -2 "$O/equiv.txt"; tail -3 "$O/conformance.txt"; grep -c FAIL "$O/conformance.txt"
grep -E "hc_post_pre_norm|linear_swiglu_add|swiglu \+|hc_post \+" "$O/conformance.txt" | head -80
for F in 1 0 1 0; do
  echo "== perf fused=$F"
  DSV4_CUDA_HC_POSTFUSE=$F DSV4_CUDA_SHARED_FUSE=$F timeout 150 bin/dsv4 perf v4-0731 --load-format dummy \
    --hf-overrides '{"num_hidden_layers": 24}' --device cuda --batch 1,2,8 --rows-per-seq 1,6 --context 4096 \
    --warmup 3 --steps 20 --logits ids 2>&1 | grep -v "CUDA graph for\|captured a graph\|INFO" | grep -E "^ *[0-9]+ |rror" \
    | tee -a "$O/perf_$F.txt"
done
# 3 (STAMPS=1, a second call if the first ran long): per-op time inside the replayed batch-1 graph, both ways
if [ -n "${STAMPS:-}" ]; then
  for F in 1 0; do
    for R in 1 6; do
      echo "== op stamps fused=$F rows $R"
      DSV4_CUDA_HC_POSTFUSE=$F DSV4_CUDA_SHARED_FUSE=$F DSV4_CUDA_OP_PROFILE=2 timeout 90 bin/dsv4 perf v4-0731 \
        --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda --batch 1 --rows-per-seq $R \
        --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "op stamps" | tail -1 | cut -c1-600 \
        | tee -a "$O/stamps_$F.txt"
    done
  done
fi
