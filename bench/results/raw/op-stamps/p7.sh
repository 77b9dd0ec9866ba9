#!/usr/bin/env bash
# DSV4_CUDA_OP_PROFILE=2 after the stream fix (dd571a7): 24 layers batch 1, plain and 6-row verify
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
for R in 1 6; do
  DSV4_CUDA_OP_PROFILE=2 timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' \
    --device cuda --batch 1 --rows-per-seq $R --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 | grep -E "op stamps|^1 +[16] " | tail -3
done
