// The blocking and threading around the AVX-512 micro-kernel (gemm_avx512.hpp): B packed once and
// shared, A packed per thread, blocks of rows handed out as threads come free.
#pragma once

#include "attn/kernels/detail/gemm_avx512.hpp"
#include "attn/kernels/detail/gemm_weight_cache.hpp"
#include "attn/kernels/dropout.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)

#include <cstdlib>
#include <new>

#include "attn/parallel.hpp"

namespace attn::kernels::detail {

/// A 64-byte aligned buffer per thread and purpose that only ever grows, so that a training loop
/// allocates packing space in its first step and never again.
enum class PackSlot { b = 0, a = 1 };
inline float* pack_buffer(PackSlot slot, Index floats) {
  struct Buffer {
    float* data = nullptr;
    Index capacity = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[2];
  Buffer& buf = buffers[static_cast<int>(slot)];
  if (buf.capacity < floats) {
    std::free(buf.data);
    buf.data = nullptr;
    buf.capacity = 0;
    const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    buf.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (buf.data == nullptr) throw std::bad_alloc();
    buf.capacity = floats;
  }
  return buf.data;
}

/// The packed form of B: kKC-deep blocks, each `panels` panels of kc x kNR.
struct PackedB {
  const float* data;
  Index panels;
  const float* panel(Index k0, Index kc, Index q) const {
    return data + k0 * panels * kNR + q * kc * kNR;
  }
};

/// Rows [i0, i0 + mc) of C: for each kKC block, pack that slice of A and sweep every B panel.
ATTN_TARGET_AVX512 inline void gemm_row_block(const StridedMatrix<const float>& a, const PackedB& b,
                                              StridedMatrix<float> c, Index i0, Index mc,
                                              bool accumulate, const GemmEpilogue& epi,
                                              float* packed_a) {
  const Index K = a.cols, N = c.cols;
  for (Index k0 = 0; k0 < K; k0 += kKC) {
    const Index kc = std::min<Index>(kKC, K - k0);
    pack_a(a, i0, mc, k0, kc, packed_a);
    const bool from_zero = k0 == 0 && !accumulate, last = k0 + kc == K;
    for (Index q = 0; q < b.panels; ++q) {
      const Index j0 = q * kNR, nc = std::min<Index>(kNR, N - j0);
      const float* bq = b.panel(k0, kc, q);
      for (Index p = 0; p < mc; p += kMR)
        micro_tile_rows(static_cast<int>(std::min<Index>(kMR, mc - p)), kc, packed_a + p * kc, bq,
                        &c(i0 + p, j0), c.row_stride, nc, from_zero, last, epi, j0);
    }
  }
  // Dropout last, on the finished rows while they are still in cache.
  if (epi.dropout > 0)
    dropout_rows(&c(i0, 0), mc, N, c.row_stride, i0, epi.dropout, epi.dropout_key);
}

/// How the rows of C are cut into blocks handed out to the threads: kMC rows each, except the last
/// rows (between 1 and 2 kMC blocks' worth per thread), which go in blocks of kTailRows so that the
/// threads finish together (with 96-row blocks only, a 512-row product on 2 threads was split
/// 288 / 224). The cut never changes a result: each element of C is summed the same way in any
/// block.
struct RowBlocks {
  static constexpr Index kTailRows = 2 * kMR;
  Index head = 0;  // blocks of kMC rows first
  Index count = 0;
  Index rows = 0;

  RowBlocks(Index M, int threads) : rows(M) {
    const Index tail_min = threads > 1 ? Index(threads) * kMC : 0;
    head = M > tail_min ? (M - tail_min) / kMC : 0;
    const Index tail = M - head * kMC;
    count = head + (tail + kTailRows - 1) / kTailRows;
    if (threads <= 1) count = head = (M + kMC - 1) / kMC;
  }
  Index start(Index r) const { return r < head ? r * kMC : head * kMC + (r - head) * kTailRows; }
  Index size(Index r) const { return std::min<Index>(r < head ? kMC : kTailRows, rows - start(r)); }
};

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
}

/// c (=, or += when accumulate) a b, then the epilogue; c [M, N] must have unit column stride.
/// Runs on up to `threads` threads (1 inside a parallel region). `constant_b`: b is a weight, whose
/// packed form is kept while a ConstantWeightsScope is open (gemm_weight_cache.hpp).
inline void gemm_packed(const StridedMatrix<const float>& a, const StridedMatrix<const float>& b,
                        StridedMatrix<float> c, bool accumulate, const GemmEpilogue& epi,
                        int threads, bool constant_b = false) {
  const Index M = c.rows, N = c.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_empty_depth(c, accumulate, epi);
  const Index panels = (N + kNR - 1) / kNR, kblocks = (K + kKC - 1) / kKC;
  const auto [cached, first_use] =
      constant_b ? cached_packing(b, K * panels * kNR) : std::pair<float*, bool>{nullptr, false};
  const PackedB packed{cached != nullptr ? cached : pack_buffer(PackSlot::b, K * panels * kNR),
                       panels};
  const auto pack_task = [&](Index t) {
    const Index k0 = (t / panels) * kKC, q = t % panels, kc = std::min<Index>(kKC, K - k0);
    pack_b_panel(b, k0, kc, q, const_cast<float*>(packed.panel(k0, kc, q)));
  };
  const bool pack = cached == nullptr || first_use;
  const Index pack_tasks = pack ? kblocks * panels : 0;
#if defined(_OPENMP)
  if (omp_in_parallel()) threads = 1;
#endif
  threads = static_cast<int>(std::min<Index>(threads, (M + kMC - 1) / kMC));
  const RowBlocks blocks(M, threads);
  const Index row_blocks = blocks.count;
  const auto row_task = [&](Index r, float* packed_a) {
    gemm_row_block(a, packed, c, blocks.start(r), blocks.size(r), accumulate, epi, packed_a);
  };
#if defined(_OPENMP)
  if (threads > 1) {
    // Dynamic hand-out in both phases: a thread slowed by another process on its core takes
    // fewer tasks instead of holding up the other one (the only wait is the barrier after
    // packing B, and the end of the region).
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(dynamic, 4)
      for (Index t = 0; t < pack_tasks; ++t) pack_task(t);
      float* packed_a = pack_buffer(PackSlot::a, kMC * kKC);
#pragma omp for schedule(dynamic, 1)
      for (Index r = 0; r < row_blocks; ++r) row_task(r, packed_a);
    }
    return;
  }
#endif
  (void)threads;
  for (Index t = 0; t < pack_tasks; ++t) pack_task(t);
  float* packed_a = pack_buffer(PackSlot::a, kMC * kKC);
  for (Index r = 0; r < row_blocks; ++r) row_task(r, packed_a);
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512_GEMM
