#!/usr/bin/env bash
# Build the GPU op harness with nvcc alone (the GPU machine has no cJSON /
# PCRE2 / libmicrohttpd, so not through CMake), run it under
# compute-sanitizer at tiny shapes, then in correctness + perf mode.
# Output goes to $OUT (the device tool's folder) or /tmp/gpuops-out.
# Usage: tests/gpu/run_h200.sh [harness args, default --perf]
# Env: COMPARE=0 skips the comparison runs (PDL off; MoE variants in MOE_VARIANTS);
#      PREFILL=1 adds dsv4-gpu-ops --prefill (tiled GEMMs at prefill sizes);
#      NCU=1 adds an ncu profile of --profile (mind the kernel regex).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTD=${OUT:-/tmp/gpuops-out}
B=/tmp/gpuops
ARCH=${ARCH:-90}
mkdir -p "$OUTD" "$B"
{ echo "commit: $(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; date -u;
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv;
  nvcc --version | tail -2; } | tee "$OUTD/env.txt"
t0=$(date +%s)
for f in src/backend/cuda/*.cu; do
  n=$(basename "$f" .cu)
  nvcc -std=c++17 -O3 -arch=sm_$ARCH -Iinclude -Isrc -Xptxas -v -c "$f" -o "$B/$n.o" 2> "$B/$n.ptxas" &
done
wait
cat "$B"/*.ptxas > "$OUTD/ptxas.txt"
gcc -std=c11 -O2 -fopenmp -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -I/usr/local/cuda/include \
    -c tests/gpu/gpu_ops.c -o "$B/gpu_ops.o" || exit 1
nvcc -arch=sm_$ARCH "$B"/*.o -o "$B/dsv4-gpu-ops" -lcublas -lcublasLt -lgomp || { grep -i error "$OUTD/ptxas.txt"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck "$B/dsv4-gpu-ops" --tiny > "$OUTD/sanitizer.txt" 2>&1
  echo "compute-sanitizer memcheck --tiny: rc=$? $(grep -E 'ERROR SUMMARY' "$OUTD/sanitizer.txt")"
fi
"$B/dsv4-gpu-ops" "${@:---perf}" 2>&1 | tee "$OUTD/gpu_ops.txt"
# prefill sizes (PREFILL=1): MoE 1365/4096/8192 tokens with skewed routing, FP8 linears to n=4096,
# tiled GEMMs vs the decode kernels (correctness, then timings of every tile shape)
[ -n "${PREFILL:-}" ] && "$B/dsv4-gpu-ops" --prefill 2>&1 | tee "$OUTD/gpu_ops_prefill.txt"
if [ -n "${NCU:-}" ] && command -v ncu >/dev/null; then
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section LaunchStats -k "regex:^(k_fp4|k_fp8|k_route|k_moe|k_act)" "$B/dsv4-gpu-ops" --profile \
      > "$OUTD/ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -E "k_fp4|k_fp8|k_route|k_moe|k_act|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall" "$OUTD/ncu.txt" | head -150
fi
# comparisons: PDL off; MoE variants (one-wave persistent kernels; activations quantised in-kernel)
if [ "${1:-}" = "--perf" ] && [ "${COMPARE:-1}" != 0 ]; then
  DSV4_CUDA_NO_PDL=1 "$B/dsv4-gpu-ops" --perf-only > "$OUTD/gpu_ops_nopdl.txt" 2>&1
  echo; echo "== with DSV4_CUDA_NO_PDL=1 (chain only; full table in gpu_ops_nopdl.txt)"
  grep -A1 "^chain" "$OUTD/gpu_ops_nopdl.txt"
  for v in ${MOE_VARIANTS:-PERSISTENT FQ MINB3}; do
    env DSV4_CUDA_MOE_$v=1 "$B/dsv4-gpu-ops" --tiny --perf > "$OUTD/gpu_ops_moe_$v.txt" 2>&1
    echo "MOE_$v tiny correctness: $(grep -E '^[0-9]+ passed' "$OUTD/gpu_ops_moe_$v.txt")"
    env DSV4_CUDA_MOE_$v=1 "$B/dsv4-gpu-ops" --perf-only >> "$OUTD/gpu_ops_moe_$v.txt" 2>&1
    echo; echo "== with DSV4_CUDA_MOE_$v=1 (moe + chain n=1; full table in gpu_ops_moe_$v.txt)"
    grep -E "^moe" "$OUTD/gpu_ops_moe_$v.txt"; grep -m1 -A1 "^chain" "$OUTD/gpu_ops_moe_$v.txt"
  done
fi
