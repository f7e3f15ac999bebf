// attn-translate runs that are interrupted, run side by side or resumed on what another run left:
// a second trainer on a directory, leftover temporary files, checkpoints that do not load, other
// data, a stop request, Ctrl-C, averaging while a trainer prunes, and the stop signal handlers.
// Hostile files and flags: test_reliability.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "corpus_io.hpp"
#include "model_average.hpp"
#include "model_dir.hpp"
#include "reliability_fixture.hpp"
#include "safetensors_edit.hpp"
#include "stop_signal.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;

namespace {

TEST_F(Reliability, ASecondTrainerOnTheDirectoryIsRefused) {
  // Two trainers used to share a directory, each pruning the other's checkpoints.
  const std::string m = path("locked");
  tr::Trainer first(tiny_options(m), split());
  const std::string msg = error_of([&] { tr::Trainer second(tiny_options(m), split()); });
  EXPECT_TRUE(contains(
      msg, "model directory '" + m + "' is in use by another attn-translate train or select"))
      << msg;
}

TEST_F(Reliability, LeftoverTemporaryFilesOfDeadWritersAreRemoved) {
  const std::string m = model_copy();
  std::ifstream pid_max_file("/proc/sys/kernel/pid_max");
  long pid_max = 4194304;
  pid_max_file >> pid_max;
  const std::string dead = m + "/checkpoint_6.safetensors.attn-tmp." + std::to_string(pid_max + 1);
  const std::string alive = m + "/vocab.txt.attn-tmp.1";  // pid 1 exists: its writer may be running
  write_file(dead, "partial");
  write_file(alive, "partial");
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  tr::Trainer t(o, split());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));
}

TEST_F(Reliability, ResumeFallsBackToTheNewestCheckpointThatLoads) {
  const std::string m = model_copy();
  const auto ckpts = tr::list_checkpoints(m);
  ASSERT_EQ(ckpts.size(), 2u);  // steps 2 and 4
  const std::string newest = ckpts.back().second, older = ckpts.front().second;
  const std::string bytes = read_file(newest), older_bytes = read_file(older);
  write_file(newest, bytes.substr(0, bytes.size() / 2));  // truncated, as by a full disk
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  {
    tr::Trainer t(o, split());
    EXPECT_EQ(t.resumed_from(), older);
    EXPECT_EQ(t.step(), 2);
    ASSERT_EQ(t.skipped_checkpoints().size(), 1u);
    EXPECT_TRUE(contains(t.skipped_checkpoints()[0], newest)) << t.skipped_checkpoints()[0];
  }
  // The skipped one is set aside, so that it no longer counts as the newest checkpoint: pruning
  // kept it and removed the ones that load (with --keep 1, every one), and averaging read it.
  EXPECT_EQ(tr::list_checkpoints(m).size(), 1u);
  EXPECT_TRUE(fs::exists(newest + ".unloadable"));
  {
    tr::TrainOptions keep_one = o;
    keep_one.keep = 1;
    tr::Trainer t(keep_one, split());
    t.train(1);
    const std::string third = t.save_checkpoint();
    EXPECT_EQ(tr::list_checkpoints(m), (decltype(ckpts){{3, third}}));
    fs::remove(third);
  }
  write_file(older, older_bytes);
  // A newest checkpoint whose config no longer fits the vocabulary is skipped the same way, and
  // named with the reason.
  write_file(newest, bytes);
  rewrite(newest, [](auto& meta) { meta["config.pad_id"] = "2"; });
  {
    tr::Trainer t(o, split());
    EXPECT_EQ(t.resumed_from(), older);
    ASSERT_EQ(t.skipped_checkpoints().size(), 1u);
    EXPECT_TRUE(contains(t.skipped_checkpoints()[0],
                         "metadata config.pad_id = 2, expected the vocabulary's pad id, 0"))
        << t.skipped_checkpoints()[0];
  }
  // And when none loads, every one is named with its reason (and none is set aside).
  write_file(newest, "junk");
  write_file(older, "junk");
  const std::string msg = error_of([&] { tr::Trainer again(o, split()); });
  EXPECT_TRUE(contains(msg, "--resume: no checkpoint of '" + m + "' loads")) << msg;
  EXPECT_TRUE(contains(msg, newest) && contains(msg, older)) << msg;
  EXPECT_TRUE(fs::exists(newest) && fs::exists(older));
}

TEST_F(Reliability, ResumeOnOtherDataIsRefusedAndAnOldCheckpointWithoutTheKeyIsNot) {
  const std::string m = model_copy();
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  // One training pair fewer, or another corpus (as when --src and --tgt are left out and the
  // built-in corpus is read): the batches differ, and every checkpoint was trained on the others.
  tr::CorpusSplit fewer = split();
  fewer.train.src.pop_back();
  fewer.train.tgt.pop_back();
  tr::CorpusSplit other = split();
  other.train = synthetic(200, 9);
  for (const tr::CorpusSplit* d : {&fewer, &other}) {
    const std::string msg = error_of([&] { tr::Trainer t(o, *d); });
    EXPECT_TRUE(contains(msg, "--resume: " + tr::list_checkpoints(m).back().second +
                                  " was trained on other data (training batches with fingerprint "))
        << msg;
    EXPECT_TRUE(contains(msg, "pass the interrupted run's --src and --tgt")) << msg;
    EXPECT_FALSE(contains(msg, "no checkpoint of")) << msg;  // not taken for a corrupt file
  }
  {
    tr::Trainer same(o, split());
    EXPECT_EQ(same.step(), 4);
  }
  // Checkpoints written before the fingerprint existed resume on whatever they are given.
  for (const auto& [step, path] : tr::list_checkpoints(m))
    rewrite(path, [](auto& meta) { meta.erase("data.fingerprint"); });
  tr::Trainer old(o, fewer);
  EXPECT_EQ(old.step(), 4);
}

