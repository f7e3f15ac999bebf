// The synthetic task and training step shared by test_training.cpp, test_training_recovery.cpp
// and resume_worker.cpp: the worker must see exactly the data stream and update the test's
// uninterrupted run sees, so both take them from here.
//
// Task: a random sentence of ids 4..V-1 (0 pad, 2 BOS, 3 EOS), target = the sentence reversed.
// Batch `k` of a stream is a pure function of (seed, k), so a resumed run draws the same batches
// without having to replay the data generator.
#pragma once

#include <attn/nn/transformer.hpp>
#include <attn/train/adam.hpp>
#include <attn/train/label_smoothed_loss.hpp>
#include <attn/train/schedule.hpp>

#include <algorithm>
#include <vector>

namespace attn {
namespace testing {

constexpr TokenId kPad = 0, kBos = 2, kEos = 3, kFirstWord = 4;

struct Batch {
  Tensor<TokenId> src;                          // [B, S] sentence, padded with kPad
  Tensor<TokenId> tgt_in;                       // [B, T] BOS + reversed sentence, padded
  Tensor<TokenId> tgt_out;                      // [B, T] reversed sentence + EOS, padded
  std::vector<std::vector<TokenId>> reference;  // [B][len] the expected outputs
};

/// B random sentences of lengths [min_len, max_len] over ids [kFirstWord, vocab).
inline Batch make_batch(Rng& rng, Index B, Index vocab, Index min_len, Index max_len) {
  Batch b;
  std::vector<std::vector<TokenId>> sentences(static_cast<std::size_t>(B));
  Index longest = 0;
  for (auto& s : sentences) {
    const Index len =
        min_len + static_cast<Index>(rng.below(static_cast<std::uint64_t>(max_len - min_len + 1)));
    for (Index i = 0; i < len; ++i)
      s.push_back(static_cast<TokenId>(
          kFirstWord +
          static_cast<Index>(rng.below(static_cast<std::uint64_t>(vocab - kFirstWord)))));
    longest = std::max(longest, len);
  }
  b.src = Tensor<TokenId>::full({B, longest}, kPad);
  b.tgt_in = Tensor<TokenId>::full({B, longest + 1}, kPad);
  b.tgt_out = Tensor<TokenId>::full({B, longest + 1}, kPad);
  for (Index r = 0; r < B; ++r) {
    std::vector<TokenId> y = sentences[static_cast<std::size_t>(r)];
    std::reverse(y.begin(), y.end());
    const Index len = static_cast<Index>(y.size());
    b.tgt_in(r, 0) = kBos;
    for (Index i = 0; i < len; ++i) {
      b.src(r, i) = sentences[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
      b.tgt_in(r, i + 1) = y[static_cast<std::size_t>(i)];
      b.tgt_out(r, i) = y[static_cast<std::size_t>(i)];
    }
    b.tgt_out(r, len) = kEos;
    b.reference.push_back(std::move(y));
  }
  return b;
}

/// Batch `k` of the stream `seed`: independent of every other batch.
inline Batch stream_batch(std::uint64_t seed, Index k, Index B, Index vocab, Index min_len = 3,
                          Index max_len = 8) {
  Rng rng(seed, static_cast<std::uint64_t>(k) << 20);
  return make_batch(rng, B, vocab, min_len, max_len);
}

/// A small model for the task (d_model 32, 2 + 2 layers, 4 heads).
inline TransformerConfig task_config(Index vocab, double dropout, Index d_model = 32) {
  TransformerConfig c = TransformerConfig::tiny(vocab);
  c.d_model = d_model;
  c.d_ff = 2 * d_model;
  c.dropout = dropout;
  c.seed = 7;
  return c;
}

/// One model, its optimiser and loss: train_step() is one update on one batch.
template <class T>
struct Trainer {
  explicit Trainer(const TransformerConfig& c)
      : model(c), adam(model.parameters()), loss(0.1, kPad) {}

  /// Zero grads, forward, loss summed over tokens scaled to the per-token mean, backward, Adam with
  /// the Noam rate of the update about to be taken. Returns the summed loss of the batch.
  double train_step(const Batch& b, Index warmup = 200, double factor = 1.0) {
    model.train();
    adam.zero_grad();
    const Tensor<T>& logits = model.forward(b.src, b.tgt_in);
    const double scale = 1.0 / static_cast<double>(count_tokens(b.tgt_out, kPad));
    const LossStats s = loss.forward_backward(logits, b.tgt_out, scale, adam.steps() + 1);
    model.backward(loss.dlogits());
    adam.step(noam_lr(adam.steps() + 1, model.config().d_model, warmup, factor));
    return s.smoothed_loss;
  }

  Transformer<T> model;
  Adam<T> adam;
  LabelSmoothedCrossEntropy<T> loss;
};

}  // namespace testing
}  // namespace attn
