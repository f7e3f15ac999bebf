// Element-wise activations and their derivatives.
#pragma once

#include <algorithm>

#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// y[n] = max(0, x[n]). `y` may alias `x`.
template <class T>
void relu_forward(T* y, const T* x, Index n) {
  ArrayMap<T>(y, n) = ArrayMap<const T>(x, n).max(T(0));
}

/// Backward of y = max(0, x) from the OUTPUT: dx = dy where y > 0, else 0 (overwritten). The
/// output suffices because y > 0 exactly where x > 0; at x = 0 the subgradient 0 is used, as
/// PyTorch does. `dx` may alias `dy`.
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, Index n) {
  parallel_for_chunks(n, 16384, kParallelMinElementwise, [&](Index b, Index len) {
    ArrayMap<T>(dx + b, len) =
        (ArrayMap<const T>(y + b, len) > T(0)).select(ArrayMap<const T>(dy + b, len), T(0));
  });
}

}  // namespace attn::kernels