TEST_F(Reliability, AVocabularyWithoutWeightsDoesNotBlockANewRun) {
  // What a run killed before its first checkpoint leaves: train and train --resume both refused.
  const std::string m = model_copy();
  for (const auto& [step, path] : tr::list_checkpoints(m)) fs::remove(path);
  fs::remove(m + "/model.safetensors");
  tr::Trainer t(tiny_options(m), split());
  t.train(1);
  EXPECT_EQ(t.step(), 1);
}

TEST_F(Reliability, AStopRequestFinishesTheUpdateAndWritesACheckpoint) {
  const std::string m = path("stopped"), ref = path("uninterrupted");
  tr::TrainOptions o = tiny_options(m);
  o.steps = 4;
  {
    tr::Trainer t(o, split());
    t.train(3);
    tr::set_stop_request(SIGTERM);
    t.train();
    tr::set_stop_request(0);
    EXPECT_TRUE(t.interrupted());
    EXPECT_EQ(t.step(), 3);  // no update lost
    EXPECT_EQ(tr::list_checkpoints(m).back().first, 3);
  }
  o.resume = true;
  tr::Trainer resumed(o, split());
  resumed.train();
  resumed.save_checkpoint();
  tr::TrainOptions u = tiny_options(ref);
  u.steps = 4;
  tr::Trainer straight(u, split());
  straight.train();
  straight.save_checkpoint();
  EXPECT_TRUE(read_file(m + "/checkpoint_4.safetensors") ==
              read_file(ref + "/checkpoint_4.safetensors"));
}

TEST_F(Reliability, CtrlCExits130WithACheckpointAndASecondOneAbortsAtOnce) {
  const tr::CorpusSplit d = split();
  const std::string src = path("train.en"), tgt = path("train.de"), m = path("m");
  tr::write_lines(src, d.train.src);
  tr::write_lines(tgt, d.train.tgt);
  const std::string train = std::string(ATTN_TRANSLATE_BIN) + " train --threads 1 --src " + src +
                            " --tgt " + tgt + " --preset tiny --vocab-size 60 --max-len 32 " +
                            "--valid-every 0 --checkpoint-every 0 --svg 0 --model-dir ";
  auto interrupt = [&](const std::string& model, const std::string& signals) {
    const std::string cmd = "sh -c '" + train + model + " 2> " + model +
                            ".err & pid=$!; sleep 2; " + signals + "; wait $pid; echo $? > " +
                            model + ".rc'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return read_file(model + ".rc");
  };
  EXPECT_EQ(interrupt(m, "kill -INT $pid"), "130\n") << read_file(m + ".err");
  EXPECT_TRUE(contains(read_file(m + ".err"), "interrupted by SIGINT")) << read_file(m + ".err");
  EXPECT_TRUE(contains(read_file(m + ".err"),
                       "train: no --steps or --minutes: "
                       "training until Ctrl-C or SIGTERM"))
      << read_file(m + ".err");
  ASSERT_FALSE(tr::list_checkpoints(m).empty());
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  EXPECT_NO_THROW(tr::Trainer t(o, split()));
  EXPECT_EQ(interrupt(path("t"), "kill -TERM $pid"), "143\n") << read_file(path("t") + ".err");
}

TEST_F(Reliability, AverageLastWhileATrainerPrunesTheSameDirectory) {
  // A trainer saving every update removes its oldest checkpoint as it writes the next, so one that
  // `average --last 2` listed could be gone when it was read: 13 of 70 runs failed with `cannot
  // open .../checkpoint_N.safetensors`. It now lists them again. A race, so this averages for as
  // long as a trainer saves (about 400 times), and every average must succeed.
  const tr::CorpusSplit d = split();
  const std::string m = path("m");
  tr::write_lines(path("train.en"), d.train.src);
  tr::write_lines(path("train.de"), d.train.tgt);
  const std::string train = std::string(ATTN_TRANSLATE_BIN) +
                            " train --threads 1 --preset tiny --vocab-size 60 --max-len 32 " +
                            "--max-tokens 128 --tokens-per-update 128 --steps 300 " +
                            "--checkpoint-every 1 --keep 2 --average 2 --svg 0 " +
                            "--no-eval --src " + path("train.en") + " --tgt " + path("train.de") +
                            " --model-dir " + m + " > /dev/null 2> " + path("err");
  std::atomic<bool> trained{false};
  int rc = -1;
  std::thread trainer([&] {
    rc = std::system(train.c_str());
    trained = true;
  });
  int averages = 0;
  std::vector<std::string> failures;
  while (!trained) {
    std::error_code ec;
    if (!fs::exists(m, ec) || tr::list_checkpoints(m).size() < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    try {
      EXPECT_EQ(tr::average_last(m, 2).size(), 2u);
      ++averages;
    } catch (const std::exception& e) {
      failures.push_back(e.what());
    }
  }
  trainer.join();
  EXPECT_EQ(rc, 0) << read_file(path("err"));
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << averages + failures.size()
                                << " averages failed, the first: " << failures.front();
  EXPECT_GE(averages, 20) << "too few averages ran while the trainer saved";
}

TEST(StopSignal, TheFirstSignalAsksToStopTheSecondEndsTheProcess) {
  // In a child process: two signals sent from a shell may merge into one before delivery.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    tr::install_stop_handlers();
    ::raise(SIGINT);
    if (tr::stop_requested() != SIGINT) ::_exit(2);
    ::raise(SIGTERM);  // the second request, of either kind
    ::_exit(3);        // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
