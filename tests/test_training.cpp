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
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "error_helpers.hpp"
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
  // One thread: this test is about learning, and on a shared 2-core machine two OpenMP threads
  // spend most of each of the many small parallel regions waiting for a descheduled partner
  // (measured 20x slower under load). Thread counts are the next tests' subject.
  const int threads_before = num_threads();
  set_num_threads(1);
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
  set_num_threads(threads_before);
}

/// Parameter values copied out (the live tensors are handles that training keeps changing).
template <class T>
std::vector<std::pair<std::string, std::vector<T>>> snapshot(const Module<T>& m) {
  std::vector<std::pair<std::string, std::vector<T>>> out;
  for (const auto& p : m.parameters())
    out.push_back({p.name, std::vector<T>(p.value.begin(), p.value.end())});
  return out;
}

/// The names of the parameters whose bits differ between two snapshots (empty when identical).
template <class T>
std::vector<std::string> differing(const std::vector<std::pair<std::string, std::vector<T>>>& a,
                                   const std::vector<std::pair<std::string, std::vector<T>>>& b) {
  std::vector<std::string> out;
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    if (a[i].second.size() != b[i].second.size() ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * sizeof(T)) != 0)
      out.push_back(a[i].first);
  }
  return out;
}

/// Losses of `steps` updates of a fresh dropout-0.1 model on stream 3, with `threads` threads.
std::vector<double> training_losses(int threads, Index steps, std::uint64_t init_seed = 7,
                                    Index d_model = 32) {
  const int before = num_threads();
  set_num_threads(threads);
  TransformerConfig c = testing::task_config(kVocab, 0.1, d_model);
  c.seed = init_seed;
  Trainer<float> t(c);
  std::vector<double> losses;
  for (Index k = 0; k < steps; ++k)
    losses.push_back(t.train_step(testing::stream_batch(3, k, kBatch, kVocab)));
  set_num_threads(before);
  return losses;
}

