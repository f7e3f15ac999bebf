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
    detail::check_has_storage(x, "ReLU::forward");
    y_.resize(x.shape());
    kernels::relu_forward<T>(y_.data(), x.data(), x.numel());
    out_ = y_;
    return out_;
  }

  /// For an output computed elsewhere (a Linear with the ReLU fused into its product): keeps a
  /// handle to y = max(0, .) for backward and returns it.
  const Tensor<T>& adopt_output(const Tensor<T>& y) {
    out_ = y;
    return out_;
  }

  /// The last output (forward's or adopted); backward's mask is where it is > 0.
  const Tensor<T>& output() const { return out_; }

  /// dy [...] -> dx [...] = dy where y > 0, else 0.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(out_.has_storage(), StateError, "ReLU::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == out_.shape(), ShapeError, "ReLU::backward: expected dy of shape ",
               out_.shape(), ", got ", dy.shape());
    dx_.resize(dy.shape());
    kernels::relu_backward<T>(dx_.data(), dy.data(), out_.data(), dy.numel());
    return dx_;
  }

 private:
  Tensor<T> y_;    // [...] output buffer of forward
  Tensor<T> out_;  // [...] handle to the last output (y_ or adopted), kept for backward: its sign
                   // is the mask
  Tensor<T> dx_;   // [...] input-gradient buffer
};

}  // namespace attn
