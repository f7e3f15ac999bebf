// The dropout mask of kernels/dropout.hpp, eight elements at a time with AVX2, for CPUs without
// AVX-512: the same SplitMix64 hash of (key, i) as uniform_at (random.hpp), so the mask and the
// output are bitwise those of the scalar loop. AVX2 has no 64-bit multiply: each product by one of
// mix64's constants is built from 32-bit multiplies (the high x high term falls out of the 64
// bits). On Zen 3 the scalar loop, four 64-bit multiplies per element on one multiplier, took
// 8-12% of a training step.
#pragma once

#include "attn/kernels/detail/avx2.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <cstdint>

#include "attn/random.hpp"

namespace attn::kernels::detail::avx2 {

/// z * c modulo 2^64 in each 64-bit lane: lo(z) lo(c) + (hi(z) lo(c) + lo(z) hi(c)) 2^32, the
/// two cross products by one 32-bit multiply of z with c's halves swapped (1.6 against 1.8 ns per
/// element with a third vpmuludq for them).
ATTN_TARGET_AVX2 inline __m256i mul64_by(__m256i z, std::uint64_t c) {
  const __m256i c_v = _mm256_set1_epi64x(static_cast<long long>(c));
  const __m256i swapped = _mm256_set1_epi64x(static_cast<long long>((c >> 32) | (c << 32)));
  const __m256i cross = _mm256_mullo_epi32(z, swapped);  // low dword lo(z) hi(c), high hi(z) lo(c)
  const __m256i sum = _mm256_add_epi32(cross, _mm256_slli_epi64(cross, 32));  // in the high dword
  return _mm256_add_epi64(_mm256_mul_epu32(z, c_v),
                          _mm256_blend_epi32(_mm256_setzero_si256(), sum, 0xAA));
}

/// mix64 (random.hpp) on four lanes.
ATTN_TARGET_AVX2 inline __m256i mix64_x4(__m256i z) {
  z = mul64_by(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), kMix64Multiplier1);
  z = mul64_by(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), kMix64Multiplier2);
  return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/// All ones in the 64-bit lanes whose element is dropped: (mix64(key ^ mix64(index + golden)) >>
/// 11) < drop_below. Both sides are below 2^63, so the signed compare is the unsigned one.
ATTN_TARGET_AVX2 inline __m256i drop_mask_x4(__m256i index, __m256i key, __m256i drop_below) {
  const __m256i golden = _mm256_set1_epi64x(static_cast<long long>(kSplitMixGamma));
  const __m256i bits = mix64_x4(_mm256_xor_si256(key, mix64_x4(_mm256_add_epi64(index, golden))));
  return _mm256_cmpgt_epi64(drop_below, _mm256_srli_epi64(bits, 11));
}

/// out[i] = element first + i dropped ? 0 : in[i] * scale, for i in [0, n); out may alias in.
/// drop_below = ceil(p * 2^53). The eight elements of a step are hashed as {0, 1, 4, 5} and
/// {2, 3, 6, 7}, so that one in-lane shuffle of the two masks puts them in order.
ATTN_TARGET_AVX2 inline void dropout_mask(float* out, const float* in, Index n, std::uint64_t first,
                                          std::uint64_t key, std::uint64_t drop_below,
                                          float scale) {
  const __m256i lanes_a = _mm256_setr_epi64x(0, 1, 4, 5), lanes_b = _mm256_setr_epi64x(2, 3, 6, 7);
  const __m256i key_v = _mm256_set1_epi64x(static_cast<long long>(key));
  const __m256i below = _mm256_set1_epi64x(static_cast<long long>(drop_below));
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (Index i = 0; i < n; i += 8) {
    const __m256i base =
        _mm256_set1_epi64x(static_cast<long long>(first + static_cast<std::uint64_t>(i)));
    const __m256 a =
        _mm256_castsi256_ps(drop_mask_x4(_mm256_add_epi64(base, lanes_a), key_v, below));
    const __m256 b =
        _mm256_castsi256_ps(drop_mask_x4(_mm256_add_epi64(base, lanes_b), key_v, below));
    const __m256 drop = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));  // elements 0..7
    store8(out + i, n - i, _mm256_andnot_ps(drop, _mm256_mul_ps(load8(in + i, n - i), scale_v)));
  }
}

}  // namespace attn::kernels::detail::avx2

#endif  // ATTN_HAVE_AVX512
