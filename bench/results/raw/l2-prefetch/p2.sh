#!/usr/bin/env bash
# L2 weight prefetch (cuda_prefetch.cu) A/B: correctness on the tiny checkpoints (CUDA engine tests, CPU == CUDA
# logits, op conformance), then decode / verify step times with DSV4_CUDA_L2_PREFETCH default (64) vs 0, and caps
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 200 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
wait
tail -1 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -3 $O/conformance.txt
pf() { local L=$1 tag=$2; shift 2
  env "$@" timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda \
    --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > $O/perf_L${L}_$tag.txt
  echo "== L$L $tag ($*) rc=${PIPESTATUS[0]}"; grep -E "^(1|2|8) +[16] " $O/perf_L${L}_$tag.txt | awk '{printf "%sx%s %s ms %sx | ", $1,$2,$4,$8} END {print ""}'
}
pf 8 off DSV4_CUDA_L2_PREFETCH=0
pf 8 on X=1
pf 8 mb24 DSV4_CUDA_L2_PREFETCH_MB=24
pf 8 mb64 DSV4_CUDA_L2_PREFETCH_MB=64
pf 8 off2 DSV4_CUDA_L2_PREFETCH=0
pf 8 on2 X=1
pf 24 off DSV4_CUDA_L2_PREFETCH=0
pf 24 on X=1
