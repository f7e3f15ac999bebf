// The subword vocabulary and token-count batching.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <attn/error.hpp>

#include <attn/random.hpp>
#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "batching.hpp"
#include "bpe.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::Index;
using attn::TokenId;
using attn::testing::error_of;

namespace {

using attn::translate::testing::fresh_temp_path;

// A few hundred sentences from a tiny English and German grammar.
std::vector<std::string> toy_sentences() {
  const std::vector<std::string> subj{"the man",   "a woman",    "two dogs",     "der mann",
                                      "eine frau", "zwei hunde", "the children", "die kinder"};
  const std::vector<std::string> verb{"runs",
                                      "is sleeping",
                                      "plays",
                                      "rennt",
                                      "schl\xc3\xa4"
                                      "ft",
                                      "spielen",
                                      "walks"};
  const std::vector<std::string> obj{"in the park .", "on the street .", "im park .",
                                     "auf der stra\xc3\x9f"
                                     "e .",
                                     "with a ball ."};
  std::vector<std::string> out;
  for (const auto& s : subj)
    for (const auto& v : verb)
      for (const auto& o : obj) out.push_back(s + " " + v + " " + o);
  return out;
}

const SubwordVocab& toy_vocab() {
  static const SubwordVocab vocab = [] {
    BpeTrainOptions o;
    o.vocab_size = 100;
    return SubwordVocab::train(toy_sentences(), fresh_temp_path("vocab").string(), o);
  }();
  return vocab;
}

}  // namespace

// ------------------------------------------------------------------------------------ vocab

TEST(SubwordVocab, TrainEncodeDecode) {
  const SubwordVocab& v = toy_vocab();
  EXPECT_EQ(v.size(), 100);
  for (const std::string& s : {std::string("the man is sleeping in the park ."),
                               std::string("zwei hunde spielen auf der stra\xc3\x9f"
                                           "e .")}) {
    const std::vector<TokenId> ids = v.encode(s);
    ASSERT_FALSE(ids.empty());
    for (TokenId id : ids) {
      EXPECT_GT(id, SubwordVocab::kEos);  // no special id inside a sentence
      EXPECT_LT(id, 100);
    }
    EXPECT_LT(ids.size(), s.size());  // merges happened
    EXPECT_EQ(v.decode(ids), s);
    std::vector<TokenId> framed{SubwordVocab::kBos};
    framed.insert(framed.end(), ids.begin(), ids.end());
    framed.push_back(SubwordVocab::kEos);
    framed.push_back(SubwordVocab::kPad);
    EXPECT_EQ(v.decode(framed), s);  // specials decode to nothing
  }
  EXPECT_EQ(v.pieces({SubwordVocab::kUnk})[0], "<unk>");
  EXPECT_NE(error_of<attn::IndexError>([&] {
              v.decode({5, 100});
            }).find("token id 100 is outside the vocabulary [0, 100)"),
            std::string::npos);
}

TEST(SubwordVocab, LoadIsIdenticalAndTrainingDeterministic) {
  const fs::path dir = fresh_temp_path("vocab_again");
  BpeTrainOptions o;
  o.vocab_size = 100;
  const SubwordVocab again = SubwordVocab::train(toy_sentences(), dir.string(), o);
  EXPECT_EQ(again.fingerprint(), toy_vocab().fingerprint());
  const SubwordVocab loaded = SubwordVocab::load(dir.string());
  EXPECT_EQ(loaded.fingerprint(), toy_vocab().fingerprint());
  const std::string s = "a woman walks with a ball .";
  EXPECT_EQ(loaded.encode(s), toy_vocab().encode(s));
  EXPECT_EQ(read_vocab_fingerprint(dir.string()), loaded.fingerprint());
  EXPECT_NO_THROW(loaded.check_directory(dir.string()));
}

TEST(SubwordVocab, TheThreadCountLeavesNoTraceInTheModel) {
  // sentencepiece stores the thread count its trainer ran on: --threads 1 and 2 wrote spm.model
  // files, and so vocabulary hashes in every model file, that differed. More threads than its
  // trainer takes (128: an internal error naming no flag before) are taken as 128.
  std::string first;
  for (const int threads : {1, 2, 3, 200}) {
    SCOPED_TRACE(threads);
    const fs::path dir = fresh_temp_path("vocab_threads");
    const SubwordVocab v = SubwordVocab::train(toy_sentences(), dir.string(), {100, threads});
    EXPECT_EQ(v.fingerprint(), toy_vocab().fingerprint());
    const std::string bytes = attn::testing::read_file(dir / "spm.model");
    if (first.empty()) first = bytes;
    EXPECT_EQ(bytes, first);
    EXPECT_EQ(SubwordVocab::load(dir.string()).encode("two dogs walk ."),
              toy_vocab().encode("two dogs walk ."));
  }
}

