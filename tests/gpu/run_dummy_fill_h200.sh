#!/usr/bin/env bash
# Build dsv4-gpu-dummy-fill (CUDA fill_dummy vs the CPU's, --load-format dummy)
# with nvcc + gcc alone (the GPU machine has no cJSON / PCRE2 / libmicrohttpd)
# and run it. Output goes to $OUT (the device tool's folder) or /tmp/gpufill-out.
# Env: ARCH (default 90), BUILD_ONLY=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTD=${OUT:-/tmp/gpufill-out}
B=${BUILD_DIR:-/tmp/gpufill}
ARCH=${ARCH:-90}
mkdir -p "$OUTD" "$B"
for f in src/backend/cuda/*.cu; do
  nvcc -std=c++17 -O3 -arch=sm_$ARCH -Iinclude -Isrc -c "$f" -o "$B/$(basename "$f" .cu).o" &
done
for f in tests/gpu/gpu_dummy_fill.c src/backend/rope_params.c src/backend/cpu/*.c src/util/err.c; do
  gcc -std=c11 -O2 -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -c "$f" -o "$B/c_$(basename "$f" .c).o" &
done
wait
nvcc -arch=sm_$ARCH "$B"/*.o -o "$B/dsv4-gpu-dummy-fill" -lcublas -lcublasLt -lgomp || exit 1
[ -n "${BUILD_ONLY:-}" ] && exit 0
"$B/dsv4-gpu-dummy-fill" 2>&1 | tee "$OUTD/dummy_fill.txt"
