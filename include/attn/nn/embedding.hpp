// Embedding: token ids -> rows of a [V, D] table, scaled by sqrt(D) as in the paper (section 3.4:
// "In the embedding layers, we multiply those weights by sqrt(d_model)"). The parameter is
// "weight" [V, D], as torch.nn.Embedding, so the Transformer can tie it to the output projection
// (Parameter::tie_to).
#pragma once

#include <cmath>

#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class Embedding : public Module<T> {
 public:
  /// padding_idx = -1 means none; otherwise that row starts at zero and never gets a gradient
  /// (a stop-gradient, as torch.nn.Embedding: forward still reads the row, which weight tying can
  /// make nonzero).
  Embedding(Index vocab, Index d_model, Index padding_idx = -1, bool scale_by_sqrt_d = true)
      : vocab_(vocab),
        d_(d_model),
        padding_idx_(padding_idx),
        scale_(scale_by_sqrt_d ? std::sqrt(static_cast<double>(d_model)) : 1.0) {
    ATTN_CHECK(vocab > 0, ConfigError, "Embedding: vocab must be > 0, got ", vocab);
    ATTN_CHECK(d_model > 0, ConfigError, "Embedding: d_model must be > 0, got ", d_model);
    ATTN_CHECK(padding_idx >= -1 && padding_idx < vocab, ConfigError,
               "Embedding: padding_idx must be -1 (none) or in [0, ", vocab, "), got ",
               padding_idx);
    weight.allocate({vocab_, d_});
    this->register_parameter("weight", &weight);
  }

  /// N(0, D^-1/2), the scale fairseq and the annotated transformer use with the sqrt(D)
  /// multiplier, so that scaled embeddings have unit variance; the padding row is zero.
  void reset_parameters(Rng& rng) {
    fill_normal(weight.value, rng, 0.0, 1.0 / std::sqrt(static_cast<double>(d_)));
    if (padding_idx_ >= 0) weight.value.matrix().row(padding_idx_).setZero();
  }

  /// ids [B, L] -> y [B, L, D] = weight[ids] * scale.
  const Tensor<T>& forward(const Tensor<TokenId>& ids) {
    ATTN_CHECK(ids.rank() == 2, ShapeError, "Embedding: expected ids [B, L], got shape ",
               ids.shape());
    const Index B = ids.size(0), L = ids.size(1);
    // Validate every id before writing anything, so a bad batch leaves no half-written output.
    for (Index b = 0; b < B; ++b)
      for (Index l = 0; l < L; ++l) {
        const TokenId id = ids(b, l);
        ATTN_CHECK(id >= 0 && id < vocab_, IndexError, "Embedding: token id ", id, " at position [",
                   b, ", ", l, "] is outside the vocabulary [0, ", vocab_, ")");
      }
    ids_ = ids;
    y_.resize({B, L, d_});
    auto y = y_.matrix();
    const auto w = weight.value.matrix();
    const T scale = static_cast<T>(scale_);
    for (Index n = 0; n < B * L; ++n) y.row(n) = w.row(ids.data()[n]) * scale;
    return y_;
  }

  /// dy [B, L, D]: weight.grad[ids[n]] += dy[n] * scale, except for the padding row. Ids are
  /// discrete, so there is no input gradient to return. Serial on purpose: repeated ids make the
  /// scatter-add a race, and a fixed order keeps the sum bit-reproducible.
  void backward(const Tensor<T>& dy) {
    ATTN_CHECK(y_.rank() >= 1, StateError, "Embedding::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError, "Embedding::backward: expected dy of shape ",
               y_.shape(), ", got ", dy.shape());
    auto g = weight.grad.matrix();
    const auto d = dy.matrix();
    const T scale = static_cast<T>(scale_);
    for (Index n = 0; n < d.rows(); ++n) {
      const TokenId id = ids_.data()[n];
      if (id == padding_idx_) continue;
      // The ids are forward's handle: a caller that refilled that buffer since could put any id
      // here.
      ATTN_CHECK(id >= 0 && id < vocab_, IndexError, "Embedding::backward: token id ", id,
                 " at position ", n, " is outside [0, ", vocab_,
                 ") (the ids given to forward changed since)");
      g.row(id) += d.row(n) * scale;
    }
  }

  Index vocab_size() const { return vocab_; }
  Index d_model() const { return d_; }
  Index padding_idx() const { return padding_idx_; }
  double scale() const { return scale_; }

  Parameter<T> weight;  // [V, D]

 private:
  Index vocab_, d_, padding_idx_;
  double scale_;         // sqrt(D), or 1 without scaling
  Tensor<TokenId> ids_;  // [B, L] handle to the ids, kept for backward
  Tensor<T> y_;          // [B, L, D] output buffer
};

}  // namespace attn
