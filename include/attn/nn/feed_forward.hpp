// The position-wise feed-forward network of the paper (section 3.3):
//   FFN(x) = max(0, x W1 + b1) W2 + b2
// with an optional dropout on the hidden ReLU output (tensor2tensor's relu_dropout; 0 = off, as in
// the paper). Parameters carry PyTorch's layer-level names, "linear1.weight" [F, D],
// "linear1.bias" [F], "linear2.weight" [D, F], "linear2.bias" [D]; a Transformer layer registers
// the FeedForward under an empty name so these sit directly in the layer, as in
// torch.nn.TransformerEncoderLayer.
#pragma once

#include "attn/nn/dropout.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/module.hpp"
#include "attn/nn/relu.hpp"

namespace attn {

template <class T>
class FeedForward : public Module<T> {
 public:
  FeedForward(Index d_model, Index d_ff, double relu_dropout = 0.0)
      : linear1(validated(d_model, d_ff, relu_dropout), d_ff),
        linear2(d_ff, d_model),
        dropout_(relu_dropout) {
    this->register_module("linear1", &linear1);
    this->register_module("activation", &relu_);
    this->register_module("dropout", &dropout_);
    this->register_module("linear2", &linear2);
  }

  /// Xavier-uniform weights, zero biases.
  void reset_parameters(Rng& rng) {
    linear1.reset_parameters(rng);
    linear2.reset_parameters(rng);
  }

  /// x [..., D] -> y [..., D].
  const Tensor<T>& forward(const Tensor<T>& x) {
    ATTN_CHECK(x.rank() >= 1 && x.size(x.rank() - 1) == d_model(), ShapeError,
               "FeedForward: expected input [..., ", d_model(), "], got ", x.shape());
    // The ReLU and the dropout are applied as linear1's product is stored; relu_ keeps the result
    // for backward, where h > 0 exactly where the ReLU passed and the dropout kept, so its mask
    // and the dropout's backward give the same bits as the separate modules.
    const DropoutMask drop = dropout_.fused_forward(x.shape().with_last(d_ff()));
    const Tensor<T>& h = relu_.adopt_output(linear1.forward(x, /*relu=*/true, drop));  // [..., F]
    return linear2.forward(h);
  }

  /// dy [..., D] -> dx [..., D]; accumulates the gradients of both Linear layers.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    // The dropout's and the ReLU's backward are applied as linear2's dx is stored: they give
    // dh * scale where h > 0 (the ReLU passed and the dropout kept) and 0 elsewhere, the same
    // bits as the two passes of the separate modules.
    const Tensor<T>& h = relu_.output();
    dropout_.check_backward_shape(h.shape());
    const Tensor<T>& dh = linear2.backward(dy, &h, dropout_.backward_scale());  // [..., F]
    return linear1.backward(dh);
  }

  Index d_model() const { return linear1.in_features(); }
  Index d_ff() const { return linear1.out_features(); }
  double relu_dropout() const { return dropout_.p(); }

  Linear<T> linear1;  // D -> F
  Linear<T> linear2;  // F -> D

 private:
  /// Checks the whole configuration up front, so the error names FeedForward's own arguments.
  static Index validated(Index d_model, Index d_ff, double relu_dropout) {
    ATTN_CHECK(d_model > 0, ConfigError, "FeedForward: d_model must be > 0, got ", d_model);
    ATTN_CHECK(d_ff > 0, ConfigError, "FeedForward: d_ff must be > 0, got ", d_ff);
    detail::check_probability("FeedForward", "relu_dropout", relu_dropout);
    return d_model;
  }

  ReLU<T> relu_;        // keeps its [..., F] output for backward
  Dropout<T> dropout_;  // on the hidden activation; the identity when p = 0 or in eval mode
};

}  // namespace attn
