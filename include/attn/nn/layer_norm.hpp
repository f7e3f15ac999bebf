// LayerNorm over the last axis, as torch.nn.LayerNorm(d): "weight" [D] (init 1), "bias" [D]
// (init 0), biased variance, eps inside the square root.
#pragma once

#include "attn/kernels/layer_norm.hpp"
#include "attn/kernels/residual.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class LayerNorm : public Module<T> {
 public:
  explicit LayerNorm(Index d, double eps = 1e-5) : d_(d), eps_(eps) {
    ATTN_CHECK(d > 0, ConfigError, "LayerNorm: d must be > 0, got ", d);
    // eps is added in T: one that rounds to 0 there gave NaN for a constant row.
    ATTN_CHECK(eps > 0 && detail::fits_in<T>(eps) && static_cast<T>(eps) > 0, ConfigError,
               "LayerNorm: eps must be > 0, finite and still > 0 in the parameters' type, got ",
               eps);
    weight.allocate({d_});
    bias.allocate({d_});
    weight.value.fill(T(1));
    this->register_parameter("weight", &weight);
    this->register_parameter("bias", &bias);
  }

  /// Ones and zeros, as PyTorch; `rng` is unused but keeps reset_parameters uniform across modules.
  void reset_parameters(Rng& /*rng*/) {
    weight.value.fill(T(1));
    bias.value.set_zero();
  }

  /// x [..., D] -> y [..., D].
  const Tensor<T>& forward(const Tensor<T>& x) {
    ATTN_CHECK(x.rank() >= 1 && x.size(x.rank() - 1) == d_, ShapeError,
               "LayerNorm: expected input [..., ", d_, "], got ", x.shape());
    x_ = x;
    const Index rows = x.numel() / d_;
    y_.resize(x.shape());
    mean_.resize({rows});
    rstd_.resize({rows});
    kernels::layer_norm_forward<T>(y_.data(), mean_.data(), rstd_.data(), x.data(),
                                   weight.value.data(), bias.value.data(), rows, d_, eps_);
    return y_;
  }

  /// The post-norm residual connection in one pass: y = LayerNorm(x + dropout(f)), the dropout
  /// given as its drop probability and key (Dropout::fused_forward; p = 0: none). x, f
  /// [..., D]. Backward is backward's, with respect to the sum s = x + dropout(f).
  const Tensor<T>& forward_residual(const Tensor<T>& x, const Tensor<T>& f, DropoutMask drop) {
    ATTN_CHECK(x.rank() >= 1 && x.size(x.rank() - 1) == d_, ShapeError,
               "LayerNorm: expected input [..., ", d_, "], got ", x.shape());
    ATTN_CHECK(f.shape() == x.shape(), ShapeError, "LayerNorm::forward_residual: expected f of ",
               "shape ", x.shape(), ", got ", f.shape());
    drop.check("LayerNorm::forward_residual");
    const Index rows = x.numel() / d_;
    sum_.resize(x.shape());
    x_ = sum_;
    y_.resize(x.shape());
    mean_.resize({rows});
    rstd_.resize({rows});
    kernels::residual_layer_norm_forward<T>(y_.data(), sum_.data(), mean_.data(), rstd_.data(),
                                            x.data(), f.data(), drop.p, drop.key,
                                            weight.value.data(), bias.value.data(), rows, d_, eps_);
    return y_;
  }

  /// dy [..., D] -> dx [..., D]; accumulates weight.grad and bias.grad.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(y_.rank() >= 1, StateError, "LayerNorm::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError, "LayerNorm::backward: expected dy of shape ",
               y_.shape(), ", got ", dy.shape());
    dx_.resize(x_.shape());
    kernels::layer_norm_backward<T>(dx_.data(), weight.grad.data(), bias.grad.data(), dy.data(),
                                    x_.data(), mean_.data(), rstd_.data(), weight.value.data(),
                                    mean_.numel(), d_);
    return dx_;
  }

  Index dim() const { return d_; }
  double eps() const { return eps_; }

  Parameter<T> weight;  // [D] gamma
  Parameter<T> bias;    // [D] beta

 private:
  Index d_;
  double eps_;
  Tensor<T> x_;     // [..., D] input handle, kept for backward (xhat is recomputed from it)
  Tensor<T> sum_;   // [..., D] forward_residual's x + dropout(f), its x_
  Tensor<T> mean_;  // [N] per-row mean, kept for backward
  Tensor<T> rstd_;  // [N] per-row 1 / sqrt(var + eps), kept for backward
  Tensor<T> y_;     // [..., D] output buffer
  Tensor<T> dx_;    // [..., D] input-gradient buffer
};

}  // namespace attn
