// `mpirun -np 2 attn-translate train` (distributed.hpp): two ranks with half of every batch train
// the model one process trains on the whole batch, a resumed two-rank run continues bit-exactly,
// summing during backward gives the bits of summing after it (2 and 3 ranks), only rank 0
// writes, and a failure on one rank stops the job with its message. Built and run
// only when MPI was found; ATTN_MPIEXEC is "mpiexec --oversubscribe --allow-run-as-root ...".
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include <attn/train/safetensors.hpp>

#include "mpi_fixture.hpp"

using namespace attn::translate::testing;

namespace {

// The progress line of update `step` in `log` from "step N | loss " on, with the loss's digits
// (empty if there is none).
std::string loss_line(const std::string& log, int step) {
  const std::string head = "step " + std::to_string(step) + " | loss ";
  const auto at = log.find(head);
  return at == std::string::npos ? std::string() : log.substr(at, head.size() + 10);
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// ||f(a) - f(b)|| / ||f(a)|| over elements [begin, end) of two float tensors, f the identity or,
// for Adam's second moment v (a running mean of squared gradients), the square root: v's relative
// error is twice its gradients', so sqrt(v) is the figure on the gradients' scale that the 1e-6
// bound is for (an ASan build at -O2 differed by 1.3e-6 in v itself and passes on sqrt(v)).
double relative_error(const attn::Tensor<float>& a, const attn::Tensor<float>& b, attn::Index begin,
                      attn::Index end, bool square_root = false) {
  const auto f = [&](float x) { return square_root ? std::sqrt(double(x)) : double(x); };
  double diff = 0, norm = 0;
  for (attn::Index i = begin; i < end; ++i) {
    diff += std::pow(f(a.data()[i]) - f(b.data()[i]), 2);
    norm += std::pow(f(a.data()[i]), 2);
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

bool is_second_moment(const std::string& name) {
  const std::string suffix = ".exp_avg_sq";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST_F(Mpi, TwoRanksWithHalfOfEachBatchTrainWhatOneProcessTrainsOnTheWholeBatch) {
  const std::string one = path("one"), two = path("two");
  if (train(0, one, 2, "", 0).exit_code != 0) return;
  const CliResult r = train(2, two, 2, "", 0);
  if (r.exit_code != 0) return;
  // Rank 0 logs the global loss: the same figures as one process, once.
  EXPECT_TRUE(contains(r.err, "step 2 | loss ")) << r.err;
  const CliResult alone = train(0, path("again"), 2, "", 0);
  EXPECT_EQ(loss_line(r.err, 2), loss_line(alone.err, 2));
  // Only rank 0 writes: the same files as one process.
  EXPECT_EQ(files_in(two), files_in(one));
  const auto a = attn::load_safetensors(one + "/checkpoint_2.safetensors");
  const auto b = attn::load_safetensors(two + "/checkpoint_2.safetensors");
  const attn::Index D = std::stoll(a.metadata().at("config.d_model"));
  int compared = 0;
  for (const std::string& name : a.names()) {
    if (a.info(name).dtype != attn::Dtype::F32) continue;
    const auto x = a.tensor<float>(name), y = b.tensor<float>(name);
    const bool root = is_second_moment(name);
    if (name.find("in_proj_bias") == std::string::npos) {
      EXPECT_LE(relative_error(x, y, 0, x.numel(), root), 1e-6) << name;
    } else {
      // in_proj_bias = [query; key; value] biases. The key bias cannot change the output (it
      // adds q . b_k to every score of a query, and softmax ignores a shift): its gradient is
      // zero in exact arithmetic, so float rounding noise is all there is, different in the
      // two computations, and Adam divides it by its own size (sqrt(v) + 1e-9) into steps of
      // about +-lr. It is compared as what it is: bounded by the learning rates taken.
      EXPECT_LE(relative_error(x, y, 0, D, root), 1e-6) << name << " (query)";
      EXPECT_LE(relative_error(x, y, 2 * D, 3 * D, root), 1e-6) << name << " (value)";
      if (name.rfind("adam.", 0) != 0) {
        for (attn::Index i = D; i < 2 * D; ++i) EXPECT_LE(std::abs(x.data()[i]), 0.02) << name;
      }
    }
    ++compared;
  }
  EXPECT_GT(compared, 50);  // parameters and both Adam moments
}

TEST_F(Mpi, ResumeWithTheSameRanksIsBitExact) {
  // Dropout on: each rank's stream must be restored from a checkpoint that holds only rank 0's.
  const std::string a = path("a"), b = path("b");
  if (train(2, a, 2, "", 0.1).exit_code != 0) return;
  if (train(2, a, 4, "--resume", 0.1).exit_code != 0) return;
  if (train(2, b, 4, "", 0.1).exit_code != 0) return;
  expect_same_checkpoints(a, b, 4);
  // The ranks' dropout streams differ: one process with dropout trains another model.
  if (train(0, path("one"), 4, "", 0.1).exit_code != 0) return;
  EXPECT_FALSE(read_file(path("one") + "/checkpoint_4.safetensors") ==
               read_file(b + "/checkpoint_4.safetensors"));
}

// Under --bpe-dropout every rank encodes each epoch's pairs itself: the ranks must draw the same
// pieces (else their batches, and so their shares and token counts, would differ), and so must a
// resumed job, in the middle of an epoch after the first.
TEST_F(Mpi, RanksDrawTheSamePiecesUnderBpeDropout) {
  const std::string flags = "--bpe-dropout 0.2";
  const CliResult alone = train(0, path("one"), 9, flags, 0);
  const CliResult job = train(2, path("two"), 9, flags, 0);
  EXPECT_TRUE(contains(job.err, "step 9 | loss ")) << job.err;
  EXPECT_EQ(loss_line(job.err, 9), loss_line(alone.err, 9)) << job.err;
  const std::string a = path("a"), b = path("b");
  // Epoch 1 begins at update 8 (BpeDropout.EachEpochHasItsOwnPiecesAndResumesExactly).
  if (train(2, a, 9, flags, 0.1).exit_code != 0) return;
  if (train(2, a, 11, flags + " --resume", 0.1).exit_code != 0) return;
  if (train(2, b, 11, flags, 0.1).exit_code != 0) return;
  expect_same_checkpoints(a, b, 11);
}

TEST_F(Mpi, SummingDuringBackwardGivesTheBitsOfSummingAfterItOnTwoRanks) {
  expect_overlap_changes_no_bit(2);
}

TEST_F(Mpi, SummingDuringBackwardGivesTheBitsOfSummingAfterItOnThreeRanks) {
  expect_overlap_changes_no_bit(3);
}

TEST_F(Mpi, ABadFileOnOneRankStopsEveryRankWithItsMessage) {
  // Rank 1's copy of the corpus is corrupt (on another machine, say); rank 0 is waiting for it.
  std::string bytes = read_file(path("train.en"));
  bytes.insert(bytes.find('\n') + 1, "\xff\xfe broken\n");
  write_file(path("bad.en"), bytes);
  const std::string bin = ATTN_TRANSLATE_BIN;
  const std::string args = " train --model-dir " + path("m") + " --steps 50 " + common(0);
  std::string bad_args = args;
  bad_args.replace(bad_args.find(path("train.en")), path("train.en").size(), path("bad.en"));
  const auto start = std::chrono::steady_clock::now();
  const CliResult r = mpirun("-n 1 " + bin + args + " : -n 1 " + bin + bad_args);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "attn-translate: error: rank 1 of 2: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "bad.en")) << r.err;
  EXPECT_TRUE(contains(r.err, "UTF-8")) << r.err;
  EXPECT_LT(seconds, 30);
  EXPECT_FALSE(fs::exists(path("m") + "/model.safetensors"));
}

TEST_F(Mpi, ANanLossOnOneRankInTheMiddleOfAnUpdateStopsEveryRankWithItsMessage) {
  // Rank 1's loss turns NaN in update 2 (ATTN_TRANSLATE_FAULT_STEP, trainer_setup.cpp); rank 0's
  // stays finite. Each update is several batches, the last one's sums start during backward (or,
  // with --no-overlap-allreduce, after it): rank 1 skips the rest of its update, starts what is
  // left of its sums so that rank 0's complete, and both stop at the end of the update on rank
  // 1's message, agreed, not through MPI_Abort.
  const std::string bin = ATTN_TRANSLATE_BIN;
  std::string flags = common(0);  // a checkpoint after every update
  flags.replace(flags.find("--checkpoint-every 0"), 20, "--checkpoint-every 1");
  for (const std::string overlap : {"", " --no-overlap-allreduce"}) {
    const std::string m = path(overlap.empty() ? "during" : "after");
    const std::string args = " train --model-dir " + m + " --steps 4" + overlap + " " + flags;
    const auto start = std::chrono::steady_clock::now();
    const CliResult r =
        mpirun("-n 1 " + bin + args + " : -n 1 env ATTN_TRANSLATE_FAULT_STEP=2 " + bin + args);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << overlap << "\n" << r.err;
    EXPECT_TRUE(contains(r.err,
                         "attn-translate: error: rank 1 of 2: loss is NaN at step 2 "
                         "(made so by ATTN_TRANSLATE_FAULT_STEP)"))
        << overlap << "\n"
        << r.err;
    EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << overlap << "\n" << r.err;
    EXPECT_LT(seconds, 30) << overlap;
    // Update 1 was saved; update 2 never happened on either rank.
    EXPECT_TRUE(fs::exists(m + "/checkpoint_1.safetensors")) << overlap;
    EXPECT_FALSE(fs::exists(m + "/checkpoint_2.safetensors")) << overlap;
  }
}

TEST_F(Mpi, AGradientNormThatIsNotFiniteAfterTheSumsIsReportedOnceByRankZero) {
  // After the sums every rank holds the same gradients, so a NaN among them stops every rank at
  // the same point (ATTN_TRANSLATE_FAULT_GRAD_STEP on both): each throws AgreedError, and rank 0
  // alone prints it. Every rank printed it before, through MPI_Abort.
  const std::string args = " train --model-dir " + path("m") + " --steps 3 " + common(0);
  const CliResult r =
      mpirun("-n 2 env ATTN_TRANSLATE_FAULT_GRAD_STEP=2 " + std::string(ATTN_TRANSLATE_BIN) + args);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string message = "step 2: the gradient norm is ";
  const auto first = r.err.find(message);
  EXPECT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(message, first + 1), std::string::npos) << r.err;  // once
  EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << r.err;
  EXPECT_FALSE(contains(r.err, "rank 1 of 2")) << r.err;
}

TEST_F(Mpi, ASignalToOneRankStopsEveryRankAfterTheSameUpdate) {
  // mpirun forwards Ctrl-C to every rank, but not at the same instant: a rank that stopped while
  // another began the next update left that one waiting for its sums for ever. Here only rank 1
  // is signalled (its shell writes its pid, then becomes attn-translate); every rank must stop
  // after the same update, and rank 0 write its checkpoint. `timeout` ends a hang.
  std::string flags = common(0);
  flags.replace(flags.find("--checkpoint-every 0"), 20, "--checkpoint-every 1");
  const std::string m = path("m"), pid = path("rank1.pid"), err = path("err"), rc = path("rc");
  const std::string run =
      std::string(ATTN_TRANSLATE_BIN) + " train --model-dir " + m + " --steps 1000000 " + flags;
  write_file(path("job.sh"), "timeout -s KILL 60 " + std::string(ATTN_MPIEXEC) + " -n 1 " + run +
                                 " : -n 1 sh -c 'echo $$ > " + pid + "; exec " + run + "' 2> " +
                                 err +
                                 " &\njob=$!\nfor i in $(seq 600); do\n"
                                 "  [ -s " +
                                 pid + " ] && ls " + m +
                                 "/checkpoint_*.safetensors >/dev/null 2>&1"
                                 " && break\n  sleep 0.1\ndone\nsleep 1\nkill -TERM $(cat " +
                                 pid + ")\nwait $job\necho $? > " + rc + "\n");
  ASSERT_EQ(std::system(("sh " + path("job.sh")).c_str()), 0);
  const std::string log = read_file(err);
  EXPECT_NE(read_file(rc), "137\n") << "killed by the timeout: a rank was left waiting\n" << log;
  // Every rank that prints "interrupted by SIGTERM at step N" names the same N (mpirun may end
  // rank 0 once rank 1 has exited 143, but not before rank 0's checkpoint is on disk).
  const std::string said = "attn-translate: interrupted by SIGTERM at step ";
  const std::size_t first = log.find(said), second = log.find(said, first + 1);
  ASSERT_NE(first, std::string::npos) << log;
  const auto step_at = [&](std::size_t at) {
    return std::stoll(log.substr(at + said.size(), log.find(';', at) - at - said.size()));
  };
  if (second != std::string::npos) {
    EXPECT_EQ(step_at(first), step_at(second)) << log;
  }
  EXPECT_TRUE(fs::exists(m + "/checkpoint_" + std::to_string(step_at(first)) + ".safetensors"));
  EXPECT_FALSE(contains(log, "MPI_ABORT")) << log;
}

TEST_F(Mpi, ARankBoundToOneCoreTrainsWithOneThreadByDefaultAndWarnsOfMore) {
  // mpirun binds a rank to one core when it starts one or two (ATTN_MPIEXEC says --bind-to none;
  // a later --bind-to core wins): two threads there would only take turns on that core.
  const std::string bin = ATTN_TRANSLATE_BIN;
  const auto args = [&](const std::string& m, const std::string& threads) {
    return " train --model-dir " + path(m) + " --steps 1 " + common(0, threads);
  };
  const CliResult bound = mpirun("--bind-to hwthread -n 1 " + bin + args("bound", ""));
  EXPECT_EQ(bound.exit_code, 0) << bound.err;
  EXPECT_TRUE(contains(bound.err, "train: 1 rank (1 on this machine) x 1 thread\n")) << bound.err;
  EXPECT_FALSE(contains(bound.err, "mpirun bound it to")) << bound.err;

  // Unbound, a rank has this process's CPUs (a cpuset may hold fewer than the machine's).
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cores =
      std::max(1, std::min(static_cast<int>(std::thread::hardware_concurrency()), CPU_COUNT(&set)));
  const CliResult unbound = mpirun("-n 1 " + bin + args("free", ""));
  EXPECT_EQ(unbound.exit_code, 0) << unbound.err;
  EXPECT_TRUE(contains(unbound.err, "train: 1 rank (1 on this machine) x " + std::to_string(cores) +
                                        (cores == 1 ? " thread\n" : " threads\n")))
      << unbound.err;

  const CliResult more = mpirun("--bind-to hwthread -n 1 " + bin + args("more", "--threads 2"));
  EXPECT_EQ(more.exit_code, 0) << more.err;
  EXPECT_TRUE(contains(more.err,
                       "train: rank 0 runs 2 threads on the 1 CPU mpirun bound it to; "
                       "start it with --map-by slot:PE=2 (or --bind-to none)"))
      << more.err;
}

}  // namespace
