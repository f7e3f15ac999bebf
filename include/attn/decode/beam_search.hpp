// Beam search as the paper ran it (section 6.1): beam size W = 4, length penalty alpha 0.6 with
// GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha, outputs up to source length + 50, batched over sentences
// and incremental. The bookkeeping (expand, prune, finish) is BeamState (beam.hpp); this file runs
// the model for it.
//
// Each source is encoded once and its memory shared by its W beams: the first step, where every
// sentence has a single hypothesis (BOS), runs on the B sentence rows, and its decoder caches
// (BOS's self-attention keys and values, the cross-attention's projection of the memory) are
// then copied to the W beam rows of each sentence. Later steps run on B*W rows and reorder the
// caches, rather than recompute them, when beams swap.
#pragma once

#include <algorithm>
#include <vector>

#include "attn/decode/beam.hpp"
#include "attn/decode/greedy.hpp"
#include "attn/decode/options.hpp"
#include "attn/nn/transformer.hpp"

namespace attn {

namespace detail {

/// Each row of x [B, ...] repeated `times` times in place: [B*times, ...], row b*times + w a copy
/// of row b. A memory copy, not a recomputation.
template <class U>
Tensor<U> repeat_rows(const Tensor<U>& x, Index times) {
  std::vector<Index> dims = x.shape().to_vector();
  const Index row = x.numel() / dims[0];
  dims[0] *= times;
  Tensor<U> out{Shape(dims)};
  for (Index r = 0; r < dims[0]; ++r)
    std::copy_n(x.data() + (r / times) * row, row, out.data() + r * row);
  return out;
}

}  // namespace detail

/// The best hypothesis of each source row of `src` [B, S], without BOS and EOS.
template <class T>
std::vector<std::vector<TokenId>> beam_search(Transformer<T>& model, const Tensor<TokenId>& src,
                                              const DecodeOptions& opts = {}) {
  const Index V = model.config().tgt_vocab;
  opts.validate(V, model.config().pad_id);
  detail::EvalGuard<T> guard(model);
  // output_limits checks src's shape first: src.size(0) of a default tensor named only an axis.
  std::vector<Index> limits = detail::output_limits(src, model.config().pad_id, opts);
  const Index B = src.size(0), W = opts.beam_size;
  const Index max_len = *std::max_element(limits.begin(), limits.end());
  detail::check_decode_memory(model.config(), B, true, W, src.size(1), max_len, sizeof(T));
  BeamState beams(std::move(limits), opts, V, model.config().pad_id);
  if (max_len <= 0) return beams.finish();

  // First step: one row per sentence, over the memory [B, S, D] encoded once.
  const Tensor<T>& memory = model.encode(src);
  DecoderCache<T> first = model.make_decoder_cache(B, max_len);
  const Tensor<TokenId> bos = Tensor<TokenId>::full({B, 1}, opts.bos);
  if (beams.step(model.decode_step(bos, 0, memory, first).data(), /*live=*/1, 0))
    return beams.finish();

  // Then W rows per sentence. The memory is only read for its shape now that the caches hold its
  // projection, but the decoder checks it and the source mask against the rows.
  const Tensor<T> beam_memory = detail::repeat_rows(memory, W);  // [B*W, S, D]
  model.set_source_padding(
      KeyPaddingMask::from_tokens(detail::repeat_rows(src, W), model.config().pad_id));
  DecoderCache<T> cache = model.make_decoder_cache(B * W, max_len);
  cache.gather(first, beams.origin());
  Tensor<TokenId> tokens = Tensor<TokenId>::full({B * W, 1}, opts.eos);
  for (Index t = 1; t < max_len; ++t) {
    beams.next_tokens(tokens);
    const Tensor<T>& logits = model.decode_step(tokens, t, beam_memory, cache);  // [B*W, 1, V]
    if (beams.step(logits.data(), W, t)) break;
    cache.reorder(beams.origin());
  }
  return beams.finish();
}

}  // namespace attn
