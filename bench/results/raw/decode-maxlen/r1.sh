#!/usr/bin/env bash
# decode cost vs --max-model-len: graph replays, and per-kernel times (ncu) of one static-shape eager step
set -uo pipefail
cd "$(dirname "$0")"; D=$(pwd)
. ../tests/gpu/gpu_env.sh
tar -xJf bin.tar.xz
O=$OUT; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > $O/env.txt
for ML in 8193 102401 1048576; do
  timeout 100 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda \
    --batch 1,4 --rows-per-seq 1,6 --context 4096 --max-model-len $ML --warmup 2 --steps 10 --logits ids 2>&1 \
    | grep -v "CUDA graph for\|captured a graph\|INFO" > $O/perf_ml$ML.txt
  echo "== ml $ML rc=${PIPESTATUS[0]}"; grep -E "^ *[0-9]+ +[0-9]" $O/perf_ml$ML.txt | head
done
for ML in 8193 1048576; do
  DSV4_PERF_PROFILE=1 timeout 150 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --log-file $O/ncu_ml$ML.csv bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' \
    --device cuda --static-shapes --batch 1 --rows-per-seq 1 --context 4096 --max-model-len $ML --warmup 1 --steps 1 \
    --logits ids > $O/ncu_run_ml$ML.txt 2>&1
  echo "== ncu ml $ML rc=$?"
  python3 - $O/ncu_ml$ML.csv <<'PY'
import csv,sys,collections
rows=list(csv.reader(open(sys.argv[1])))
h=None; agg=collections.defaultdict(lambda:[0,0.0])
for r in rows:
    if 'Kernel Name' in r: h=r; continue
    if not h or len(r)!=len(h): continue
    d=dict(zip(h,r))
    if d.get('Metric Name')!='gpu__time_duration.sum': continue
    k=d['Kernel Name'].split('(')[0][:70]; agg[k][0]+=1; agg[k][1]+=float(d['Metric Value'].replace(',',''))
tot=sum(v[1] for v in agg.values())
print(f"total {tot/1e3:.1f} us over {sum(v[0] for v in agg.values())} kernels")
for k,v in sorted(agg.items(),key=lambda x:-x[1][1])[:25]: print(f"{v[1]/1e3:9.1f} us {v[0]:4d}x  {k}")
PY
done
