// The encoder of the paper (section 3.1, Figure 1 left): a stack of N identical layers, each a
// self-attention sublayer and a feed-forward sublayer with a residual connection around each
// (residual.hpp):
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
#include "attn/nn/residual.hpp"

namespace attn {

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
    const Tensor<T>& h = self_attn_residual_.forward(
        x, [&](auto& in) -> auto& { return self_attn.forward_self(in, mask_); });
    return ffn_residual_.forward(
        h, [&](auto& in) -> auto& { return ffn.forward(in); });
  }

  /// dy [B, S, D] -> dx [B, S, D]; accumulates every parameter gradient.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    const Shape& y_shape = ffn_residual_.output_shape();
    ATTN_CHECK(y_shape.rank() >= 1, StateError, "EncoderLayer::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_shape, ShapeError, "EncoderLayer::backward: expected dy of shape ",
               y_shape, ", got ", dy.shape());
    const Tensor<T>& dh = ffn_residual_.backward(
        dy, [&](auto& d) -> auto& { return ffn.backward(d); });
    return self_attn_residual_.backward(
        dh, [&](auto& d) -> auto& { return self_attn.backward(d); });
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
  // Figure 1, left: two sublayers, each inside a residual connection (residual.hpp).
  Residual<T> self_attn_residual_{norm1, dropout1, options_.norm_first};
  Residual<T> ffn_residual_{norm2, dropout2, options_.norm_first};
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

  /// dmemory [B, S, D] -> dx [B, S, D]. Calls finished() after each stage of backward_stages().
  template <class Finished = detail::NoStageHook>
  const Tensor<T>& backward(const Tensor<T>& dy, Finished&& finished = {}) {
    return this->backward_layers(dy, finished, [](const auto&, bool) {});
  }

  /// Makes every layer's self-attention keep its [B, H, S, S] weights:
  /// layers[i]->self_attn.attention_weights().
  void keep_attention_weights(bool keep) {
    for (auto& layer : this->layers) layer->self_attn.keep_attention_weights(keep);
  }
};

}  // namespace attn
