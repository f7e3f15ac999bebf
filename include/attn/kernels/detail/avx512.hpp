// What every AVX-512 kernel of attn shares: the target attribute that lets a function use AVX-512
// in a build without -mavx512f, the run-time check that the CPU has it, and lane masks for edges.
// (GCC 12 warns that the plain forms of some intrinsics, e.g. _mm512_srli_epi64, read an
// uninitialised vector: the kernels use the maskz forms with a full mask instead.)
// A kernel with such an attribute may only be called after cpu_has_avx512() said yes.
#pragma once

#include "attn/kernels/detail/avx2.hpp"  // ATTN_HAVE_AVX512, the 16-lane fold

#if defined(ATTN_HAVE_AVX512)

#include <immintrin.h>

#include "attn/tensor.hpp"

#define ATTN_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

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

}  // namespace attn::kernels::detail

#endif  // x86-64 with GCC or clang
