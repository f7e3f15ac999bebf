// gemm_small.hpp's few-row kernels for CPUs with AVX2 and FMA but no AVX-512: each is its AVX-512
// twin lane for lane (a 16-lane vector as two ymm halves, the dot products folded by lane_fold16 in
// lane_sum's order), so both give the same bits; small_rows_dot_single is one body for both ISAs
// (small_rows_dot_single.inc). Before these, the AVX2 path packed B even for one row: batch-1
// greedy decoding spent about a fifth of its time packing each weight and faulting in the pages
// of its packed copy, once per call. `finish` and kSmallChunk, which both ISAs' kernels use, are
// defined here, the first of the two headers gemm_small.hpp includes.
#pragma once

#include "attn/kernels/detail/avx2.hpp"
#include "attn/kernels/detail/gemm_tile.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <immintrin.h>

#include <algorithm>

namespace attn::kernels::detail {

/// Finishes one element: start (0 or c), plus the sum, then the epilogue's bias and ReLU.
inline float finish(float start, float sum, const GemmEpilogue& epi, Index j) {
  float v = start + sum;
  if (epi.bias != nullptr) v += epi.bias[j];
  return epi.relu ? std::max(v, 0.0f) : v;
}

inline constexpr Index kSmallChunk = 64;  // columns per step of the row-major-B kernels

namespace avx2 {

/// avx512 small_rows_axpy: columns [j0, j1) of C when B's rows are contiguous, 64 columns at a time
/// in 8 registers, k ascending.
ATTN_TARGET_AVX2 inline void small_rows_axpy(const StridedMatrix<const float>& a,
                                             const StridedMatrix<const float>& b,
                                             StridedMatrix<float> c, Index j0, Index j1,
                                             bool accumulate, const GemmEpilogue& epi) {
  constexpr int kVectors = kSmallChunk / 8;
  for (Index j = j0; j < j1; j += kSmallChunk) {
    const Index w = std::min<Index>(kSmallChunk, j1 - j);
    for (Index i = 0; i < c.rows; ++i) {
      __m256 acc[kVectors];
      for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_setzero_ps();
      for (Index k = 0; k < a.cols; ++k) {
        const __m256 aik = _mm256_set1_ps(a(i, k));
        const float* brow = &b(k, j);
#pragma GCC unroll 8
        for (int v = 0; v < kVectors; ++v)
          acc[v] = _mm256_fmadd_ps(aik, load8(brow + 8 * v, w - 8 * v), acc[v]);
      }
      alignas(32) float sums[kSmallChunk];
      for (int v = 0; v < kVectors; ++v) _mm256_store_ps(sums + 8 * v, acc[v]);
      for (Index t = 0; t < w; ++t)
        c(i, j + t) = finish(accumulate ? c(i, j + t) : 0.0f, sums[t], epi, j + t);
    }
  }
}

/// One step of 16 lanes of k (`lanes` of them real) of small_rows_dot_block's two rows by two
/// columns. Inlined with lanes = 16 in the loop, so that its loads are plain ones there.
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline void dot_block_step(
    const float* const (&ar)[2], const float* const (&bc)[2], Index k, Index lanes,
    Lanes16 (&acc)[2][2]) {
  const Lanes16 b0 = load16(bc[0] + k, lanes), b1 = load16(bc[1] + k, lanes);
  for (int r = 0; r < 2; ++r) {
    const Lanes16 av = load16(ar[r] + k, lanes);
    fma16(av, b0, acc[r][0]);
    fma16(av, b1, acc[r][1]);
  }
}

/// avx512 small_rows_dot_block's elements for rows [i, i + 2) x columns [j, j + nc) (nc <= 2), the
/// block of gemm_small.hpp's small_rows_dot<2, 2>: dot products 16 lanes of k at a time, one
/// accumulator each, k ascending, then lane_fold16. Two by two, since four by four in two halves
/// would need 32 registers; the columns of a pair stay in L1 for the next pair of rows.
ATTN_TARGET_AVX2 inline void small_rows_dot_block(const StridedMatrix<const float>& a,
                                                  const StridedMatrix<const float>& b,
                                                  StridedMatrix<float> c, Index i, Index j, int nc,
                                                  bool accumulate, const GemmEpilogue& epi) {
  const Index K = a.cols;
  const float* const ar[2] = {&a(i, 0), &a(i + 1, 0)};
  const float* const bc[2] = {&b(0, j), &b(0, j + std::min(1, nc - 1))};
  const __m256 zero = _mm256_setzero_ps();
  Lanes16 acc[2][2] = {{{zero, zero}, {zero, zero}}, {{zero, zero}, {zero, zero}}};
  // The next pair of columns is fetched while this one is summed: without it the loads of each
  // pair waited on memory, and beam 4 decoding at batch 1 (4 rows) was 1.17x (1 thread) and 1.09x
  // (2) slower, alternating runs on Zen 3. (The last pair fetches the last column again.)
  const float* next[2] = {&b(0, std::min(j + 2, b.cols - 1)), &b(0, std::min(j + 3, b.cols - 1))};
  Index k = 0;
  for (; k + 16 <= K; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(next[0] + k), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(next[1] + k), _MM_HINT_T0);
    dot_block_step(ar, bc, k, 16, acc);
  }
  if (k < K) dot_block_step(ar, bc, k, K - k, acc);
  for (int r = 0; r < 2; ++r)
    for (int q = 0; q < nc; ++q) {
      float& out = c(i + r, j + q);
      out = finish(accumulate ? out : 0.0f, lane_fold16(acc[r][q].lo, acc[r][q].hi, LaneAdd{}), epi,
                   j + q);
    }
}

#define ATTN_ISA_TARGET ATTN_TARGET_AVX2
#include "attn/kernels/detail/small_rows_dot_single.inc"  // small_rows_dot_single
#undef ATTN_ISA_TARGET

}  // namespace avx2
}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
