// BPE-dropout (--bpe-dropout): every epoch's training pairs encoded afresh, each BPE merge skipped
// with a probability, so that a word also comes in smaller pieces. What it must keep: the text (the
// pieces decode to it), the same pieces for the same seed on every run and every rank, other pieces
// in each epoch, validation untouched, and a resume that continues bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "bpe.hpp"
#include "pipeline_fixture.hpp"
#include "trainer.hpp"
#include "training_pairs.hpp"
#include "translate_fixture.hpp"

using attn::Index;
using attn::TokenId;
using namespace attn::translate::testing;

namespace {

class BpeDropout : public TempDirTest {
 protected:
  // A vocabulary of 60 pieces on both sides of split()'s training pairs, as tiny_options trains.
  tr::SubwordVocab vocab() {
    const tr::ParallelCorpus c = split().train;
    std::vector<std::string> both = c.src;
    both.insert(both.end(), c.tgt.begin(), c.tgt.end());
    return tr::SubwordVocab::train(both, path("vocab"), {60, 1});
  }
};

Index tokens(const std::vector<tr::TokenizedPair>& pairs) {
  Index n = 0;
  for (const auto& p : pairs) n += static_cast<Index>(p.src.size() + p.tgt.size());
  return n;
}

bool same_pairs(const std::vector<tr::TokenizedPair>& a, const std::vector<tr::TokenizedPair>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].src != b[i].src || a[i].tgt != b[i].tgt) return false;
  return true;
}

// Every token of every batch of the epoch under way, in the batches' own order (not the order the
// epoch visits them in, which differs from epoch to epoch anyway).
std::vector<TokenId> epoch_tokens(const tr::Trainer& t) {
  std::vector<TokenId> out;
  for (const tr::Batch& b : t.epoch_batches().batches())
    for (const attn::Tensor<TokenId>* ids : {&b.src, &b.tgt_out})
      out.insert(out.end(), ids->data(), ids->data() + ids->numel());
  return out;
}

}  // namespace

TEST_F(BpeDropout, SmallerPiecesOfTheSameText) {
  const tr::SubwordVocab v = vocab();
  const tr::ParallelCorpus c = split().train;
  Index whole = 0, sampled = 0;
  tr::SubwordVocab::with_sampling_seed(1, [&] {
    for (const std::string& s : c.src) {
      EXPECT_EQ(v.sample_encode(s, 0), v.encode(s)) << s;
      const std::vector<TokenId> ids = v.sample_encode(s, 0.5);
      EXPECT_EQ(v.decode(ids), s);
      whole += static_cast<Index>(v.encode(s).size());
      sampled += static_cast<Index>(ids.size());
    }
  });
  EXPECT_GT(sampled, whole + whole / 10) << "half the merges dropped, yet hardly more pieces";
  for (const double bad : {-0.1, 1.0, std::nan("")}) {
    const std::string msg = error_of<attn::ConfigError>([&] { v.sample_encode(c.src[0], bad); });
    EXPECT_TRUE(contains(msg, "BPE-dropout must be in [0, 1), got ")) << msg;
  }
}

TEST_F(BpeDropout, TheSeedAloneDecidesThePieces) {
  const tr::SubwordVocab v = vocab();
  const tr::ParallelCorpus c = split().train;
  const auto first = tr::tokenize_pairs(v, c, 32, 0.3, 7);
  EXPECT_GT(tokens(first), tokens(tr::tokenize_pairs(v, c, 32)));
  // Draws made in this thread before, and another seed's run in another thread at the same time,
  // change nothing.
  for (int i = 0; i < 50; ++i) v.sample_encode(c.src[i], 0.5);
  std::vector<tr::TokenizedPair> other;
  std::thread t([&] { other = tr::tokenize_pairs(v, c, 32, 0.3, 8); });
  const auto again = tr::tokenize_pairs(v, c, 32, 0.3, 7);
  t.join();
  EXPECT_TRUE(same_pairs(first, again));
  EXPECT_FALSE(same_pairs(first, other));
  EXPECT_TRUE(same_pairs(other, tr::tokenize_pairs(v, c, 32, 0.3, 8)));
  // What encode_all throws in its thread reaches the caller.
  EXPECT_THROW(tr::tokenize_pairs(v, c, 32, 1.0, 7), attn::ConfigError);
  // Pairs too long in bytes are still left unencoded.
  tr::ParallelCorpus long_pair = c;
  long_pair.src[3] = std::string(40 * 64, 'a');
  const auto marked = tr::tokenize_pairs(v, long_pair, 32, 0.3, 7);
  EXPECT_TRUE(marked[3].overlong);
  EXPECT_TRUE(marked[3].src.empty());
}

