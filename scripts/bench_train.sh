#!/usr/bin/env bash
# One full training step (forward, loss, backward, Adam) and greedy decoding, attn against PyTorch
# in one run on this machine: bench_train_step (Release, -march=native), then the peer script
# ../shared/bench/peers/torch_transformer.py in its tuned512 environment (PyTorch at its best
# here: OpenBLAS with its AVX-512 kernels, see ../shared/bench/peers/README.md).
# Usage: bash scripts/bench_train.sh [build dir, default build-bench]   (about 10 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch libopenblas0-pthread >/dev/null
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_NATIVE=ON >/dev/null
cmake --build "$build" -j2 --target bench_train_step
echo "## attn $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
"$build/benchmarks/bench_train_step" --benchmark_format=console

peers=../shared/bench/peers
# shellcheck source=/dev/null
source "$peers/peer_env.sh"
for threads in 2 1; do
  for cfg in small base; do
    echo "## PyTorch train $cfg, mode tuned512, threads=$threads"
    ( peer_env tuned512 "$threads"; "$PY" "$peers/torch_transformer.py" train --config "$cfg" --threads "$threads" --steps 5 )
  done
  for batch in 1 32; do
    echo "## PyTorch greedy decode base batch $batch, mode tuned512, threads=$threads"
    ( peer_env tuned512 "$threads"; "$PY" "$peers/torch_transformer.py" decode --config base --threads "$threads" --batch "$batch" --reps 3 )
  done
done
