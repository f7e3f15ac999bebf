// The residual connection around one sublayer (section 5.4 and Figure 1): "the output of each
// sub-layer is LayerNorm(x + Sublayer(x))", with dropout on the sublayer output before the add.
//
//   post-norm (the paper):  y = LayerNorm(x + Dropout(Sublayer(x)))
//   pre-norm (option):      y = x + Dropout(Sublayer(LayerNorm(x)))
//
// Written once here, for forward, backward and the incremental decoding step, so that an encoder
// layer is two of these and a decoder layer three (annotated-transformer's SublayerConnection).
//
// The LayerNorm and Dropout are the layer's own members, registered there under
// torch.nn.TransformerEncoderLayer's names ("norm1", "dropout1", ...); a Residual only refers to
// them and owns the buffers of the connection. The sublayer is passed to each call as a callable,
// so one connection serves self-attention, cross-attention and the feed-forward alike:
//   forward:  sublayer(const Tensor<T>& in) -> const Tensor<T>&       its forward
//   backward: sublayer(const Tensor<T>& dout) -> const Tensor<T>& din  its backward
#pragma once

#include "attn/error.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/layer_norm.hpp"
#include "attn/tensor.hpp"

namespace attn {

namespace detail {

/// out <- a + b (same shape), into out's reused storage, in parallel chunks.
template <class T>
void add_into(Tensor<T>& out, const Tensor<T>& a, const Tensor<T>& b) {
  ATTN_ASSERT(a.shape() == b.shape());
  out.resize(a.shape());
  kernels::residual_add(out.data(), a.data(), b.data(), a.numel(), 0.0, 0);
}

}  // namespace detail

template <class T>
class Residual {
 public:
  Residual(LayerNorm<T>& norm, Dropout<T>& dropout, bool norm_first)
      : norm_(norm), dropout_(dropout), norm_first_(norm_first) {}
  Residual(const Residual&) = delete;
  Residual& operator=(const Residual&) = delete;

  /// x [B, L, D] -> y [B, L, D] (see the top of this file).
  template <class Sublayer>
  const Tensor<T>& forward(const Tensor<T>& x, Sublayer&& sublayer) {
    // The dropout, the add and (post-norm) the norm run as one fused kernel (kernels/residual.hpp).
    if (!norm_first_) {
      const Tensor<T>& f = sublayer(x);
      out_shape_ = x.shape();
      return norm_.forward_residual(x, f, dropout_.fused_forward(f.shape()));
    }
    const Tensor<T>& f = sublayer(norm_.forward(x));
    ATTN_CHECK(f.shape() == x.shape(), ShapeError, "Residual: the sublayer maps ", x.shape(),
               " to ", f.shape());
    const DropoutMask drop = dropout_.fused_forward(f.shape());
    sum_.resize(x.shape());
    kernels::residual_add(sum_.data(), x.data(), f.data(), x.numel(), drop.p, drop.key);
    out_shape_ = x.shape();
    return sum_;
  }

  /// dy [B, L, D] -> dx [B, L, D]; `sublayer_backward` maps the sublayer's output gradient to its
  /// input gradient (accumulating its parameter gradients).
  template <class SublayerBackward>
  const Tensor<T>& backward(const Tensor<T>& dy, SublayerBackward&& sublayer_backward) {
    if (!norm_first_) {
      // y = norm(s), s = x + drop(f(x)): ds = norm'(dy), dx = ds + f'(drop'(ds)).
      const Tensor<T>& ds = norm_.backward(dy);
      detail::add_into(dx_, ds, sublayer_backward(dropout_.backward(ds)));
      return dx_;
    }
    // y = x + drop(f(norm(x))): dx = dy + norm'(f'(drop'(dy))).
    detail::add_into(dx_, dy, norm_.backward(sublayer_backward(dropout_.backward(dy))));
    return dx_;
  }

  /// The shape of the last forward's output ([B, L, D] of its input; empty before one).
  const Shape& output_shape() const { return out_shape_; }

  /// One incremental decoding step, x_t [B, 1, D] -> [B, 1, D]: the forward without dropout
  /// (decoding is inference whatever the mode), and nothing kept for backward.
  template <class Sublayer>
  const Tensor<T>& step(const Tensor<T>& x_t, Sublayer&& sublayer) {
    if (!norm_first_) return norm_.forward_residual(x_t, sublayer(x_t), DropoutMask{});
    detail::add_into(sum_, x_t, sublayer(norm_.forward(x_t)));
    return sum_;
  }

 private:
  LayerNorm<T>& norm_;
  Dropout<T>& dropout_;
  bool norm_first_;
  Tensor<T> sum_;    // [B, L, D] pre-norm: x + Dropout(Sublayer(.)), the output
  Shape out_shape_;  // of the last forward
  Tensor<T> dx_;     // [B, L, D] input-gradient buffer
};

}  // namespace attn
