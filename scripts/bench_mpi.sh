#!/usr/bin/env bash
# Data-parallel scaling on one machine: 2 ranks x 1 thread (mpirun) against 1 rank x 2 threads
# (plain attn-translate), training tokens/s of the small and base presets; the 2-rank runs once
# with the gradient sums overlapped with backward (the default) and once after it
# (--no-overlap-allreduce). The configurations alternate for ROUNDS rounds and each reports its
# median; then the gradient all-reduce alone (allreduce_mpi). Run it on a quiet machine: other
# jobs make every figure meaningless.
#
# Usage: bash scripts/bench_mpi.sh [build dir, default build-bench]
# Environment (defaults in brackets):
#   PRESETS [small base]  ROUNDS [3]  STEPS [40] updates per run, the second half is timed
#   MAX_TOKENS [4096]  SRC/TGT [unset: the built-in gettext corpus]  VOCAB [8000]
#   LINK_MBIT [unset]: the ranks talk over TCP on the loopback device instead of shared memory,
#     held to this many Mbit/s in each direction by a tc token-bucket filter (root only; removed
#     at exit), as two machines on such a link would. Both directions of the ring pass through
#     lo's one queue, so the filter gets twice the rate. Unset: shared memory, as on one machine.
# A smoke test with tiny settings: PRESETS=tiny STEPS=4 ROUNDS=3 VOCAB=60 MAX_TOKENS=256 \
#   SRC=train.en TGT=train.de bash scripts/bench_mpi.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
PRESETS=${PRESETS:-small base}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
MAX_TOKENS=${MAX_TOKENS:-4096}
VOCAB=${VOCAB:-8000}
(( STEPS >= 2 && STEPS % 2 == 0 )) || { echo "STEPS must be even and >= 2" >&2; exit 1; }

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DATTN_NATIVE=ON >/dev/null
fi
cmake --build "$build" -j2 --target attn-translate allreduce_mpi >/dev/null
bin="$build/examples/translate/attn-translate"
[ -x "$build/benchmarks/allreduce_mpi" ] || { echo "no allreduce_mpi: was MPI found?" >&2; exit 1; }
mpirun=(mpirun --allow-run-as-root)

work=$(mktemp -d)
cleanup() {
  rm -rf "$work"
  [ -z "${LINK_MBIT:-}" ] || tc qdisc del dev lo root 2>/dev/null || true
}
trap cleanup EXIT
link="shared memory"
if [ -n "${LINK_MBIT:-}" ]; then
  [[ "$LINK_MBIT" =~ ^[0-9]+$ ]] && (( LINK_MBIT > 0 )) || {
    echo "LINK_MBIT must be a positive whole number of Mbit/s, got '$LINK_MBIT'" >&2; exit 1; }
  command -v tc >/dev/null || { echo "LINK_MBIT needs tc (iproute2)" >&2; exit 1; }
  tc qdisc show dev lo | grep -q '^qdisc noqueue' || {
    echo "lo already has a queueing discipline; not replacing it" >&2; exit 1; }
  # burst: 10 ms of traffic at the rate (at least the 64 KiB of one loopback packet)
  burst=$(( LINK_MBIT * 2 * 1000000 / 8 / 100 ))
  (( burst >= 65536 )) || burst=65536
  tc qdisc add dev lo root tbf rate "$(( LINK_MBIT * 2 ))mbit" burst "$burst" latency 100ms
  mpirun+=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
  link="TCP over loopback held to $LINK_MBIT Mbit/s per direction"
fi
data=()
[ -n "${SRC:-}" ] && data=(--src "$SRC" --tgt "${TGT:?TGT goes with SRC}")

# tokens/s of the second half of a run: the last progress line covers updates STEPS/2+1..STEPS.
tokens_per_second() {
  sed -n 's/.* | \([0-9]*\) tok\/s | .*/\1/p' "$1" | tail -1
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

run() {  # run <preset> <config> <round>: prints tokens/s
  local preset=$1 config=$2 round=$3 dir="$work/$1-$2-$3" log="$work/$1-$2-$3.log"
  # --no-eval: a run ends after its updates, without the validation and the beam-search test
  # BLEU that a training run ends with; they are not timed and only add minutes per run.
  local args=(train --model-dir "$dir" --preset "$preset" --steps "$STEPS" --log-every
              $((STEPS / 2)) --max-tokens "$MAX_TOKENS" --vocab-size "$VOCAB" --no-eval
              --checkpoint-every 0 --svg 0 "${data[@]}")
  if [ "$config" = 2x1 ]; then
    "${mpirun[@]}" -np 2 --bind-to core "$bin" "${args[@]}" --threads 1 >/dev/null 2>"$log"
  elif [ "$config" = 2x1-after ]; then
    "${mpirun[@]}" -np 2 --bind-to core "$bin" "${args[@]}" --threads 1 --no-overlap-allreduce \
      >/dev/null 2>"$log"
  else
    "$bin" "${args[@]}" --threads 2 >/dev/null 2>"$log"
  fi
  tokens_per_second "$log"
}

echo "## attn $(git rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "ranks linked by $link"
echo "| preset | 1 rank x 2 threads, tok/s | 2 ranks x 1 thread, tok/s | 2x1 / 1x2 |" \
  "2x1 summing after backward, tok/s | overlapped / after | rounds |"
echo "|---|---|---|---|---|---|---|"
for preset in $PRESETS; do
  one=() two=() after=()
  for round in $(seq "$ROUNDS"); do  # alternate, so that drift in the machine hits all alike
    one+=("$(run "$preset" 1x2 "$round")")
    two+=("$(run "$preset" 2x1 "$round")")
    after+=("$(run "$preset" 2x1-after "$round")")
  done
  m1=$(printf '%s\n' "${one[@]}" | median)
  m2=$(printf '%s\n' "${two[@]}" | median)
  m3=$(printf '%s\n' "${after[@]}" | median)
  ratio=$(awk -v a="$m2" -v b="$m1" 'BEGIN { printf "%.2f", a / b }')
  overlap=$(awk -v a="$m2" -v b="$m3" 'BEGIN { printf "%.3f", a / b }')
  echo "| $preset | $m1 | $m2 | $ratio | $m3 | $overlap |" \
    "1x2: ${one[*]}; 2x1: ${two[*]}; 2x1 after: ${after[*]} |"
done

echo
echo "## gradient all-reduce alone, 2 ranks (ring = DataParallel, fixed order; MPI_Allreduce = Open MPI's choice)"
for preset in $PRESETS; do
  "${mpirun[@]}" -np 2 --bind-to core "$build/benchmarks/allreduce_mpi" "$preset" "$VOCAB" 5
done
