// The encoder of the paper (section 3.1): a stack of N identical layers, each a self-attention
// sublayer and a feed-forward sublayer with a residual connection around each.
//
//   post-norm (the paper):  x = norm1(x + dropout1(self_attn(x)))
//                           x = norm2(x + dropout2(ffn(x)))
//   pre-norm (option):      x = x + dropout1(self_attn(norm1(x)))
//                           x = x + dropout2(ffn(norm2(x)))
//
// Children are named as torch.nn.TransformerEncoderLayer's ("self_attn", "linear1", "linear2",
// "norm1", "norm2"), the stack's as torch.nn.TransformerEncoder's ("layers.{i}.", "norm."), so
// state_dicts move between the two by name. LayerNorm: biased variance, eps inside the square
// root, as PyTorch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attn/mask.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/feed_forward.hpp"
#include "attn/nn/layer_norm.hpp"
#include "attn/nn/layer_options.hpp"
#include "attn/nn/layer_stack.hpp"
#include "attn/nn/module.hpp"
#include "attn/nn/multi_head_attention.hpp"

namespace attn {

namespace detail {

/// Validates before any member is built, so the error names the LayerOptions field.
inline const LayerOptions& validated(const LayerOptions& o) {
  o.validate();
  return o;
}

/// out <- a + b (same shape), into out's reused storage.
template <class T>
void add_into(Tensor<T>& out, const Tensor<T>& a, const Tensor<T>& b) {
  ATTN_ASSERT(a.shape() == b.shape());
  out.resize(a.shape());
  out.vector() = a.vector() + b.vector();
}

/// Throws ShapeError unless x is [B, L, D] (and B == batch when batch >= 0).
template <class T>
void check_activation(const Tensor<T>& x, Index d_model, const char* who, const char* what,
                      Index batch = -1) {
  const bool ok = x.rank() == 3 && x.size(2) == d_model && (batch < 0 || x.size(0) == batch);
  if (batch < 0)
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [B, L, ", d_model, "], got ", x.shape());
  else
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [", batch, ", S, ", d_model,
               "] (B of the target), got ", x.shape());
}

}  // namespace detail

template <class T>
class EncoderLayer : public Module<T> {
 public:
  explicit EncoderLayer(const LayerOptions& options)
      : options_(detail::validated(options)),
        self_attn(options.d_model, options.heads, options.attention_dropout,
                  options.use_fast_kernel),
        ffn(options.d_model, options.d_ff, options.relu_dropout),
        norm1(options.d_model, options.layer_norm_eps),
        norm2(options.d_model, options.layer_norm_eps),
        dropout1(options.dropout),
        dropout2(options.dropout) {
    this->register_module("self_attn", &self_attn);
    this->register_module("", &ffn);  // "linear1.*", "linear2.*" directly in the layer, as torch
    this->register_module("norm1", &norm1);
    this->register_module("norm2", &norm2);
    this->register_module("dropout1", &dropout1);
    this->register_module("dropout2", &dropout2);
  }

  /// Xavier-uniform matrices, zero biases, unit LayerNorms (torch.nn.Transformer's init).
  void reset_parameters(Rng& rng) {
    self_attn.reset_parameters(rng);
    ffn.reset_parameters(rng);
    norm1.reset_parameters(rng);
    norm2.reset_parameters(rng);
  }

  /// x [B, S, D] -> [B, S, D]; padding keys of `src_padding` ([B, S] or empty) are not attended.
  const Tensor<T>& forward(const Tensor<T>& x, const KeyPaddingMask& src_padding) {
    detail::check_activation(x, options_.d_model, "EncoderLayer", "x");
    mask_.key_padding = src_padding;
    if (!options_.norm_first) {
      detail::add_into(sum1_, x, dropout1.forward(self_attn.forward_self(x, mask_)));
      const Tensor<T>& h = norm1.forward(sum1_);
      detail::add_into(sum2_, h, dropout2.forward(ffn.forward(h)));
      return norm2.forward(sum2_);
    }
    detail::add_into(sum1_, x, dropout1.forward(self_attn.forward_self(norm1.forward(x), mask_)));
    detail::add_into(sum2_, sum1_, dropout2.forward(ffn.forward(norm2.forward(sum1_))));
    return sum2_;
  }

