#!/usr/bin/env bash
# Indexer scores on the tensor cores (k_idx_scores_tc, src/backend/cuda/cuda_indexer.cu), one H200:
#  1. correctness: dsv4-gpu-conformance --no-perf (indexer_select on random q = the scalar fallback, and on
#     Hadamard + FP4 q = the tensor cores, incl. the 1x2048 prefill chunk); QUICK=1: --layouts-only;
#  2. kernel time: ncu over the k_idx* kernels of one 8192-token prefill (4 layers) and decode steps,
#     tensor cores with 2 rows per block (default), 4 rows per block (DSV4_CUDA_IDX_TC=4) and the scalar
#     kernel (DSV4_CUDA_IDX_TC=0), same binary;
#  3. end to end: dsv4 perf, 8 layers, prefill 8192 and 32768, bin/dsv4.before (main) vs bin/dsv4
#     (skipped with QUICK=1).
# Runs from a folder holding bin/ (dsv4, dsv4.before, dsv4-gpu-conformance), lib/, v4-0731/. Output: $OUT.
set -uo pipefail
D=$(pwd)
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
O=${OUT:-/tmp/idxtc-out}
mkdir -p "$O"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; } > "$O/env.txt" 2>&1
CF=--no-perf
[ -n "${QUICK:-}" ] && CF=--layouts-only
timeout 150 bin/dsv4-gpu-conformance $CF > "$O/conformance.txt" 2>&1
echo "conformance $CF rc=$?" | tee -a "$O/conformance.txt"
grep -E "^== |indexer_select|FAIL|ERROR|summary" "$O/conformance.txt" | grep -B1 -E "indexer_select|FAIL|ERROR|summary" |
  grep -vE "^--" | cut -c1-150
AGG='import csv,sys
r=list(csv.reader(open(sys.argv[1]))); h=next(x for x in r if x and x[0]=="ID")
k,v,g=h.index("Kernel Name"),h.index("Metric Value"),h.index("Grid Size")
for x in r:
    if len(x)>v and x[0].isdigit(): print(f"  {x[k].split(chr(40))[0][:28]:28s} grid {x[g]:16s} {float(x[v].replace(chr(44),chr(32)).replace(chr(32),str()))/1e3:9.1f} us")'
for tc in 2 4 0; do
  DSV4_CUDA_IDX_TC=$tc timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --kernel-name 'regex:k_idx' \
    --csv --print-units base bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 4}' \
    --device cuda --enforce-eager --kv-cache-dtype f32 --batch 1,64 --rows-per-seq 1 --context 4096 --steps 1 \
    --warmup 0 --prefill 8192 > "$O/ncu_tc$tc.csv" 2> "$O/ncu_tc$tc.err"
  echo "ncu DSV4_CUDA_IDX_TC=$tc rc=$? (k_idx* kernels: 8192-token prefill, decode at batch 1 and 64)"
  python3 -c "$AGG" "$O/ncu_tc$tc.csv"
done
gzip -f "$O"/ncu_tc*.csv
if [ -z "${QUICK:-}" ]; then
  for b in dsv4.before dsv4; do
    timeout 100 bin/$b perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda \
      --kv-cache-dtype f32 --batch 1 --rows-per-seq 1 --context 4096 --warmup 2 --steps 3 --prefill 8192,32768 \
      2>&1 | grep -v "CUDA graph for\|captured a graph\|INFO" > "$O/perf_$b.txt"
    echo "== perf bin/$b rc=${PIPESTATUS[0]}"; grep -E "^ *1 |prefill|rror" "$O/perf_$b.txt"
  done
fi
