// `mpirun` jobs whose ranks would train differently: different flags, a checkpoint one rank cannot
// read, or checkpoints of the same weights in another state. Each is refused before the first
// update by every rank at once (AgreedError), never left waiting for another rank's sums.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mpi_fixture.hpp"
#include "safetensors_edit.hpp"

using namespace attn::translate::testing;

namespace {

// A checkpoint that one rank alone cannot read (its file system, say; made so here by
// ATTN_TRANSLATE_FAULT_UNREADABLE_STEP) makes that rank resume from an older one. The weights of
// the ranks then differ and the job stops before its first update, but rank 0 must not set the
// checkpoint aside even when it is the rank that could not read it: the file is sound, and a rerun
// that can read it goes on from it.
TEST_F(Mpi, ACheckpointOneRankCannotReadIsNotSetAside) {
  const std::string bin = ATTN_TRANSLATE_BIN;
  const std::string fault = "env ATTN_TRANSLATE_FAULT_UNREADABLE_STEP=4 ";
  for (const int unreadable_on : {0, 1}) {
    SCOPED_TRACE("unreadable on rank " + std::to_string(unreadable_on));
    const std::string m = path("m" + std::to_string(unreadable_on));
    if (train(2, m, 2, "", 0).exit_code != 0) return;
    if (train(2, m, 4, "--resume", 0).exit_code != 0) return;
    const std::string args = " train --model-dir " + m + " --steps 6 --resume " + common(0);
    const CliResult r = mpirun("-n 1 " + (unreadable_on == 0 ? fault : "") + bin + args +
                               " : -n 1 " + (unreadable_on == 1 ? fault : "") + bin + args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.err, "starting parameters")) << r.err;
    EXPECT_FALSE(contains(r.err, "set aside")) << r.err;
    const auto ckpts = tr::list_checkpoints(m);
    ASSERT_FALSE(ckpts.empty());
    EXPECT_EQ(ckpts.back().first, 4);
    if (train(2, m, 6, "--resume", 0).exit_code != 0) return;
    EXPECT_TRUE(fs::exists(m + "/checkpoint_6.safetensors"));
  }
}

TEST_F(Mpi, RanksThatWouldTrainDifferentlyAreStoppedBeforeTheFirstStep) {
  // Different --steps would leave one rank waiting for the other: refused, by every rank at once.
  const std::string bin = ATTN_TRANSLATE_BIN;
  const std::string args = " train --model-dir " + path("m") + " " + common(0);
  const CliResult r =
      mpirun("-n 1 " + bin + args + " --steps 3 : -n 1 " + bin + args + " --steps 4");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "attn-translate: error: rank 1's --max-tokens, --steps")) << r.err;
  EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << r.err;  // agreed, so no rank is killed
  EXPECT_FALSE(fs::exists(path("m") + "/checkpoint_3.safetensors"));
}

TEST_F(Mpi, FlagsThatDecideTheExchangesAreComparedBeforeAnyOther) {
  // A --resume on rank 0 alone took a path without the barrier the other rank waited in: the
  // job hung before the options were compared. --minutes 0 and 1e-7 were compared as printed
  // with six decimals, alike, and the rank with a time limit waited for the other.
  const std::string bin = ATTN_TRANSLATE_BIN;
  const std::string args = " train --model-dir " + path("m") + " --steps 3 " + common(0);
  for (const auto& [first, second] : std::vector<std::pair<std::string, std::string>>{
           {" --resume", ""}, {" --minutes 0", " --minutes 1e-7"}}) {
    const CliResult r = mpirun("-n 1 " + bin + args + first + " : -n 1 " + bin + args + second);
    EXPECT_EQ(r.exit_code, 1) << first << second << "\n" << r.err;
    EXPECT_TRUE(contains(r.err,
                         "attn-translate: error: rank 1's --max-tokens, --steps, --minutes, "
                         "--resume, --max-tokens-per-rank or --no-overlap-allreduce"))
        << r.err;
    EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << r.err;
  }
  // --max-tokens-per-rank whose whole batch a checkpoint could not record (it wrote checkpoints
  // that --resume then refused).
  std::string flags = common(0);
  flags.replace(flags.find("--max-tokens 128"), 16, "--max-tokens 1099511627776");
  const CliResult r = ranks(
      2, "train --model-dir " + path("m2") + " --steps 3 " + flags + " --max-tokens-per-rank");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "--max-tokens 1099511627776 per rank on 2 ranks is more than "
                       "1099511627776 tokens per batch"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << r.err;
}

// Every rank reads the checkpoint to resume from, from its own copy of the model directory when
// the machines share no file system. Copies with the same weights in another state (written by
// hand, or by a run that went on in one copy) made one rank stop at another update than the
// others, which then waited for its sums for ever, or made the replicas drift apart unseen.
TEST_F(Mpi, RanksThatResumedOtherStatesOfTheSameWeightsAreStoppedBeforeTheFirstStep) {
  const std::string bin = ATTN_TRANSLATE_BIN, m = path("m");
  if (train(2, m, 4, "", 0).exit_code != 0) return;
  using Meta = std::map<std::string, std::string>;
  const auto set = [](const char* key, const char* value) {
    return [=](Meta& meta) {
      ASSERT_NE(meta.at(key), value) << key;
      meta[key] = value;
    };
  };
  const auto flip_first_moment = [](const std::string& name, std::vector<unsigned char>& bytes) {
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".exp_avg") == 0) bytes[3] ^= 0x80;
  };
  const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> edits = {
      {"update count", [&](const std::string& f) { rewrite(f, set("step", "5")); }},
      {"data position", [&](const std::string& f) { rewrite(f, set("data.batch", "1")); }},
      {"dropout stream", [&](const std::string& f) { rewrite(f, set("rng_counter", "7")); }},
      {"Adam moments", [&](const std::string& f) {
         rewrite(
             f, [](Meta&) {}, flip_first_moment);
       }}};
  for (const auto& [what, edit] : edits) {
    SCOPED_TRACE(what);
    const std::string copy = path("copy");
    fs::remove_all(copy);
    fs::copy(m, copy, fs::copy_options::recursive);
    ASSERT_NO_FATAL_FAILURE(edit(copy + "/checkpoint_4.safetensors"));
    const std::string args = " --steps 8 --resume " + common(0);
    const auto start = std::chrono::steady_clock::now();
    const CliResult r = mpirun("-n 1 " + bin + " train --model-dir " + m + args + " : -n 1 " + bin +
                                   " train --model-dir " + copy + args,
                               60);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(contains(r.err,
                         "attn-translate: error: rank 1's update count, data position, Adam "
                         "moments and dropout stream (the training state a checkpoint restores) "
                         "differ from rank 0's"))
        << r.err;
    EXPECT_FALSE(contains(r.err, "MPI_ABORT")) << r.err;  // agreed, so no rank is killed
    EXPECT_LT(seconds, 30);
    EXPECT_FALSE(fs::exists(m + "/checkpoint_8.safetensors"));
  }
  // The copies as they were train on together.
  const std::string copy = path("copy");
  fs::remove_all(copy);
  fs::copy(m, copy, fs::copy_options::recursive);
  const std::string args = " --steps 6 --resume " + common(0);
  const CliResult r = mpirun("-n 1 " + bin + " train --model-dir " + m + args + " : -n 1 " + bin +
                                 " train --model-dir " + copy + args,
                             60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(m + "/checkpoint_6.safetensors"));
}

}  // namespace
