// Element-wise activations and their derivatives.
#pragma once

#include <algorithm>

#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// y[n] = max(0, x[n]). `y` may alias `x`.
template <class T>
void relu_forward(T* y, const T* x, Index n) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(y, n) =
      Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, n).max(T(0));
}

/// Backward of y = max(0, x) from the OUTPUT: dx = dy where y > 0, else 0 (overwritten). The
/// output suffices because y > 0 exactly where x > 0; at x = 0 the subgradient 0 is used, as
/// PyTorch does. `dx` may alias `dy`.
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, Index n) {
  using Arr = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
  parallel_for_chunks(n, 16384, kParallelMinElementwise, [&](Index b, Index len) {
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(dx + b, len) =
        (Arr(y + b, len) > T(0)).select(Arr(dy + b, len), T(0));
  });
}

}  // namespace attn::kernels
