#!/usr/bin/env bash
# Set up a fresh machine: system packages (Debian), Python packages (PyPI),
# build dsv4, and prepare the generated models (tiny checkpoints, embedded
# default). Idempotent: safe to re-run; each step skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { printf '\n== setup: %s\n' "$*"; }

APT_PKGS="build-essential cmake pkg-config libcjson-dev libpcre2-dev libmicrohttpd-dev"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  say "installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

say "Python packages"
PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check -r requirements.txt
if [ "${DSV4_SKIP_REF:-0}" != 1 ]; then
  $PY -m pip install -q --disable-pip-version-check -r requirements-ref.txt
fi

say "building (build/)"
BUILD_TYPE=${DSV4_BUILD_TYPE:-RelWithDebInfo}
cmake -S . -B build -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${DSV4_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"

say "generated models (models/)"
if [ -f tools/gen_checkpoints.py ]; then
  $PY tools/gen_checkpoints.py --out "$ROOT/models"
fi
say "done: build/dsv4 is ready"
