#!/usr/bin/env bash
# Installs the Debian packages it needs, builds attn's tests, benchmarks and examples, and runs
# every test. Usage: bash scripts/test.sh  (from anywhere; builds in ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
jobs=$(nproc)
# Explicit switches: the main job (run_example.sh) configures the same build dir with them off.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=ON -DATTN_BUILD_BENCHMARKS=ON \
  -DATTN_BUILD_EXAMPLES=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs"