// sentencepiece leaves out sentences longer than 4,192 bytes; with none left it failed with
// "Internal: ... [!sentences_.empty()]", which said nothing of the lines.
TEST(Bpe, TrainingOnOnlyOverlongLinesNamesTheLimit) {
  const std::vector<std::string> lines = {std::string(5000, 'a'), std::string(4193, 'b')};
  const std::string m = error_of<attn::DataError>([&] {
    SubwordVocab::train(lines, fresh_temp_path("vocab_long").string(), {100, 1});
  });
  EXPECT_NE(m.find("every one of the 2 training sentences is empty or longer than 4192 bytes"),
            std::string::npos)
      << m;
  // Overlong lines among others are left out, as before.
  std::vector<std::string> with_others = toy_sentences();
  with_others.insert(with_others.end(), lines.begin(), lines.end());
  EXPECT_NO_THROW(
      SubwordVocab::train(with_others, fresh_temp_path("vocab_fits").string(), {100, 1}));
}

TEST(SubwordVocab, Errors) {
  const fs::path missing = fresh_temp_path("vocab_missing");
  EXPECT_NE(error_of<attn::IOError>([&] {
              SubwordVocab::load(missing.string());
            }).find((missing / "spm.model").string()),
            std::string::npos);

  const fs::path corrupt = fresh_temp_path("vocab_corrupt");
  fs::create_directories(corrupt);
  std::ofstream(corrupt / "spm.model") << "this is not a protobuf";
  EXPECT_NE(error_of<attn::FormatError>([&] {
              SubwordVocab::load(corrupt.string());
            }).find("spm.model' is not a sentencepiece model"),
            std::string::npos);

  // A directory whose vocab.txt belongs to another vocabulary.
  const fs::path other = fresh_temp_path("vocab_other");
  BpeTrainOptions o;
  o.vocab_size = 90;
  SubwordVocab::train(toy_sentences(), other.string(), o);
  const std::string m =
      error_of<attn::FormatError>([&] { toy_vocab().check_directory(other.string()); });
  EXPECT_NE(m.find("was trained with a different vocabulary: its vocab.txt says size 90"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("this vocabulary has size 100"), std::string::npos) << m;
  // spm.model replaced behind vocab.txt's back.
  const fs::path toy_dir = fresh_temp_path("vocab_copy");
  SubwordVocab::train(toy_sentences(), toy_dir.string(), BpeTrainOptions{100, 2});
  fs::copy_file(toy_dir / "spm.model", other / "spm.model", fs::copy_options::overwrite_existing);
  EXPECT_THROW(SubwordVocab::load(other.string()), attn::FormatError);
  std::ofstream(other / "vocab.txt") << "garbage";
  EXPECT_NE(error_of<attn::FormatError>([&] {
              read_vocab_fingerprint(other.string());
            }).find("vocab.txt': expected \"attn-translate-vocab 1\""),
            std::string::npos);

  o.vocab_size = 5000;  // far more pieces than the text has
  EXPECT_NE(error_of<attn::DataError>([&] {
              SubwordVocab::train(toy_sentences(), fresh_temp_path("vocab_big").string(), o);
            }).find("sentencepiece BPE training (vocab_size 5000"),
            std::string::npos);
}

// sentencepiece loads a model's precompiled character map unchecked, and a crafted one made
// encoding read out of bounds (SIGSEGV in the normalizer, session 41). attn-translate trains with
// identity normalisation, whose models have none, so one in the normalizer (ModelProto field 3) or
// the denormalizer (5) is refused at load; an empty one, as identity normalisation writes, is not.
// Protobuf merges a message field met twice, so the map is appended as a second NormalizerSpec.
TEST(SubwordVocab, AModelWithAPrecompiledCharacterMapIsRefused) {
  const fs::path dir = fresh_temp_path("vocab_charsmap");
  SubwordVocab::train(toy_sentences(), dir.string(), BpeTrainOptions{100, 2});
  std::string trained;
  {
    std::ifstream in(dir / "spm.model", std::ios::binary);
    trained.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto with_map = [&](const std::string& spec_key, std::size_t map_bytes) {
    const std::string map(map_bytes, '\xff');  // both lengths below fit in one varint byte
    const std::string spec = std::string("\x12") + char(map_bytes) + map;
    std::ofstream(dir / "spm.model", std::ios::binary)
        << trained << spec_key << char(spec.size()) << spec;
  };
  // protobuf reads a key as 32 bits, dropping those above: field 3 with bit 32 set as well, which
  // a reader of 64-bit keys took for another field and skipped.
  with_map("\x9a\x80\x80\x80\x10", 100);
  EXPECT_NE(error_of<attn::FormatError>([&] {
              SubwordVocab::load(dir.string());
            }).find("is not a sentencepiece model: its bytes are not protobuf wire format"),
            std::string::npos);
  for (const std::string spec_key : {"\x1a", "\x2a"}) {  // field 3 or 5, length-delimited
    with_map(spec_key, 100);
    const std::string m = error_of<attn::FormatError>([&] { SubwordVocab::load(dir.string()); });
    EXPECT_NE(m.find("has a precompiled character map (100 bytes)"), std::string::npos) << m;
    with_map(spec_key, 0);
    EXPECT_NE(error_of<attn::FormatError>([&] {
                SubwordVocab::load(dir.string());
              }).find("was trained with a different vocabulary"),
              std::string::npos)
        << "an empty map loads, and only vocab.txt's hash stops it";
  }
}

// --------------------------------------------------------------------------------- batching

namespace {

std::vector<TokenizedPair> random_pairs(std::size_t n, Index max_len, std::uint64_t seed) {
  attn::Rng rng(seed);
  std::vector<TokenizedPair> pairs(n);
  for (TokenizedPair& p : pairs) {
    p.src.resize(1 + rng.below(static_cast<std::uint64_t>(max_len)));
    p.tgt.resize(rng.below(static_cast<std::uint64_t>(max_len)));
    for (TokenId& t : p.src) t = 4 + static_cast<TokenId>(rng.below(50));
    for (TokenId& t : p.tgt) t = 4 + static_cast<TokenId>(rng.below(50));
  }
  return pairs;
}

}  // namespace

TEST(Batcher, BatchesRespectTheBudgetAndCoverEveryPairOnce) {
  const auto pairs = random_pairs(500, 40, 3);
  BatchingOptions o;
  o.max_tokens = 200;
  o.max_len = 41;
  const Batcher batcher(pairs, o);
  std::multiset<std::size_t> seen;
  for (const Batch& b : batcher.batches()) {
    const Index B = b.rows(), S = b.src.size(1), T = b.tgt_in.size(1);
    EXPECT_LE(B * std::max(S, T), o.max_tokens);
    ASSERT_EQ(b.tgt_out.shape(), b.tgt_in.shape());
    Index src_tokens = 0, tgt_tokens = 0;
    for (Index r = 0; r < B; ++r) {
      const TokenizedPair& p = pairs[b.pairs[static_cast<std::size_t>(r)]];
      seen.insert(b.pairs[static_cast<std::size_t>(r)]);
      const Index n = static_cast<Index>(p.src.size()), m = static_cast<Index>(p.tgt.size());
      for (Index s = 0; s < S; ++s)
        EXPECT_EQ(b.src.data()[r * S + s], s < n ? p.src[static_cast<std::size_t>(s)] : o.pad_id);
      EXPECT_EQ(b.tgt_in.data()[r * T], o.bos_id);
      for (Index t = 0; t < T; ++t) {
        const TokenId expect_in = t == 0   ? o.bos_id
                                  : t <= m ? p.tgt[static_cast<std::size_t>(t - 1)]
                                           : o.pad_id;
        const TokenId expect_out = t < m    ? p.tgt[static_cast<std::size_t>(t)]
                                   : t == m ? o.eos_id
                                            : o.pad_id;
        EXPECT_EQ(b.tgt_in.data()[r * T + t], expect_in);
        EXPECT_EQ(b.tgt_out.data()[r * T + t], expect_out);
      }
      src_tokens += n;
      tgt_tokens += m + 1;
    }
    EXPECT_EQ(b.src_tokens, src_tokens);
    EXPECT_EQ(b.tgt_tokens, tgt_tokens);
  }
  EXPECT_EQ(seen.size(), pairs.size());
  EXPECT_EQ(std::set<std::size_t>(seen.begin(), seen.end()).size(), pairs.size());
  // Length bucketing keeps padding low: most slots hold real tokens.
  Index real = 0, slots = 0;
  for (const Batch& b : batcher.batches()) {
    real += b.src_tokens;
    slots += b.src.numel();
  }
  EXPECT_GT(static_cast<double>(real) / static_cast<double>(slots), 0.8);
}

TEST(Batcher, EpochOrderIsADeterministicPermutation) {
  const Batcher batcher(random_pairs(300, 20, 5), BatchingOptions{100, 21});
  ASSERT_GT(batcher.size(), 10u);
  const auto a = batcher.epoch_order(42, 0), b = batcher.epoch_order(42, 0);
  const auto c = batcher.epoch_order(42, 1), d = batcher.epoch_order(43, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_EQ(std::set<std::size_t>(a.begin(), a.end()).size(), batcher.size());
  std::size_t visited = 0;
  for (const Batch& batch : batcher.epoch(42, 1)) {
    EXPECT_EQ(&batch, &batcher.batches()[c[visited]]);
    ++visited;
  }
  EXPECT_EQ(visited, batcher.size());
}

TEST(Batcher, OverlongPairs) {
  std::vector<TokenizedPair> pairs = random_pairs(10, 8, 9);
  pairs[6].tgt.assign(12, 7);  // 12 + 1 > max_len 10
  BatchingOptions o{100, 10};
  const std::string m = error_of<attn::DataError>([&] { Batcher(pairs, o); });
  EXPECT_NE(m.find("pair 6 (line 7) is longer than max_len 10: source"), std::string::npos) << m;
  EXPECT_NE(m.find("target 12 + 1 tokens"), std::string::npos) << m;
  o.overlong = OverlongPolicy::kSkip;
  const Batcher skipping(pairs, o);
  EXPECT_EQ(skipping.skipped(), 1u);
  std::size_t rows = 0;
  for (const Batch& b : skipping.batches()) {
    rows += b.pairs.size();
    for (std::size_t i : b.pairs) EXPECT_NE(i, 6u);
  }
  EXPECT_EQ(rows, 9u);

  // A pair too long in bytes to be encoded (tokenize_pairs leaves it empty) counts as overlong.
  pairs[6] = TokenizedPair{{}, {}, true};
  o.overlong = OverlongPolicy::kReject;
  const std::string b = error_of<attn::DataError>([&] { Batcher(pairs, o); });
  EXPECT_NE(b.find("pair 6 (line 7) is longer than max_len 10: a side has too many bytes"),
            std::string::npos)
      << b;
  o.overlong = OverlongPolicy::kSkip;
  EXPECT_EQ(Batcher(pairs, o).skipped(), 1u);
}

TEST(Batcher, BadInputAndConfiguration) {
  std::vector<TokenizedPair> pairs = random_pairs(4, 5, 1);
  pairs[2].src.clear();
  EXPECT_NE(error_of<attn::DataError>([&] {
              Batcher(pairs, BatchingOptions{});
            }).find("pair 2 (line 3): the source is empty"),
            std::string::npos);
  EXPECT_NE(error_of<attn::ConfigError>([&] {
              Batcher({}, BatchingOptions{50, 64});
            }).find("max_tokens (50) must be at least max_len (64)"),
            std::string::npos);
  EXPECT_EQ(Batcher({}, BatchingOptions{}).size(), 0u);
}

TEST(GroupBatches, ReachesTheTarget) {
  using Groups = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(group_batches({30, 40, 50, 10, 90, 5}, 70), (Groups{{0, 2}, {2, 5}, {5, 6}}));
  EXPECT_EQ(group_batches({100, 100}, 70), (Groups{{0, 1}, {1, 2}}));
  EXPECT_EQ(group_batches({}, 70), Groups{});
  EXPECT_NE(error_of<attn::ConfigError>([] {
              group_batches({1}, 0);
            }).find("target token count must be > 0, got 0"),
            std::string::npos);
}
