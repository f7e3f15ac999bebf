// Greedy decoding with the incremental decoder: each step feeds one token per sentence and attends
// the cached keys/values of the earlier steps, so step t costs O(t) rather than O(t^2).
#pragma once

#include <algorithm>
#include <vector>

#include "attn/nn/transformer.hpp"

namespace attn {

struct DecodeOptions {
  /// Upper bounds, so that lengths and beam rows never overflow and the key/value caches stay a
  /// size that can be allocated: the paper decodes with +50 tokens and 4 beams.
  static constexpr Index kMaxExtraLength = 4096;
  static constexpr Index kMaxBeamSize = 256;

  TokenId bos = 2;              // first decoder input
  TokenId eos = 3;              // ends a hypothesis (not part of the returned tokens)
  Index max_extra_length = 50;  // output length limit = source length + 50 (the paper, 6.1)
  Index beam_size = 4;          // the paper's beam
  double length_penalty = 0.6;  // alpha of GNMT's ((5 + |Y|) / 6)^alpha

  void validate(Index vocab) const {
    ATTN_CHECK(bos >= 0 && bos < vocab && eos >= 0 && eos < vocab, ConfigError, "decode: bos (",
               bos, ") and eos (", eos, ") must be in the vocabulary [0, ", vocab, ")");
    ATTN_CHECK(max_extra_length >= 0 && max_extra_length <= kMaxExtraLength, ConfigError,
               "decode: max_extra_length must be in [0, ", kMaxExtraLength, "], got ",
               max_extra_length);
    ATTN_CHECK(beam_size >= 1 && beam_size <= kMaxBeamSize, ConfigError,
               "decode: beam_size must be in [1, ", kMaxBeamSize, "], got ", beam_size);
    ATTN_CHECK(length_penalty >= 0, ConfigError, "decode: length_penalty must be >= 0, got ",
               length_penalty);
  }
};

namespace detail {

/// Non-padding tokens of each source row: the length that bounds its output.
inline std::vector<Index> source_lengths(const Tensor<TokenId>& src, TokenId pad) {
  std::vector<Index> len(static_cast<std::size_t>(src.size(0)), 0);
  for (Index b = 0; b < src.size(0); ++b)
    for (Index s = 0; s < src.size(1); ++s) len[static_cast<std::size_t>(b)] += src(b, s) != pad;
  return len;
}

/// Puts `model` in eval mode for the lifetime of the guard, then restores its mode.
template <class T>
class EvalGuard {
 public:
  explicit EvalGuard(Module<T>& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalGuard() { m_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Module<T>& m_;
  bool was_training_;
};

}  // namespace detail

/// The most probable next token at every step, for each source row of `src` [B, S]. Returns
/// each output without BOS and EOS.
template <class T>
std::vector<std::vector<TokenId>> greedy_decode(Transformer<T>& model, const Tensor<TokenId>& src,
                                                const DecodeOptions& opts = {}) {
  const Index V = model.config().tgt_vocab;
  opts.validate(V);
  detail::EvalGuard<T> guard(model);
  const Index B = src.size(0);
  const std::vector<Index> src_len = detail::source_lengths(src, model.config().pad_id);
  const Index max_len = *std::max_element(src_len.begin(), src_len.end()) + opts.max_extra_length;

  const Tensor<T>& memory = model.encode(src);
  DecoderCache<T> cache = model.decoder.make_cache(B, std::max<Index>(max_len, 1));

  std::vector<std::vector<TokenId>> out(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  Tensor<TokenId> tokens = Tensor<TokenId>::full({B, 1}, opts.bos);
  for (Index t = 0; t < max_len; ++t) {
    const Tensor<T>& logits = model.decode_step(tokens, t, memory, cache);  // [B, 1, V]
    bool all_done = true;
    for (Index b = 0; b < B; ++b) {
      auto& hyp = out[static_cast<std::size_t>(b)];
      if (done[static_cast<std::size_t>(b)]) continue;
      const T* row = logits.data() + b * V;
      const TokenId best = static_cast<TokenId>(std::max_element(row, row + V) - row);
      if (best == opts.eos) {
        done[static_cast<std::size_t>(b)] = true;
      } else {
        hyp.push_back(best);
        if (static_cast<Index>(hyp.size()) >=
            src_len[static_cast<std::size_t>(b)] + opts.max_extra_length)
          done[static_cast<std::size_t>(b)] = true;
      }
      tokens(b, 0) = best;
      all_done = all_done && done[static_cast<std::size_t>(b)];
    }
    if (all_done) break;
  }
  return out;
}

}  // namespace attn
