#!/usr/bin/env bash
# small-n FP8 linear with D chunks in flight per warp (DSV4_CUDA_FP8_DEPTH 1 = the old kernel's schedule, 2, 4 =
# default): correctness (conformance at D=4 and D=1 must agree line for line, CUDA engine tests, CPU == CUDA
# logits), decode / verify step times, ncu per launch
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}; cp ../tools/ncu_agg.py /tmp/agg.py
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
( timeout 200 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance.txt 2>&1; echo "conformance rc=$?" >> $O/conformance.txt ) &
( DSV4_CUDA_FP8_DEPTH=1 timeout 200 bin/dsv4-gpu-conformance --no-perf --flash-rows 4 --flash-rows 48 > $O/conformance_d1.txt 2>&1; echo "conformance rc=$?" >> $O/conformance_d1.txt ) &
wait
tail -1 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt; tail -3 $O/conformance.txt; tail -3 $O/conformance_d1.txt
diff <(grep -v "us\b\|GB/s\|rc=" $O/conformance.txt) <(grep -v "us\b\|GB/s\|rc=" $O/conformance_d1.txt) > $O/conformance_diff.txt; echo "conformance D4 vs D1 diff lines: $(wc -l < $O/conformance_diff.txt)"
pf() { local L=$1 tag=$2; shift 2
  env "$@" timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda \
    --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|INFO" > $O/perf_L${L}_$tag.txt
  echo "== L$L $tag ($*) rc=${PIPESTATUS[0]}"; grep -E "^(1|2|8) +[16] " $O/perf_L${L}_$tag.txt | awk '{printf "%sx%s %s ms %sx | ", $1,$2,$4,$8} END {print ""}'
}
pf 8 d1 DSV4_CUDA_FP8_DEPTH=1
pf 8 d4 X=1
pf 8 d2 DSV4_CUDA_FP8_DEPTH=2
pf 8 d4m2 DSV4_CUDA_FP8_MINCH=2
pf 8 d4m1 DSV4_CUDA_FP8_MINCH=1
pf 8 d1b DSV4_CUDA_FP8_DEPTH=1
pf 8 d4b X=1
pf 24 d1 DSV4_CUDA_FP8_DEPTH=1
pf 24 d4 X=1
for V in "DSV4_CUDA_FP8_DEPTH=1" "DSV4_CUDA_FP8_DEPTH=4"; do
  env $V timeout 120 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name 'regex:k_fp8_small|k_embed' --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda \
    --enforce-eager --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids > $O/ncu_$V.csv 2>/dev/null
  echo "== ncu $V rc=$?"; python3 /tmp/agg.py $O/ncu_$V.csv 6 void > $O/ncuagg_$V.txt; grep -A8 "launches" $O/ncuagg_$V.txt | head -7
done
