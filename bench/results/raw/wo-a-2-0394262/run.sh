#!/usr/bin/env bash
# cudadot (issue 7, k_dot_rows): rows conformance + timings, perf after/before, CPU==CUDA tokens, full conformance
set -uo pipefail
cd "$(dirname "$0")"
D=$PWD; export LD_LIBRARY_PATH=$D/lib NCCL_NVLS_ENABLE=0
O=${OUT:-/tmp/o}; mkdir -p "$O"; L="$O/log.txt"; t0=$(date +%s)
el() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))s" >> "$L"; }
{ cat .commit; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv; } > "$L" 2>&1
PERF=(perf v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 8}' --device cuda --batch 1,8 --rows-per-seq 1,6 --context 4096 --steps 5 --prefill 4096)
timeout ${T_ROWS:-80} bin/dsv4-gpu-conformance --rows-only > "$O/rows.txt" 2>&1; el rows $?
timeout 50 bin/dsv4 "${PERF[@]}" > "$O/perf_after.txt" 2>&1; el perf_after $?
SKIP_PERF=1 DIR=$D OUT=$O timeout 50 bash run_gpurun_h200.sh > /dev/null 2>&1; el gpurun $?
[ -n "${BEFORE:-}" ] && timeout 50 bin-before/dsv4 "${PERF[@]}" > "$O/perf_before.txt" 2>&1; el perf_before $?
[ -z "${NO_CONF:-}" ] && { timeout 40 bin/dsv4-gpu-conformance --no-perf --no-rows > "$O/conformance.txt" 2>&1; el conformance $?; }
exit 0
