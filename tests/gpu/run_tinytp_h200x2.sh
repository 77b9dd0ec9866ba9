#!/usr/bin/env bash
# The tiny checkpoints under CUDA tensor parallelism (issue 7 "Done when"), on
# the 2x H200 machine (kind nvidia-h200-x2): greedy tokens of
#   dsv4 run models/<m> --device cuda -tp 2
# against --device cpu -tp 1, speculation off and on, for tiny-flash,
# tiny-dspark and their -bf16 copies. Their TP = 2 slices are below the CUDA
# tiles (64-wide wo_a / wo_b / shared and expert w2 slices: cuda_subtile.cu);
# the -bf16 copies also take the BF16-expert MoE (cuda_moe_generic.cu).
# Per case it also runs --device cpu -tp 2 (the same sliced computation on
# the CPU) and --device cuda -tp 1. One line per case:
#   PASS  cuda tp2 == cpu tp1
#   PASS* cuda tp2 == cpu tp2 and cpu tp2 != cpu tp1: the CPU's own TP = 2
#         departs from TP = 1 (reference numerics: a rank quantises its 64-wide
#         half of a 128-wide W8A8 block with its own scale, tp_shard.c banner)
#   FAIL  otherwise.
# Every TP run has DSV4_TP_CHECK_RANKS=1 (both ranks' logits bit-identical per step).
# Then test_device_equiv (one GPU, teacher-forced logits CPU vs CUDA) under the EQUIV_MODES of
# cuda_rows.cu (below), and, when bin/dsv4-gpu-conformance is there, its rows cases at the tiny and
# sub-tile shapes plus the real wo_a at T = 1, 48, with and without the chained accumulation.
# Runs from a folder holding bin/dsv4 (-DDSV4_CUDA=ON), optionally bin/test_device_equiv,
# lib/ (the .so files the GPU machine lacks) and models/. Output: $OUT (or /tmp/tinytp-out).
# Env: KV_DTYPE (f32 on both devices: `auto` is fp8 rows on CUDA, f32 on the CPU), MAX_TOKENS (24), MODELS, SKIP_EQUIV=1, EQUIV_MODES, SKIP_CONF=1.
set -uo pipefail
D=${DIR:-$(pwd)}
. "$(dirname "$0")/gpu_env.sh"  # D, lib path, multicast off, DSV4_NCCL_LIB
export DSV4_TP_CHECK_RANKS=1
BIN=${BIN:-$D/bin/dsv4}
OUTD=${OUT:-/tmp/tinytp-out}
R=/tmp/tinytp-runs
mkdir -p "$OUTD" "$R"
{ echo "commit: $(cat "$D/.commit" 2>/dev/null)"; date -u; echo "DSV4_NCCL_LIB=${DSV4_NCCL_LIB:-}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } 2>&1 | tee "$OUTD/env.txt"
P=5,17,42,7,99,3,250,11,64,8
N=${MAX_TOKENS:-24}
fail=0
# $1 label: run the model with the remaining args, generated ids ([id] on stderr) into $R/$1.ids
gen() {
  local label=$1; shift
  timeout 90 "$BIN" run --prompt-ids $P --max-tokens $N --show-ids --kv-cache-dtype "${KV_DTYPE:-f32}" "$@" > "$R/$label.out" 2> "$R/$label.err"
  echo "rc=$?" >> "$R/$label.err"
  grep -av '^prompt ids' "$R/$label.err" | grep -ao '\[[0-9]\+\]' | tr -d '\n' > "$R/$label.ids"
}
# index of the first differing token of two id strings ("-" when equal)
first_diff() {
  python3 -c 'import re,sys; a=re.findall(r"\d+",sys.argv[1]); b=re.findall(r"\d+",sys.argv[2]); d=[i for i in range(max(len(a),len(b))) if i>=len(a) or i>=len(b) or a[i]!=b[i]]; print(d[0] if d else "-")' "$1" "$2"
}
{
for m in ${MODELS:-tiny-flash tiny-dspark tiny-flash-bf16 tiny-dspark-bf16}; do
  k=1; case $m in tiny-dspark*) k=5 ;; esac
  for spec in 0 $k; do
    L="${m}_k$spec"
    gen "$L.cpu1" "$D/models/$m" --device cpu --spec $spec
    gen "$L.cpu2" "$D/models/$m" --device cpu -tp 2 --spec $spec
    gen "$L.cuda2" "$D/models/$m" --device cuda -tp 2 --spec $spec
    gen "$L.cuda1" "$D/models/$m" --device cuda --spec $spec
    c1=$(cat "$R/$L.cpu1.ids"); c2=$(cat "$R/$L.cpu2.ids"); g2=$(cat "$R/$L.cuda2.ids"); g1=$(cat "$R/$L.cuda1.ids")
    if [ -n "$c1" ] && [ "$g2" = "$c1" ]; then r=PASS
    elif [ -n "$c2" ] && [ "$g2" = "$c2" ] && [ "$c2" != "$c1" ]; then r="PASS*"
    else r=FAIL; fail=1; fi
    echo "$r $m spec=$spec: cuda tp2 vs cpu tp1 first diff $(first_diff "$g2" "$c1"), vs cpu tp2 $(first_diff "$g2" "$c2"); cpu tp2 vs tp1 $(first_diff "$c2" "$c1"); cuda tp1 vs cpu tp1 $(first_diff "$g1" "$c1")"
    echo "  cpu  tp1: $c1"; echo "  cpu  tp2: $c2"; echo "  cuda tp2: $g2"; echo "  cuda tp1: $g1"
    grep -hE "acceptance|dsv4 run:|ERROR|error|failed" "$R/$L.cuda2.err" | sort | uniq -c | head -6 | sed 's/^/  tp2| /'
    grep -h "^rc=" "$R/$L.cuda2.err" "$R/$L.cuda1.err" | tr '\n' ' ' | sed 's/^/  rc (cuda tp2, tp1): /'; echo
  done
done
} 2>&1 | tee "$OUTD/tokens.txt"
grep -q "^FAIL" "$OUTD/tokens.txt" && fail=1
if [ -z "${SKIP_EQUIV:-}" ] && [ -x "$D/bin/test_device_equiv" ]; then
  # default: the shipped dispatch; chain: k_rows_mma with the former chained tensor-core accumulation;
  # naive: the per-output kernel for every rows linear; all: small BF16/F32 linears on the
  # fast paths too
  for f in ${EQUIV_MODES:-default chain naive all}; do
    echo "== $f"
    case $f in
      chain) export DSV4_CUDA_ROWS_MMA_CHAIN=1 ;;
      naive) export DSV4_CUDA_ROWS_NAIVE=1 ;;
      all) export DSV4_CUDA_ROWS_SMALL_FAST=all ;;
    esac
    "$D/bin/test_device_equiv" "$D/models/tiny-flash" "$D/models/tiny-dspark" 2>&1 \
      | grep -E "CHECK failed|per-position|largest|passed" | sed "s|$D/models/||"
    unset DSV4_CUDA_ROWS_MMA_CHAIN DSV4_CUDA_ROWS_NAIVE DSV4_CUDA_ROWS_SMALL_FAST
  done 2>&1 | tee "$OUTD/equiv.txt"
fi
if [ -z "${SKIP_CONF:-}" ] && [ -x "$D/bin/dsv4-gpu-conformance" ]; then
  # the rows linears at the tiny shapes (wo_a and its TP = 2 slice, the padded W8A8 slices) and the
  # real wo_a at T = 1, 48; default (k_rows_mma unchained, k_rows_mma2 chained), both chained, both unchained
  for ch in default chain unchained; do
    echo "== rows harness, $ch"
    case $ch in chain) export DSV4_CUDA_ROWS_MMA_CHAIN=1 ;; unchained) export DSV4_CUDA_ROWS_MMA2_UNCHAINED=1 ;; esac
    DSV4_CONF_ROWS_FEW=1 timeout 120 "$D/bin/dsv4-gpu-conformance" --rows-only --no-perf 2>&1
    unset DSV4_CUDA_ROWS_MMA_CHAIN DSV4_CUDA_ROWS_MMA2_UNCHAINED
  done 2>&1 | tee "$OUTD/conformance_rows.txt"
fi
tar -czf "$OUTD/runs.tgz" -C /tmp tinytp-runs 2>/dev/null
echo "overall: $([ $fail = 0 ] && echo PASS || echo FAIL)" | tee -a "$OUTD/tokens.txt"
exit $fail
