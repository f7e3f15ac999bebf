// ReLU: y = max(0, x), element-wise.
#pragma once

#include "attn/kernels/activation.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class ReLU : public Module<T> {
 public:
  /// x [...] -> y [...].
  const Tensor<T>& forward(const Tensor<T>& x) {
    y_.resize(x.shape());
    kernels::relu_forward<T>(y_.data(), x.data(), x.numel());
    return y_;
  }

  /// dy [...] -> dx [...] = dy where y > 0, else 0.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError, "ReLU::backward: expected dy of shape ",
               y_.shape(), ", got ", dy.shape());
    dx_.resize(dy.shape());
    kernels::relu_backward<T>(dx_.data(), dy.data(), y_.data(), dy.numel());
    return dx_;
  }

 private:
  Tensor<T> y_;   // [...] output, kept for backward (its sign is the mask)
  Tensor<T> dx_;  // [...] input-gradient buffer
};

}  // namespace attn
