// The decoder of the paper (section 3.1, Figure 1 right): N identical layers, each masked (causal)
// self-attention, cross-attention over the encoder output ("memory") and a feed-forward sublayer,
// with a residual connection around each (residual.hpp).
//
//   post-norm (the paper):  y = norm1(y + dropout1(self_attn(y)))           causal + tgt padding
//                           y = norm2(y + dropout2(multihead_attn(y, mem)))  memory padding
//                           y = norm3(y + dropout3(ffn(y)))
//   pre-norm (option):      y = y + dropout1(self_attn(norm1(y))), and so on for 2 and 3.
//
// Names as torch.nn.TransformerDecoderLayer / TransformerDecoder: "self_attn", "multihead_attn",
// "linear1", "linear2", "norm1".."norm3"; "layers.{i}.", "norm.".
//
// Incremental decoding (forward_step) feeds one target position per call and caches every layer's
// self-attention keys and values and its projected memory; it is inference only (dropout is not
// applied whatever the mode, and there is no backward) and gives the same outputs as the full
// causal forward.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attn/mask.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/feed_forward.hpp"
#include "attn/nn/kv_cache.hpp"
#include "attn/nn/layer_norm.hpp"
#include "attn/nn/layer_options.hpp"
#include "attn/nn/layer_stack.hpp"
#include "attn/nn/module.hpp"
#include "attn/nn/multi_head_attention.hpp"
#include "attn/nn/residual.hpp"

namespace attn {

/// What one decoder layer caches while decoding: its self-attention keys and values, growing by
/// one position per step, and its cross-attention projection of the memory, made once.
template <class T>
struct DecoderLayerCache {
  KVCache<T> self;
  KVCache<T> cross;

  void allocate(Index batch, Index max_len, Index d_model) {
    self.allocate(batch, max_len, d_model);
    cross.clear();
  }
  void clear() {
    self.clear();
    cross.clear();
  }
  /// Beam search: row b continues from row rows[b] (see KVCache::reorder).
  void reorder(const std::vector<Index>& rows) {
    self.reorder(rows);
    if (cross.length > 0) cross.reorder(rows);
  }
  /// Row b becomes row rows[b] of `from` (see KVCache::gather).
  void gather(const DecoderLayerCache& from, const std::vector<Index>& rows) {
    self.gather(from.self, rows);
    if (from.cross.length > 0)
      cross.gather(from.cross, rows);
    else
      cross.clear();
  }
};

/// The caches of a decoder stack, one per layer. allocate() once per batch size and maximum
/// output length; clear() between batches of the same sizes.
template <class T>
struct DecoderCache {
  std::vector<DecoderLayerCache<T>> layers;

  void allocate(Index num_layers, Index batch, Index max_len, Index d_model) {
    ATTN_CHECK(num_layers >= 0, ShapeError, "DecoderCache: num_layers must be >= 0, got ",
               num_layers);
    layers.resize(static_cast<std::size_t>(num_layers));
    for (auto& l : layers) l.allocate(batch, max_len, d_model);
  }
  void clear() {
    for (auto& l : layers) l.clear();
  }
  /// Beam search: row b continues from row rows[b] in every layer (see KVCache::reorder).
  void reorder(const std::vector<Index>& rows) {
    for (auto& l : layers) l.reorder(rows);
  }
  /// Row b becomes row rows[b] of `from` in every layer (see KVCache::gather).
  void gather(const DecoderCache& from, const std::vector<Index>& rows) {
    layers.resize(from.layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) layers[i].gather(from.layers[i], rows);
  }
  /// Target positions decoded so far.
  Index length() const { return layers.empty() ? 0 : layers.front().self.length; }
  /// The bytes every layer's caches hold (KVCache::bytes).
  double bytes() const {
    double sum = 0;
    for (const auto& l : layers) sum += l.self.bytes() + l.cross.bytes();
    return sum;
  }
};

template <class T>
class DecoderLayer : public Module<T> {
 public:
  explicit DecoderLayer(const LayerOptions& options)
      : options_(detail::validated(options)),
        self_attn(options.d_model, options.heads, options.attention_dropout,
                  options.use_fast_kernel),
        multihead_attn(options.d_model, options.heads, options.attention_dropout,
                       options.use_fast_kernel),
        ffn(options.d_model, options.d_ff, options.relu_dropout),
        norm1(options.d_model, options.layer_norm_eps),
        norm2(options.d_model, options.layer_norm_eps),
        norm3(options.d_model, options.layer_norm_eps),
        dropout1(options.dropout),
        dropout2(options.dropout),
        dropout3(options.dropout) {
    self_mask_.causal = true;
    this->register_module("self_attn", &self_attn);
    this->register_module("multihead_attn", &multihead_attn);
    this->register_module("", &ffn);  // "linear1.*", "linear2.*" directly in the layer, as torch
    this->register_module("norm1", &norm1);
    this->register_module("norm2", &norm2);
    this->register_module("norm3", &norm3);
    this->register_module("dropout1", &dropout1);
    this->register_module("dropout2", &dropout2);
    this->register_module("dropout3", &dropout3);
  }

