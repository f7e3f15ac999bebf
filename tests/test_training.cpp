// Training end to end: the model learns a task to 99% accuracy, training is deterministic, resumes
// bit for bit from a checkpoint (in this process and in a fresh one), survives a kill during a
// save, refuses bad input clearly, and accumulates gradients over split batches exactly.
#include <attn/decode/greedy.hpp>
#include <attn/parallel.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/clip.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "pch.hpp"
#include "training_task.hpp"

namespace attn {
namespace {

using testing::Batch;
using testing::Trainer;

constexpr Index kVocab = 20;
constexpr Index kBatch = 64;

/// Position-wise matches over max(|hyp|, |ref|) per sentence: a wrong length costs every missing
/// or extra position.
double token_accuracy(const std::vector<std::vector<TokenId>>& hyp,
                      const std::vector<std::vector<TokenId>>& ref) {
  Index match = 0, total = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const std::size_t n = std::max(hyp[i].size(), ref[i].size());
    for (std::size_t j = 0; j < n; ++j)
      match += j < hyp[i].size() && j < ref[i].size() && hyp[i][j] == ref[i][j];
    total += static_cast<Index>(n);
  }
  return static_cast<double>(match) / static_cast<double>(total);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Training, LearnsToReverseSequencesTo99PercentTokenAccuracy) {
  const auto t0 = std::chrono::steady_clock::now();
  Trainer<float> t(testing::task_config(kVocab, /*dropout=*/0.0));
  // Held out: a stream seed the training batches never use.
  Rng held_rng(999);
  const Batch held = testing::make_batch(held_rng, 200, kVocab, 3, 8);
  DecodeOptions opt;
  opt.bos = testing::kBos;
  opt.eos = testing::kEos;
  opt.max_extra_length = 2;

  constexpr Index kBudget = 3000, kEvalEvery = 100;
  double accuracy = 0, loss = 0;
  Index steps = 0;
  while (steps < kBudget && accuracy < 0.99) {
    loss = t.train_step(testing::stream_batch(1, steps, kBatch, kVocab));
    ++steps;
    if (steps % kEvalEvery == 0)
      accuracy = token_accuracy(greedy_decode(t.model, held.src, opt), held.reference);
  }
  std::printf(
      "[ reverse  ] %lld steps, held-out token accuracy %.4f, last batch loss %.4f, %.1f s\n",
      static_cast<long long>(steps), accuracy, loss, seconds_since(t0));
  EXPECT_GE(accuracy, 0.99) << "after " << steps << " steps";
  EXPECT_LT(steps, kBudget);
}

}  // namespace
}  // namespace attn
