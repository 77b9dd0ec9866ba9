#!/usr/bin/env bash
# Check the NCCL communicator on the 2x H200 machine (kind nvidia-h200-x2):
# build tests/gpu/nccl_tp_check.c with gcc + libcudart (no CMake there), find
# libnccl.so.2 from the pip wheel nvidia-nccl-cu13, run with NVLink multicast off.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTD=${OUT:-/tmp/nccl-out}
mkdir -p "$OUTD"
CUDA=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
. tests/gpu/gpu_env.sh  # lib path, multicast off, DSV4_NCCL_LIB (after the cd: the repo root)
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvidia-smi topo -m; } 2>&1 | tee "$OUTD/env.txt"
gcc -std=c11 -O2 -D_GNU_SOURCE -Wall -Iinclude -Isrc -I"$CUDA/include" tests/gpu/nccl_tp_check.c \
    src/parallel/comm_nccl.c src/util/err.c -L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lcudart -lpthread -ldl \
    -o /tmp/nccl_tp_check || exit 1
echo "DSV4_NCCL_LIB=${DSV4_NCCL_LIB:-}"
NCCL_NVLS_ENABLE=0 NCCL_DEBUG=WARN timeout 120 /tmp/nccl_tp_check 2>&1 | tee "$OUTD/nccl_tp_check.txt"
