#include "training_pairs.hpp"

namespace attn::translate {

std::vector<TokenizedPair> tokenize_pairs(const SubwordVocab& vocab, const ParallelCorpus& c,
                                          Index max_len, double bpe_dropout, std::uint64_t seed) {
  std::vector<TokenizedPair> pairs(c.size());
  const auto encode_all = [&] {
    for (std::size_t i = 0; i < c.size(); ++i) {
      TokenizedPair& p = pairs[i];
      p.overlong = too_long_to_encode(c.src[i], max_len) || too_long_to_encode(c.tgt[i], max_len);
      if (p.overlong) continue;
      p.src = vocab.sample_encode(c.src[i], bpe_dropout);
      p.tgt = vocab.sample_encode(c.tgt[i], bpe_dropout);
      // Smaller pieces make longer pairs: one that no longer fits (the Batcher's test) is taken
      // whole, so that every epoch trains on the pairs the whole-word batches hold.
      if (bpe_dropout > 0 && p.longer_than(max_len)) {
        p.src = vocab.encode(c.src[i]);
        p.tgt = vocab.encode(c.tgt[i]);
      }
    }
  };
  if (bpe_dropout == 0)
    encode_all();
  else
    SubwordVocab::with_sampling_seed(seed, encode_all);
  return pairs;
}

}  // namespace attn::translate
