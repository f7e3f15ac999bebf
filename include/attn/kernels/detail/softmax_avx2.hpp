// The rows of attention's softmax in AVX2 + FMA, float: softmax_avx512.hpp's three passes over
// each row with 8-lane vectors, for CPUs without AVX-512 (on Zen 3 the generic Eigen path took
// seven passes and Eigen's exp).
//
// The same bits as the AVX-512 rows: each pass takes the row sixteen keys at a time, as two
// halves of eight, so every lane of the running sum holds the keys of the AVX-512 kernel's lane and
// lane_fold16 adds them up in its order; the exp is the AVX-512 one, one body (exp_lanes.inc),
// and where the AVX-512 exp scales by 2^n with vscalefps (one rounding, for denormal results too)
// this one multiplies by 2^(n/2) and then by 2^(n - n/2): both factors are normal floats and the
// first product is exact, so the one rounding is the same. Same contract as softmax_row_forward
// (kernels/softmax.hpp).
#pragma once

#include "attn/kernels/detail/avx2.hpp"
#include "attn/kernels/detail/expf_cephes.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <cmath>
#include <limits>

namespace attn::kernels::detail::avx2 {

/// p 2^n for integer-valued n in [-150, 128] and p in [0.5, 2] (or NaN), rounded once: vscalefps.
ATTN_TARGET_AVX2 inline __m256 scale_by_power_of_two(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1), rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

#define ATTN_ISA_TARGET ATTN_TARGET_AVX2
#include "attn/kernels/detail/exp_lanes.inc"  // exp_lanes
#undef ATTN_ISA_TARGET

/// exp of 8 floats (exp_lanes), then 0 for results below the smallest normal float.
ATTN_TARGET_AVX2 inline __m256 exp8_flushed(__m256 x) {
  const __m256 e = exp_lanes(x);
  const __m256 tiny =
      _mm256_cmp_ps(e, _mm256_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
  return _mm256_andnot_ps(tiny, e);
}

/// The masked logits of the `lanes` keys from j (zeros past them): scale x + additive + pad, the
/// multiply and first add one FMA as in softmax_avx512.hpp's masked_logits.
ATTN_TARGET_AVX2 inline __m256 masked_logits(const float* x, const float* additive,
                                             const float* pad, Index j, Index lanes, __m256 scale) {
  const __m256 xs = load8(x + j, lanes);
  const float* first = additive != nullptr ? additive : pad;
  if (first == nullptr) return _mm256_mul_ps(xs, scale);
  const __m256 v = _mm256_fmadd_ps(xs, scale, load8(first + j, lanes));
  return additive != nullptr && pad != nullptr ? _mm256_add_ps(v, load8(pad + j, lanes)) : v;
}

/// All ones in the first `lanes` of 8.
ATTN_TARGET_AVX2 inline __m256 valid_lanes(Index lanes) {
  return _mm256_castsi256_ps(lane_mask(lanes));
}

/// In place: row[0, n) <- softmax(scale row + additive + pad); returns the log-sum-exp of the
/// masked logits (+infinity, and a zero row, when every key is blocked). softmax_row_avx512's
/// passes; half h of each sixteen keys goes to vmax[h] and vsum[h].
ATTN_TARGET_AVX2 inline float softmax_row(float* row, Index n, float scale, const float* additive,
                                          const float* pad) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-kInf);
  __m256 vmax[2] = {neg_inf, neg_inf};
  __m256 nan = _mm256_setzero_ps();  // max drops a NaN in some lane orders: tracked apart
  for (Index j = 0; j < n; j += 8) {
    const int h = static_cast<int>((j / 8) % 2);
    const __m256 v = masked_logits(row, additive, pad, j, n - j, vscale);
    store8(row + j, n - j, v);
    vmax[h] = _mm256_max_ps(vmax[h], _mm256_blendv_ps(neg_inf, v, valid_lanes(n - j)));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // lanes past n are 0
  }
  // A NaN logit makes the whole row and its log-sum-exp NaN, as in the generic path.
  const float mx = _mm256_movemask_ps(nan) != 0 ? std::numeric_limits<float>::quiet_NaN()
                                                : lane_fold16(vmax[0], vmax[1], LaneMax{});
  if (n == 0 || mx == -kInf) {
    for (Index j = 0; j < n; ++j) row[j] = 0.0f;
    return kInf;
  }
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 vsum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (Index j = 0; j < n; j += 8) {
    const int h = static_cast<int>((j / 8) % 2);
    const __m256 e =
        _mm256_and_ps(valid_lanes(n - j), exp8_flushed(_mm256_sub_ps(load8(row + j, n - j), vm)));
    store8(row + j, n - j, e);
    vsum[h] = _mm256_add_ps(vsum[h], e);
  }
  const float sum = lane_fold16(vsum[0], vsum[1], LaneAdd{});
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (Index j = 0; j < n; j += 8)
    store8(row + j, n - j, _mm256_mul_ps(load8(row + j, n - j), inv));
  return mx + std::log(sum);
}

/// In place: row[0, n) <- exp(scale row + additive + pad - lse), flushed: backward's recomputed
/// probabilities (probabilities_avx512).
ATTN_TARGET_AVX2 inline void probabilities(float* row, Index n, float scale, const float* additive,
                                           const float* pad, float lse) {
  const __m256 vscale = _mm256_set1_ps(scale), vlse = _mm256_set1_ps(lse);
  for (Index j = 0; j < n; j += 8) {
    const __m256 v = masked_logits(row, additive, pad, j, n - j, vscale);
    store8(row + j, n - j, exp8_flushed(_mm256_sub_ps(v, vlse)));
  }
}

}  // namespace attn::kernels::detail::avx2

#endif  // ATTN_HAVE_AVX512
