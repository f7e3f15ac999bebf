// Sums of a float row accumulated in double, sixteen lanes at a time: the cross-entropy's sum of
// the logits (with their maximum from the same read) and the gradient norm's sum of squares.
// Eigen's cast<double>().sum() is a scalar chain of dependent adds: on a [2048, 8000] logits
// matrix it took 10.7 of the cross-entropy's 17 ms on one thread.
//
// One order on every path, so that all give the same bits (tests/test_loss.cpp): lane k (0..15)
// adds x[k], x[k + 16], x[k + 32] ... in double, from +0; then the lanes fold as
// fold_double_lanes says. The AVX-512 kernel holds the lanes in two zmm registers of 8 doubles,
// the AVX2 kernel in four ymm registers of 4, the generic loop in an array. A float squared is
// exact in double, so a fused multiply-add of it rounds as the add alone does.
#pragma once

#include <algorithm>
#include <limits>

#include "attn/kernels/detail/avx512.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels::detail {

inline constexpr int kDoubleLanes = 16;

/// A row's sum in double and its largest element (which is unspecified if an element is NaN).
struct SumAndMax {
  double sum;
  float max;
};

/// The lanes folded in halves: lane k += lane k + 8 (k < 8), then k += k + 4, k += k + 2, and
/// lane 0 + lane 1. Overwrites s.
inline double fold_double_lanes(double* s) {
  for (int half = kDoubleLanes / 2; half >= 1; half /= 2)
    for (int k = 0; k < half; ++k) s[k] += s[k + half];
  return s[0];
}

/// The reference loops, and the path of a CPU without AVX2.
inline SumAndMax sum_and_max_generic(const float* x, Index n) {
  double s[kDoubleLanes] = {};
  float m = -std::numeric_limits<float>::infinity();
  for (Index j = 0; j < n; ++j) {
    s[j % kDoubleLanes] += static_cast<double>(x[j]);
    m = std::max(m, x[j]);
  }
  return {fold_double_lanes(s), m};
}

inline double sum_of_squares_generic(const float* x, Index n) {
  double s[kDoubleLanes] = {};
  for (Index j = 0; j < n; ++j) {
    const auto v = static_cast<double>(x[j]);
    s[j % kDoubleLanes] += v * v;
  }
  return fold_double_lanes(s);
}

#if defined(ATTN_HAVE_AVX512)

namespace avx512 {

/// Lanes 0-7 and 8-15 of 16 floats, in double.
ATTN_TARGET_AVX512 inline __m512d low_in_double(__m512 v) {
  return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, v, 0));
}
ATTN_TARGET_AVX512 inline __m512d high_in_double(__m512 v) {
  return _mm512_maskz_cvtps_pd(0xFF, _mm512_maskz_extractf32x8_ps(0xFF, v, 1));
}

ATTN_TARGET_AVX512 inline double fold(__m512d lo, __m512d hi) {
  alignas(64) double s[kDoubleLanes];
  _mm512_store_pd(s, lo);
  _mm512_store_pd(s + 8, hi);
  return fold_double_lanes(s);
}

ATTN_TARGET_AVX512 inline SumAndMax sum_and_max(const float* x, Index n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 k = lane_mask(n - j);
    const __m512 v = _mm512_maskz_loadu_ps(k, x + j);  // zeros past the row add nothing
    lo = _mm512_add_pd(lo, low_in_double(v));
    hi = _mm512_add_pd(hi, high_in_double(v));
    m = _mm512_mask_max_ps(m, k, m, v);
  }
  return {fold(lo, hi), lane_max(m)};
}

ATTN_TARGET_AVX512 inline double sum_of_squares(const float* x, Index n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (Index j = 0; j < n; j += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(lane_mask(n - j), x + j);
    const __m512d a = low_in_double(v), b = high_in_double(v);
    lo = _mm512_fmadd_pd(a, a, lo);
    hi = _mm512_fmadd_pd(b, b, hi);
  }
  return fold(lo, hi);
}

}  // namespace avx512

namespace avx2 {

/// Four lanes of double from four floats.
ATTN_TARGET_AVX2 inline __m256d low_in_double(__m256 v) {
  return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}
ATTN_TARGET_AVX2 inline __m256d high_in_double(__m256 v) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

/// Sixteen double lanes as four registers: lanes 4i .. 4i + 3 in s[i].
struct DoubleLanes16 {
  __m256d s[4];
};

ATTN_TARGET_AVX2 inline double fold(const DoubleLanes16& a) {
  alignas(32) double s[kDoubleLanes];
  for (int i = 0; i < 4; ++i) _mm256_store_pd(s + 4 * i, a.s[i]);
  return fold_double_lanes(s);
}

ATTN_TARGET_AVX2 inline SumAndMax sum_and_max(const float* x, Index n) {
  DoubleLanes16 acc{
      {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  const __m256 low = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m_lo = low, m_hi = low;
  for (Index j = 0; j < n; j += 16) {
    const Lanes16 v = load16(x + j, n - j);
    acc.s[0] = _mm256_add_pd(acc.s[0], low_in_double(v.lo));
    acc.s[1] = _mm256_add_pd(acc.s[1], high_in_double(v.lo));
    acc.s[2] = _mm256_add_pd(acc.s[2], low_in_double(v.hi));
    acc.s[3] = _mm256_add_pd(acc.s[3], high_in_double(v.hi));
    // Past the row, -infinity instead of the loaded zeros, which could exceed every element.
    const Index lanes = n - j;
    m_lo = _mm256_max_ps(m_lo, _mm256_blendv_ps(low, v.lo, _mm256_castsi256_ps(lane_mask(lanes))));
    m_hi =
        _mm256_max_ps(m_hi, _mm256_blendv_ps(low, v.hi, _mm256_castsi256_ps(lane_mask(lanes - 8))));
  }
  return {fold(acc), lane_fold16(m_lo, m_hi, LaneMax{})};
}

ATTN_TARGET_AVX2 inline double sum_of_squares(const float* x, Index n) {
  DoubleLanes16 acc{
      {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  for (Index j = 0; j < n; j += 16) {
    const Lanes16 v = load16(x + j, n - j);
    const __m256d d[4] = {low_in_double(v.lo), high_in_double(v.lo), low_in_double(v.hi),
                          high_in_double(v.hi)};
    for (int i = 0; i < 4; ++i) acc.s[i] = _mm256_fmadd_pd(d[i], d[i], acc.s[i]);
  }
  return fold(acc);
}

}  // namespace avx2

#endif  // ATTN_HAVE_AVX512

/// x[0, n): the sum in double and the largest element, on the fastest path the CPU has.
inline SumAndMax sum_and_max(const float* x, Index n) {
#if defined(ATTN_HAVE_AVX512)
  if (cpu_has_avx512()) return avx512::sum_and_max(x, n);
  if (cpu_has_avx2_fma()) return avx2::sum_and_max(x, n);
#endif
  return sum_and_max_generic(x, n);
}

/// sum_j x[j]^2 in double, on the fastest path the CPU has.
inline double sum_of_squares(const float* x, Index n) {
#if defined(ATTN_HAVE_AVX512)
  if (cpu_has_avx512()) return avx512::sum_of_squares(x, n);
  if (cpu_has_avx2_fma()) return avx2::sum_of_squares(x, n);
#endif
  return sum_of_squares_generic(x, n);
}

}  // namespace attn::kernels::detail
