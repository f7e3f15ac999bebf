// The fp32 FMA peak of this machine on 1 and 2 threads (benchmarks/fma_peak.hpp: 16 independent
// chains of AVX-512 FMAs per thread, AVX2 where the CPU has no AVX-512), with repetitions like
// every other benchmark. Every GFLOP/s counter of the other bench binaries is also shown as
// "%peak" of this probe taken in the same process (or of ATTN_FMA_PEAK, set by
// scripts/bench_compare.sh from this binary's figures in the same run).
//
// FLOP model: 2 per lane per FMA; one iteration = 16 chains x iters FMAs on every thread.
// Args: {threads}. Counters: GFLOP/s of all threads together, %peak of the probe in main().
#include "bench_support.hpp"

namespace {

void BM_FmaPeak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int lanes = attn_bench::fma_probe_lanes();
  if (lanes == 0) {
    state.SkipWithError("no AVX-512 or AVX2+FMA on this CPU");
    return;
  }
  // About 50-80 ms per thread at 3-4 GHz: runs of 2^20 rounds (a few ms) measured 40% low here,
  // as if the clock they were timed with ticked in 4 ms steps.
  const long iters = 1 << 24;
  attn_bench::time_fma_chains(threads, iters);  // warm-up: threads created, clock ramped up
  const auto start = attn_bench::loop_start();
  for (auto _ : state) attn_bench::time_fma_chains(threads, iters);
  const double flop =
      2.0 * lanes * attn_bench::fma_probe_chains() * static_cast<double>(iters) * threads;
  attn_bench::set_rate_counters(state, start, flop, 0, threads);
}

}  // namespace

BENCHMARK(BM_FmaPeak)
    ->Name("fma_peak")
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->Apply(attn_bench::wall_clock_ms);

ATTN_BENCHMARK_MAIN();
