set -uo pipefail
D=$(pwd); export LD_LIBRARY_PATH="$D/lib"; export NCCL_NVLS_ENABLE=0
F='regex:^(?!k_fill|k_repack)'
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --kernel-name "$F" --csv --print-units base \
    bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' --device cuda --enforce-eager \
    --batch 64 --rows-per-seq 6 --context 4096 --steps 1 --warmup 0 > $OUT/ncu_v64.csv 2> $OUT/ncu_v64.err
echo "ncu rc=$?"; python3 agg.py $OUT/ncu_v64.csv > $OUT/agg_v64.txt; cat $OUT/agg_v64.txt; gzip $OUT/ncu_v64.csv
