#!/usr/bin/env bash
# L2 weight prefetch, round 2: side stream vs PDL chain, bulk vs per-line, grid size; ncu of the prefetch kernel
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
[ -f ../models/default/tokenizer.json ] || tar -xJf models-lite.tar.xz -C ..
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 200 bin/test_device_equiv > $O/equiv.txt 2>&1; echo "test_device_equiv rc=$?" >> $O/equiv.txt ) &
wait
tail -1 $O/engine_model_cuda.txt; tail -2 $O/equiv.txt
pf() { local L=$1 tag=$2; shift 2
  env "$@" timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "{\"num_hidden_layers\": $L}" --device cuda \
    --batch 1,2,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|INFO" > $O/perf_L${L}_$tag.txt
  echo "== L$L $tag ($*) rc=${PIPESTATUS[0]}"; grep -E "^(1|2|8) +[16] " $O/perf_L${L}_$tag.txt | awk '{printf "%sx%s %s ms %sx | ", $1,$2,$4,$8} END {print ""}'
}
pf 8 off DSV4_CUDA_L2_PREFETCH=0
pf 8 side32 X=1
pf 8 side132 DSV4_CUDA_L2_PREFETCH_BLOCKS=132
pf 8 side8 DSV4_CUDA_L2_PREFETCH_BLOCKS=8
pf 8 lanes132 DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_LANES=1
pf 8 chain132 DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_SIDE=0
pf 8 side32mb24 DSV4_CUDA_L2_PREFETCH_MB=24
pf 8 exp132 DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_EXPERTS=1
pf 8 off2 DSV4_CUDA_L2_PREFETCH=0
grep -m3 "captured a graph" $O/perf_L8_side32.txt | cut -c1-200
for V in "X=1" "DSV4_CUDA_L2_PREFETCH_BLOCKS=132" "DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_SIDE=0" "DSV4_CUDA_L2_PREFETCH_BLOCKS=132 DSV4_CUDA_L2_PREFETCH_LANES=1"; do
  env $V timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --kernel-name regex:k_l2_prefetch \
    --csv --print-units base bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 2}' --device cuda \
    --enforce-eager --batch 1 --rows-per-seq 1 --context 4096 --steps 1 --warmup 0 --logits ids 2>/dev/null \
    | grep k_l2_prefetch | awk -F'","' '{print $(NF-2), $NF}' | head -6 | tr '\n' ' '; echo " <- ncu $V"
done
