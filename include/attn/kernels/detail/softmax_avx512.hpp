// The rows of attention's softmax in AVX-512, float: each row of scaled, masked logits in three
// passes over memory instead of seven (scale and mask with the running maximum; exp and the sum;
// the division), for the short rows of attention (S = 64 in a training batch) where the generic
// Eigen path (kernels/softmax.hpp) costs more in per-pass overhead than in arithmetic.
//
// Same contract as softmax_row_forward: -infinity marks a blocked key and gives exactly 0, a row
// whose keys are all blocked gives zeros and log-sum-exp +infinity, exp results below the smallest
// normal float are flushed to 0, and a NaN logit stays NaN. The exp (exp_lanes.inc, the AVX2
// rows' too) is within 2 ulp of expf, so results differ from the Eigen path by rounding only
// (tests/test_attention_kernels.cpp).
#pragma once

#include "attn/kernels/detail/avx512.hpp"
#include "attn/kernels/detail/expf_cephes.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <cmath>
#include <limits>

namespace attn::kernels::detail {

namespace avx512 {

/// p 2^n for integer-valued n, rounded once: vscalefps.
ATTN_TARGET_AVX512 inline __m512 scale_by_power_of_two(__m512 p, __m512 n) {
  return _mm512_maskz_scalef_ps(0xFFFF, p, n);
}

#define ATTN_ISA_TARGET ATTN_TARGET_AVX512
#include "attn/kernels/detail/exp_lanes.inc"  // exp_lanes
#undef ATTN_ISA_TARGET

}  // namespace avx512

/// exp of 16 floats (exp_lanes), then 0 for results below the smallest normal float.
ATTN_TARGET_AVX512 inline __m512 exp16_flushed(__m512 x) {
  const __m512 e = avx512::exp_lanes(x);
  const __mmask16 tiny =
      _mm512_cmp_ps_mask(e, _mm512_set1_ps(std::numeric_limits<float>::min()), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(e, tiny, _mm512_setzero_ps());
}

/// The masked logits of keys j .. j + 15 whose scores are xs (zero outside m): scale xs +
/// additive + pad (the last two optional). The multiply and the first add are one FMA, written
/// out: left to the compiler (-ffp-contract=fast), whether they fuse would depend on the
/// instruction set and the code around them, and the AVX2 rows (softmax_avx2.hpp) could not give
/// these bits.
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline __m512 masked_logits_of(
    __m512 xs, const float* additive, const float* pad, Index j, __mmask16 m, __m512 scale) {
  const float* first = additive != nullptr ? additive : pad;
  if (first == nullptr) return _mm512_mul_ps(xs, scale);
  const __m512 v = _mm512_fmadd_ps(xs, scale, _mm512_maskz_loadu_ps(m, first + j));
  return additive != nullptr && pad != nullptr ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, pad + j))
                                               : v;
}

/// The masked logits of 16 keys of a row x in memory: masked_logits_of its lanes under m.
ATTN_TARGET_AVX512 inline __m512 masked_logits(const float* x, const float* additive,
                                               const float* pad, Index j, __mmask16 m,
                                               __m512 scale) {
  return masked_logits_of(_mm512_maskz_loadu_ps(m, x + j), additive, pad, j, m, scale);
}

/// In place: row[0, n) <- softmax(scale row + additive + pad); returns the log-sum-exp of the
/// masked logits (+infinity, and a zero row, when every key is blocked).
/// attention_tile_avx512.hpp's softmax_tile_row runs these steps on registers: a change here must
/// go there too.
ATTN_TARGET_AVX512 inline float softmax_row_avx512(float* row, Index n, float scale,
                                                   const float* additive, const float* pad) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(-kInf);
  __mmask16 nan = 0;  // max drops a NaN in some lane orders: a NaN logit is tracked apart
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    const __m512 v = masked_logits(row, additive, pad, j, m, vscale);
    _mm512_mask_storeu_ps(row + j, m, v);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
  }
  // A NaN logit makes the whole row and its log-sum-exp NaN, as in the generic path.
  const float mx = nan != 0 ? std::numeric_limits<float>::quiet_NaN() : lane_max(vmax);
  if (n == 0 || mx == -kInf) {
    for (Index j = 0; j < n; ++j) row[j] = 0.0f;
    return kInf;
  }
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    const __m512 e = exp16_flushed(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vm));
    _mm512_mask_storeu_ps(row + j, m, e);
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
  }
  const float sum = lane_sum(vsum);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
  }
  return mx + std::log(sum);
}

/// In place: row[0, n) <- exp(scale row + additive + pad - lse), flushed: backward's recomputed
/// probabilities (exactly 0 for blocked keys, and for every key of a row whose lse is +infinity).
ATTN_TARGET_AVX512 inline void probabilities_avx512(float* row, Index n, float scale,
                                                    const float* additive, const float* pad,
                                                    float lse) {
  const __m512 vscale = _mm512_set1_ps(scale), vlse = _mm512_set1_ps(lse);
  for (Index j = 0; j < n; j += 16) {
    const __mmask16 m = lane_mask(n - j);
    const __m512 v = masked_logits(row, additive, pad, j, m, vscale);
    _mm512_mask_storeu_ps(row + j, m, exp16_flushed(_mm512_sub_ps(v, vlse)));
  }
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
