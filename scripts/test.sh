#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run every test: the C unit tests (ctest),
# the same built with AddressSanitizer + UBSan, and the Python tests (pytest).
# Ends with one line "N passed, N failed" over all suites.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
PY=${PYTHON:-python3}
pass=0; fail=0
LOGS=$(mktemp -d)   # per-run logs: two runs on one machine must not share them
trap 'rm -rf "$LOGS"' EXIT
count() { # $1 = log file, ctest summary "N tests failed out of M"
  local line; line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$1" | tail -1)
  if [ -n "$line" ]; then
    local f t; f=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/')
    t=$(echo "$line" | sed -E 's/.* tests failed out of ([0-9]+).*/\1/')
    pass=$((pass + t - f)); fail=$((fail + f))
  else
    fail=$((fail + 1))
  fi
}

echo "== test: C unit tests (warnings as errors)"
cmake -S . -B build -DDSV4_WERROR=ON >/dev/null && cmake --build build -j"$(nproc)" 2>&1 | tail -20
(cd build && ctest --output-on-failure -j2) 2>&1 | tee "$LOGS/ctest.log"
count "$LOGS/ctest.log"

if [ "${DSV4_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== test: C unit tests under ASan + UBSan"
  cmake -S . -B build-asan -DDSV4_SANITIZE=ON -DDSV4_CUDA=OFF -DDSV4_WERROR=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null \
    && cmake --build build-asan -j"$(nproc)" 2>&1 | tail -20
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 -LE slow) 2>&1 | tee "$LOGS/ctest-asan.log"
  count "$LOGS/ctest-asan.log"
fi

if ls tests/py/test_*.py >/dev/null 2>&1; then
  echo "== test: Python tests (pytest)"
  $PY -m pytest -q tests/py 2>&1 | tee "$LOGS/pytest.log"
  # pytest's closing line: "== 3 failed, 10 passed, 1 error in 2.0s =="
  line=$(tail -1 "$LOGS/pytest.log")
  p=$(echo "$line" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || true)
  f=$(echo "$line" | grep -oE "[0-9]+ (failed|errors?)" | grep -oE "[0-9]+" | awk '{s+=$1} END {print s+0}')
  p=${p:-0}
  if ! echo "$line" | grep -qE "passed|failed|error"; then f=$((f + 1)); fi
  pass=$((pass + p)); fail=$((fail + f))
fi

echo
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
