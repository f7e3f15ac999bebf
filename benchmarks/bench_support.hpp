// What every bench_<topic>.cpp shares so that its figures cannot mislead (issue 8):
//   - defaults of at least 5 repetitions, reported as median, mean, stddev, min and max (min of a
//     time and max of a rate are the best repetition); the command line still overrides them;
//   - the FMA peak of this machine, probed in the same process (or handed in by
//     scripts/bench_compare.sh through ATTN_FMA_PEAK="<1 thread>,<2 threads>" GFLOP/s, so that
//     one run uses one probe), and a "%peak" counter beside every GFLOP/s counter;
//   - peak resident memory of the process (getrusage ru_maxrss).
// Warm-up is each benchmark's own job: it runs its operation untimed before the timed loop, so
// the first touch of every buffer is never timed (see bench_train_step.cpp for whole steps).
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fma_peak.hpp"

namespace attn_bench {

/// GFLOP/s of independent FMAs on 1 and 2 threads, set once by main() before any benchmark runs.
inline double g_peak_gflops[3] = {0, 0, 0};

/// The probed peak for `threads` threads (threads beyond 2 scale the 1-thread figure).
inline double peak_gflops(int threads) {
  if (threads >= 1 && threads <= 2 && g_peak_gflops[threads] > 0) return g_peak_gflops[threads];
  return g_peak_gflops[1] * threads;
}

/// Peak resident set of this process so far, in MiB (Linux reports ru_maxrss in KiB).
inline double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

/// Start of a timed loop, for set_rate_counters.
inline std::chrono::steady_clock::time_point loop_start() {
  return std::chrono::steady_clock::now();
}

/// Counters of the timed loop that began at `start` (call right after the loop): tokens/s (when
/// tokens_per_iter > 0), GFLOP/s by the caller's FLOP model, and that as a percentage of the FMA
/// peak for `threads` threads (both left out when flop_per_iter is 0). Plain values over the loop's
/// wall time, not Counter::kIsRate, so that the console shows "%peak=85.1" rather than "85.1/s";
/// with UseRealTime() this is the time Google Benchmark reports, to within the loop's own overhead.
inline void set_rate_counters(benchmark::State& state, std::chrono::steady_clock::time_point start,
                              double flop_per_iter, double tokens_per_iter, int threads) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double iters = static_cast<double>(state.iterations());
  if (tokens_per_iter > 0) state.counters["tokens/s"] = tokens_per_iter * iters / seconds;
  if (flop_per_iter <= 0) return;  // no FLOP model (decoding)
  const double gflops = flop_per_iter * iters / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["%peak"] = 100.0 * gflops / peak_gflops(threads);
}

/// Adds "min" and "max" to the repetition statistics (Google Benchmark reports mean, median,
/// stddev and cv): the best repetition is the min of the times and the max of the rates.
inline void best_statistics(benchmark::internal::Benchmark* b) {
  b->ComputeStatistics(
      "min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
  b->ComputeStatistics(
      "max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); });
}

/// How every attn benchmark reports: wall-clock milliseconds, with the min/max statistics.
inline void wall_clock_ms(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->Unit(benchmark::kMillisecond);
  best_statistics(b);
}

/// Peak GFLOP/s from ATTN_FMA_PEAK ("p1,p2") when set, else probed now (about a second).
inline void init_peak() {
  if (const char* env = std::getenv("ATTN_FMA_PEAK")) {
    if (std::sscanf(env, "%lf,%lf", &g_peak_gflops[1], &g_peak_gflops[2]) == 2 &&
        g_peak_gflops[1] > 0 && g_peak_gflops[2] > 0)
      return;
    std::fprintf(stderr, "ATTN_FMA_PEAK: expected \"<1 thread>,<2 threads>\" GFLOP/s, got \"%s\"\n",
                 env);
    std::exit(2);
  }
  g_peak_gflops[1] = probe_fma_peak_gflops(1);
  g_peak_gflops[2] = probe_fma_peak_gflops(2);
}

/// main() of every bench binary: honest defaults before the user's flags (later flags win), the
/// peak in the report's context, then Google Benchmark as usual.
inline int run_main(int argc, char** argv) {
  std::vector<std::string> defaults = {"--benchmark_repetitions=5",
                                       "--benchmark_display_aggregates_only=true"};
  std::vector<char*> args = {argv[0]};
  for (auto& d : defaults) args.push_back(d.data());
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  init_peak();
  benchmark::AddCustomContext("fma_peak_isa", fma_probe_isa());
  benchmark::AddCustomContext("fma_peak_GFLOP/s_1_thread", std::to_string(g_peak_gflops[1]));
  benchmark::AddCustomContext("fma_peak_GFLOP/s_2_threads", std::to_string(g_peak_gflops[2]));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace attn_bench

#define ATTN_BENCHMARK_MAIN() \
  int main(int argc, char** argv) { return attn_bench::run_main(argc, argv); }