  void reset_parameters(Rng& rng) {
    self_attn.reset_parameters(rng);
    multihead_attn.reset_parameters(rng);
    ffn.reset_parameters(rng);
    norm1.reset_parameters(rng);
    norm2.reset_parameters(rng);
    norm3.reset_parameters(rng);
  }

  /// y [B, T, D], memory [B, S, D] -> [B, T, D]. Self-attention is causal and skips the padding of
  /// `tgt_padding` ([B, T] or empty); cross-attention skips that of `memory_padding` ([B, S]).
  const Tensor<T>& forward(const Tensor<T>& y, const Tensor<T>& memory,
                           const KeyPaddingMask& tgt_padding,
                           const KeyPaddingMask& memory_padding) {
    detail::check_activation(y, options_.d_model, "DecoderLayer", "y");
    detail::check_activation(memory, options_.d_model, "DecoderLayer", "memory", y.size(0));
    self_mask_.key_padding = tgt_padding;
    cross_mask_.key_padding = memory_padding;
    const Tensor<T>& h1 = self_attn_residual_.forward(
        y, [&](auto& in) -> auto& { return self_attn.forward_self(in, self_mask_); });
    const Tensor<T>& h2 = cross_attn_residual_.forward(
        h1, [&](auto& in) -> auto& {
          return multihead_attn.forward_cross(in, memory, cross_mask_);
        });
    return ffn_residual_.forward(
        h2, [&](auto& in) -> auto& { return ffn.forward(in); });
  }

  /// dy [B, T, D] -> dy_in [B, T, D]; the memory's gradient is dmemory(). Accumulates every
  /// parameter gradient.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    const Shape& y_shape = ffn_residual_.output_shape();
    ATTN_CHECK(y_shape.rank() >= 1, StateError, "DecoderLayer::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_shape, ShapeError, "DecoderLayer::backward: expected dy of shape ",
               y_shape, ", got ", dy.shape());
    const Tensor<T>& dh2 = ffn_residual_.backward(
        dy, [&](auto& d) -> auto& { return ffn.backward(d); });
    const Tensor<T>& dh1 = cross_attn_residual_.backward(
        dh2, [&](auto& d) -> auto& { return multihead_attn.backward(d); });
    return self_attn_residual_.backward(
        dh1, [&](auto& d) -> auto& { return self_attn.backward(d); });
  }

  /// Gradient of the memory [B, S, D] from the last backward (overwritten by each).
  const Tensor<T>& dmemory() const { return multihead_attn.dmemory(); }

  /// One decoding step: y_t [B, 1, D], the newest target position -> [B, 1, D]. `cache` must be
  /// allocated for B and the maximum length; the memory is projected on the first step after
  /// allocate()/clear() and reused after. Inference only: no dropout, no backward.
  const Tensor<T>& forward_step(const Tensor<T>& y_t, const Tensor<T>& memory,
                                const KeyPaddingMask& memory_padding, DecoderLayerCache<T>& cache) {
    check_step(y_t, memory, memory_padding, cache, "DecoderLayer::forward_step");
    cross_mask_.key_padding = memory_padding;
    const Tensor<T>& h1 = self_attn_residual_.step(
        y_t, [&](auto& in) -> auto& { return self_attn.forward_self_step(in, cache.self); });
    const Tensor<T>& h2 = cross_attn_residual_.step(
        h1, [&](auto& in) -> auto& {
          return multihead_attn.forward_cross_cached(in, memory, cache.cross, cross_mask_);
        });
    return ffn_residual_.step(
        h2, [&](auto& in) -> auto& { return ffn_step(in); });
  }

