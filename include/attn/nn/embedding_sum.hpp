// EmbeddingSum: the input of an encoder or decoder stack,
//
//   Dropout(embed(ids) * sqrt(D) + positions)
//
// the scaled embeddings of section 3.4 plus the positional encodings of section 3.5 (sinusoidal,
// or learned ones as the paper's Table 3 row (E) compares), with the dropout section 5.4 applies
// "to the sums of the embeddings and the positional encodings".
//
// It refers to an Embedding and a Dropout that its owner registers under its own names, and owns
// the positions: the sinusoidal table, or learned positions that the owner registers through
// learned_positions() (a Transformer names them "src_pos" and "tgt_pos").
#pragma once

#include <memory>

#include "attn/nn/dropout.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/positional_encoding.hpp"

namespace attn {

template <class T>
class EmbeddingSum {
 public:
  /// Learned positions for max_positions > 0 (at most that many), else sinusoidal ones.
  EmbeddingSum(Embedding<T>& embed, Dropout<T>& dropout, Index d_model, Index learned_max_positions)
      : embed_(embed), dropout_(dropout), sinusoid_(d_model) {
    if (learned_max_positions > 0)
      learned_ = std::make_unique<LearnedPositionalEmbedding<T>>(learned_max_positions, d_model);
  }

  /// ids [B, L] at positions start, start + 1, ... -> the stack's input [B, L, D].
  const Tensor<T>& forward(const Tensor<TokenId>& ids, Index start = 0) {
    const Tensor<T>& e = embed_.forward(ids);
    return dropout_.forward(learned_ ? learned_->forward(e, start) : sinusoid_.forward(e, start));
  }

  /// d(input) [B, L, D] -> accumulates the embedding's (and learned positions') gradients.
  void backward(const Tensor<T>& dinput) {
    const Tensor<T>& dsum = dropout_.backward(dinput);
    embed_.backward(learned_ ? learned_->backward(dsum) : sinusoid_.backward(dsum));
  }

  /// Grows the sinusoidal table to `length` positions now, so that no later forward allocates.
  void reserve_positions(Index length) {
    if (!learned_) sinusoid_.table(length);
  }

  /// The learned positions, or nullptr with sinusoidal ones.
  LearnedPositionalEmbedding<T>* learned_positions() { return learned_.get(); }
  const LearnedPositionalEmbedding<T>* learned_positions() const { return learned_.get(); }

 private:
  Embedding<T>& embed_;
  Dropout<T>& dropout_;
  SinusoidalPositionalEncoding<T> sinusoid_;
  std::unique_ptr<LearnedPositionalEmbedding<T>> learned_;  // only with learned positions
};

}  // namespace attn
