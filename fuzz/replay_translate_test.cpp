// The translate-side fuzz targets (model file, training state, vocab.txt, parallel text) run in
// the ordinary test suite over their seeds and deterministic mutations of them: truncations and
// byte flips. Only attn::Error may refuse an input; anything else escapes and fails the test.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model_file_target.hpp"
#include "mutations.hpp"
#include "text_targets.hpp"

namespace attn::fuzz {
namespace {

/// The seed, its truncations (every prefix shorter than 64 bytes, 31 more and all but the last
/// byte), and 4 flips at each of 128 positions.
std::vector<std::string> mutations(const std::string& seed, std::uint64_t salt) {
  std::vector<std::string> out{seed};
  for (std::size_t n : truncation_lengths(seed.size(), 64)) out.push_back(seed.substr(0, n));
  for (std::string& m : byte_flips(seed, salt, 128, {-1, 0x00, int{'-'}, int{'9'}}))
    out.push_back(std::move(m));
  return out;
}

template <class Outcome>
std::pair<int, int> replay(Outcome (*run)(const std::uint8_t*, std::size_t),
                           const std::vector<std::pair<std::string, std::string>>& seeds,
                           Outcome accepted) {
  int ok = 0, refused = 0;
  std::uint64_t salt = 1;
  for (const auto& [name, bytes] : seeds) {
    EXPECT_EQ(run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), accepted)
        << name << " is a valid seed";
    for (const std::string& m : mutations(bytes, salt++))
      (run(reinterpret_cast<const std::uint8_t*>(m.data()), m.size()) == accepted ? ok : refused)++;
  }
  return {ok, refused};
}

TEST(FuzzReplayTranslate, ModelFileSeedsLoadAndMutationsAreRefusedCleanly) {
  std::string dir = ::testing::TempDir() + "attn_fuzz_model_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const auto seeds = model_file_seeds(dir);
  ::rmdir(dir.c_str());
  const auto [ok, refused] = replay(&run_model_file, seeds, ModelFileOutcome::loaded);
  EXPECT_GT(refused, 100);
  EXPECT_GT(ok, 0);  // flips inside weight bytes still give a loadable (finite) model
}

TEST(FuzzReplayTranslate, TrainStateVocabAndParallelText) {
  EXPECT_GT(replay(&run_train_state, train_state_seeds(), TextOutcome::accepted).second, 50);
  EXPECT_GT(replay(&run_vocab, vocab_seeds(), TextOutcome::accepted).second, 50);
  EXPECT_GT(replay(&run_parallel_text, parallel_text_seeds(), TextOutcome::accepted).second, 10);
}

}  // namespace
}  // namespace attn::fuzz
