// The training pairs as subword ids for the Batcher: encoded whole, or under BPE-dropout (each
// epoch's own pieces, drawn from a seed).
#pragma once

#include <cstdint>
#include <vector>

#include "batching.hpp"
#include "bpe.hpp"
#include "corpus_io.hpp"

namespace attn::translate {

/// Tokenizes parallel text into pairs for the Batcher; a pair with a side of more bytes than
/// max_len tokens can hold is marked overlong, not encoded. With `bpe_dropout` > 0, each side is
/// encoded by SubwordVocab::sample_encode, its draws a function of `seed` alone.
std::vector<TokenizedPair> tokenize_pairs(const SubwordVocab& vocab, const ParallelCorpus& corpus,
                                          Index max_len, double bpe_dropout = 0,
                                          std::uint64_t seed = 0);

}  // namespace attn::translate
