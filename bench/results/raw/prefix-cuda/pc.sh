set -uo pipefail
D=$(pwd); G=$D/../tests/gpu; . $G/gpu_env.sh
[ -d models ] || tar -xJf models.tar.xz; [ -d bin ] || tar -xJf bin.tar.xz
DSV4_TEST_DEVICE=cuda timeout 120 bin/test_prefix_cache_model > $OUT/prefix_cuda.txt 2>&1; echo "test_prefix_cache_model (cuda) rc=$?"; grep -v INFO $OUT/prefix_cuda.txt | tail -4
for pc in --enable-prefix-caching --no-enable-prefix-caching; do
  bin/dsv4 serve v4-0731 --load-format dummy --hf-overrides '{"num_hidden_layers": 24}' --device cuda --port 8898 \
    --max-num-seqs 32 $pc --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > $OUT/serve$pc.log 2>&1 &
  SP=$!
  echo "== serve 24 layers $pc (max_model_len default)"; timeout 100 python3 $G/serve_concurrency.py 8898 8 48 2>&1
  kill $SP; sleep 3; kill -9 $SP 2>/dev/null; grep -E "KV cache|max_model_len|ERROR" $OUT/serve$pc.log | cut -c1-300 | head -4
done
