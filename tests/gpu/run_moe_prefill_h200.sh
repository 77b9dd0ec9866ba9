#!/usr/bin/env bash
# Prefill-size GEMMs (issue 7: FP4 expert grouped GEMM, FP8 linear GEMM) on
# one H200, everything in one device call: op harness at prefill sizes (GEMM
# vs the decode kernels, sampled rows vs the reference, timings), the op
# harness with the GEMM forced for every size (+ compute-sanitizer on the tiny
# set), backend conformance, CPU == CUDA logits/tokens on the tiny
# checkpoints, and `dsv4 perf`: bin/dsv4-base (the commit before, if given),
# this build with the GEMMs turned off, this build as is.
# Runs from a folder holding bin/{dsv4,test_device_equiv,dsv4-gpu-ops,
# dsv4-gpu-conformance} (built elsewhere with -DDSV4_CUDA=ON), lib/ (the .so
# files the GPU machine lacks), models/tiny-{flash,dspark} and v4-0731/.
# Output: $OUT or /tmp/moe-prefill-out. Env: STEPS (which parts, default all).
set -uo pipefail
D=$(pwd)
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
O=${OUT:-/tmp/moe-prefill-out}
mkdir -p "$O"
STEPS=${STEPS:-prefill perf equiv conf forced confgemm}
FORCE="DSV4_CUDA_MOE_GEMM_MIN=0 DSV4_CUDA_FP8_GEMM_MIN=9"
OLD="DSV4_CUDA_MOE_GEMM_MIN=1000000 DSV4_CUDA_FP8_GEMM_MIN=1000000"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>/dev/null; } \
  > "$O/env.txt" 2>&1
t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
T0=$(date +%s)
PERF="v4-0731 --load-format dummy --hf-overrides {\"num_hidden_layers\":8} --device cuda --batch 1,8 --rows-per-seq 1,6 --context 4096 --steps 5 --prefill 4096"
for s in $STEPS; do
  case $s in
  prefill)
    timeout 120 bin/dsv4-gpu-ops --prefill > "$O/gpu_ops_prefill.txt" 2>&1; t "prefill rc=$?"
    grep -E "^(ok|FAIL)|^fp8_pf|^moe_pf|passed" "$O/gpu_ops_prefill.txt" ;;
  perf) # base: bin/dsv4-base (the commit before, when present); old: this build, GEMMs off
    for v in ${PERF_VARIANTS:-base old new}; do
      B=bin/dsv4; E=""
      if [ $v = base ]; then B=bin/dsv4-base; [ -x $B ] || continue; fi
      if [ $v = old ]; then E=$OLD; fi
      env $E timeout 100 $B perf $PERF > "$O/perf_$v.txt" 2>&1; t "perf $v rc=$?"
      grep -E "^[0-9]|prefill chunk" "$O/perf_$v.txt"
    done ;;
  conf)
    timeout 60 bin/dsv4-gpu-conformance --no-perf > "$O/conformance.txt" 2>&1; t "conformance rc=$?"
    grep -iE "moe|linear|fail|summary|passed" "$O/conformance.txt" | tail -15 ;;
  confgemm)
    env $FORCE timeout 60 bin/dsv4-gpu-conformance --no-perf > "$O/conformance_gemm_forced.txt" 2>&1
    t "conformance (GEMM forced) rc=$?"; tail -3 "$O/conformance_gemm_forced.txt" ;;
  equiv)
    timeout 100 bin/test_device_equiv models/tiny-flash models/tiny-dspark > "$O/equiv.txt" 2>&1
    t "test_device_equiv rc=$?"; tail -6 "$O/equiv.txt" ;;
  forced)
    env $FORCE timeout 45 bin/dsv4-gpu-ops > "$O/gpu_ops_gemm_forced.txt" 2>&1; t "gpu-ops GEMM forced rc=$?"
    grep -E "FAIL|passed" "$O/gpu_ops_gemm_forced.txt" | tail -5
    if command -v compute-sanitizer > /dev/null; then
      env $FORCE timeout 40 compute-sanitizer --tool memcheck bin/dsv4-gpu-ops --tiny > "$O/sanitizer_gemm.txt" 2>&1
      t "compute-sanitizer memcheck --tiny (GEMM forced) rc=$?: $(grep -E 'ERROR SUMMARY' "$O/sanitizer_gemm.txt")"
    fi ;;
  esac
done
