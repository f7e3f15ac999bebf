// How the packed GEMM (gemm_packed.hpp) cuts one product into tasks for its threads: blocks of C,
// each a range of rows by a range of B's panels.
#pragma once

#include <algorithm>

#include "attn/kernels/detail/gemm_tile.hpp"

namespace attn::kernels::detail {

/// The tasks of one product, blocks of C handed out to the threads as they come free:
///   - head: blocks of kMC rows by at most kNC columns, column blocks outermost, so that the
///     threads sweep all rows against one block of B (which stays in cache) before the next;
///   - tail (on several threads): the last rows, between 1 and 2 kMC blocks' worth per thread, in
///     blocks of at most kMC rows by kTailPanels or fewer panels, so that the threads finish
///     together. Narrow, not short: a block of 24 rows by 1024 columns (the tail before) passed
///     each B panel to only two micro-tiles, and a weight gradient of 256 rows summed over 2048
///     tokens was 9-11 such tasks of up to 50 M multiply-adds for two threads;
///   - own panels, instead of both (on several threads, at most kOwnPanelsMaxRows rows, B not
///     packed already): all rows by a few panels, about kTasksPerThread tasks per thread, each
///     packing its own panels of B (at most kOwnPanelsBytes of them). B packed once by the threads
///     together is read by both, and on this machine a line one core wrote costs the other a
///     transfer: weight gradients summed over 2048 tokens, whose B (the layer's input) is as
///     large as their A and read by few rows, ran at 316-322 GFLOP/s (256 x 256, A^T B, 2
///     threads) and 360-366 (512 x 512) with B shared, 382-386 and 391-392 with own panels
///     (1536 x 512: no difference, so the limit stays low).
/// The cut never changes a result: each element of C is summed the same way in any block.
template <class Isa>
struct GemmTasks {
  static constexpr Index kMR = Isa::kMR, kNR = Isa::kNR, kMC = Isa::kMC, kNC = Isa::kNC;
  static constexpr Index kTasksPerThread = 4;
  static constexpr Index kMinPanels = 2;   // a tail task's columns: at least 64, unless heavy
  static constexpr Index kTailPanels = 4;  // and at most 128
  static constexpr double kTailTaskWork = 1 << 23;  // multiply-adds: above, a tail task is heavy
  static constexpr Index kOwnPanelsMaxRows = 512;
  // A task's packed panels at most. Each task reads all of A (dy^T) once, so a cap that leaves
  // one panel per task makes the threads stream A once per 32 columns. At 512 KiB (until
  // session 34) that happened from 2049 tokens on; at 2 MiB (session 34, scratch timings, medians
  // of 3 alternating runs, 2 threads, GFLOP/s) dW = dy^T x at 128 x 3072 x 512 went from 249 to
  // 290, 128 x 4200 x 512 from 237 to 278, 512 x 8192 x 2048 from 220 to 294, 256 x 6000 x 1024
  // from 279 to 327, and the 2048-token ones (512 x 2048 x 2048, 256 x 2048 x 1024) stayed level,
  // although their panels then outgrow the 1 MiB L2. Products deeper than 3072 now run in
  // slices (gemm_slices.hpp), so at least five panels fit.
  static constexpr Index kOwnPanelsBytes = Index(2) << 20;
  Index rows, panels;
  // head: row blocks, panels per column block, column blocks
  Index head_blocks = 0, nc_panels = 0, col_blocks = 0;
  Index tail_blocks = 0, tail_rows = 0, tail_panels = 0, tail_col_blocks = 0;
  // own panels: tasks of all rows by own_panels panels, each packing its own panels of B
  Index own_panels = 0;

  /// `shared_b`: B's packed copy is shared (a cached weight), so no task packs its own panels.
  GemmTasks(Index M, Index N, Index K, int threads, bool shared_b = false)
      : rows(M), panels(ceil_div(N, kNR)) {
    // A task's block of packed B stays at kKC x kNC floats whatever the depth of its blocks.
    nc_panels = std::min(panels, std::max<Index>(1, kNC * Isa::kKC / depth_block<Isa>(K, N) / kNR));
    col_blocks = ceil_div(panels, nc_panels);
    if (threads <= 1) {
      head_blocks = ceil_div(M, kMC);
      return;
    }
    if (!shared_b && M <= kOwnPanelsMaxRows) {
      const Index fit = std::max<Index>(1, kOwnPanelsBytes / (K * kNR * Index(sizeof(float))));
      own_panels = std::clamp<Index>(panels / (Index(threads) * kTasksPerThread), 1,
                                     std::min(fit, kNC / kNR));
      return;
    }
    const Index tail_min = Index(threads) * kMC;
    head_blocks = M > tail_min ? (M - tail_min) / kMC : 0;
    const Index tail = M - head_blocks * kMC;
    tail_blocks = ceil_div(tail, kMC);
    tail_rows = ceil_div(ceil_div(tail, tail_blocks), kMR) * kMR;
    tail_blocks = ceil_div(tail, tail_rows);
    const Index wanted = Index(threads) * kTasksPerThread;
    // Narrower tail tasks until every thread has a few, and until none is heavy (a weight
    // gradient summed over 2048 tokens: one 96 x 128 task is 25 M multiply-adds, and with 256 rows
    // the threads got 5 and 4 of 9 such tasks).
    const auto heavy = [&](Index p) {
      return static_cast<double>(tail_rows * p * kNR) * static_cast<double>(K) > kTailTaskWork;
    };
    tail_panels = std::min(kTailPanels, panels);
    while (tail_panels > 1 &&
           (heavy(tail_panels) ||
            (tail_panels > kMinPanels && tail_blocks * ceil_div(panels, tail_panels) < wanted)))
      --tail_panels;
    tail_col_blocks = ceil_div(panels, tail_panels);
  }
  static Index ceil_div(Index x, Index y) { return (x + y - 1) / y; }
  Index head_tasks() const { return head_blocks * col_blocks; }
  Index count() const {
    return own_panels > 0 ? ceil_div(panels, own_panels)
                          : head_tasks() + tail_blocks * tail_col_blocks;
  }
  CBlock block(Index t) const {
    if (own_panels > 0) return {0, rows, t * own_panels, std::min((t + 1) * own_panels, panels)};
    if (t < head_tasks()) {
      const Index i0 = t % head_blocks * kMC, q0 = t / head_blocks * nc_panels;
      return {i0, std::min(kMC, rows - i0), q0, std::min(q0 + nc_panels, panels)};
    }
    t -= head_tasks();
    const Index i0 = head_blocks * kMC + t % tail_blocks * tail_rows;
    const Index q0 = t / tail_blocks * tail_panels;
    return {i0, std::min(tail_rows, rows - i0), q0, std::min(q0 + tail_panels, panels)};
  }
};

}  // namespace attn::kernels::detail
