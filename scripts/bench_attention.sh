#!/usr/bin/env bash
# The attention table of docs/performance.md ("Attention kernel"): every shape, both kernels, one
# side after the other (for the interleaved attn / PyTorch ratios use scripts/bench_compare.sh
# --only mha):
#   1. bench_attention (naive vs fast attn kernel and the whole MHA block, forward and
#      forward+backward, 1 and 2 threads, 5 repetitions each with %peak of the FMA peak; and the
#      fast kernel under a causal mask), built Release with -march=native (ATTN_NATIVE, on by
#      default);
#   2. benchmarks/torch_attention.py (PyTorch math attention, also causal forward+backward, and
#      nn.MultiheadAttention at the same shapes) under ../shared/bench/peers/peer_env.sh mode
#      tuned512, PyTorch at its best here, with 1 and 2 threads.
# Usage: bash scripts/bench_attention.sh [build dir, default build-bench]   (5 to 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_NATIVE=ON >/dev/null
cmake --build "$build" -j2 --target bench_attention
echo "## attn: $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
"$build/benchmarks/bench_attention" --benchmark_format=console

# Debian's torch calls whatever libblas.so.3 the system selects; with the reference BLAS every
# PyTorch figure would be meaningless (about 2 GFLOP/s), and the peer's tuned512 environment
# assumes OpenBLAS 0.3.21: install it (and torch) from Debian's archive.
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch libopenblas0-pthread >/dev/null

peers=../shared/bench/peers
# shellcheck source=/dev/null
source "$peers/peer_env.sh"
# tuned512 where the CPU has AVX-512; else tuned without its SkylakeX kernels, which an AVX2 CPU
# cannot run (OpenBLAS then picks its own: Haswell's on a Zen 3).
mode=tuned512
grep -qw avx512f /proc/cpuinfo || mode=tuned-avx2
for threads in 1 2; do
  echo "## PyTorch, mode $mode, threads=$threads"
  if [ "$mode" = tuned512 ]; then
    ( peer_env tuned512 "$threads"; "$PY" benchmarks/torch_attention.py --threads "$threads" )
  else
    ( peer_env tuned "$threads"; unset OPENBLAS_CORETYPE
      "$PY" benchmarks/torch_attention.py --threads "$threads" )
  fi
done
