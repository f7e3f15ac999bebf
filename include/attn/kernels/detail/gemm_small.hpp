// C[M, N] (=, +=) A B for a few rows of C (decoding: one row per sentence or beam), without
// packing: packing all of B for one row would cost as much as the product itself. Such products
// read every weight once per row and are bound by memory bandwidth, so they split the columns
// of C over the threads (each thread streams its own share of the weights).
//
// Each element of C is computed by the same instructions whichever thread owns its column, so
// results do not depend on the thread count.
#pragma once

#include "attn/kernels/detail/gemm_avx512.hpp"
#include "attn/kernels/detail/gemm_small_avx2.hpp"
#include "attn/parallel.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)

namespace attn::kernels::detail {

namespace avx512 {

/// Columns [j0, j1) of C when B's rows are contiguous (dy W, x B): each row of C is a sum of rows
/// of B scaled by A's numbers, 64 columns at a time in 4 registers, k ascending.
ATTN_TARGET_AVX512 inline void small_rows_axpy(const StridedMatrix<const float>& a,
                                               const StridedMatrix<const float>& b,
                                               StridedMatrix<float> c, Index j0, Index j1,
                                               bool accumulate, const GemmEpilogue& epi) {
  for (Index j = j0; j < j1; j += kSmallChunk) {
    const Index w = std::min<Index>(kSmallChunk, j1 - j);
    const __mmask16 m[4] = {lane_mask(w), lane_mask(w - 16), lane_mask(w - 32), lane_mask(w - 48)};
    for (Index i = 0; i < c.rows; ++i) {
      __m512 acc[4];
      for (int v = 0; v < 4; ++v) acc[v] = _mm512_setzero_ps();
      for (Index k = 0; k < a.cols; ++k) {
        const __m512 aik = _mm512_set1_ps(a(i, k));
        const float* brow = &b(k, j);
        for (int v = 0; v < 4; ++v)
          acc[v] = _mm512_fmadd_ps(aik, _mm512_maskz_loadu_ps(m[v], brow + 16 * v), acc[v]);
      }
      alignas(64) float sums[kSmallChunk];
      for (int v = 0; v < 4; ++v) _mm512_store_ps(sums + 16 * v, acc[v]);
      for (Index t = 0; t < w; ++t)
        c(i, j + t) = finish(accumulate ? c(i, j + t) : 0.0f, sums[t], epi, j + t);
    }
  }
}

/// Rows [i, i + 4) x columns [j, j + nc) of C (nc <= 4) when B's columns and A's rows are
/// contiguous: 4 x 4 dot products at once, 16 lanes of k at a time (one accumulator each, k
/// ascending), then each reduced by lane_sum. Past the last column, columns repeat the last valid
/// one and are not stored, so every element is computed the same way wherever it sits.
ATTN_TARGET_AVX512 inline void small_rows_dot_block(const StridedMatrix<const float>& a,
                                                    const StridedMatrix<const float>& b,
                                                    StridedMatrix<float> c, Index i, Index j,
                                                    int nc, bool accumulate,
                                                    const GemmEpilogue& epi) {
  constexpr int kR = 4, kC = 4;
  const Index K = a.cols;
  const float* ar[kR];
  const float* bc[kC];
  for (int r = 0; r < kR; ++r) ar[r] = &a(i + r, 0);
  for (int q = 0; q < kC; ++q) bc[q] = &b(0, j + std::min(q, nc - 1));
  __m512 acc[kR][kC];
#pragma GCC unroll 4
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < kC; ++q) acc[r][q] = _mm512_setzero_ps();
  for (Index k = 0; k < K; k += 16) {
    const __mmask16 m = lane_mask(K - k);
    __m512 bv[kC];
#pragma GCC unroll 4
    for (int q = 0; q < kC; ++q) bv[q] = _mm512_maskz_loadu_ps(m, bc[q] + k);
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      const __m512 av = _mm512_maskz_loadu_ps(m, ar[r] + k);
#pragma GCC unroll 4
      for (int q = 0; q < kC; ++q) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int q = 0; q < nc; ++q) {
      float& out = c(i + r, j + q);
      out = finish(accumulate ? out : 0.0f, lane_sum(acc[r][q]), epi, j + q);
    }
}

#define ATTN_ISA_TARGET ATTN_TARGET_AVX512
#include "attn/kernels/detail/small_rows_dot_single.inc"  // small_rows_dot_single
#undef ATTN_ISA_TARGET

}  // namespace avx512

/// Columns [j0, j1) of C when B's columns are contiguous (x W^T, the Linear forward): the rows
/// that fill blocks of 4 by `block`, kRows x kCols dot products at a time (AVX-512: 4 x 4, each
/// column of B read once per 4 rows; AVX2: 2 x 2), the 1-3 rows left over one at a time by
/// `single`. Which rows go which way decides the order of the sums, so it is the same for both
/// kernels.
template <int kRows, int kCols, class Block, class Single>
void small_rows_dot(const StridedMatrix<const float>& a, const StridedMatrix<const float>& b,
                    StridedMatrix<float> c, Index j0, Index j1, bool accumulate,
                    const GemmEpilogue& epi, Block block, Single single) {
  static_assert(4 % kRows == 0, "blocks must tile the rows of 4-row blocks");
  const Index blocked = c.rows / 4 * 4;
  for (Index j = j0; j < j1 && blocked > 0; j += kCols) {
    const int nc = static_cast<int>(std::min<Index>(kCols, j1 - j));
    for (Index i = 0; i < blocked; i += kRows) block(a, b, c, i, j, nc, accumulate, epi);
  }
  if (blocked < c.rows) single(a, b, c, blocked, j0, j1, accumulate, epi);
}

/// c (=, or +=) a b, then the epilogue's bias and ReLU, for a few rows, with the AVX-512 kernels
/// or their AVX2 twins (gemm_small_avx2.hpp: the same bits); false when the layout does not suit
/// (A's rows or B not contiguous in either direction), and the caller takes another path.
inline bool gemm_small_rows(const StridedMatrix<const float>& a,
                            const StridedMatrix<const float>& b, StridedMatrix<float> c,
                            bool accumulate, const GemmEpilogue& epi, int threads, bool avx512) {
  const bool axpy = b.col_stride == 1, dot = b.row_stride == 1 && a.col_stride == 1;
  if (!axpy && !dot) return false;
  const Index N = c.cols, grain = axpy ? kSmallChunk : 16;
  const Index grains = (N + grain - 1) / grain;
  threads = static_cast<int>(std::min<Index>(threads, grains));
  const auto run = [&](Index part, Index parts) {
    const Index j0 = std::min(N, grains * part / parts * grain);
    const Index j1 = std::min(N, grains * (part + 1) / parts * grain);
    if (axpy)
      (avx512 ? avx512::small_rows_axpy : avx2::small_rows_axpy)(a, b, c, j0, j1, accumulate, epi);
    else if (avx512)
      small_rows_dot<4, 4>(a, b, c, j0, j1, accumulate, epi, avx512::small_rows_dot_block,
                           avx512::small_rows_dot_single);
    else
      small_rows_dot<2, 2>(a, b, c, j0, j1, accumulate, epi, avx2::small_rows_dot_block,
                           avx2::small_rows_dot_single);
  };
#if defined(_OPENMP)
  if (threads > 1 && !omp_in_parallel()) {
    RegionErrors errors;
#pragma omp parallel for schedule(static, 1) num_threads(threads)
    for (int part = 0; part < threads; ++part) errors.run([&] { run(part, threads); });
    errors.rethrow();
    return true;
  }
#endif
  run(0, 1);
  return true;
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512_GEMM