TEST(Training, SameSeedAndThreadCountGiveBitIdenticalLossesWithDropout) {
  const auto t0 = std::chrono::steady_clock::now();
  // One thread for the 20 steps (fast on a loaded machine); two threads are checked over fewer
  // steps below.
  const int threads = 1;
  const std::vector<double> a = training_losses(threads, 20), b = training_losses(threads, 20);
  ASSERT_EQ(a.size(), 20u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  // The comparison can fail: another initialisation seed (hence other dropout masks) does differ.
  const std::vector<double> other = training_losses(threads, 3, 8);
  EXPECT_NE(std::vector<double>(a.begin(), a.begin() + 3), other);
  std::printf("[ determin ] %d threads: 20 losses bit-identical, %.2f -> %.2f, %.1f s\n", threads,
              a.front(), a.back(), seconds_since(t0));
}

/// Every parameter gradient (and the logits) after one forward/backward of a fresh dropout-0.1
/// model of width d_model with `threads` threads.
std::pair<std::vector<float>, std::vector<std::pair<std::string, std::vector<float>>>> one_backward(
    int threads, Index d_model) {
  const int before = num_threads();
  set_num_threads(threads);
  Trainer<float> t(testing::task_config(kVocab, 0.1, d_model));
  const Batch b = testing::stream_batch(3, 0, kBatch, kVocab);
  t.model.zero_grad();
  const Tensor<float>& logits = t.model.forward(b.src, b.tgt_in);
  std::vector<float> y(logits.begin(), logits.end());
  t.loss.forward_backward(logits, b.tgt_out, 1.0 / count_tokens(b.tgt_out, testing::kPad));
  t.model.backward(t.loss.dlogits());
  std::vector<std::pair<std::string, std::vector<float>>> g;
  for (const auto& p : t.model.parameters())
    g.push_back({p.name, std::vector<float>(p.grad.begin(), p.grad.end())});
  set_num_threads(before);
  return {y, g};
}

// Every parallel loop of attn gives each output element to one thread with a fixed order of
// summation, and the products split rows at multiples of Eigen's row panel (kernels/gemm.hpp), so
// the thread count does not change a single bit. d_model = 128 makes the products big enough to
// be split (QKV: 320 x 128 x 384 multiply-adds, above kGemmParallelMinWork).
TEST(Training, OneAndTwoThreadsGiveBitIdenticalLossesAndGradients) {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr Index kSteps = 3, kWidth = 128;
  const std::vector<double> one = training_losses(1, kSteps, 7, kWidth),
                            two = training_losses(2, kSteps, 7, kWidth);
  EXPECT_EQ(one, two);
  const auto [y1, g1] = one_backward(1, kWidth);
  const auto [y2, g2] = one_backward(2, kWidth);
  EXPECT_TRUE(y1.size() == y2.size() &&
              std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0)
      << "logits differ between 1 and 2 threads";
  std::string names;
  for (const auto& n : differing(g1, g2)) names += " " + n;
  EXPECT_EQ(names, "") << "gradients that differ between 1 and 2 threads";
  std::printf("[ threads  ] 1 vs 2 threads, d_model %lld: %lld losses %.6f -> %.6f, %.1f s\n",
              static_cast<long long>(kWidth), static_cast<long long>(kSteps), one.front(),
              one.back(), seconds_since(t0));
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "attn_h7_" + std::to_string(::getpid()) + "_" + name;
}

TEST(Training, ResumedRunMatchesUninterruptedRunBitwiseInProcessAndInAFreshProcess) {
  const auto t0 = std::chrono::steady_clock::now();
  constexpr Index k = 6, m = 6, B = 32;
  constexpr std::uint64_t kStream = 5;
  constexpr double kDropout = 0.1;
  auto batch = [&](Index i) { return testing::stream_batch(kStream, i, B, kVocab); };
  // One thread here and in the worker: the result must not depend on the machine's default, and
  // on a loaded 2-core machine two threads make this test 10x slower (see the first test).
  const int threads_before = num_threads();
  set_num_threads(1);

  Trainer<float> straight(testing::task_config(kVocab, kDropout));
  for (Index i = 0; i < k + m; ++i) straight.train_step(batch(i));
  const auto expected = snapshot(straight.model);

  const std::string ckpt = temp_path("resume.safetensors");
  {
    Trainer<float> first(testing::task_config(kVocab, kDropout));
    for (Index i = 0; i < k; ++i) first.train_step(batch(i));
    save_training_checkpoint(ckpt, first.model.parameters(), first.adam,
                             first.model.random_state());
    ASSERT_GT(first.model.random_state().counter, 0u) << "dropout drew no masks";
  }
  TransformerConfig other_init = testing::task_config(kVocab, kDropout);
  other_init.seed = 12345;  // everything must come from the checkpoint
  {
    Trainer<float> resumed(other_init);
    const TrainingCheckpoint info = load_training_checkpoint(
        ckpt, resumed.model.parameters(), resumed.adam, resumed.model.random_state());
    EXPECT_EQ(info.step, k);
    for (Index i = 0; i < m; ++i) resumed.train_step(batch(resumed.adam.steps()));
    EXPECT_EQ(differing(expected, snapshot(resumed.model)), std::vector<std::string>{});
  }
  {
    // Without the dropout stream's state the run diverges: the comparison above can fail.
    Trainer<float> no_rng(other_init);
    RandomState ignored;
    load_training_checkpoint(ckpt, no_rng.model.parameters(), no_rng.adam, ignored);
    for (Index i = 0; i < m; ++i) no_rng.train_step(batch(no_rng.adam.steps()));
    EXPECT_FALSE(differing(expected, snapshot(no_rng.model)).empty());
  }

  const std::string out = temp_path("resumed_by_worker.safetensors");
  const std::string cmd = std::string("OMP_NUM_THREADS=1 \"") + ATTN_RESUME_WORKER + "\" \"" +
                          ckpt + "\" \"" + out + "\" " + std::to_string(m) + " " +
                          std::to_string(kVocab) + " 0.1 " + std::to_string(kStream) + " " +
                          std::to_string(B);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Transformer<float> from_worker(other_init);
  load_model(out, from_worker);
  EXPECT_EQ(differing(expected, snapshot(from_worker)), std::vector<std::string>{});
  std::remove(ckpt.c_str());
  std::remove(out.c_str());
  set_num_threads(threads_before);
  std::printf(
      "[ resume   ] %lld + %lld steps, in-process and fresh-process resume bitwise equal, %.1f s\n",
      static_cast<long long>(k), static_cast<long long>(m), seconds_since(t0));
}

extern "C" void stop_on_file_size_limit(int) { ::raise(SIGSTOP); }

TEST(Training, KillDuringSaveLeavesThePreviousCheckpointLoadable) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = temp_path("crash.safetensors");
  Transformer<float> good(testing::task_config(kVocab, 0.0));
  save_model(path, good);
  const auto good_values = snapshot(good);
  std::ifstream probe(path, std::ios::binary | std::ios::ate);
  const auto full_size = static_cast<long long>(probe.tellg());
  ASSERT_GT(full_size, 4096);

  TransformerConfig newer = testing::task_config(kVocab, 0.0);
  newer.seed = 99;
  Transformer<float> next(newer);
  ASSERT_FALSE(differing(good_values, snapshot(next)).empty());

  // The child writes the new checkpoint with a file size limit of half of it: the write that
  // crosses the limit raises SIGXFSZ, whose handler stops the child in the middle of save_model.
  // The parent then finds the half-written temporary file and kill -9s the writer, so the kill
  // lands during the save every time instead of by luck of timing.
  const long long limit = full_size / 2;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(limit);
    ::setrlimit(RLIMIT_FSIZE, &rl);
    ::signal(SIGXFSZ, stop_on_file_size_limit);
    try {
      save_model(path, next);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(4);  // the save finished: the limit did not interrupt it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the writer was not stopped mid-save (status " << status
                                  << ")";
  const std::string tmp = path + ".tmp." + std::to_string(pid);
  std::ifstream partial(tmp, std::ios::binary | std::ios::ate);
  ASSERT_TRUE(partial.good()) << "no temporary file " << tmp << " during the save";
  EXPECT_EQ(static_cast<long long>(partial.tellg()), limit);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  // The stray truncated temporary file is itself unloadable, and changes nothing about `path`.
  Transformer<float> reader(newer);
  EXPECT_THROW(load_model(tmp, reader), FormatError);
  load_model(path, reader);
  EXPECT_EQ(differing(good_values, snapshot(reader)), std::vector<std::string>{});
  // Nor does it stop the next save, which replaces the checkpoint as a whole.
  save_model(path, next);
  Transformer<float> reader2(testing::task_config(kVocab, 0.0));
  load_model(path, reader2);
  EXPECT_EQ(differing(snapshot(next), snapshot(reader2)), std::vector<std::string>{});
  std::remove(tmp.c_str());
  std::remove(path.c_str());
  std::printf("[ crash    ] writer killed at %lld of %lld bytes, old checkpoint intact, %.1f s\n",
              limit, full_size, seconds_since(t0));
}

using testing::error_of;

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
}

