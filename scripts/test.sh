#!/usr/bin/env bash
# Installs the Debian packages it needs, builds attn's tests, benchmarks and examples, and runs
# every test. Usage: bash scripts/test.sh  (from anywhere; builds in ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
