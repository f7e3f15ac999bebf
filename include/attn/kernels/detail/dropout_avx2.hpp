// The dropout mask of kernels/dropout.hpp, eight elements at a time with AVX2 (CPUs with AVX-512
// take dropout_avx512.hpp's sixteen): the draws of random.hpp's draw_bits, so the mask and the
// output are bitwise those of the scalar loop. Each 64-bit lane runs the SplitMix64 stream of `key`
// at one pair of elements, and its two 32-bit halves are the pair's draws, already in memory order.
// AVX2 has no 64-bit multiply: each product by one of mix64's constants is built from 32-bit
// multiplies (the high x high term falls out of the 64 bits). On Zen 3: 0.32-0.37 ns per
// element; 1.7 when each element took a mix of a mix (the scalar loop of that hash had been 8-12%
// of a training step).
#pragma once

#include "attn/kernels/detail/avx2.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <cstdint>

#include "attn/random.hpp"

namespace attn::kernels::detail::avx2 {

/// z * c modulo 2^64 in each 64-bit lane: lo(z) lo(c) + (hi(z) lo(c) + lo(z) hi(c)) 2^32, the
/// two cross products by one 32-bit multiply of z with c's halves swapped (the earlier hash of two
/// mixes per element, measured on its own: 1.6 ns per element this way, 1.8 with a third
/// vpmuludq; 1.7 in the dropout loop).
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

/// out[i] = element first + i dropped ? 0 : in[i] * scale, for i in [0, n); out may alias in.
/// Element e is dropped when draw_bits(key, e) < drop_below (ceil(p 2^32), below 2^32), which is
/// uniform_at(key, e) < p: u = bits 2^-32 is exact, and an integer is below p 2^32 exactly when it
/// is below its ceiling.
ATTN_TARGET_AVX2 inline void dropout_mask(float* out, const float* in, Index n, std::uint64_t first,
                                          std::uint64_t key, std::uint32_t drop_below,
                                          float scale) {
  if (n > 0 && (first & 1)) {  // an odd first element: the high half of its pair's output
    out[0] = draw_bits(key, first) < drop_below ? 0.0f : in[0] * scale;
    ++out, ++in, --n, ++first;
  }
  // Lane j: the stream at pair first / 2 + j, then 4 pairs further at every step.
  const auto pair = [&](std::uint64_t j) {
    return static_cast<long long>(key + (first / 2 + j) * kSplitMixGamma);
  };
  __m256i state = _mm256_setr_epi64x(pair(0), pair(1), pair(2), pair(3));
  const __m256i step = _mm256_set1_epi64x(static_cast<long long>(4 * kSplitMixGamma));
  // Unsigned bits < drop_below as a signed compare: both with the sign bit flipped.
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i below = _mm256_set1_epi32(static_cast<int>(drop_below ^ 0x80000000u));
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (Index i = 0; i < n; i += 8) {
    const __m256i bits = mix64_x4(state);
    state = _mm256_add_epi64(state, step);
    const __m256 drop =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(below, _mm256_xor_si256(bits, sign)));
    store8(out + i, n - i, _mm256_andnot_ps(drop, _mm256_mul_ps(load8(in + i, n - i), scale_v)));
  }
}

}  // namespace attn::kernels::detail::avx2

#endif  // ATTN_HAVE_AVX512
