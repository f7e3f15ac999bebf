// The MPI-free part of data-parallel training (distributed.hpp): how a batch is shared among the
// ranks, the ranks' dropout seeds, and the one-process Replicas the trainer uses without mpirun.
#include <gtest/gtest.h>

#include <limits>
#include <set>

#include "distributed.hpp"
#include "error_helpers.hpp"

namespace tr = attn::translate;
using attn::Index;
using attn::TokenId;

namespace {

// Four pairs of source lengths 2, 5, 1, 3 (ids 10+row), targets one shorter but at least 1.
tr::Batcher four_pairs() {
  std::vector<tr::TokenizedPair> pairs;
  for (int len : {2, 5, 1, 3}) {
    tr::TokenizedPair p;
    p.src.assign(static_cast<std::size_t>(len), static_cast<TokenId>(10 + pairs.size()));
    p.tgt.assign(static_cast<std::size_t>(std::max(1, len - 1)), static_cast<TokenId>(20));
    pairs.push_back(p);
  }
  tr::BatchingOptions o;
  o.max_tokens = 64;
  o.max_len = 8;
  return tr::Batcher(pairs, o);
}

TEST(ShareBatch, RanksTakeEveryNthRowTrimmedToTheirOwnLengthAndTogetherHoldTheBatch) {
  const tr::Batcher batcher = four_pairs();
  ASSERT_EQ(batcher.size(), 1u);
  const tr::Batch& whole = batcher.batches()[0];
  for (int ranks : {1, 2, 3, 4, 6}) {
    Index src_tokens = 0, tgt_tokens = 0;
    std::multiset<std::size_t> pairs;
    for (int rank = 0; rank < ranks; ++rank) {
      tr::Batch share;
      tr::share_batch(whole, rank, ranks, share);
      ASSERT_EQ(share.rows(), (whole.rows() - rank + ranks - 1) / ranks) << ranks << " " << rank;
      for (Index i = 0; i < share.rows(); ++i) {
        const Index row = rank + i * ranks;
        // The row's ids, then padding only up to this share's longest sentence.
        for (Index j = 0; j < share.src.size(1); ++j) EXPECT_EQ(share.src(i, j), whole.src(row, j));
        for (Index j = 0; j < share.tgt_in.size(1); ++j) {
          EXPECT_EQ(share.tgt_in(i, j), whole.tgt_in(row, j));
          EXPECT_EQ(share.tgt_out(i, j), whole.tgt_out(row, j));
        }
      }
      if (share.rows() > 0) {
        bool full_column = false;  // trimmed: some row reaches the last column
        for (Index i = 0; i < share.rows(); ++i)
          full_column |= share.src(i, share.src.size(1) - 1) != 0;
        EXPECT_TRUE(full_column);
      }
      src_tokens += share.src_tokens;
      tgt_tokens += share.tgt_tokens;
      pairs.insert(share.pairs.begin(), share.pairs.end());
    }
    EXPECT_EQ(src_tokens, whole.src_tokens) << ranks;
    EXPECT_EQ(tgt_tokens, whole.tgt_tokens) << ranks;
    EXPECT_EQ(pairs, std::multiset<std::size_t>(whole.pairs.begin(), whole.pairs.end()));
  }
}

TEST(RankSeed, RankZeroKeepsTheSeedAndEveryRankHasItsOwn) {
  std::set<std::uint64_t> seeds;
  for (int r = 0; r < 64; ++r) seeds.insert(tr::rank_seed(1, r));
  EXPECT_EQ(seeds.size(), 64u);
  EXPECT_EQ(tr::rank_seed(1, 0), 1u);
  EXPECT_EQ(tr::rank_seed(12345, 0), 12345u);
  EXPECT_EQ(tr::rank_seed(1, 3), tr::rank_seed(1, 3));  // reproducible
  EXPECT_NE(tr::rank_seed(1, 3), tr::rank_seed(2, 3));
}

TEST(RankThreads, CoresAreSharedAmongTheMachinesRanksWithinTheCpusARankIsBoundTo) {
  EXPECT_EQ(tr::default_rank_threads(8, 2, 0), 4);  // binding unknown: the share of the cores
  EXPECT_EQ(tr::default_rank_threads(8, 2, 8), 4);  // --bind-to none
  EXPECT_EQ(tr::default_rank_threads(8, 2, 1), 1);  // Open MPI's default for 2 ranks: a core each
  EXPECT_EQ(tr::default_rank_threads(8, 2, 2), 2);  // --map-by slot:PE=2
  EXPECT_EQ(tr::default_rank_threads(8, 1, 1), 1);  // mpirun -np 1 binds to a core too
  EXPECT_EQ(tr::default_rank_threads(2, 3, 2), 1);  // more ranks than cores: at least 1
  EXPECT_EQ(tr::default_rank_threads(2, 0, 0), 2);  // no rank count: as one rank
}

TEST(Replicas, OneProcessSharesNothingAndRethrowsAnError) {
  tr::Replicas alone;
  const tr::Batcher batcher = four_pairs();
  EXPECT_EQ(&alone.share(batcher.batches()[0]), &batcher.batches()[0]);
  attn::LossStats s;
  s.tokens = 7;
  EXPECT_EQ(alone.rank0_decides(true), true);
  EXPECT_EQ(alone.report_here(std::runtime_error("x")), true);
  attn::Transformer<float> model(attn::TransformerConfig::tiny(32));
  EXPECT_EQ(alone.finish_update(s, "", model).tokens, 7);
  EXPECT_EQ(attn::testing::error_of<tr::AgreedError>([&] { alone.finish_update(s, "bad", model); }),
            "bad");
}

TEST(SlowUpdateWarning, NamesTheUpdateTheWaitAndWhatToPassMpirun) {
  EXPECT_EQ(tr::slow_update_warning(0.5, nullptr), "");  // within Open MPI's default second
  EXPECT_EQ(tr::slow_update_warning(30, "60"), "");      // room for the update and a checkpoint
  EXPECT_NE(tr::slow_update_warning(31, "60"), "");
  const std::string w = tr::slow_update_warning(3.24, nullptr);
  EXPECT_TRUE(attn::testing::contains(
      w,
      "train: an update takes 3.2 s, and mpirun kills the ranks 1 second after "
      "it passes Ctrl-C on as SIGTERM"))
      << w;
  EXPECT_TRUE(attn::testing::contains(w, "Start mpirun with --mca odls_base_sigkill_timeout 60 "))
      << w;
  const std::string slow = tr::slow_update_warning(100, "60");
  EXPECT_TRUE(attn::testing::contains(slow, "kills the ranks 60 seconds after")) << slow;
  EXPECT_TRUE(attn::testing::contains(slow, "--mca odls_base_sigkill_timeout 300 ")) << slow;
  for (const char* unreadable : {"", "x", "5s", "-3"})
    EXPECT_TRUE(attn::testing::contains(tr::slow_update_warning(2, unreadable),
                                        "kills the ranks 1 second after"))
        << unreadable;
  EXPECT_EQ(tr::slow_update_warning(std::numeric_limits<double>::infinity(), nullptr), "");
}

TEST(Fingerprint, ChangesWithAnyKeyOrValue) {
  const std::map<std::string, std::string> a{{"train.seed", "1"}, {"x", "ab"}};
  auto b = a;
  b["train.seed"] = "2";
  auto c = a;
  c["x"] = "a";
  c["xb"] = "";
  EXPECT_NE(tr::fingerprint(a), tr::fingerprint(b));
  EXPECT_NE(tr::fingerprint(a), tr::fingerprint(c));
  EXPECT_EQ(tr::fingerprint(a), tr::fingerprint(std::map<std::string, std::string>(a)));
}

}  // namespace