  /// ShapeError unless forward_step takes these arguments, naming `who`. Everything the step's
  /// sublayers would refuse is checked before its self-attention appends to the cache: a step
  /// refused by the cross-attention (a memory of another length than its padding mask, a cross
  /// cache of another memory) had advanced the self-attention's cache already.
  void check_step(const Tensor<T>& y_t, const Tensor<T>& memory,
                  const KeyPaddingMask& memory_padding, const DecoderLayerCache<T>& cache,
                  const char* who) const {
    const Index D = options_.d_model;
    detail::check_activation(y_t, D, who, "y_t");
    ATTN_CHECK(y_t.size(1) == 1, ShapeError, who, ": expected y_t [B, 1, ", D, "], got ",
               y_t.shape());
    const Index B = y_t.size(0);
    detail::check_activation(memory, D, who, "memory", B);
    const Index S = memory.size(1);
    ATTN_CHECK(
        memory_padding.empty() || (memory_padding.batch() == B && memory_padding.length() == S),
        ShapeError, who, ": expected a source padding mask [B, S] = [", B, ", ", S, "] for memory ",
        memory.shape(), ", got [", memory_padding.batch(), ", ", memory_padding.length(), "]");
    const KVCache<T>& self = cache.self;
    ATTN_CHECK(self.allocated() && self.batch() == B && self.keys.size(2) == D, ShapeError, who,
               ": expected a self-attention cache allocated for [B, *, D] = [", B, ", *, ", D,
               "], got keys ", self.keys.shape());
    self.check_length(who);
    ATTN_CHECK(self.length < self.capacity(), ShapeError, who, ": cache full, capacity ",
               self.capacity(), " positions");
    const KVCache<T>& cross = cache.cross;
    ATTN_CHECK(cross.length == 0 || (cross.keys.shape() == Shape({B, S, D}) && cross.length == S),
               ShapeError, who, ": the cross-attention cache holds memory ", cross.keys.shape(),
               ", got memory ", memory.shape(), " (clear() it for a new batch)");
  }

  const LayerOptions& options() const { return options_; }

 private:
  /// The feed-forward without its ReLU dropout: steps are inference, whatever the mode.
  const Tensor<T>& ffn_step(const Tensor<T>& x) {
    const bool training = ffn.is_training();
    if (training) ffn.eval();
    const Tensor<T>& out = ffn.forward(x);
    if (training) ffn.train();
    return out;
  }

  LayerOptions options_;

 public:
  MultiHeadAttention<T> self_attn;       // causal, over the target
  MultiHeadAttention<T> multihead_attn;  // queries from the target, keys and values from memory
  FeedForward<T> ffn;                    // "linear1", "linear2"
  LayerNorm<T> norm1, norm2, norm3;
  Dropout<T> dropout1, dropout2, dropout3;

 private:
  AttentionMask<T> self_mask_;   // causal + tgt padding of the last forward
  AttentionMask<T> cross_mask_;  // memory padding of the last forward
  // Figure 1, right: three sublayers, each inside a residual connection (residual.hpp).
  Residual<T> self_attn_residual_{norm1, dropout1, options_.norm_first};
  Residual<T> cross_attn_residual_{norm2, dropout2, options_.norm_first};
  Residual<T> ffn_residual_{norm3, dropout3, options_.norm_first};
};

/// N decoder layers, and a final LayerNorm when `final_norm` (layer_stack.hpp).
template <class T>
class Decoder : public LayerStack<T, DecoderLayer<T>> {
 public:
  Decoder(const LayerOptions& options, Index num_layers, bool final_norm)
      : LayerStack<T, DecoderLayer<T>>(options, num_layers, final_norm, "Decoder") {}

  /// y [B, T, D], memory [B, S, D] -> [B, T, D].
  const Tensor<T>& forward(const Tensor<T>& y, const Tensor<T>& memory,
                           const KeyPaddingMask& tgt_padding,
                           const KeyPaddingMask& memory_padding) {
    const Tensor<T>* h = &y;
    for (auto& layer : this->layers) h = &layer->forward(*h, memory, tgt_padding, memory_padding);
    return this->final_forward(*h);
  }

