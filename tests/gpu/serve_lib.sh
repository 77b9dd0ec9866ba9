# shellcheck shell=bash
# Shared by the tests/gpu serving scripts (run_serve_dummy_h200.sh,
# run_tp2_serve_h200x2.sh), sourced: one way to start `dsv4 serve` on the
# dummy-weight 0731 config and to stop it, so the scripts differ only in what
# they measure. Their client side is serve_client.py (next to this file).
# Sourcing sets D (the run folder: $DIR or the current directory), puts $D/lib
# on LD_LIBRARY_PATH and keeps NVLink multicast off (KINDS.md), and sets
# GPU_LIB_DIR (this folder, for serve_client.py).
D=${DIR:-$(pwd)}
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
# shellcheck disable=SC2034 # read by the scripts that source this file
GPU_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# dummy_serve BIN LAYERS PORT LOG [ARGS...]: start BIN serve on $D/v4-0731 with
# dummy weights and LAYERS layers, ARGS (e.g. --device cuda -tp 2), on PORT with
# max_model_len 16384, 16 sequences and DSpark k=5, logging to LOG; in the
# background, its pid in SP.
dummy_serve() {
  local bin=$1 layers=$2 port=$3 log=$4
  shift 4
  "$bin" serve "$D/v4-0731" --load-format dummy --hf-overrides "{\"num_hidden_layers\": $layers}" "$@" \
    --port "$port" --max-model-len 16384 --max-num-seqs 16 \
    --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > "$log" 2>&1 &
  # shellcheck disable=SC2034 # read by the scripts that source this file
  SP=$!
}

# stop_serve PID: SIGTERM, then SIGKILL after 3 s if it has not exited (a hung
# server must not keep the GPU machine busy).
stop_serve() {
  kill "$1" 2>/dev/null
  for _ in 1 2 3 4 5 6; do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.5
  done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
