#!/usr/bin/env bash
# H100, second call: prefill rates at 16 layers, then serve at 12 layers (16 + the three DSpark stages do not fit 80 GB) (dummy weights, DSpark k=5):
# start to ready, the first requests right after ready against warm ones.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
O=${OUT:-/tmp}
timeout 200 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 16}' --device cuda \
  --batch 1 --rows-per-seq 1 --context 4096 --warmup 3 --steps 20 --logits ids --prefill 8192,32768 > $O/perf_prefill_L16.txt 2>&1
echo "rc=$?" >> $O/perf_prefill_L16.txt; grep -E "^#|^ *[0-9]+ |prefill|rc=" $O/perf_prefill_L16.txt | grep -v "^# kv"
OUT=$O LAYERS=12 PORT=8899 timeout 300 bash ../tests/gpu/run_serve_dummy_h200.sh > $O/serve_run.txt 2>&1
echo "serve script rc=$?" >> $O/serve_run.txt
grep -vE "^ *[0-9]+ +[0-9]+ " $O/serve_run.txt | tail -40