TEST(Training, BadInputIsRefusedWithMessagesNamingTheValues) {
  Trainer<float> t(testing::task_config(kVocab, 0.0));
  const Batch good = testing::stream_batch(6, 0, 4, kVocab);

  Batch bad = good;
  bad.src = good.src.clone();
  bad.src(1, 0) = 25;
  expect_contains(error_of<IndexError>([&] { t.train_step(bad); }), {"token id 25", "[0, 20)"});
  bad.src(1, 0) = -1;
  expect_contains(error_of<IndexError>([&] { t.train_step(bad); }), {"token id -1", "[0, 20)"});
  bad = good;
  bad.tgt_in = good.tgt_in.clone();
  bad.tgt_in(2, 1) = 20;
  expect_contains(error_of<IndexError>([&] { t.train_step(bad); }), {"token id 20", "[0, 20)"});
  bad = good;
  bad.tgt_out = good.tgt_out.clone();
  bad.tgt_out(0, 0) = 31;
  expect_contains(error_of<IndexError>([&] { t.train_step(bad); }), {"target id 31", "[0, 20)"});

  Batch empty;
  empty.src = Tensor<TokenId>({0, 5});
  empty.tgt_in = Tensor<TokenId>({0, 6});
  empty.tgt_out = Tensor<TokenId>({0, 6});
  expect_contains(error_of<ShapeError>([&] { t.train_step(empty); }), {"non-empty", "[0, 5]"});
  empty.src = Tensor<TokenId>({2, 0});
  empty.tgt_in = Tensor<TokenId>({2, 3});
  expect_contains(error_of<ShapeError>([&] { t.train_step(empty); }), {"non-empty", "[2, 0]"});
  empty.src = good.src;
  empty.tgt_in = Tensor<TokenId>({4, 0});
  expect_contains(error_of<ShapeError>([&] { t.model.forward(empty.src, empty.tgt_in); }),
                  {"non-empty", "[4, 0]"});
  // No update happened through any of these.
  EXPECT_EQ(t.adam.steps(), 0);

  // A NaN weight: the loss names the step it happened at.
  t.model.parameters()[1].value.data()[0] = std::numeric_limits<float>::quiet_NaN();
  const Tensor<float>& logits = t.model.forward(good.src, good.tgt_in);
  expect_contains(
      error_of<NumericError>([&] { t.loss.forward_backward(logits, good.tgt_out, 1.0, 123); }),
      {"NaN", "123"});

  // A checkpoint of another configuration: the tensor and both shapes are named.
  const std::string path = temp_path("other_config.safetensors");
  Transformer<float> wide(testing::task_config(kVocab, 0.0, /*d_model=*/64));
  save_model(path, wide);
  Transformer<float> narrow(testing::task_config(kVocab, 0.0));
  const auto before = snapshot(narrow);
  expect_contains(error_of<FormatError>([&] { load_model(path, narrow); }),
                  {"src_embed.weight", "[20, 32]", "[20, 64]"});
  EXPECT_EQ(differing(before, snapshot(narrow)), std::vector<std::string>{});  // nothing loaded
  Transformer<float> bigger_vocab(testing::task_config(24, 0.0));
  expect_contains(error_of<FormatError>([&] { load_model(path, bigger_vocab); }),
                  {"src_embed.weight", "[24, 32]", "[20, 64]"});
  Trainer<float> t64(testing::task_config(kVocab, 0.0, 64));
  save_training_checkpoint(path, t64.model.parameters(), t64.adam, t64.model.random_state());
  Trainer<float> t32(testing::task_config(kVocab, 0.0));
  expect_contains(error_of<FormatError>([&] {
                    load_training_checkpoint(path, t32.model.parameters(), t32.adam,
                                             t32.model.random_state());
                  }),
                  {"[20, 32]", "[20, 64]"});
  std::remove(path.c_str());
}

