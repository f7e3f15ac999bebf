#!/usr/bin/env bash
# attn against PyTorch, alternately (attn, PyTorch; PyTorch, attn; ... the order swapped every
# round, >= 3 rounds) on the same shapes, with an FMA-peak probe in every round, and the ratio
# table that goes into the README (markdown, with date, commit and command): training step small
# and base, greedy decoding batch 1 and 32, the multi-head attention block forward+backward, and
# the GEMM shapes of a step against OpenBLAS SkylakeX (torch.mm). benchmarks/bench_compare.py says
# what is timed and how.
#
# Usage: bash scripts/bench_compare.sh [--build DIR] [--only train,decode,mha,gemm] [--rounds 3]
#                                      [--reps 5] [--threads 2,1] [--min-time 0.2] [--out FILE]
#   full run (all groups, 2 and 1 threads, 3 rounds):   about 15-20 minutes on 2 cores
#   quick look: --only train,gemm --threads 2 --rounds 1   about 3 minutes
#   smoke test of the machinery only (figures meaningless):
#               --rounds 1 --reps 1 --min-time 0.01 --threads 2
# Run it on a quiet machine: the table states the load average at its start and end.
set -euo pipefail
cd "$(dirname "$0")/.."
command="bash scripts/bench_compare.sh $*"
build=build-bench
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --build=*) build=${1#--build=}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

# The peer: Debian's torch calls whatever libblas.so.3 the system selects; with the reference BLAS
# every PyTorch figure would be meaningless (about 2 GFLOP/s), and the peer's tuned512 environment
# assumes OpenBLAS 0.3.21 (libopenblas0-pthread).
missing=()
for pkg in python3-torch libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
[ -f ../shared/bench/peers/peer_env.sh ] || {
  echo "bench_compare.sh: the PyTorch peer (../shared/bench/peers) is missing" >&2; exit 2; }

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_NATIVE=ON -DATTN_BUILD_BENCHMARKS=ON >/dev/null
cmake --build "$build" -j2 --target bench_fma_peak bench_train_step bench_attention bench_gemm >/dev/null
exec /usr/bin/python3 benchmarks/bench_compare.py --build "$build" --command "$command" \
  ${args[@]+"${args[@]}"}
