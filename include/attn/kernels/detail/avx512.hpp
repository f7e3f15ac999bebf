// What every AVX-512 kernel of attn shares: the target attribute that lets a function use AVX-512
// in a build without -mavx512f, the run-time check that the CPU has it, lane masks for edges, and
// the register ops of the bodies written once for both ISAs (avx2.hpp says how).
// (GCC 12 warns that the plain forms of some intrinsics, e.g. _mm512_srli_epi64, read an
// uninitialised vector: the kernels use the maskz forms with a full mask instead.)
// A kernel with such an attribute may only be called after cpu_has_avx512() said yes.
#pragma once

#include "attn/kernels/detail/avx2.hpp"  // ATTN_HAVE_AVX512, the 16-lane fold

#if defined(ATTN_HAVE_AVX512)

#include <immintrin.h>

#include "attn/tensor.hpp"

// prfchw: the write prefetch (prefetchw), which every CPU with AVX-512 has; without it GCC turns a
// prefetch for writing into a read prefetch in builds without -march.
#define ATTN_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,prfchw")))

namespace attn::kernels::detail {

/// Is this process's CPU (and OS) able to run the AVX-512 kernels?
inline bool cpu_has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return has;
}

/// The first `lanes` of 16 (none for lanes <= 0, all for lanes >= 16).
inline __mmask16 ATTN_TARGET_AVX512 lane_mask(Index lanes) {
  return lanes >= 16  ? __mmask16(0xFFFF)
         : lanes <= 0 ? __mmask16(0)
                      : __mmask16((1u << lanes) - 1u);
}

/// The 16 lanes of v folded as avx2::lane_fold16 folds them: the upper half of the vector onto the
/// lower, then the upper half of that, down to one lane.
template <class Op>
ATTN_TARGET_AVX512 inline float lane_fold(__m512 v, Op op) {
  return avx2::lane_fold16(_mm512_maskz_extractf32x8_ps(0xFF, v, 0),
                           _mm512_maskz_extractf32x8_ps(0xFF, v, 1), op);
}

/// The sum of a vector's 16 lanes in a fixed order (GCC 12's _mm512_reduce_add_ps draws a false
/// -Wmaybe-uninitialized from its undefined-vector operands).
ATTN_TARGET_AVX512 inline float lane_sum(__m512 v) { return lane_fold(v, avx2::LaneAdd{}); }

/// The largest of a vector's 16 lanes.
ATTN_TARGET_AVX512 inline float lane_max(__m512 v) { return lane_fold(v, avx2::LaneMax{}); }

namespace avx512 {

/// One register's ops, named as avx2.hpp names them, for the bodies both ISAs share (avx2.hpp
/// says how): ATTN_VECTOR_OPS's, then those whose form differs. max and min return b where a lane
/// of either is NaN (maxps, minps); the masked load reads no lane outside the mask.
ATTN_VECTOR_OPS(ATTN_TARGET_AVX512, __m512, _mm512)
using Mask = __mmask16;  // lane_mask's
ATTN_TARGET_AVX512 inline __m512 max(__m512 a, __m512 b) {
  return _mm512_maskz_max_ps(0xFFFF, a, b);
}
ATTN_TARGET_AVX512 inline __m512 min(__m512 a, __m512 b) {
  return _mm512_maskz_min_ps(0xFFFF, a, b);
}
ATTN_TARGET_AVX512 inline __m512 round_to_nearest(__m512 x) {
  return _mm512_maskz_roundscale_ps(0xFFFF, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
ATTN_TARGET_AVX512 inline __m512 load_masked(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
ATTN_TARGET_AVX512 inline void store_masked(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}

/// avx2.hpp's sixteen-lane ops on one register.
using Lanes16 = __m512;
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512 zero16() {
  return _mm512_setzero_ps();
}
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
using Mask16 = __mmask16;
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline __mmask16 mask16(Index lanes) {
  return lane_mask(lanes);
}
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512 load16(const float* p,
                                                                       __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline void fma16(__m512 x, __m512 y,
                                                                    __m512& acc) {
  acc = _mm512_fmadd_ps(x, y, acc);
}
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline float lane_sum_of_sum(__m512 x, __m512 y) {
  return lane_sum(_mm512_add_ps(x, y));
}

}  // namespace avx512
}  // namespace attn::kernels::detail

#endif  // x86-64 with GCC or clang
