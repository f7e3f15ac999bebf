// The product by its definition, one dot product per element of C: the test oracle and the
// benchmark baseline of kernels/gemm.hpp.
#pragma once

#include "attn/kernels/gemm.hpp"

namespace attn::kernels {

/// c (=, or += when accumulate) a * b, then the epilogue; each element summed over k ascending in
/// Acc (the scalar type by default; long double gives the tests a near-exact reference).
template <class Acc = void, class Dst, class Lhs, class Rhs,
          class T = typename std::decay_t<Dst>::Scalar>
void gemm_naive(Dst&& c, const Lhs& a, const Rhs& b, bool accumulate, const Epilogue<T>& epi = {}) {
  using Sum = std::conditional_t<std::is_void_v<Acc>, T, Acc>;
  for (Index i = 0; i < c.rows(); ++i)
    for (Index j = 0; j < c.cols(); ++j) {
      Sum s = accumulate ? static_cast<Sum>(c(i, j)) : Sum(0);
      for (Index k = 0; k < a.cols(); ++k)
        s += static_cast<Sum>(a(i, k)) * static_cast<Sum>(b(k, j));
      if (epi.bias != nullptr) s += static_cast<Sum>(epi.bias[j]);
      if (epi.relu && s < Sum(0)) s = Sum(0);
      c(i, j) = static_cast<T>(s);
      if (epi.gate != nullptr)
        c(i, j) = epi.gate[i * epi.gate_stride + j] > T(0) ? c(i, j) * epi.gate_scale : T(0);
    }
}

}  // namespace attn::kernels
