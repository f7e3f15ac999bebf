#!/usr/bin/env bash
# The whole test suite under sanitizers:
#   1. ASan + UBSan (with float-cast-overflow and signed-integer-overflow, which GCC's
#      -fsanitize=undefined leaves out or only warns about), every report fatal: build-asan/.
#      The install step is on, so that the cmake_consumer_* projects (built with these flags too)
#      and attn_to_torch (attn-translate and attn-logits against PyTorch) run instrumented.
#   2. TSan over the threaded kernels and the trainer's tests, with OpenMP (attn's only threads):
#      build-tsan/. GCC's libgomp is not instrumented, so TSan cannot see its barriers and reports
#      accesses on either side of one as races (14 such reports in the kernel tests). clang++ with
#      LLVM's libomp and its Archer tool (libarcher.so, which gives TSan OpenMP's synchronisation)
#      is used when found; TSAN_CXX=c++ forces GCC.
# Usage: [JOBS=2] [SANITIZE=asan|tsan|all] bash scripts/sanitize.sh [ctest -R pattern for asan]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
which=${SANITIZE:-all}
pattern=${1:-}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_BUILD_TESTS=ON -DATTN_BUILD_EXAMPLES=ON
        -DATTN_BUILD_BENCHMARKS=OFF -DATTN_INSTALL=ON -DATTN_NATIVE=OFF "${launcher[@]}")
status=0

if [ "$which" = asan ] || [ "$which" = all ]; then
  flags="-fsanitize=address,undefined,float-cast-overflow,signed-integer-overflow"
  flags+=" -fno-sanitize-recover=all -fno-omit-frame-pointer"
  cmake -S . -B build-asan "${common[@]}" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  cmake --build build-asan -j"$jobs"
  export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  args=(--test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" --timeout 3000)
  [ -z "$pattern" ] || args+=(-R "$pattern")
  mpi='^data_parallel_np|^Mpi\.'
  ctest "${args[@]}" -E "$mpi" || status=1
  # Open MPI 4 leaves ~120 KB in ~3,360 blocks allocated at MPI_Finalize (every LeakSanitizer stack
  # is in libmpi, libopen-pal or an unloaded MCA plugin, none in attn), so the MPI tests run with
  # every ASan and UBSan check but the leak check. They are absent without MPI.
  if [ -z "$pattern" ]; then
    ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} \
      ctest --test-dir build-asan --output-on-failure --no-tests=ignore -j1 --timeout 3000 \
      -R "$mpi" || status=1
  fi
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  cxx=${TSAN_CXX:-c++}
  [ -n "${TSAN_CXX:-}" ] || ! command -v clang++ >/dev/null || cxx=clang++
  archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -n 1 || true)
  if [ "$cxx" = clang++ ] && [ -n "$archer" ]; then export OMP_TOOL_LIBRARIES=$archer; fi
  cmake -S . -B build-tsan "${common[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  cmake --build build-tsan -j"$jobs" --target test_gemm test_gemm_packed test_gemm_kept_b test_attention_kernels \
    test_parallel test_training test_training_recovery translate_test_pipeline attn-translate
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1
  ctest --test-dir build-tsan --output-on-failure --no-tests=error -j1 --timeout 3000 \
    -R 'Gemm|Attention|StealingLoop|Training|Resume|Pipeline|Reliability|StopSignal|TrainState' || status=1
fi
exit $status
