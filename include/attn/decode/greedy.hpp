// Greedy decoding with the incremental decoder: each step feeds one token per sentence and attends
// the cached keys/values of the earlier steps, so step t costs O(t) rather than O(t^2).
#pragma once

#include <algorithm>
#include <vector>

#include "attn/decode/options.hpp"
#include "attn/nn/transformer.hpp"

namespace attn {

/// The most probable next token at every step, for each source row of `src` [B, S]. Returns
/// each output without BOS and EOS.
template <class T>
std::vector<std::vector<TokenId>> greedy_decode(Transformer<T>& model, const Tensor<TokenId>& src,
                                                const DecodeOptions& opts = {}) {
  const Index V = model.config().tgt_vocab;
  opts.validate(V, model.config().pad_id);
  detail::EvalGuard<T> guard(model);
  const Index B = src.size(0);
  const std::vector<Index> src_len = detail::source_lengths(src, model.config().pad_id);
  const Index max_len = *std::max_element(src_len.begin(), src_len.end()) + opts.max_extra_length;

  const Tensor<T>& memory = model.encode(src);
  DecoderCache<T> cache = model.make_decoder_cache(B, std::max<Index>(max_len, 1));

  std::vector<std::vector<TokenId>> out(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  for (Index b = 0; b < B; ++b)  // a limit of 0 tokens (an all-padding source, no extra length)
    done[static_cast<std::size_t>(b)] =
        src_len[static_cast<std::size_t>(b)] + opts.max_extra_length == 0;
  Tensor<TokenId> tokens = Tensor<TokenId>::full({B, 1}, opts.bos);
  for (Index t = 0; t < max_len; ++t) {
    const Tensor<T>& logits = model.decode_step(tokens, t, memory, cache);  // [B, 1, V]
    bool all_done = true;
    for (Index b = 0; b < B; ++b) {
      auto& hyp = out[static_cast<std::size_t>(b)];
      if (done[static_cast<std::size_t>(b)]) continue;
      const T* row = logits.data() + b * V;
      detail::check_finite_logits(row, V, b, t);
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
