// The dropout mask of kernels/dropout.hpp, sixteen elements at a time with AVX-512: the same
// SplitMix64 hash of (key, i) as uniform_at (random.hpp), eight 64-bit lanes per vector, so the
// mask and the output are bitwise those of the scalar loop. The comparison u < p is done on the
// integers: u = (bits >> 11) * 2^-53 is exact, so u < p exactly when (bits >> 11) < ceil(p * 2^53).
#pragma once

#include "attn/kernels/detail/avx512.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <cstdint>

#include "attn/random.hpp"

namespace attn::kernels::detail {

/// mix64 (random.hpp) on eight lanes.
ATTN_TARGET_AVX512 inline __m512i mix64_x8(__m512i z) {
  z = _mm512_xor_si512(z, _mm512_maskz_srli_epi64(0xFF, z, 30));
  z = _mm512_mullo_epi64(z, _mm512_set1_epi64(static_cast<long long>(kMix64Multiplier1)));
  z = _mm512_xor_si512(z, _mm512_maskz_srli_epi64(0xFF, z, 27));
  z = _mm512_mullo_epi64(z, _mm512_set1_epi64(static_cast<long long>(kMix64Multiplier2)));
  return _mm512_xor_si512(z, _mm512_maskz_srli_epi64(0xFF, z, 31));
}

/// Bit j set when element index[j] is kept: (mix64(key ^ mix64(index + golden)) >> 11) >=
/// drop_below.
ATTN_TARGET_AVX512 inline __mmask8 keep_mask_x8(__m512i index, __m512i key, __m512i drop_below) {
  const __m512i golden = _mm512_set1_epi64(static_cast<long long>(kSplitMixGamma));
  const __m512i bits = mix64_x8(_mm512_xor_si512(key, mix64_x8(_mm512_add_epi64(index, golden))));
  return _mm512_cmpge_epu64_mask(_mm512_maskz_srli_epi64(0xFF, bits, 11), drop_below);
}

/// out[i] = element first + i dropped ? 0 : in[i] * scale, for i in [0, n); out may alias in.
/// drop_below = ceil(p * 2^53).
ATTN_TARGET_AVX512 inline void dropout_mask_avx512(float* out, const float* in, Index n,
                                                   std::uint64_t first, std::uint64_t key,
                                                   std::uint64_t drop_below, float scale) {
  const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i key_v = _mm512_set1_epi64(static_cast<long long>(key));
  const __m512i below = _mm512_set1_epi64(static_cast<long long>(drop_below));
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (Index i = 0; i < n; i += 16) {
    const __m512i index = _mm512_add_epi64(
        _mm512_set1_epi64(static_cast<long long>(first + static_cast<std::uint64_t>(i))), lanes);
    const __mmask8 lo = keep_mask_x8(index, key_v, below);
    const __mmask8 hi = keep_mask_x8(_mm512_add_epi64(index, _mm512_set1_epi64(8)), key_v, below);
    const __mmask16 keep = static_cast<__mmask16>(lo | (static_cast<unsigned>(hi) << 8));
    const __mmask16 valid = lane_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(valid, in + i);
    _mm512_mask_storeu_ps(out + i, valid, _mm512_maskz_mul_ps(keep, x, scale_v));
  }
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
