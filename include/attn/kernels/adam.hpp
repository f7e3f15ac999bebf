// The elementwise update of Adam (train/adam.hpp), over one parameter tensor:
//   g = grad + weight_decay * value;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   value += -step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// in parallel chunks. For float on a CPU with AVX2 (and so on every CPU with AVX-512) eight
// elements go at a time (adam_update_avx2); the scalar loop is the path for double and other CPUs
// and the tests' reference. Each element is computed alone, so the split over threads does not
// change a bit. The vector path rounds every product before adding it, as the scalar loop does
// unless the compiler contracts its multiply-adds into FMAs (a build with -mfma or
// -march=native), where the two may differ by that rounding.
//
// There is no AVX-512 twin (there was one, with the same bits): per element, an update costs two
// divisions and a square root, which run at the same rate per element in 8 and in 16 lanes on
// Intel's cores (a zmm vdivps or vsqrtps takes twice a ymm one's issue slots), and it moves 28
// bytes of memory, more than a core's share of the memory bandwidth at that rate: the wider
// vector buys nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attn/kernels/detail/avx2.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// The scalars of one Adam step, in the parameters' type.
template <class T>
struct AdamCoefficients {
  T beta1, beta2;  // moment decay rates
  T one_minus_beta1, one_minus_beta2;
  T step_size;              // lr / (1 - beta1^t)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  T eps, weight_decay;
};

namespace detail {

/// Elements [0, n) of one tensor, one at a time.
template <class T>
void adam_update_scalar(T* x, const T* g, T* m, T* v, Index n, const AdamCoefficients<T>& c) {
  for (Index i = 0; i < n; ++i) {
    const T gi = c.weight_decay != T(0) ? g[i] + c.weight_decay * x[i] : g[i];
    m[i] = m[i] * c.beta1 + c.one_minus_beta1 * gi;
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    const T denom = std::sqrt(v[i]) / c.bias_correction2_sqrt + c.eps;
    x[i] = x[i] + (-c.step_size) * m[i] / denom;
  }
}

#if defined(ATTN_HAVE_AVX512)
/// v, opaque to the compiler: a product passed through this is rounded before it is added. Under
/// GCC's default -ffp-contract=fast a multiply feeding an add may become one FMA, and where it does
/// depends on the instruction set and the surrounding code: with it the vector update differed
/// from the scalar loop (a moment 9e-7 off PyTorch's after 3 steps).
ATTN_TARGET_AVX2 inline __m256 rounded(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

/// The update of adam_update_scalar on x, g, m, v [n], eight elements at a time, with masked loads
/// and stores at the end.
ATTN_TARGET_AVX2 inline void adam_update_avx2(float* x, const float* g, float* m, float* v, Index n,
                                              const AdamCoefficients<float>& c) {
  const __m256 b1 = _mm256_set1_ps(c.beta1), b2 = _mm256_set1_ps(c.beta2);
  const __m256 a1 = _mm256_set1_ps(c.one_minus_beta1), a2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 neg_step = _mm256_set1_ps(-c.step_size), eps = _mm256_set1_ps(c.eps);
  const __m256 bc2 = _mm256_set1_ps(c.bias_correction2_sqrt), wd = _mm256_set1_ps(c.weight_decay);
  const bool decay = c.weight_decay != 0.0f;
  for (Index i = 0; i < n; i += 8) {
    const Index lanes = n - i;
    const __m256 xi = avx2::load8(x + i, lanes);
    __m256 gi = avx2::load8(g + i, lanes);
    if (decay) gi = _mm256_add_ps(gi, rounded(_mm256_mul_ps(wd, xi)));
    const __m256 mi = _mm256_add_ps(rounded(_mm256_mul_ps(avx2::load8(m + i, lanes), b1)),
                                    rounded(_mm256_mul_ps(a1, gi)));
    const __m256 vi = _mm256_add_ps(rounded(_mm256_mul_ps(avx2::load8(v + i, lanes), b2)),
                                    rounded(_mm256_mul_ps(_mm256_mul_ps(a2, gi), gi)));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    const __m256 xo = _mm256_add_ps(xi, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom));
    avx2::store8(m + i, lanes, mi);
    avx2::store8(v + i, lanes, vi);
    avx2::store8(x + i, lanes, xo);
  }
}

#endif  // ATTN_HAVE_AVX512

/// Elements per task of the parallel loop.
inline constexpr Index kAdamChunk = 8192;

}  // namespace detail

/// One Adam update of x[n] (values) and m[n], v[n] (moments) from g[n] (gradients).
/// `vectorized` = false forces the scalar loop.
template <class T>
void adam_update(T* x, const T* g, T* m, T* v, Index n, const AdamCoefficients<T>& c,
                 bool vectorized = true) {
  bool avx2 = false;
#if defined(ATTN_HAVE_AVX512)
  avx2 = vectorized && std::is_same_v<T, float> && detail::cpu_has_avx2_fma();
#endif
  (void)vectorized;
  parallel_for_chunks(n, detail::kAdamChunk, kParallelMinOptimizer, [&](Index b, Index len) {
#if defined(ATTN_HAVE_AVX512)
    if constexpr (std::is_same_v<T, float>) {
      if (avx2) return detail::adam_update_avx2(x + b, g + b, m + b, v + b, len, c);
    }
#endif
    detail::adam_update_scalar(x + b, g + b, m + b, v + b, len, c);
  });
  (void)avx2;
}

}  // namespace attn::kernels
