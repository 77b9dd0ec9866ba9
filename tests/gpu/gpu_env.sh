# shellcheck shell=bash
# Sourced first by every tests/gpu script: the one place that says how a run folder
# is laid out and how the GPU machine must be used, so the scripts differ only in
# what they check.
#  D               the run folder (bin/, lib/, v4-0731/, models/): $DIR or the current directory
#  LD_LIBRARY_PATH $D/lib first (cJSON, PCRE2, libmicrohttpd carried with the binaries)
#  NVLink multicast off in NCCL, PyTorch and NVSHMEM (/work/.library/device/KINDS.md: a
#                  program that uses it can take the host's GPUs out of service)
#  DSV4_NCCL_LIB   libnccl.so.2 from the pip wheel nvidia-nccl-cu13 when not already set
D=${D:-${DIR:-$(pwd)}}
export LD_LIBRARY_PATH="$D/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${DSV4_NCCL_LIB:-}" ]; then
  _nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  [ -n "$_nccl_dir" ] && export DSV4_NCCL_LIB="$_nccl_dir/lib/libnccl.so.2"
  unset _nccl_dir
fi
