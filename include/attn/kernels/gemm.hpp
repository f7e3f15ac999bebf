// Matrix products split over threads by rows of the result, each block a serial Eigen GEMM.
//
// Why not Eigen's own threaded GEMM: its threads share packed blocks and wait for each other in
// busy loops, so on a shared machine a descheduled thread stalls the other for a whole time slice
// (measured: a 2-thread training step 10-50x slower than 1 thread under load). Here each thread
// packs what it needs and the only synchronisation is the end of the parallel loop.
//
// Determinism: a block boundary is a multiple of kGemmRowGrain rows, a multiple of the row panel
// of Eigen's kernel (3 SIMD packets: 48 floats with AVX-512), so every row of C sees the same
// kernel and the same order of summation whatever the thread count; results are bitwise equal on
// 1 and N threads (tests/test_gemm.cpp).
#pragma once

#include <algorithm>

#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// Row blocks are multiples of this many rows: 3 panels of the widest SIMD packet (16 floats).
inline constexpr Index kGemmRowGrain = 48;

/// Up to this many blocks of rows per thread, so that work can be rebalanced; but a block has at
/// least kGemmMinBlockGrains grains, since each block packs the whole right-hand side again and
/// the packing is paid back over the block's rows (48-row blocks spent 17% of a training step
/// packing).
inline constexpr Index kGemmBlocksPerThread = 4;
inline constexpr Index kGemmMinBlockGrains = 4;

/// Below this many multiply-adds a product runs on the calling thread.
inline constexpr double kGemmParallelMinWork = 1 << 20;

/// c (=, or += when accumulate) a * b, for Eigen expressions a [M, K] and b [K, N] and a
/// writable block c [M, N] (Eigen's serial GEMM for each block of rows).
template <class Dst, class Lhs, class Rhs>
void gemm(Dst&& c, const Lhs& a, const Rhs& b, bool accumulate) {
  attn::detail::keep_eigen_serial();
  const Index M = c.rows();
  const double work =
      static_cast<double>(M) * static_cast<double>(c.cols()) * static_cast<double>(a.cols());
  int threads = 1;
#if defined(_OPENMP)
  if (!omp_in_parallel() && work >= kGemmParallelMinWork)
    threads = static_cast<int>(std::min<Index>(num_threads(), M / kGemmRowGrain));
#endif
  const auto block = [&](Index r0, Index rows) {
    if (rows <= 0) return;
    if (accumulate)
      c.middleRows(r0, rows).noalias() += a.middleRows(r0, rows) * b;
    else
      c.middleRows(r0, rows).noalias() = a.middleRows(r0, rows) * b;
  };
  if (threads <= 1) {
    block(0, M);
    return;
  }
  // A few blocks per thread, handed out as threads come free: a thread slowed down by another
  // process on its core takes fewer blocks instead of holding up the others. Block boundaries
  // depend on M and the thread count only, never on timing, and rows do not depend on them.
  const Index grains = (M + kGemmRowGrain - 1) / kGemmRowGrain;
  const Index blocks =
      std::min<Index>(grains, std::clamp<Index>(grains / kGemmMinBlockGrains, threads,
                                                Index(threads) * kGemmBlocksPerThread));
  const Index per = (grains + blocks - 1) / blocks * kGemmRowGrain;
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#endif
  for (Index i = 0; i < blocks; ++i) {
    const Index r0 = std::min<Index>(M, i * per);
    block(r0, std::min<Index>(M, r0 + per) - r0);
  }
}

}  // namespace attn::kernels
