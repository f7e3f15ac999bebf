// What every AVX2 kernel of attn shares (the counterpart of avx512.hpp for CPUs with AVX2 and FMA
// but no AVX-512, such as AMD Zen 1-3): the target attribute that lets a function use AVX2 in a
// build without -mavx2, the run-time check, lane masks for the edges of a row, and the fold of
// sixteen lanes held in two ymm registers, the order of every 16-lane reduction (avx512.hpp's
// fold of one zmm register is this fold of its two halves), so that a reduction gives the same
// bits on both ISAs. A function with this attribute may only be called after cpu_has_avx2_fma()
// said yes.
//
// Where a kernel is one algorithm on both ISAs, its body is written once, in a detail/*.inc file
// that each ISA includes inside its own namespace (avx2, avx512) with ATTN_ISA_TARGET defined as
// its target attribute, as Eigen's plugin files are included into classes. The body is built
// from the ops below, which avx512.hpp gives again for zmm registers. A template cannot do it:
// each instantiation would need its own target attribute, and GCC and clang refuse to inline an
// intrinsic into a function compiled without that intrinsic's target.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// A compiler that can emit the AVX2 and the AVX-512 kernels (with target attributes).
#define ATTN_HAVE_AVX512 1

#include <immintrin.h>

#include <algorithm>

#include "attn/tensor.hpp"

#define ATTN_TARGET_AVX2 __attribute__((target("avx2,fma")))

/// Stamps, where it stands (namespace avx2 below, avx512 in avx512.hpp), the register type Vec = V,
/// its kLanes floats and the ops whose form is the same for a ymm and a zmm register (intrinsics
/// prefixed `mm`), each with the attribute `target`: splat, add, mul, fmadd (a b + c) and fnmadd
/// (c - a b), the last two rounded once.
#define ATTN_VECTOR_OPS(target, V, mm)                                    \
  using Vec = V;                                                          \
  inline constexpr int kLanes = sizeof(V) / sizeof(float);                \
  target inline V splat(float x) { return mm##_set1_ps(x); }              \
  target inline V add(V a, V b) { return mm##_add_ps(a, b); }             \
  target inline V mul(V a, V b) { return mm##_mul_ps(a, b); }             \
  target inline V fmadd(V a, V b, V c) { return mm##_fmadd_ps(a, b, c); } \
  target inline V fnmadd(V a, V b, V c) { return mm##_fnmadd_ps(a, b, c); }

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

/// One register's ops, named as avx512.hpp names them, for the bodies both ISAs share (see above):
/// ATTN_VECTOR_OPS's, then those whose form differs. max and min return b where a lane of either
/// is NaN (maxps, minps); the masked load reads no lane outside the mask.
ATTN_VECTOR_OPS(ATTN_TARGET_AVX2, __m256, _mm256)
using Mask = __m256i;  // lane_mask's
ATTN_TARGET_AVX2 inline __m256 max(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
ATTN_TARGET_AVX2 inline __m256 min(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
ATTN_TARGET_AVX2 inline __m256 round_to_nearest(__m256 x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ATTN_TARGET_AVX2 inline __m256 load_masked(const float* p, __m256i m) {
  return _mm256_maskload_ps(p, m);
}
ATTN_TARGET_AVX2 inline void store_masked(float* p, __m256i m, __m256 v) {
  _mm256_maskstore_ps(p, m, v);
}

/// Sixteen lanes, one zmm register's worth, as two halves: the AVX-512 kernels' vectors, for the
/// bodies both ISAs share (avx512.hpp's Lanes16 is one __m512). Always inlined, so that a load of
/// a constant 16 lanes is two plain loads.
struct Lanes16 {
  __m256 lo, hi;
};
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline Lanes16 zero16() {
  return {_mm256_setzero_ps(), _mm256_setzero_ps()};
}
/// The first `lanes` of 16 as load16 takes them: the count, of which load8 makes each half's mask.
using Mask16 = Index;
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline Index mask16(Index lanes) { return lanes; }
/// The first `lanes` of 16 from p (zeros past them, which are not read).
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline Lanes16 load16(const float* p, Index lanes) {
  return {load8(p, lanes), load8(p + 8, lanes - 8)};
}
/// 16 lanes from p: two plain loads.
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline Lanes16 load16(const float* p) {
  return load16(p, 16);
}
/// acc += x y, lane by lane, one rounding.
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline void fma16(const Lanes16& x,
                                                                  const Lanes16& y, Lanes16& acc) {
  acc.lo = _mm256_fmadd_ps(x.lo, y.lo, acc.lo);
  acc.hi = _mm256_fmadd_ps(x.hi, y.hi, acc.hi);
}
/// The sum of the 16 lanes of x + y, in avx512.hpp's lane_sum order.
ATTN_TARGET_AVX2 __attribute__((always_inline)) inline float lane_sum_of_sum(const Lanes16& x,
                                                                             const Lanes16& y) {
  return lane_fold16(_mm256_add_ps(x.lo, y.lo), _mm256_add_ps(x.hi, y.hi), LaneAdd{});
}

}  // namespace avx2
}  // namespace attn::kernels::detail

#endif  // x86-64 with GCC or clang
