// Linear: y = x W^T + b over the last axis, as torch.nn.Linear (names "weight" [O, I], "bias" [O]).
#pragma once

#include "attn/kernels/linear.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class Linear : public Module<T> {
 public:
  Linear(Index in_features, Index out_features, bool with_bias = true)
      : in_(in_features), out_(out_features), has_bias_(with_bias) {
    ATTN_CHECK(in_features > 0 && out_features > 0, ConfigError,
               "Linear: in_features and out_features must be > 0, got ", in_features, " and ",
               out_features);
    weight.allocate({out_, in_});
    this->register_parameter("weight", &weight);
    if (has_bias_) {
      bias.allocate({out_});
      this->register_parameter("bias", &bias);
    }
  }

  /// Xavier-uniform weight, zero bias (torch.nn.Transformer's initialisation).
  void reset_parameters(Rng& rng) {
    xavier_uniform(weight.value, rng);
    if (has_bias_) bias.value.set_zero();
  }

  /// x [..., I] -> y [..., O]; with `relu`, y = max(0, x W^T + b), and with `drop` (a Dropout's
  /// fused_forward) a dropout after that, both applied as the product is stored (FeedForward's
  /// first layer; backward is still that of the affine map alone).
  const Tensor<T>& forward(const Tensor<T>& x, bool relu = false, DropoutMask drop = {}) {
    ATTN_CHECK(x.rank() >= 1 && x.size(x.rank() - 1) == in_, ShapeError,
               "Linear: expected input [..., ", in_, "], got ", x.shape());
    drop.check("Linear");
    x_ = x;
    y_.resize(x.shape().with_last(out_));
    kernels::linear_forward<T>(y_.matrix(), x.matrix(), weight.value.matrix(),
                               has_bias_ ? bias.value.data() : nullptr, relu, drop);
    return y_;
  }

  /// dy [..., O] -> dx [..., I]; accumulates weight.grad and bias.grad.
  const Tensor<T>& backward(const Tensor<T>& dy) { return backward(dy, nullptr, T(1)); }

  /// The same, with dx gated as it is stored: dx = gate > 0 ? dx * gate_scale : 0 for `gate` of
  /// the input's shape. With gate = a ReLU's (and dropout's) output x and gate_scale 1 / (1 - p),
  /// this is the backward of those too, fused (FeedForward).
  const Tensor<T>& backward(const Tensor<T>& dy, const Tensor<T>* gate, T gate_scale) {
    ATTN_CHECK(y_.rank() >= 1, StateError, "Linear::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError, "Linear::backward: expected dy of shape ",
               y_.shape(), ", got ", dy.shape());
    ATTN_CHECK(gate == nullptr || gate->shape() == x_.shape(), ShapeError,
               "Linear::backward: expected a gate of shape ", x_.shape(), ", got ",
               gate == nullptr ? Shape() : gate->shape());
    dx_.resize(x_.shape());
    kernels::Epilogue<T> dx_gate;
    if (gate != nullptr) {
      dx_gate.gate = gate->data();
      dx_gate.gate_stride = in_;
      dx_gate.gate_scale = gate_scale;
    }
    kernels::linear_backward<T>(dx_.matrix(), weight.grad.matrix(),
                                has_bias_ ? bias.grad.data() : nullptr, dy.matrix(), x_.matrix(),
                                weight.value.matrix(), dx_gate);
    return dx_;
  }

  Index in_features() const { return in_; }
  Index out_features() const { return out_; }

  Parameter<T> weight;  // [O, I]
  Parameter<T> bias;    // [O] (empty when constructed without bias)

 private:
  Index in_, out_;
  bool has_bias_;
  Tensor<T> x_;   // [..., I] input handle, kept for dW
  Tensor<T> y_;   // [..., O] output buffer
  Tensor<T> dx_;  // [..., I] input-gradient buffer
};

}  // namespace attn
