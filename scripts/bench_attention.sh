#!/usr/bin/env bash
# Attention kernels against PyTorch, in one run on this machine:
#   1. bench_attention (naive vs fast attn kernel, forward and forward+backward, 1 and 2 threads),
#      built Release with -march=native (ATTN_NATIVE, on by default);
#   2. benchmarks/torch_attention.py (PyTorch math attention and nn.MultiheadAttention at the same
#      shapes) under ../shared/bench/peers/peer_env.sh mode tuned512, PyTorch at its best here,
#      with 1 and 2 threads.
# Usage: bash scripts/bench_attention.sh [build dir, default build-bench]   (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_NATIVE=ON >/dev/null
cmake --build "$build" -j2 --target bench_attention
echo "## attn: $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
"$build/benchmarks/bench_attention" --benchmark_format=console

# Debian's torch calls whatever libblas.so.3 the system's alternatives select; without OpenBLAS
# that is the reference BLAS (about 2 GFLOP/s: every PyTorch figure would be meaningless), and the
# peer's tuned512 environment assumes OpenBLAS 0.3.21. Use the system's OpenBLAS when installed,
# else unpack Debian's package into the build dir for these runs only (no system change).
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ ! -e "$openblas/libblas.so.3" ]; then
  openblas="$PWD/$build/peer-openblas/usr/lib/x86_64-linux-gnu/openblas-pthread"
  if [ ! -e "$openblas/libblas.so.3" ]; then
    ( cd "$build" && apt-get download libopenblas0-pthread >/dev/null 2>&1 \
        && dpkg -x libopenblas0-pthread_*.deb peer-openblas ) \
      || echo "warning: OpenBLAS unavailable; PyTorch runs on the reference BLAS"
  fi
fi
export LD_LIBRARY_PATH="$openblas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "## PyTorch BLAS from: $openblas"

peers=../shared/bench/peers
# shellcheck source=/dev/null
source "$peers/peer_env.sh"
for threads in 1 2; do
  echo "## PyTorch, mode tuned512, threads=$threads"
  ( peer_env tuned512 "$threads"; "$PY" benchmarks/torch_attention.py --threads "$threads" )
done
