#!/usr/bin/env bash
# The main job: installs the Debian packages it needs, builds the example and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCHMARKS=OFF
cmake --build build -j"$(nproc)" --target hello_attention
./build/examples/hello_attention
