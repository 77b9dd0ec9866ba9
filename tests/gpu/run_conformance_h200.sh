#!/usr/bin/env bash
# Build dsv4-gpu-conformance (CUDA backend vs CPU reference, conformance.h)
# with nvcc + gcc alone — the GPU machine has no cJSON / PCRE2 /
# libmicrohttpd, so not through CMake — unless a prebuilt binary is given
# in BIN, then run it. Output goes to $OUT (the device tool's folder) or
# /tmp/gpuconf-out.
# Usage: tests/gpu/run_conformance_h200.sh [harness args]
# Env: BIN=path (skip the build), ARCH (default 90), BUILD_ONLY=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTD=${OUT:-/tmp/gpuconf-out}
B=${BUILD_DIR:-/tmp/gpuconf}
ARCH=${ARCH:-90}
mkdir -p "$OUTD" "$B"
if [ -z "${BIN:-}" ]; then
  t0=$(date +%s)
  for f in src/backend/cuda/*.cu; do
    nvcc -std=c++17 -O3 -arch=sm_$ARCH -Iinclude -Isrc -c "$f" -o "$B/$(basename "$f" .cu).o" &
  done
  for f in tests/gpu/gpu_conformance.c src/backend/conformance.c src/backend/rope_params.c \
           src/backend/timing.c src/backend/cpu/*.c src/model/kvcodec.c src/model/formats.c src/util/err.c; do
    gcc -std=c11 -O2 -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -c "$f" -o "$B/c_$(basename "$f" .c).o" &
  done
  wait
  nvcc -arch=sm_$ARCH "$B"/*.o -o "$B/dsv4-gpu-conformance" -lcublas -lcublasLt -lgomp || exit 1
  echo "build: $(( $(date +%s) - t0 )) s"
  BIN="$B/dsv4-gpu-conformance"
fi
[ -n "${BUILD_ONLY:-}" ] && exit 0
{ echo "commit: $(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null)"; date -u;
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv 2>/dev/null;
  nvcc --version | tail -2; } | tee "$OUTD/env.txt"
"$BIN" "$@" 2>&1 | tee "$OUTD/conformance.txt"
