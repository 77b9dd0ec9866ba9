#!/usr/bin/env bash
# Multi-node tensor parallelism with NCCL, emulated on one 2-GPU host (issue 7 "Parallelism"): two
# `dsv4 run --nnodes 2 --node-rank R -tp 2 --device cuda` processes, each seeing one GPU
# (CUDA_VISIBLE_DEVICES), joined by the TCP rendezvous (NCCL id from node 0) and NCCL; greedy ids must equal
# `dsv4 run --device cpu` (TP=1), speculation off and DSpark k=5. Uses the shrunk 0731 config of
# run_tp2_h200.sh (its TP=2 slices fit the CUDA tiles), dummy weights. PASS/FAIL per case.
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), lib/, configs/. Output: $OUT.
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
BIN=${BIN:-$D/bin/dsv4}
OUTD=${OUT:-/tmp/multinode-out}
mkdir -p "$OUTD"
OV='{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128, "moe_intermediate_size": 256, "n_routed_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4, "index_topk": 4, "vocab_size": 1024, "num_hash_layers": 2, "dspark_noise_token_id": 1000, "dspark_markov_rank": 32}'
M="$D/configs/deepseek-v4-flash-0731"
fail=0
for k in 0 5; do
  base=(run "$M" --load-format dummy --hf-overrides "$OV" --prompt-ids 5,17,42,7,99,3,250,11,64,8 --max-tokens 24
        --show-ids --spec $k
        --kv-cache-dtype "${KV_DTYPE:-f32}")  # the same rows on both devices (auto: fp8 on CUDA, f32 on CPU)
  timeout 60 "$BIN" "${base[@]}" --device cpu > /dev/null 2> "$OUTD/cpu_k$k.err"
  port=$((29400 + k))
  CUDA_VISIBLE_DEVICES=1 timeout 120 "$BIN" "${base[@]}" --device cuda -tp 2 --nnodes 2 --node-rank 1 \
    --master-addr 127.0.0.1 --master-port $port > "$OUTD/node1_k$k.out" 2> "$OUTD/node1_k$k.err" &
  F=$!
  CUDA_VISIBLE_DEVICES=0 timeout 120 "$BIN" "${base[@]}" --device cuda -tp 2 --nnodes 2 --node-rank 0 \
    --master-addr 127.0.0.1 --master-port $port > /dev/null 2> "$OUTD/node0_k$k.err"
  r0=$?
  wait $F; r1=$?
  a=$(grep -av '^prompt ids' "$OUTD/cpu_k$k.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  b=$(grep -av '^prompt ids' "$OUTD/node0_k$k.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ $r0 = 0 ] && [ $r1 = 0 ]; then r=PASS; else r=FAIL; fail=1; fi
  echo "$r multinode nnodes=2 cuda+NCCL spec=$k (node0 rc=$r0, node1 rc=$r1)"
  echo "  cpu tp1 : $a"; echo "  2 nodes : $b"
  grep -ahE "NCCL|nccl|ERROR|following|rendezvous" "$OUTD/node0_k$k.err" "$OUTD/node1_k$k.err" | sort | uniq -c | head -8
done 2>&1 | tee "$OUTD/multinode.txt"
exit $fail
