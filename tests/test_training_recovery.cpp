// Training through interruptions and bad input: it resumes bit for bit from a checkpoint (in this
// process and in a fresh one, resume_worker.cpp), survives a kill during a save, and refuses bad
// input with messages naming the values. Learning and determinism: test_training.cpp.
#include <attn/train/checkpoint.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "error_helpers.hpp"
#include "pch.hpp"
#include "training_task.hpp"
#include "training_testing.hpp"

namespace attn {
namespace {

using testing::Batch;
using testing::differing;
using testing::kVocab;
using testing::seconds_since;
using testing::Trainer;

/// Parameter values copied out (the live tensors are handles that training keeps changing).
template <class T>
std::vector<std::pair<std::string, std::vector<T>>> snapshot(const Module<T>& m) {
  std::vector<std::pair<std::string, std::vector<T>>> out;
  for (const auto& p : m.parameters())
    out.push_back({p.name, std::vector<T>(p.value.begin(), p.value.end())});
  return out;
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
  // on a loaded 2-core machine two threads make this test 10x slower (see the first test of
  // test_training.cpp).
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
  const std::string tmp = path + ".attn-tmp." + std::to_string(pid);
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

}  // namespace
}  // namespace attn
