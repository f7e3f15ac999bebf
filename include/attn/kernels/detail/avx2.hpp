// What every AVX2 kernel of attn shares (the counterpart of avx512.hpp for CPUs with AVX2 and FMA
// but no AVX-512, such as AMD Zen 1-3): the target attribute that lets a function use AVX2 in a
// build without -mavx2, the run-time check, lane masks for the edges of a row, and the fold of
// sixteen lanes held in two ymm registers, the order of every 16-lane reduction (avx512.hpp's
// fold of one zmm register is this fold of its two halves), so that a reduction gives the same
// bits on both ISAs. A function with this attribute may only be called after cpu_has_avx2_fma()
// said yes.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// A compiler that can emit the AVX2 and the AVX-512 kernels (with target attributes).
#define ATTN_HAVE_AVX512 1

#include <immintrin.h>

#include <algorithm>

#include "attn/tensor.hpp"

#define ATTN_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace attn::kernels::detail {

/// Is this process's CPU able to run the AVX2 kernels?
inline bool cpu_has_avx2_fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

namespace avx2 {

/// The first `lanes` of 8 as a maskload/maskstore mask (none for lanes <= 0, all for >= 8).
ATTN_TARGET_AVX2 inline __m256i lane_mask(Index lanes) {
  const int n = static_cast<int>(std::clamp<Index>(lanes, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// The first `lanes` floats at p (zeros past them, which are not read); a plain load for >= 8.
ATTN_TARGET_AVX2 inline __m256 load8(const float* p, Index lanes) {
  return lanes >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(lanes));
}

/// Stores the first `lanes` of v at p; a plain store for >= 8 (a masked store is slow on Zen).
ATTN_TARGET_AVX2 inline void store8(float* p, Index lanes, __m256 v) {
  if (lanes >= 8)
    _mm256_storeu_ps(p, v);
  else if (lanes > 0)
    _mm256_maskstore_ps(p, lane_mask(lanes), v);
}

struct LaneAdd {
  ATTN_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
  ATTN_TARGET_AVX2 __m128 operator()(__m128 a, __m128 b) const { return _mm_add_ps(a, b); }
};
struct LaneMax {
  ATTN_TARGET_AVX2 __m256 operator()(__m256 a, __m256 b) const { return _mm256_max_ps(a, b); }
  ATTN_TARGET_AVX2 __m128 operator()(__m128 a, __m128 b) const { return _mm_max_ps(a, b); }
};

/// Sixteen lanes, lanes 0-7 in `lo` and 8-15 in `hi`, folded with `op` in one fixed order: the
/// upper eight onto the lower, then the upper half of that, down to one lane. `op` combines two
/// __m256 and two __m128 (LaneAdd, LaneMax).
template <class Op>
ATTN_TARGET_AVX2 inline float lane_fold16(__m256 lo, __m256 hi, Op op) {
  const __m256 h = op(lo, hi);
  __m128 q = op(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = op(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(op(q, _mm_movehdup_ps(q)));
}

}  // namespace avx2
}  // namespace attn::kernels::detail

#endif  // x86-64 with GCC or clang
