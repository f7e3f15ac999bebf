// The machine's fp32 FMA peak, probed: every thread runs independent chains of FMAs on full
// vector registers, nothing else (no loads, no stores). 16 zmm chains cover an FMA latency of 4
// cycles times 2 FMA ports (8 chains needed) with room to spare, and leave 16 of the 32 zmm
// registers free, so the compiler keeps all of them in registers. With AVX2 there are only 16
// ymm registers: 12 chains (and the two constants) fit; 16 did not, and the spilled chains ran
// at half the rate (52 GFLOP/s per core on a Zen 3 whose GEMM reached 73).
//
// Compiled with function target attributes, so the probe needs no -march=native: the AVX-512
// loop runs when the CPU has avx512f, else an AVX2+FMA loop, else nothing (0).
// FLOP model: 2 per lane per FMA (multiply + add).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace attn_bench {

inline constexpr int kFmaChains = 16;      // zmm chains
inline constexpr int kFmaChainsAvx2 = 12;  // ymm chains

// The probe's loop, written once and stamped per instruction set by this macro (a template could
// not take a target attribute per instantiation, and GCC will not inline an intrinsic into a
// function without its target): `mm` is the intrinsics' prefix (_mm512, _mm256), `V` their vector
// type. The chains are summed only so that they are used.
#define ATTN_BENCH_FMA_CHAINS(name, isa, V, mm, chains)                                     \
  __attribute__((target(isa))) inline float name(long iters, float x, float y) {            \
    V acc[chains];                                                                          \
    for (int i = 0; i < chains; ++i) acc[i] = mm##_set1_ps(0.001f * static_cast<float>(i)); \
    const V vx = mm##_set1_ps(x), vy = mm##_set1_ps(y);                                     \
    for (long n = 0; n < iters; ++n) {                                                      \
      _Pragma("GCC unroll 16") for (int i = 0; i < chains; ++i) {                           \
        acc[i] = mm##_fmadd_ps(acc[i], vx, vy);                                             \
      }                                                                                     \
    }                                                                                       \
    V sum = acc[0];                                                                         \
    for (int i = 1; i < chains; ++i) sum = mm##_add_ps(sum, acc[i]);                        \
    float lanes[sizeof(V) / sizeof(float)];                                                 \
    mm##_storeu_ps(lanes, sum);                                                             \
    float total = 0;                                                                        \
    for (float v : lanes) total += v;                                                       \
    return total;                                                                           \
  }
ATTN_BENCH_FMA_CHAINS(fma_chains_avx512, "avx512f", __m512, _mm512, kFmaChains)
ATTN_BENCH_FMA_CHAINS(fma_chains_avx2, "avx2,fma", __m256, _mm256, kFmaChainsAvx2)
#undef ATTN_BENCH_FMA_CHAINS

/// Floats per vector register of the probe that runs here (16, 8, or 0: no FMA probe).
inline int fma_probe_lanes() {
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
  return 0;
}

/// Chains per thread of the probe that runs here.
inline int fma_probe_chains() { return fma_probe_lanes() == 16 ? kFmaChains : kFmaChainsAvx2; }

inline const char* fma_probe_isa() {
  const int lanes = fma_probe_lanes();
  return lanes == 16 ? "avx512f" : lanes == 8 ? "avx2+fma" : "none";
}

/// Runs `iters` rounds of the chains on `threads` threads at once; wall-clock seconds.
inline double time_fma_chains(int threads, long iters) {
  // x < 1 and y small: the chains converge to y / (1 - x) and never overflow or go denormal.
  const float x = 0.999f, y = 0.001f;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<float> sink(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      sink[static_cast<std::size_t>(t)] =
          fma_probe_lanes() == 16 ? fma_chains_avx512(iters, x, y) : fma_chains_avx2(iters, x, y);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float keep = sink[0];  // the chains' results are used
  (void)keep;
  return seconds;
}

/// Best of 5 runs of about 0.1 s each: GFLOP/s of `threads` threads doing nothing but FMAs.
inline double probe_fma_peak_gflops(int threads) {
  const int lanes = fma_probe_lanes();
  if (lanes == 0 || threads < 1) return 0.0;
  long iters = 1 << 14;
  while (time_fma_chains(1, iters) < 0.1) iters *= 2;
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) best = std::min(best, time_fma_chains(threads, iters));
  const double flop = 2.0 * lanes * fma_probe_chains() * static_cast<double>(iters) * threads;
  return flop / best * 1e-9;
}

}  // namespace attn_bench
