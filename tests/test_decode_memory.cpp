// What decoding holds is sized before it is allocated: a batch of sentences times a beam times the
// output length can ask for more than the machine holds, and greedy decoding and beam search
// refuse such a call with a ConfigError naming the sizes, before they encode.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <attn/decode/beam_search.hpp>
#include <attn/decode/greedy.hpp>

#include "address_space_limit.hpp"
#include "error_helpers.hpp"
#include "pch.hpp"
#include "sanitizers.hpp"

namespace attn {
namespace {

// decode_memory's figure is what the caches hold at their largest. Greedy decoding: one row per
// sentence, whose self-attention keeps max_len positions and cross-attention S. Beam search: the
// first step's sentence rows, then the beam rows, whose caches reorder() also stages, and the
// memory repeated per beam row (as beam_search lays them out).
TEST(DecodeMemory, IsWhatTheCachesHoldAtTheirLargest) {
  Transformer<float> m(TransformerConfig::tiny(32));
  m.eval();
  const Index B = 3, W = 2, S = 5, max_len = 9;
  const Index L = m.config().decoder_layers, D = m.config().d_model;
  const Tensor<float> memory = m.encode(Tensor<TokenId>::full({B, S}, 7)).clone();
  DecoderCache<float> first = m.make_decoder_cache(B, max_len);
  m.decode_step(Tensor<TokenId>::full({B, 1}, 2), 0, memory, first);
  EXPECT_EQ(detail::decode_memory(L, D, B, false, 1, S, max_len, 4).caches, first.bytes());
  // The beams take over the first step's caches, then reorder theirs at every step.
  std::vector<Index> rows;
  for (Index r = 0; r < B * W; ++r) rows.push_back(r / W);
  DecoderCache<float> beams = m.make_decoder_cache(B * W, max_len);
  beams.gather(first, rows);
  const Tensor<float> beam_memory = detail::repeat_rows(memory, W);
  m.set_source_padding(KeyPaddingMask::from_tokens(Tensor<TokenId>::full({B * W, S}, 7), 0));
  std::reverse(rows.begin(), rows.end());
  for (Index t = 1; t < max_len; ++t) {
    m.decode_step(Tensor<TokenId>::full({B * W, 1}, 5), t, beam_memory, beams);
    for (Index& r : rows) r = B * W - 1 - r;  // a permutation
    beams.reorder(rows);
  }
  const double held = first.bytes() + beams.bytes() + beam_memory.numel() * sizeof(float);
  EXPECT_EQ(detail::decode_memory(L, D, B, true, W, S, max_len, 4).caches, held);
  EXPECT_GT(detail::decode_memory(L, D, B, true, W, S, max_len, 4).available, 0.0);
}

// Enough sentences of one token, at the largest beam and output length, for more than this
// process may have: both decoders refuse them before encoding, naming the sizes.
TEST(DecodeMemory, CachesBeyondTheMachinesMemoryAreRefusedBeforeDecoding) {
  Transformer<float> m(TransformerConfig::tiny(32));
  DecodeOptions o;
  o.beam_size = DecodeOptions::kMaxBeamSize;
  o.max_extra_length = DecodeOptions::kMaxExtraLength;
  const Index L = m.config().decoder_layers, D = m.config().d_model;
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "beam search");
    // Sized by the caches alone, so that a decoder that counted only them refuses it too (rather
    // than allocate the machine's memory).
    const detail::DecodeMemory one =
        detail::decode_memory(L, D, 1, !greedy, o.beam_size, 1, 1 + o.max_extra_length, 4);
    ASSERT_GT(one.available, 0.0);
    const auto B = static_cast<Index>(std::ceil(one.available / one.caches)) + 1;
    const Tensor<TokenId> src = Tensor<TokenId>::full({B, 1}, 7);
    const std::string what = testing::error_of<ConfigError>(
        [&] { greedy ? greedy_decode(m, src, o) : beam_search(m, src, o); });
    const std::string sizes = std::to_string(B) + " sentences x " +
                              std::to_string(greedy ? 1 : o.beam_size) +
                              " beam rows, sources of up to 1 tokens and outputs of up to 4097";
    EXPECT_NE(what.find(sizes), std::string::npos) << what;
    EXPECT_NE(what.find("GiB of key/value caches, "), std::string::npos) << what;
    EXPECT_NE(what.find(" of activations and logits), more than the"), std::string::npos) << what;
    EXPECT_NE(what.find("lower beam_size or max_extra_length"), std::string::npos) << what;
  }
}

// The caches are not all that decoding holds: every encoder layer keeps its activations for the
// batch, and each step makes logits [rows, V]. A greedy translation estimated at 1.91 GiB (its
// caches) used 5.49 GB (session 53's audit). Here the encoder's activations are more than three
// times the caches. Under an address-space limit, a batch whose caches fit but whose whole estimate
// does not is refused before it encodes (it was a std::bad_alloc), and a batch estimated at half
// the headroom decodes: the estimate is not far below what decoding takes.
TEST(DecodeMemory, TheEncodersActivationsAndTheLogitsCountToo) {
  if (testing::kSanitized) GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  Transformer<float> m(TransformerConfig::tiny(32));
  DecodeOptions o;
  o.max_extra_length = 0;
  const Index S = 64;
  const auto src = [&](Index B) { return Tensor<TokenId>::full({B, S}, 7); };
  const rlim_t headroom = rlim_t{128} << 20;
  const auto fits =
      static_cast<Index>(static_cast<double>(headroom) / 2 /
                         detail::decode_memory(m.config(), 1, false, 1, S, S, 4).total());
  ASSERT_GT(fits, 16);
  // Threads, tables, packed weights and the buffers of a batch that fits exist before the limit.
  set_num_threads(2);
  greedy_decode(m, src(fits), o);
  const testing::AddressSpaceLimit limit(headroom);
  if (!limit.ok()) GTEST_SKIP() << "cannot lower the address-space limit below the hard one";
  const detail::DecodeMemory one = detail::decode_memory(m.config(), 1, false, 1, S, S, 4);
  ASSERT_GT(one.total(), 3 * one.caches) << "the encoder's activations dominate";
  const auto refused = static_cast<Index>(one.available / one.total()) + 1;
  EXPECT_LT(static_cast<double>(refused) * one.caches, one.available) << "the caches fit";
  const std::string what =
      testing::error_of<ConfigError>([&] { greedy_decode(m, src(refused), o); });
  EXPECT_NE(what.find("decode: " + std::to_string(refused) + " sentences x 1 beam rows"),
            std::string::npos)
      << what;
  EXPECT_EQ(greedy_decode(m, src(fits), o).size(), static_cast<std::size_t>(fits));
}

}  // namespace
}  // namespace attn
