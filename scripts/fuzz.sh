#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan, and runs each for
# ${FUZZ_SECONDS:-60} seconds (inputs up to ${FUZZ_MAX_LEN:-1048576} bytes) on a working copy of its corpus: fuzz/corpus/<target>, the seeds
# attn_fuzz_make_seeds writes, and (for .mo) a few small catalogs from /usr/share/locale.
# New inputs stay in build-fuzz/corpus; crashes go to build-fuzz/artifacts/<target>/ and make the
# script fail. FUZZ_RUNS=N stops each target after N executions instead (FUZZ_SECONDS then only
# bounds the time, default unbounded); FUZZ_FLAGS adds libFuzzer flags, e.g. -len_control=0 so that
# inputs grow towards the 1 MB -max_len at once instead of after hours.
# FUZZ_LARGE chooses the seeds: "all" (default), "no" (without the ~1 MB large_* seeds: a corpus
# that holds them runs at a few hundred executions a second) or "only" (just the large seeds, in
# build-fuzz/corpus/<target>-large, to fuzz inputs of close to 1 MB).
# Usage: [FUZZ_SECONDS=60] [FUZZ_RUNS=N] [FUZZ_FLAGS=...] [JOBS=N] bash scripts/fuzz.sh [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
runs=${FUZZ_RUNS:-}
seconds=${FUZZ_SECONDS:-$([ -n "$runs" ] && echo 0 || echo 60)}
read -r -a extra <<<"${FUZZ_FLAGS:-}"
[ -z "$runs" ] || extra+=(-runs="$runs")
large=${FUZZ_LARGE:-all}
jobs=${JOBS:-$(nproc)}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(mo_catalog safetensors model_file train_state vocab parallel_text)
max_len=${FUZZ_MAX_LEN:-1048576}  # inputs up to 1 MB: the header size caps must hold there too

if ! command -v clang++ >/dev/null || ! clang++ -fsanitize=fuzzer -x c++ - -o /dev/null \
  <<<'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' 2>/dev/null
then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Debian's clang does not pull in the compiler-rt runtimes that hold libFuzzer and the sanitizers.
  $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null ||
    $SUDO apt-get install -y -qq --no-install-recommends clang "libclang-rt-$(clang++ -dumpversion |
      cut -d. -f1)-dev" >/dev/null
fi

cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DATTN_BUILD_FUZZERS=ON -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCHMARKS=OFF \
  -DATTN_BUILD_EXAMPLES=OFF -DATTN_INSTALL=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target attn_fuzz_make_seeds "${targets[@]/#/fuzz_}"

"$build/fuzz/attn_fuzz_make_seeds" "$build/seeds" >/dev/null
status=0
for target in "${targets[@]}"; do
  corpus=$build/corpus/$target
  [ "$large" != only ] || corpus=$build/corpus/$target-large
  artifacts=$build/artifacts/$target
  log=$build/fuzz_$target.log
  [ "$large" != only ] || log=$build/fuzz_$target-large.log
  mkdir -p "$corpus" "$artifacts"
  if [ -d "$root/fuzz/corpus/$target" ] && [ "$large" != only ]; then
    cp "$root/fuzz/corpus/$target/"* "$corpus/"
  fi
  for seed in "$build/seeds/$target/"*; do
    case "$large:$(basename "$seed")" in no:large_*) continue ;; only:large_*) ;; only:*) continue ;; esac
    cp "$seed" "$corpus/generated_$(basename "$seed")"
  done
  if [ "$target" = mo_catalog ] && [ -d /usr/share/locale ] && [ "$large" != only ]; then
    mapfile -t catalogs < <(find /usr/share/locale -name '*.mo' -size -8k 2>/dev/null | sort)
    for mo in "${catalogs[@]:0:20}"; do
      cp "$mo" "$corpus/system_$(echo "$mo" | md5sum | cut -c1-12).mo"
    done
  fi
  dict=()
  [ -f "$root/fuzz/$target.dict" ] && dict=(-dict="$root/fuzz/$target.dict")
  echo "== fuzz_$target for ${runs:-unbounded} runs, ${seconds}s (0: unbounded) (corpus $corpus)"
  start=$(date +%s)
  if ! "$build/fuzz/fuzz_$target" "${dict[@]}" -max_total_time="$seconds" -max_len="$max_len" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "${extra[@]}" "$corpus" 2>"$log"; then
    status=1
    echo "fuzz_$target FAILED; see $log and $artifacts/" >&2
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb|slowest_unit_time_sec|largest_input_bytes|inputs_of_512KiB_or_more)' \
    "$log" || true
  # libFuzzer also keeps inputs slower than 10 s as slow-unit-*: reported apart, not failures
  # (on a loaded machine they are the machine; replay them to see).
  echo "wall_seconds: $(($(date +%s) - start));" \
    "crash/timeout/oom/leak artifacts: $(find "$artifacts" -type f ! -name 'slow-unit-*' | wc -l);" \
    "slow units: $(find "$artifacts" -type f -name 'slow-unit-*' | wc -l);" \
    "largest corpus input: $(find "$corpus" -type f -printf '%s\n' | sort -n | tail -n 1) bytes"
done
exit $status