// A pair that sampling makes too long for max_len is taken whole: every epoch trains on the pairs
// of the whole-word batches, and none is lost however close to max_len the corpus is.
TEST_F(BpeDropout, APairTooLongInPiecesIsTakenWhole) {
  const tr::SubwordVocab v = vocab();
  const tr::ParallelCorpus c = split().train;
  const auto whole = tr::tokenize_pairs(v, c, 32);
  Index longest = 0;
  for (const auto& p : whole)
    longest = std::max({longest, Index(p.src.size()), Index(p.tgt.size()) + 1});
  const auto sampled = tr::tokenize_pairs(v, c, longest, 0.5, 3);
  int taken_whole = 0, sampled_pairs = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_LE(Index(sampled[i].src.size()), longest) << i;
    EXPECT_LE(Index(sampled[i].tgt.size()) + 1, longest) << i;
    const bool same = sampled[i].src == whole[i].src && sampled[i].tgt == whole[i].tgt;
    taken_whole += same;
    sampled_pairs += !same;
  }
  EXPECT_GT(taken_whole, 0);
  EXPECT_GT(sampled_pairs, 0);
}

// Validation loss and BLEU are measured on whole words, with or without BPE-dropout.
TEST_F(BpeDropout, ValidationIsEncodedWhole) {
  tr::TrainOptions o = tiny_options(path("sampled"));
  o.bpe_dropout = 0.3;
  tr::TrainOptions plain = tiny_options(path("whole"));
  tr::Trainer sampled(o, split()), whole(plain, split());
  EXPECT_NE(epoch_tokens(sampled), epoch_tokens(whole));
  const auto a = sampled.validate(), b = whole.validate();
  EXPECT_EQ(a.loss.tokens, b.loss.tokens);
  EXPECT_EQ(a.loss.mean_loss(), b.loss.mean_loss());
  EXPECT_EQ(a.bleu.score, b.bleu.score);
}

TEST_F(BpeDropout, EachEpochHasItsOwnPiecesAndResumesExactly) {
  tr::TrainOptions o = tiny_options(path("a"));
  o.bpe_dropout = 0.2;
  o.log_every = 1;
  Index epoch_end = 0;  // the first update of epoch 1
  std::vector<TokenId> epoch0, epoch1;
  {
    tr::Trainer first(o, split());
    epoch0 = epoch_tokens(first);
    while (first.epoch() == 0 && first.step() < 100) first.train(1);
    ASSERT_EQ(first.epoch(), 1u);
    epoch_end = first.step();
    epoch1 = epoch_tokens(first);
    first.save_checkpoint();  // in epoch 1: its pairs must be sampled again on resume
  }
  EXPECT_NE(epoch0, epoch1) << "epoch 1 has epoch 0's pieces";
  tr::TrainOptions r = o;
  r.resume = true;
  r.bpe_dropout = 0;  // ignored: the checkpoint's --bpe-dropout wins
  tr::TrainOptions s = o;
  s.model_dir = path("straight");
  tr::Trainer straight(s, split());
  EXPECT_EQ(epoch_tokens(straight), epoch0);  // the same seed, the same pieces
  straight.train(epoch_end + 3);
  {
    tr::Trainer resumed(r, split());
    EXPECT_EQ(resumed.options().bpe_dropout, 0.2);
    EXPECT_EQ(resumed.epoch(), 1u);
    EXPECT_EQ(epoch_tokens(resumed), epoch1);
    resumed.train(3);
    expect_same_parameters(resumed.model(), straight.model());
    ASSERT_EQ(resumed.curves().size(), straight.curves().size());
    for (std::size_t i = 0; i < straight.curves().size(); ++i)
      EXPECT_EQ(resumed.curves()[i].train_loss, straight.curves()[i].train_loss) << i;
    expect_same_checkpoint(resumed.save_checkpoint(), straight.save_checkpoint());
  }
  // Without BPE-dropout the same run learns from other pieces.
  tr::TrainOptions plain = tiny_options(path("plain"));
  plain.log_every = 1;
  tr::Trainer whole(plain, split());
  whole.train(epoch_end + 3);
  EXPECT_FALSE(same_parameters(whole.model(), straight.model()));
  EXPECT_LT(epoch_tokens(whole).size(), epoch0.size()) << "whole words, fewer padded tokens";
}
