// The memory a training step's batch needs (batch_memory.hpp): a lower bound of the activations,
// checked against what this process may use before the first step.
#include <gtest/gtest.h>

#include <attn/parallel.hpp>

#include "batch_memory.hpp"
#include "error_helpers.hpp"

namespace tr = attn::translate;
using attn::Index;
using attn::testing::contains;
using attn::testing::error_of;

namespace {

// A batch of `rows` sentences of src_len and tgt_len tokens, none of them padding.
tr::Batch padded(Index rows, Index src_len, Index tgt_len) {
  tr::Batch b;
  b.src = attn::Tensor<attn::TokenId>::full({rows, src_len}, 5);
  b.tgt_in = attn::Tensor<attn::TokenId>::full({rows, tgt_len}, 5);
  b.tgt_out = attn::Tensor<attn::TokenId>::full({rows, tgt_len}, 5);
  return b;
}

TEST(BatchMemory, TheEstimateIsALowerBoundOfWhatTheBaseModelsStepTakes) {
  // The README's measurement: base at 32 x 64 tokens a side grows the process by 0.94 MiB per
  // target token; the count of what backward keeps comes to 0.68.
  const attn::TransformerConfig base = attn::TransformerConfig::base(8000);
  const double per_token = tr::step_activation_bytes(base, 32, 64, 64) / (32 * 64) / (1 << 20);
  EXPECT_GT(per_token, 0.6);
  EXPECT_LT(per_token, 0.94);
  // Twice the rows, twice the bytes; the attention weights grow with the square of the length.
  EXPECT_DOUBLE_EQ(tr::step_activation_bytes(base, 64, 64, 64),
                   2 * tr::step_activation_bytes(base, 32, 64, 64));
  EXPECT_GT(tr::step_activation_bytes(base, 16, 128, 128),
            tr::step_activation_bytes(base, 32, 64, 64));
}

TEST(BatchMemory, ABatchBeyondThisProcesssMemoryIsRefusedNamingMaxTokens) {
  const double memory = attn::detail::memory_limit_bytes();
  if (memory <= 0) GTEST_SKIP() << "the system does not say how much memory there is";
  const attn::TransformerConfig base = attn::TransformerConfig::base(8000);
  // 2,000 sentences of 1,024 tokens a side: terabytes of attention weights alone.
  const std::vector<tr::Batch> batches = {padded(32, 64, 64), padded(2000, 1024, 1000)};
  const std::string message =
      error_of<attn::ConfigError>([&] { tr::check_batch_memory(base, batches, 1, 1e9, 2048000); });
  EXPECT_TRUE(contains(message,
                       "a training batch of 2000 sentences padded to 1024 source and 1000 target "
                       "tokens (batches of at most 2048000 tokens), needs at least "))
      << message;
  EXPECT_TRUE(contains(message, "GiB this process may use; lower --max-tokens")) << message;
  const std::string resumed = error_of<attn::ConfigError>(
      [&] { tr::check_batch_memory(base, batches, 1, 1e9, 2048000, true); });
  EXPECT_TRUE(contains(resumed, "the checkpoint's train.max_tokens makes the batches")) << resumed;
  // The base model's usual batch fits, and so does the large one shared by enough ranks.
  EXPECT_NO_THROW(tr::check_batch_memory(base, {padded(32, 64, 64)}, 1, 1e9, 4096));
  EXPECT_NO_THROW(tr::check_batch_memory(base, batches, 1000, 1e9, 2048000));
  // A rank's share is padded to its own longest sentences (share_batch): one long row among short
  // ones counts for one rank only. 2,000 rows of 8 tokens but row 0 of 1,024, on 2 ranks: rank 1's
  // share is 1,000 rows of 8 tokens, rank 0's 1,000 rows padded to 1,024 (refused); on 2,000
  // ranks rank 0's share is that one row, which fits.
  tr::Batch mixed = padded(2000, 1024, 1000);
  for (Index r = 1; r < 2000; ++r)
    for (Index j = 8; j < 1024; ++j) {
      mixed.src(r, j) = base.pad_id;
      if (j < 1000) mixed.tgt_out(r, j) = mixed.tgt_in(r, j) = base.pad_id;
    }
  const std::string shared =
      error_of<attn::ConfigError>([&] { tr::check_batch_memory(base, {mixed}, 2, 1e9, 2048000); });
  EXPECT_TRUE(contains(shared,
                       "a training batch's share on one rank, 1000 sentences padded to "
                       "1024 source and 1000 target tokens"))
      << shared;
  EXPECT_NO_THROW(tr::check_batch_memory(base, {mixed}, 2000, 1e9, 2048000));
  // The model alone beyond the memory: every batch is too much.
  EXPECT_THROW(tr::check_batch_memory(base, {padded(1, 2, 2)}, 1, memory, 4096), attn::ConfigError);
}

}  // namespace
