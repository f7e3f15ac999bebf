// Gradient norm clipping and scaling over a model's parameters.
//
// Gradient accumulation is the caller's: backward passes add into Parameter::grad, and
// scale_gradients() turns the sum into a mean (or applies any other factor) before the update.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "attn/kernels/detail/double_sums.hpp"
#include "attn/nn/module.hpp"

namespace attn {

/// The global L2 norm of all gradients, sqrt(sum of squares), accumulated in double (16 lanes at
/// a time, kernels/detail/double_sums.hpp, for float).
template <class T>
double grad_norm(const std::vector<NamedParameter<T>>& params) {
  double sum = 0;
  for (const auto& p : params) {
    if constexpr (std::is_same_v<T, float>)
      sum += kernels::detail::sum_of_squares(p.grad.data(), p.grad.numel());
    else
      sum += p.grad.vector().squaredNorm();
  }
  return std::sqrt(sum);
}

/// Multiplies every gradient by `factor`.
template <class T>
void scale_gradients(const std::vector<NamedParameter<T>>& params, double factor) {
  ATTN_CHECK(detail::fits_in<T>(factor), NumericError,
             "scale_gradients: factor must be finite in the gradients' type, got ", factor);
  for (auto p : params) p.grad.vector() *= static_cast<T>(factor);
}

/// As torch.nn.utils.clip_grad_norm_: when the global norm exceeds max_norm, scales every gradient
/// by max_norm / (norm + 1e-6); returns the norm before clipping. A NaN or Inf norm throws
/// NumericError (the gradients are left as they are).
template <class T>
double clip_grad_norm(const std::vector<NamedParameter<T>>& params, double max_norm) {
  ATTN_CHECK(max_norm > 0 && std::isfinite(max_norm), ConfigError,
             "clip_grad_norm: max_norm must be finite and > 0, got ", max_norm);
  const double norm = grad_norm(params);
  ATTN_CHECK(std::isfinite(norm), NumericError, "clip_grad_norm: the gradient norm is ",
             std::isnan(norm) ? "NaN" : "Inf");
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) scale_gradients(params, coef);
  return norm;
}

}  // namespace attn
