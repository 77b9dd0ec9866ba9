#!/usr/bin/env bash
# H100: first vs next for ~2K and ~6K-token prompts that share no prefix, with the start-up warm-up (default) and without (DSV4_WARMUP=0).
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz
O=${OUT:-/tmp}
for W in default 0; do
  if [ $W = default ]; then unset DSV4_WARMUP; else export DSV4_WARMUP=0; fi
  echo "== DSV4_WARMUP=$W"
  t0=$(date +%s.%N)
  bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 12}' --device cuda --port 8899 \
    --max-model-len 16384 --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_$W.log 2>&1 &
  SP=$!
  timeout 200 python3 p21_client.py 8899 $t0 2>&1 | tee $O/client_$W.txt
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; wait $SP 2>/dev/null
done
unset DSV4_WARMUP