  /// dy [B, S, D] -> dx [B, S, D]; accumulates every parameter gradient.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(dy.shape() == sum2_.shape(), ShapeError,
               "EncoderLayer::backward: expected dy of shape ", sum2_.shape(), ", got ",
               dy.shape());
    if (!options_.norm_first) {
      // h = norm1(s1), s2 = h + drop(ffn(h)), y = norm2(s2): dh = ds2 + ffn'(ds2).
      const Tensor<T>& ds2 = norm2.backward(dy);
      detail::add_into(dh_, ds2, ffn.backward(dropout2.backward(ds2)));
      // s1 = x + drop(attn(x)): dx = ds1 + attn'(ds1).
      const Tensor<T>& ds1 = norm1.backward(dh_);
      detail::add_into(dx_, ds1, self_attn.backward(dropout1.backward(ds1)));
      return dx_;
    }
    // y = s1 + drop(ffn(norm2(s1))): ds1 = dy + norm2'(ffn'(dy)).
    detail::add_into(dh_, dy, norm2.backward(ffn.backward(dropout2.backward(dy))));
    // s1 = x + drop(attn(norm1(x))): dx = ds1 + norm1'(attn'(ds1)).
    detail::add_into(dx_, dh_, norm1.backward(self_attn.backward(dropout1.backward(dh_))));
    return dx_;
  }

  const LayerOptions& options() const { return options_; }

 private:
  LayerOptions options_;

 public:
  MultiHeadAttention<T> self_attn;
  FeedForward<T> ffn;  // "linear1", "linear2"
  LayerNorm<T> norm1, norm2;
  Dropout<T> dropout1, dropout2;  // P_drop on each sublayer output, before the residual add

 private:
  AttentionMask<T> mask_;  // key padding of the last forward (the attention keeps its own copy)
  Tensor<T> sum1_;         // [B, S, D] first residual sum (pre-norm: also norm2's input)
  Tensor<T> sum2_;         // [B, S, D] second residual sum (pre-norm: the output)
  Tensor<T> dh_;           // [B, S, D] gradient between the two sublayers
  Tensor<T> dx_;           // [B, S, D] input-gradient buffer
};

/// N encoder layers, and a final LayerNorm when `final_norm` (layer_stack.hpp).
template <class T>
class Encoder : public LayerStack<T, EncoderLayer<T>> {
 public:
  Encoder(const LayerOptions& options, Index num_layers, bool final_norm)
      : LayerStack<T, EncoderLayer<T>>(options, num_layers, final_norm, "Encoder") {}

  /// x [B, S, D] -> memory [B, S, D].
  const Tensor<T>& forward(const Tensor<T>& x, const KeyPaddingMask& src_padding) {
    const Tensor<T>* h = &x;
    for (auto& layer : this->layers) h = &layer->forward(*h, src_padding);
    return this->final_forward(*h);
  }

  /// dmemory [B, S, D] -> dx [B, S, D].
  const Tensor<T>& backward(const Tensor<T>& dy) {
    const Tensor<T>* d = &this->final_backward(dy);
    for (auto it = this->layers.rbegin(); it != this->layers.rend(); ++it) d = &(*it)->backward(*d);
    return *d;
  }

  /// Makes every layer's self-attention keep its [B, H, S, S] weights:
  /// layers[i]->self_attn.attention_weights().
  void keep_attention_weights(bool keep) {
    for (auto& layer : this->layers) layer->self_attn.keep_attention_weights(keep);
  }
};

}  // namespace attn