  /// dy [B, T, D] -> dy_in [B, T, D]; dmemory() is the sum of every layer's memory gradient.
  /// Calls finished() after each stage of backward_stages().
  template <class Finished = detail::NoStageHook>
  const Tensor<T>& backward(const Tensor<T>& dy, Finished&& finished = {}) {
    return this->backward_layers(dy, finished, [this](const auto& layer, bool last) {
      const Tensor<T>& dm = layer.dmemory();
      if (last) {
        dmemory_.resize(dm.shape());
        dmemory_.vector() = dm.vector();
      } else {
        dmemory_.vector() += dm.vector();
      }
    });
  }

  /// Gradient of the memory [B, S, D] summed over the layers, from the last backward.
  const Tensor<T>& dmemory() const {
    ATTN_CHECK(dmemory_.rank() == 3, StateError,
               "Decoder::dmemory: needs forward and backward first");
    return dmemory_;
  }

  /// A cache for decoding `batch` rows of up to `max_len` positions.
  DecoderCache<T> make_cache(Index batch, Index max_len) const {
    DecoderCache<T> cache;
    cache.allocate(this->num_layers(), batch, max_len, this->options().d_model);
    return cache;
  }

  /// One decoding step through every layer: y_t [B, 1, D] -> [B, 1, D] (final norm included).
  const Tensor<T>& forward_step(const Tensor<T>& y_t, const Tensor<T>& memory,
                                const KeyPaddingMask& memory_padding, DecoderCache<T>& cache) {
    check_step(y_t, memory, memory_padding, cache);
    const Tensor<T>* h = &y_t;
    const Index position = cache.length();
    std::size_t i = 0;
    try {
      for (; i < this->layers.size(); ++i)
        h = &this->layers[i]->forward_step(*h, memory, memory_padding, cache.layers[i]);
      return this->final_forward(*h);
    } catch (...) {
      // A layer that failed part-way (std::bad_alloc, say) after the ones before it appended the
      // position: each back where the step found it, so that the step can be taken again. The
      // cross-attention caches are filled at position 0 (made again then).
      for (std::size_t k = 0; k <= i && k < this->layers.size(); ++k) {
        cache.layers[k].self.length = position;
        if (position == 0) cache.layers[k].cross.clear();
      }
      throw;
    }
  }

  /// Makes every layer keep its self- and cross-attention weights: layers[i]->self_attn and
  /// layers[i]->multihead_attn .attention_weights().
  void keep_attention_weights(bool keep) {
    for (auto& layer : this->layers) {
      layer->self_attn.keep_attention_weights(keep);
      layer->multihead_attn.keep_attention_weights(keep);
    }
  }

 private:
  /// Every layer's check_step, and the layers' agreement on the positions decoded, before layer 0
  /// appends to its cache: a step refused by a later layer left the layers' caches at different
  /// lengths, and the steps after gave wrong outputs in silence. A cache left so by other means
  /// (its lengths are public fields) is refused too.
  void check_step(const Tensor<T>& y_t, const Tensor<T>& memory,
                  const KeyPaddingMask& memory_padding, const DecoderCache<T>& cache) const {
    const char* who = "Decoder::forward_step";
    ATTN_CHECK(static_cast<Index>(cache.layers.size()) == this->num_layers(), ShapeError, who,
               ": expected a cache of ", this->num_layers(), " layers, got ", cache.layers.size());
    const Index length = cache.length();
    for (std::size_t i = 0; i < cache.layers.size(); ++i) {
      ATTN_CHECK(cache.layers[i].self.length == length, ShapeError, who,
                 ": the cache's layers disagree on the positions decoded: layer 0 holds ", length,
                 ", layer ", i, " holds ", cache.layers[i].self.length,
                 " (clear() it and decode again from position 0)");
      this->layers[i]->check_step(y_t, memory, memory_padding, cache.layers[i], who);
    }
  }

  Tensor<T> dmemory_;  // [B, S, D] sum of the layers' memory gradients
};

}  // namespace attn