/// Rows [r0, r1) of `b`, with the columns that are padding in every kept row dropped.
Batch rows(const Batch& b, Index r0, Index r1) {
  auto slice = [&](const Tensor<TokenId>& x) {
    Index width = 0;
    for (Index r = r0; r < r1; ++r)
      for (Index c = 0; c < x.size(1); ++c)
        if (x(r, c) != testing::kPad) width = std::max(width, c + 1);
    Tensor<TokenId> y({r1 - r0, width});
    for (Index r = r0; r < r1; ++r)
      for (Index c = 0; c < width; ++c) y(r - r0, c) = x(r, c);
    return y;
  };
  Batch out;
  out.src = slice(b.src);
  out.tgt_in = slice(b.tgt_in);
  out.tgt_out = slice(b.tgt_out);
  return out;
}

TEST(Training, TwoAccumulatedHalfBatchesGiveTheFullBatchGradient) {
  Transformer<double> model(testing::task_config(kVocab, 0.0));
  LabelSmoothedCrossEntropy<double> loss(0.1, testing::kPad);
  const Batch full = testing::stream_batch(7, 0, 8, kVocab);
  const Index tokens = count_tokens(full.tgt_out, testing::kPad);
  auto accumulate = [&](const Batch& b) {
    const Tensor<double>& logits = model.forward(b.src, b.tgt_in);
    const LossStats s = loss.forward_backward(logits, b.tgt_out, 1.0 / static_cast<double>(tokens));
    model.backward(loss.dlogits());
    return s;
  };
  auto grads = [&] {
    std::vector<std::vector<double>> g;
    for (const auto& p : model.parameters()) g.emplace_back(p.grad.begin(), p.grad.end());
    return g;
  };
  model.zero_grad();
  const LossStats whole = accumulate(full);
  const auto g_full = grads();

  model.zero_grad();
  const Batch first = rows(full, 0, 4), second = rows(full, 4, 8);
  ASSERT_NE(first.src.size(1), second.src.size(1)) << "pick a batch whose halves pad differently";
  LossStats halves = accumulate(first);
  halves += accumulate(second);
  const auto g_halves = grads();

  EXPECT_EQ(halves.tokens, whole.tokens);
  EXPECT_NEAR(halves.smoothed_loss, whole.smoothed_loss, 1e-10 * whole.smoothed_loss);
  const auto params = model.parameters();
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < g_full.size(); ++i)
    for (std::size_t j = 0; j < g_full[i].size(); ++j) {
      largest = std::max(largest, std::abs(g_full[i][j]));
      const double err = std::abs(g_full[i][j] - g_halves[i][j]);
      if (err > worst) worst = err;
      ASSERT_NEAR(g_halves[i][j], g_full[i][j], 1e-12) << params[i].name << "[" << j << "]";
    }
  EXPECT_GT(largest, 1e-3);  // the gradients are not trivially zero
  std::printf("[ accum    ] max |full - accumulated| = %.3g (largest gradient %.3g)\n", worst,
              largest);
}
}  // namespace
}  // namespace attn
