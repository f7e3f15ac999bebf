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

#include <utility>

#include "attn/kernels/detail/gemm_tasks.hpp"
#include "attn/parallel.hpp"

namespace attn::kernels::detail {

/// Panels of B per packing task when B's rows are contiguous (pack_b_panels): 256 bytes of each
/// row for the AVX2 kernel, 512 for the AVX-512 one.
inline constexpr Index kPackPanels = 4;

/// Packs the panels [q0, q1) of B's depth block at row k0 into `packed` (whose panels they must
/// be, of B's first packed.rows rows): B with contiguous rows kPackPanels panels at a time, row by
/// row (pack_b_panels), other layouts a panel at a time.
template <class Isa>
void pack_b_block(const StridedMatrix<const float>& b, Index k0, Index q0, Index q1,
                  const PackedB<Isa::kNR>& packed) {
  const Index kc = std::min(packed.depth, packed.rows - k0);
  const bool by_rows = b.col_stride == 1;
  for (Index q = q0; q < q1; q += by_rows ? kPackPanels : 1) {
    float* first = const_cast<float*>(packed.panel(k0, q));
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

/// Whether a product of depth K in blocks `depth` deep computes C's blocks in the copy: C's rows
/// alias, and there is more than one depth block (one is stored once, in place).
inline bool computes_c_in_copy(const StridedMatrix<float>& c, Index K, Index depth) {
  return c_rows_alias(c) && K > depth;
}

/// The calling thread's copy of a block of C: at most kMC x kNC (GemmTasks), its rows 64 bytes
/// more than kNC apart.
template <class Isa>
CTarget<Isa::kNR> c_copy() {
  return {pack_buffer(PackSlot::c, Isa::kMC * (Isa::kNC + 16)), Isa::kNC + 16};
}

/// The calling thread's buffer for `panels` panels of B, K deep (a task's own panels).
template <class Isa>
float* own_panels_buffer(Index K, Index panels) {
  return pack_buffer(PackSlot::b, K * panels * Isa::kNR);
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
  const Index K = a.cols, N = c.cols, i0 = blk.i0, mc = blk.mc;
  const Index j0 = blk.q0 * kNR, cols = std::min<Index>(blk.q1 * kNR, N) - j0;
  const bool copy = computes_c_in_copy(c, K, b.depth);
  const CTarget<kNR> target = copy ? c_copy<Isa>() : CTarget<kNR>{&c(i0, j0), c.row_stride};
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
  if (epi.dropout.p > 0)
    dropout_block(&c(i0, j0), mc, cols, c.row_stride, i0, j0, N, epi.dropout.p, epi.dropout.key);
}

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
  if (epi.dropout.p > 0)
    dropout_rows(c.data, c.rows, c.cols, c.row_stride, 0, epi.dropout.p, epi.dropout.key);
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
  const PackedB<kNR> own{own_panels_buffer<Isa>(K, blk.q1 - blk.q0), K, blk.q1 - blk.q0, depth,
                         blk.q0};
  for (Index k0 = 0; k0 < K; k0 += depth) pack_b_block<Isa>(b, k0, blk.q0, blk.q1, own);
  for (Index i0 = 0; i0 < M; i0 += Isa::kMC)
    gemm_block<Isa>(a, layout, own, c, {i0, std::min(Isa::kMC, M - i0), blk.q0, blk.q1}, accumulate,
                    epi, own_a);
}

/// Grows the calling thread's buffers to what any task of the product may ask (gemm_block's copy of
/// C, gemm_own_panels' panels of B), so that every thread of a region has them after its first
/// products, whichever tasks it took (see reserve_reused_copies).
template <class Isa>
void reserve_task_buffers(const StridedMatrix<float>& c, Index K, Index depth,
                          const GemmTasks<Isa>& tasks) {
  if (tasks.own_panels > 0) own_panels_buffer<Isa>(K, tasks.own_panels);
  if (computes_c_in_copy(c, K, depth)) c_copy<Isa>();
}

/// How a product's B is packed when the threads share it: into `packed` (a kept copy, or the
/// thread's buffer), by `tasks` packing tasks of `group` panels of one depth block each (none when
/// the kept copy is packed already). `source` is what is packed: B, or all of the larger operand
/// whose leading block B is when that operand's copy is kept (gemm_packed_slice). `kept` is the
/// kept copy, which the product marks written once it has returned.
template <class Isa>
struct SharedBPacking {
  StridedMatrix<const float> source;
  PackedB<Isa::kNR> packed;
  Index group = 1, per_block = 0, tasks = 0;
  KeptCopy kept = {};

  void run(Index t) const {
    const Index k0 = t / per_block * packed.depth, q0 = t % per_block * group;
    pack_b_block<Isa>(source, k0, q0, std::min(q0 + group, packed.panels), packed);
  }
};

/// The packing of B [K, N], the leading block of b, for a product whose tasks share it: in a kept
/// copy, a weight's (`weight_copy`: cached_packing's answer) or, for `scope`, one looked up here,
/// else in the thread's buffer. A scope's copy is of all of b, so that products with other leading
/// blocks of b read it too.
template <class Isa>
SharedBPacking<Isa> plan_shared_b(const StridedMatrix<const float>& b, Index K, Index N,
                                  BLifetime b_lifetime, KeptCopy weight_copy, Index depth) {
  constexpr int kNR = Isa::kNR;
  const auto panels_of = [](const StridedMatrix<const float>& m) {
    return GemmTasks<Isa>::ceil_div(m.cols, kNR);
  };
  SharedBPacking<Isa> plan;
  plan.source = {b.data, K, N, b.row_stride, b.col_stride};
  plan.kept = weight_copy;
  if (b_lifetime == BLifetime::scope) {
    plan.kept = reused_packing(b, b.rows * panels_of(b) * kNR, kNR, depth);
    if (plan.kept.data != nullptr) plan.source = b;
  }
  const StridedMatrix<const float>& src = plan.source;
  const Index panels = panels_of(src);
  float* data = plan.kept.data != nullptr ? plan.kept.data
                                          : pack_buffer(PackSlot::b, src.rows * panels * kNR);
  plan.packed = {data, src.rows, panels, depth};
  plan.group = src.col_stride == 1 ? kPackPanels : 1;
  plan.per_block = (panels + plan.group - 1) / plan.group;
  if (plan.kept.data == nullptr || plan.kept.to_write())
    plan.tasks = (src.rows + depth - 1) / depth * plan.per_block;
  return plan;
}

/// c (=, or += when accumulate) a b, then the epilogue, in one pass over all of K: a product not
/// sliced, or one slice of depth of one that is (gemm_slices.hpp's gemm_packed, the entry point).
/// c [M, N] must have unit column stride. Runs on up to `threads` threads (1 inside a parallel
/// region). `b_lifetime` says whether b's packed form is kept: a weight's while a
/// ConstantWeightsScope is open (gemm_weight_cache.hpp), an operand marked `scope` while a
/// ReusedBScope is (gemm_pack_buffers.hpp). A kept copy this product writes is marked written when
/// it returns, so that one it did not finish is written again by the next. B is b's leading
/// [K, N] block (K = a.cols): all of b, but for `scope`, where b may be larger and its copy holds
/// all of it (attention's causal query blocks each see more of a head's keys).
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
  const StridedMatrix<const float> b_used{b.data, K, N, b.row_stride, b.col_stride};  // B
  // A weight's kept packed form, if it has one, and whether that is still to be written.
  const auto weight = b_lifetime == BLifetime::weight
                          ? cached_packing(b_used, K * Tasks::ceil_div(N, kNR) * kNR, kNR)
                          : KeptCopy{};
  const Tasks tasks(M, N, K, threads, weight.data != nullptr);
  threads = static_cast<int>(std::min<Index>(threads, tasks.count()));
  const ALayout in_place = a_layout<Isa>(a, tasks.own_panels > 0);
  const SharedA shared_a = packs_a_once(a, tasks) ? shared_a_buffer<Isa>(M, K) : SharedA{};
  const ALayout layout = shared_a.data != nullptr ? ALayout::packed : in_place;
  const bool packs_a = layout == ALayout::packed && shared_a.data == nullptr;
  // A cached weight keeps its packing depth whatever the later A (scope copies are keyed on it).
  const Index depth =
      depth_block<Isa>(K, N, in_place == ALayout::columns && weight.data == nullptr);
  const Index kblocks = (K + depth - 1) / depth;
  // Shared B: packed by the threads together, then one barrier (tasks with their own panels of
  // B pack those instead).
  const SharedBPacking<Isa> b_plan = tasks.own_panels == 0
                                         ? plan_shared_b<Isa>(b, K, N, b_lifetime, weight, depth)
                                         : SharedBPacking<Isa>{b_used, {nullptr, K, 0, depth}};
  const Index pack_tasks = b_plan.tasks + shared_a.pack_tasks(kblocks);  // B's, then A's
  const auto pack_task = [&](Index t) {
    if (t >= b_plan.tasks) return pack_shared_a<Isa>(a, shared_a, t - b_plan.tasks, depth);
    b_plan.run(t);
  };
  const Index work_tasks = tasks.count();
  const auto work_task = [&](Index t, float* own_a) {
    const CBlock blk = tasks.block(t);
    if (tasks.own_panels == 0)
      return gemm_block<Isa>(a, layout, b_plan.packed, c, blk, accumulate, epi, own_a, shared_a);
    gemm_own_panels<Isa>(a, layout, b_used, c, blk, depth, accumulate, epi, own_a);
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
      errors.run([&] { reserve_task_buffers<Isa>(c, K, depth, tasks); });
#pragma omp for schedule(dynamic, 1)
      for (Index t = 0; t < work_tasks; ++t) errors.run([&] { work_task(t, own_a); });
    }
    errors.rethrow();
    b_plan.kept.mark_written();
    return;
  }
#endif
  for (Index t = 0; t < pack_tasks; ++t) pack_task(t);
  float* own_a = packs_a ? pack_buffer(PackSlot::a, kMC * depth) : nullptr;
  for (Index t = 0; t < work_tasks; ++t) work_task(t, own_a);
  b_plan.kept.mark_written();
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512_GEMM
