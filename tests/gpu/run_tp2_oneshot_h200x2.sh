#!/usr/bin/env bash
# The one-shot all-reduce (src/backend/cuda/cuda_allreduce.cu) against NCCL on the 2x H200 machine
# (kind nvidia-h200-x2; issue 7, bench/results/2026-12-01-tp2-oneshot-allreduce.md):
#  1. `dsv4 perf -tp 2 --all-reduce-bench` on the real 0731 config cut to $LAYERS layers (dummy weights):
#     the collective alone (F32 1..384 rows of 4096, BF16 1/8/64 rows; eager and inside CUDA graphs), every
#     size checked bit for bit against the host rank-order sum on both paths ("all-reduce check: PASS"),
#     then whole decode / verify steps with the one-shot path (the default);
#  2. the same steps with DSV4_TP_ONESHOT=0 (NCCL only);
#  4. with AB_ROUNDS=N: N more rounds of steps alone, one-shot and NCCL processes alternating (run-to-run
#     noise against the ~50 us per step the one-shot path saves at 8 layers); SKIP_MAIN=1 runs only these.
#  3. greedy tokens of a small dummy model: CPU TP=1 against CUDA TP=2 with the one-shot path, speculation
#     off and DSpark k=5, with DSV4_TP_CHECK_RANKS=1 (a step fails unless both ranks' logits are bit-identical).
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), lib/, v4-0731/ and configs/deepseek-v4-flash-0731.
set -uo pipefail
D=$(pwd)
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
OUTD=${OUT:-/tmp/oneshot-out}
mkdir -p "$OUTD"
L=${LAYERS:-8}
OV8="{\"num_hidden_layers\": $L}"
PA=${PERF_ARGS:---batch 1,8 --rows-per-seq 1,6 --context 4096 --warmup 3 --steps 20}
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u; echo "DSV4_NCCL_LIB=${DSV4_NCCL_LIB:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvidia-smi topo -m; } > "$OUTD/env.txt" 2>&1
fail=0
for i in $(seq 1 "${AB_ROUNDS:-0}"); do
  for m in 1 0; do
    DSV4_TP_ONESHOT=$m timeout 60 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$OV8" --device cuda -tp 2 $PA \
      2>&1 | grep -v "captured a graph" > "$OUTD/ab_oneshot${m}_$i.txt"
  done
done
[ -n "${SKIP_MAIN:-}" ] && { grep -h "full$" "$OUTD"/ab_*.txt >/dev/null; exit 0; }
timeout 120 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$OV8" --device cuda -tp 2 --all-reduce-bench $PA \
  2>&1 | grep -v "captured a graph" > "$OUTD/perf_oneshot.txt"
grep -q "all-reduce check: PASS" "$OUTD/perf_oneshot.txt" || fail=1
DSV4_TP_ONESHOT=0 timeout 120 bin/dsv4 perf v4-0731 --load-format dummy --hf-overrides "$OV8" --device cuda -tp 2 $PA \
  2>&1 | grep -v "captured a graph" > "$OUTD/perf_nccl.txt"
P=5,17,42,7,99,3,250,11,64,8
OV='{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128, "moe_intermediate_size": 256, "n_routed_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16, "index_n_heads": 4, "index_topk": 4, "vocab_size": 1024, "num_hash_layers": 2, "dspark_noise_token_id": 1000, "dspark_markov_rank": 32}'
for k in 0 5; do
  timeout 60 bin/dsv4 run configs/deepseek-v4-flash-0731 --load-format dummy --hf-overrides "$OV" --prompt-ids $P \
    --max-tokens 24 --device cpu --spec $k --show-ids > "$OUTD/tok_cpu_k$k.out" 2> "$OUTD/tok_cpu_k$k.err"
  DSV4_TP_CHECK_RANKS=1 timeout 60 bin/dsv4 run configs/deepseek-v4-flash-0731 --load-format dummy --hf-overrides "$OV" \
    --prompt-ids $P --max-tokens 24 --device cuda -tp 2 --spec $k --show-ids > "$OUTD/tok_tp2_k$k.out" 2> "$OUTD/tok_tp2_k$k.err"
  echo "rc=$?" >> "$OUTD/tok_tp2_k$k.err"
  a=$(grep -av '^prompt ids' "$OUTD/tok_cpu_k$k.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  b=$(grep -av '^prompt ids' "$OUTD/tok_tp2_k$k.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n')
  if [ -n "$a" ] && [ "$a" = "$b" ]; then r=SAME; else r=DIFFER; fail=1; fi
  echo "small dummy spec=$k cpu tp1 vs cuda tp2 (one-shot): $r"; echo "  cpu : $a"; echo "  tp2 : $b"
done | tee "$OUTD/tokens.txt"
grep -q DIFFER "$OUTD/tokens.txt" && fail=1
grep -h "one-shot" "$OUTD"/tok_tp2_k0.err | head -2 >> "$OUTD/tokens.txt"
exit $fail
