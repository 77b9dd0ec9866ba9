#!/usr/bin/env bash
# H100: the warm-up's borrowed pages (afd4343) and streams opening with the first token (b0ea552): CUDA tiny-checkpoint tests, then serve 12 layers with the
# warm-up (default) and without (DSV4_WARMUP=0): same greedy texts for a 6-page prompt, first vs next timings.
set -uo pipefail
cd "$(dirname "$0")"; . ../tests/gpu/gpu_env.sh; rm -rf bin; tar -xJf bin.tar.xz; tar -xJf models.tar.xz
O=${OUT:-/tmp}
( DSV4_TEST_DEVICE=cuda timeout 200 bin/test_engine_model > $O/engine_model_cuda.txt 2>&1; echo "test_engine_model (cuda) rc=$?" >> $O/engine_model_cuda.txt ) &
( timeout 150 bin/test_cuda_graphs > $O/cuda_graphs.txt 2>&1; echo "test_cuda_graphs rc=$?" >> $O/cuda_graphs.txt ) &
wait
tail -1 $O/engine_model_cuda.txt $O/cuda_graphs.txt
for W in default 0; do
  if [ $W = default ]; then unset DSV4_WARMUP; else export DSV4_WARMUP=0; fi
  t0=$(date +%s.%N)
  bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 12}' --device cuda --port 8899 \
    --max-model-len 16384 --max-num-seqs 16 --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $O/serve_$W.log 2>&1 &
  SP=$!
  timeout 200 python3 p20_client.py 8899 $t0 2>&1 | tee $O/client_$W.txt
  kill $SP; sleep 2; kill -9 $SP 2>/dev/null; wait $SP 2>/dev/null
  grep -E "warm-up|CUDA graphs: captured|ready|ERROR" $O/serve_$W.log | head -5
done
unset DSV4_WARMUP
# the streamed requests again (b0ea552: the first chunk now comes with the first token, so TTFT is real)
mkdir -p $O/serve2
OUT=$O/serve2 LAYERS=12 PORT=8899 timeout 250 bash ../tests/gpu/run_serve_dummy_h200.sh > $O/serve2/run.txt 2>&1
echo "serve script rc=$?" >> $O/serve2/run.txt
grep -E "start to ready|request [0-9]|rc=" $O/serve2/run.txt
