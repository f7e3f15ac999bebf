// Greedy decoding with the incremental decoder: each step feeds one token per sentence and attends
// the cached keys/values of the earlier steps, so step t costs O(t) rather than O(t^2).
#pragma once

#include <algorithm>
#include <vector>

#include "attn/decode/options.hpp"
#include "attn/nn/transformer.hpp"

namespace attn {

/// The most probable next token at every step (never the padding token: detail::may_output), for
/// each source row of `src` [B, S]. Returns each output without BOS and EOS.
template <class T>
std::vector<std::vector<TokenId>> greedy_decode(Transformer<T>& model, const Tensor<TokenId>& src,
                                                const DecodeOptions& opts = {}) {
  const Index V = model.config().tgt_vocab;
  opts.validate(V, model.config().pad_id);
  detail::EvalGuard<T> guard(model);
  const TokenId pad = model.config().pad_id;
  // output_limits checks src's shape first: src.size(0) of a default tensor named only an axis.
  const std::vector<Index> limit = detail::output_limits(src, pad, opts);
  const Index B = src.size(0);
  const Index max_len = *std::max_element(limit.begin(), limit.end());

  detail::check_decode_memory(model.config(), B, false, 1, src.size(1), std::max<Index>(max_len, 1),
                              sizeof(T));
  const Tensor<T>& memory = model.encode(src);
  DecoderCache<T> cache = model.make_decoder_cache(B, std::max<Index>(max_len, 1));

  std::vector<std::vector<TokenId>> out(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  for (Index b = 0; b < B; ++b)  // a limit of 0 tokens (an all-padding source, no extra length)
    done[static_cast<std::size_t>(b)] = limit[static_cast<std::size_t>(b)] == 0;
  Tensor<TokenId> tokens = Tensor<TokenId>::full({B, 1}, opts.bos);
  for (Index t = 0; t < max_len; ++t) {
    const Tensor<T>& logits = model.decode_step(tokens, t, memory, cache);  // [B, 1, V]
    bool all_done = true;
    for (Index b = 0; b < B; ++b) {
      const std::size_t ub = static_cast<std::size_t>(b);
      if (done[ub]) continue;
      const T* row = logits.data() + b * V;
      detail::check_finite_logits(row, V, b, t);
      TokenId best = -1;  // the first of the highest logits among the tokens it may output
      for (Index v = 0; v < V; ++v)
        if (detail::may_output(static_cast<TokenId>(v), pad, opts) &&
            (best < 0 || row[v] > row[best]))
          best = static_cast<TokenId>(v);
      if (best == opts.eos) {
        done[ub] = true;
      } else {
        out[ub].push_back(best);
        done[ub] = static_cast<Index>(out[ub].size()) >= limit[ub];
      }
      tokens(b, 0) = best;
      all_done = all_done && done[ub];
    }
    if (all_done) break;
  }
  return out;
}

}  // namespace attn
