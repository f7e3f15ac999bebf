// The blocking and threading around a micro-kernel (Isa: gemm_avx512.hpp's or gemm_avx2.hpp's):
// B packed once and shared, A read in place (or packed per thread, or once and shared), blocks of
// rows handed out as threads come free.
#pragma once

#include "attn/kernels/detail/gemm_avx2.hpp"
#include "attn/kernels/detail/gemm_avx512.hpp"
#include "attn/kernels/detail/gemm_pack_buffers.hpp"
#include "attn/kernels/detail/gemm_weight_cache.hpp"
#include "attn/kernels/dropout.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)

#include <tuple>

#include "attn/parallel.hpp"

namespace attn::kernels::detail {

/// Panels of B per packing task when B's rows are contiguous (pack_b_panels): 256 bytes of each
/// row for the AVX2 kernel, 512 for the AVX-512 one.
inline constexpr Index kPackPanels = 4;

/// Packs the panels [q0, q1) of B's kc-deep block at row k0 into `packed` (whose panels they must
/// be): B with contiguous rows kPackPanels panels at a time, row by row (pack_b_panels), other
/// layouts a panel at a time.
template <class Isa>
void pack_b_block(const StridedMatrix<const float>& b, Index k0, Index kc, Index q0, Index q1,
                  const PackedB<Isa::kNR>& packed) {
  const bool by_rows = b.col_stride == 1;
  for (Index q = q0; q < q1; q += by_rows ? kPackPanels : 1) {
    float* first = const_cast<float*>(packed.panel(k0, kc, q));
    if (by_rows)
      Isa::pack_b_panels(b, k0, kc, q, std::min(q + kPackPanels, q1), first);
    else
      Isa::pack_b_panel(b, k0, kc, q, first);
  }
}

/// How the tasks read A: in place when its rows are contiguous, or its columns (unless the kernel
/// packs those, Isa::kPackColumnsOfA, and each task's A block meets many B panels), else packed
/// (see ALayout in gemm_tile.hpp). Tasks with their own few panels of B (GemmTasks::own_panels)
/// each read all of A: packing it per task made a 512 x 2048 x 512 weight gradient on AVX2 take
/// 13-15 ms instead of 10.5-10.8.
template <class Isa>
ALayout a_layout(const StridedMatrix<const float>& a, bool own_panels) {
  if (a.col_stride == 1) return ALayout::rows;
  if (a.row_stride == 1 && (own_panels || !Isa::kPackColumnsOfA)) return ALayout::columns;
  return ALayout::packed;
}

/// Copies rows x cols floats between row-major blocks.
inline void copy_block(const float* src, Index src_ld, float* dst, Index dst_ld, Index rows,
                       Index cols) {
  for (Index i = 0; i < rows; ++i)
    std::memcpy(dst + i * dst_ld, src + i * src_ld, sizeof(float) * static_cast<size_t>(cols));
}

/// Whether C's blocks are computed in a per-thread copy whose rows are not 4 KiB apart, then
/// stored row by row. When C's rows are a multiple of 4 KiB apart (FeedForward's hidden layer at
/// d_ff 1024 or 2048), the twelve rows of a tile fall in the same sets of the L1, and storing or
/// loading a tile evicts the B panel the next tile reads: C = A B at 2048 x 256 x 2048 on one
/// thread ran at 170 GFLOP/s in place against 211 with C's rows 64 bytes further apart. With the
/// copy, 2048 x 512 x 2048 took 11.3-11.5 ms instead of 12.2-12.6 (A^T B) and 11.1-11.5 instead of
/// 12.0-12.4 (A B^T) on 2 threads (bench_gemm, three alternating rounds); storing the last depth
/// block straight to C instead of copying lost most of that (11.7-13.0 ms). A product of one
/// depth block stores each tile once and stays in place: through the copy, 2048 x 256 x 1024 ran
/// at 194-207 GFLOP/s on one thread against 215-216 in place.
inline bool c_rows_alias(const StridedMatrix<float>& c) {
  return c.rows > 1 && c.row_stride > 0 && c.row_stride % 1024 == 0;
}

/// A packed once per product and shared by the threads: depth blocks of `depth`, each the panels
/// of all `rows` (a multiple of kMR) rows, kc x kMR each; block(k0, kc, i0) is where row i0's
/// panel of the block at k0 starts.
/// The threads pack it in tasks of kMC rows of a depth block, after B's.
struct SharedA {
  float* data = nullptr;
  Index rows = 0;
  Index groups = 0;  // packing tasks per depth block
  float* block(Index k0, Index kc, Index i0) const { return data + k0 * rows + i0 * kc; }
  Index pack_tasks(Index depth_blocks) const { return data != nullptr ? depth_blocks * groups : 0; }
};
template <class Isa>
SharedA shared_a_buffer(Index M, Index K) {
  const Index rows = (M + Isa::kMR - 1) / Isa::kMR * Isa::kMR;
  return {pack_buffer(PackSlot::shared_a, rows * K), rows, (M + Isa::kMC - 1) / Isa::kMC};
}
template <class Isa>
void pack_shared_a(const StridedMatrix<const float>& a, const SharedA& s, Index t, Index depth) {
  const Index k0 = t / s.groups * depth, i0 = t % s.groups * Isa::kMC;
  const Index kc = std::min<Index>(depth, a.cols - k0);
  Isa::pack_a(a, i0, std::min<Index>(Isa::kMC, a.rows - i0), k0, kc, s.block(k0, kc, i0));
}

/// One block of C: for each depth block (depth_block), A's rows (read in place, packed into
/// `own_a`, or already packed in `shared_a`) against the block's B panels; then the epilogue's
/// dropout.
template <class Isa>
void gemm_block(const StridedMatrix<const float>& a, ALayout layout, const PackedB<Isa::kNR>& b,
                StridedMatrix<float> c, const CBlock& blk, bool accumulate, const GemmEpilogue& epi,
                float* own_a, const SharedA& shared_a = {}) {
  constexpr int kNR = Isa::kNR;
  constexpr Index kMC = Isa::kMC, kNC = Isa::kNC;
  const Index K = a.cols, N = c.cols, i0 = blk.i0, mc = blk.mc;
  const Index j0 = blk.q0 * kNR, cols = std::min<Index>(blk.q1 * kNR, N) - j0;
  const bool copy = c_rows_alias(c) && K > b.depth;  // one depth block: stored once, in place
  // A block is at most kMC x kNC (GemmTasks); the copy's rows are 64 bytes more than kNC apart.
  const CTarget<kNR> target =
      copy ? CTarget<kNR>{pack_buffer(PackSlot::c, kMC * (kNC + 16)), kNC + 16}
           : CTarget<kNR>{&c(i0, j0), c.row_stride};
  if (copy && accumulate) copy_block(&c(i0, j0), c.row_stride, target.data, target.ld, mc, cols);
  for (Index k0 = 0; k0 < K; k0 += b.depth) {
    const Index kc = std::min<Index>(b.depth, K - k0);
    const bool from_zero = k0 == 0 && !accumulate, last = k0 + kc == K;
    // The row sums of A by the tasks of the first columns, which together see each row once.
    if (epi.row_sums_of_a != nullptr && blk.q0 == 0)
      Isa::add_row_sums(a, i0, mc, k0, kc, epi.row_sums_of_a);
    switch (layout) {
      case ALayout::rows:
        Isa::template block_depth<ALayout::rows>(a, b, target, N, blk, k0, kc, from_zero, last, epi,
                                                 nullptr);
        break;
      case ALayout::columns:
        Isa::template block_depth<ALayout::columns>(a, b, target, N, blk, k0, kc, from_zero, last,
                                                    epi, nullptr);
        break;
      case ALayout::packed: {
        const float* panels = shared_a.data ? shared_a.block(k0, kc, i0) : own_a;
        if (shared_a.data == nullptr) Isa::pack_a(a, i0, mc, k0, kc, own_a);
        Isa::template block_depth<ALayout::packed>(a, b, target, N, blk, k0, kc, from_zero, last,
                                                   epi, panels);
        break;
      }
    }
  }
  if (copy) copy_block(target.data, target.ld, &c(i0, j0), c.row_stride, mc, cols);
  // Dropout last, on the finished block while it is still in cache.
  if (epi.dropout > 0)
    dropout_block(&c(i0, j0), mc, cols, c.row_stride, i0, j0, N, epi.dropout, epi.dropout_key);
}

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

/// Whether A is packed once for the whole product, by the threads together with B, and shared:
/// when its columns are contiguous (A = dy^T) and each row block meets at least
/// kShareAColumnBlocks blocks of B's columns. Read in place, A's rows (a step of k) are M floats
/// apart, 8 KiB at M = 2048, so a 12-row panel lands in few sets of the L1 and L2 and comes from
/// L3 again for every panel of B; packed per task (the AVX2 kernel), it is copied once per column
/// block. Packing once, A^T B at 2048 x 512 x 8000 took 49.7 instead of 53.0 ms (AVX-512, 2
/// threads, medians of 5 alternating rounds, faster in all 5), 89-91 instead of 95-99 (1 thread,
/// 3 rounds), 87-90 instead of 92-98 (AVX2 kernel, 2 threads); at 2048 x 512 x 2048 (2 column
/// blocks) it lost 3%, at 2048 x 2048 x 512 (1) 15%: the packing pass over all of A comes before
/// any product and overlaps nothing.
inline constexpr Index kShareAColumnBlocks = 4;
template <class Isa>
bool packs_a_once(const StridedMatrix<const float>& a, const GemmTasks<Isa>& tasks) {
  return a.row_stride == 1 && a.col_stride != 1 && tasks.own_panels == 0 &&
         tasks.col_blocks >= kShareAColumnBlocks;
}

/// The epilogue's gate over all of c, for the paths that apply it after the product.
inline void apply_gate(StridedMatrix<float> c, const GemmEpilogue& epi) {
  if (epi.gate == nullptr) return;
  for (Index i = 0; i < c.rows; ++i)
    for (Index j = 0; j < c.cols; ++j)
      c(i, j) = gated(c(i, j), epi.gate[i * epi.gate_stride + j], epi.gate_scale);
}

/// C = A B with an empty inner dimension: C (or C + 0 when accumulating), then the epilogue.
inline void gemm_empty_depth(StridedMatrix<float> c, bool accumulate, const GemmEpilogue& epi) {
  for (Index i = 0; i < c.rows; ++i)
    for (Index j = 0; j < c.cols; ++j) {
      float v = accumulate ? c(i, j) : 0.0f;
      if (epi.bias) v += epi.bias[j];
      if (epi.relu) v = std::max(v, 0.0f);
      c(i, j) = v;
    }
  if (epi.dropout > 0)
    dropout_rows(c.data, c.rows, c.cols, c.row_stride, 0, epi.dropout, epi.dropout_key);
  apply_gate(c, epi);
}

/// A task with its own panels of B (GemmTasks::own_panels): columns [blk.q0, blk.q1) of C for all
/// rows, its panels packed by the thread that reads them, then its rows kMC at a time.
template <class Isa>
void gemm_own_panels(const StridedMatrix<const float>& a, ALayout layout,
                     const StridedMatrix<const float>& b, StridedMatrix<float> c, const CBlock& blk,
                     Index depth, bool accumulate, const GemmEpilogue& epi, float* own_a) {
  constexpr int kNR = Isa::kNR;
  const Index K = a.cols, M = c.rows;
  const PackedB<kNR> own{pack_buffer(PackSlot::b, K * (blk.q1 - blk.q0) * kNR), blk.q1 - blk.q0,
                         depth, blk.q0};
  for (Index k0 = 0; k0 < K; k0 += depth)
    pack_b_block<Isa>(b, k0, std::min<Index>(depth, K - k0), blk.q0, blk.q1, own);
  for (Index i0 = 0; i0 < M; i0 += Isa::kMC)
    gemm_block<Isa>(a, layout, own, c, {i0, std::min(Isa::kMC, M - i0), blk.q0, blk.q1}, accumulate,
                    epi, own_a);
}

/// c (=, or += when accumulate) a b, then the epilogue, in one pass over all of K: a product not
/// sliced, or one slice of depth of one that is (gemm_slices.hpp's gemm_packed, the entry point).
/// c [M, N] must have unit column stride. Runs on up to `threads` threads (1 inside a parallel
/// region). `b_lifetime` says whether b's packed form is kept: a weight's while a
/// ConstantWeightsScope is open (gemm_weight_cache.hpp), an operand marked `scope` while a
/// ReusedBScope is (gemm_pack_buffers.hpp). The latter's copy is looked up after every allocation
/// before B is packed, so that a copy marked as packed is always packed.
///
/// Two phases: the threads pack B together (unless it is cached), meet at one barrier, then take
/// tasks (blocks of C); or, for few rows, one phase of tasks that each pack their own panels of B
/// (GemmTasks). A is read in place unless neither its rows nor its columns are contiguous, or it is
/// packed once with B (packs_a_once).
template <class Isa>
void gemm_packed_slice(const StridedMatrix<const float>& a, const StridedMatrix<const float>& b,
                       StridedMatrix<float> c, bool accumulate, const GemmEpilogue& epi,
                       int threads, BLifetime b_lifetime) {
  constexpr int kNR = Isa::kNR;
  constexpr Index kMC = Isa::kMC;
  using Tasks = GemmTasks<Isa>;
  const Index M = c.rows, N = c.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_empty_depth(c, accumulate, epi);
#if defined(_OPENMP)
  if (omp_in_parallel()) threads = 1;
#endif
  const Index panels = Tasks::ceil_div(N, kNR);
  // B's kept packed form, if it has one, and whether that is still to be written.
  auto [cached, first_use] = b_lifetime == BLifetime::weight
                                 ? cached_packing(b, K * panels * kNR, kNR)
                                 : std::pair<float*, bool>{nullptr, false};
  const Tasks tasks(M, N, K, threads, cached != nullptr);
  threads = static_cast<int>(std::min<Index>(threads, tasks.count()));
  const ALayout in_place = a_layout<Isa>(a, tasks.own_panels > 0);
  const SharedA shared_a = packs_a_once(a, tasks) ? shared_a_buffer<Isa>(M, K) : SharedA{};
  const ALayout layout = shared_a.data != nullptr ? ALayout::packed : in_place;
  const bool packs_a = layout == ALayout::packed && shared_a.data == nullptr;
  // A cached weight keeps its packing depth whatever the later A (scope copies are keyed on it).
  const Index depth = depth_block<Isa>(K, N, in_place == ALayout::columns && cached == nullptr);
  const Index kblocks = (K + depth - 1) / depth;
  if (b_lifetime == BLifetime::scope && tasks.own_panels == 0)
    std::tie(cached, first_use) = reused_packing(b, K * panels * kNR, kNR, depth);
  const PackedB<kNR> packed_b{cached != nullptr      ? cached
                              : tasks.own_panels > 0 ? nullptr
                                                     : pack_buffer(PackSlot::b, K * panels * kNR),
                              panels, depth};
  // Shared B: packed by the threads together, kPackPanels (or one) panels of a depth block per
  // task, then one barrier.
  const Index group = b.col_stride == 1 ? kPackPanels : 1, per_block = (panels + group - 1) / group;
  const Index b_pack_tasks =
      tasks.own_panels == 0 && (cached == nullptr || first_use) ? kblocks * per_block : 0;
  const Index pack_tasks = b_pack_tasks + shared_a.pack_tasks(kblocks);  // B's, then A's
  const auto pack_task = [&](Index t) {
    if (t >= b_pack_tasks) return pack_shared_a<Isa>(a, shared_a, t - b_pack_tasks, depth);
    const Index k0 = (t / per_block) * depth, q0 = t % per_block * group;
    pack_b_block<Isa>(b, k0, std::min<Index>(depth, K - k0), q0, std::min(q0 + group, panels),
                      packed_b);
  };
  const Index work_tasks = tasks.count();
  const auto work_task = [&](Index t, float* own_a) {
    const CBlock blk = tasks.block(t);
    if (tasks.own_panels == 0)
      return gemm_block<Isa>(a, layout, packed_b, c, blk, accumulate, epi, own_a, shared_a);
    gemm_own_panels<Isa>(a, layout, b, c, blk, depth, accumulate, epi, own_a);
  };
#if defined(_OPENMP)
  if (threads > 1) {
    // Dynamic hand-out in both phases: a thread slowed by another process on its core takes
    // fewer tasks instead of holding up the other one (the only wait is the barrier after
    // packing, and the end of the region).
    RegionErrors errors;
#pragma omp parallel num_threads(threads)
    {
      if (pack_tasks > 0) {  // the same on every thread
#pragma omp for schedule(dynamic, 4)
        for (Index t = 0; t < pack_tasks; ++t) errors.run([&] { pack_task(t); });
      }
      float* own_a = nullptr;
      if (packs_a) errors.run([&] { own_a = pack_buffer(PackSlot::a, kMC * depth); });
#pragma omp for schedule(dynamic, 1)
      for (Index t = 0; t < work_tasks; ++t) errors.run([&] { work_task(t, own_a); });
    }
    errors.rethrow();
    return;
  }
#endif
  for (Index t = 0; t < pack_tasks; ++t) pack_task(t);
  float* own_a = packs_a ? pack_buffer(PackSlot::a, kMC * depth) : nullptr;
  for (Index t = 0; t < work_tasks; ++t) work_task(t, own_a);
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512_GEMM
