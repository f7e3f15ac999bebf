// What a resumed run must give: the files of a run never interrupted. A kill and resume audit
// (session 41) found two ways they differed, and two ways a signal or a failed rename was handled
// wrongly:
//   - the loss a log line shows (and the curves a checkpoint stores) averaged only the updates
//     since the resume, when a run resumed between two log points;
//   - the checkpoint a signal wrote pushed an older one out under --keep, and was averaged into
//     model.safetensors in its place;
//   - after the last update, the first SIGINT or SIGTERM was ignored (the final validation and
//     test report ran on for minutes): now tested in the command too;
//   - a corrupt newest checkpoint that could not be set aside made every checkpoint that loads
//     "not load".
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "model_dir.hpp"
#include "stop_signal.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;
using attn::Index;

namespace {

class ResumeExact : public TempDirTest {};

/// 12 updates, a checkpoint every 4, the last 2 kept and averaged, a log line every 3 updates.
tr::TrainOptions run_options(const std::string& dir) {
  tr::TrainOptions o = tiny_options(dir);
  o.steps = 12;
  o.checkpoint_every = 4;
  o.keep = 2;
  o.average = 2;
  o.log_every = 3;
  return o;
}

/// The run of run_options in `dir`, stopped by SIGTERM after each of `stops` (ascending steps)
/// and resumed, then finished.
void run_with_stops(const std::string& dir, const std::vector<Index>& stops) {
  tr::TrainOptions o = run_options(dir);
  for (const Index stop : stops) {
    tr::Trainer t(o, split());
    ASSERT_LT(t.step(), stop);
    t.train(stop - t.step());
    tr::set_stop_request(SIGTERM);
    t.train();  // as a signal during the update does: its checkpoint, then a stop
    tr::set_stop_request(0);
    ASSERT_EQ(t.interrupted_by(), SIGTERM);
    const auto ckpts = tr::list_checkpoints(dir);
    EXPECT_EQ(ckpts.back().first, stop);
    EXPECT_EQ(ckpts.size(), 3u)
        << "the signal's checkpoint displaced one, or an earlier one stayed";
    o.resume = true;
  }
  tr::Trainer t(o, split());
  t.train();
  t.finish();
  EXPECT_EQ(t.averaged(), 2);
}

TEST_F(ResumeExact, RunsStoppedBySignalsBetweenCheckpointsAndLogPointsEndAsAnUninterruptedOne) {
  const std::string a = path("a");
  {
    tr::Trainer t(run_options(a), split());
    t.train();
    t.finish();
  }
  // Step 11: between the checkpoints of 8 and 12 and the log points 9 and 12. Steps 9 and 10: a
  // second signal before the next checkpoint, whose resume point replaces the first.
  for (const std::vector<Index>& stops : {std::vector<Index>{11}, std::vector<Index>{9, 10}}) {
    const std::string b = path("b" + std::to_string(stops.size()));
    run_with_stops(b, stops);
    const auto ckpts = tr::list_checkpoints(b);
    ASSERT_EQ(ckpts.size(), 2u);
    EXPECT_EQ(ckpts[0].first, 8);
    EXPECT_EQ(ckpts[1].first, 12);
    // Byte for byte: the curves in the checkpoint's metadata, the weights, Adam, the average.
    for (const std::string file :
         {"checkpoint_8.safetensors", "checkpoint_12.safetensors", "model.safetensors"})
      EXPECT_EQ(read_file(a + "/" + file), read_file(b + "/" + file)) << file << ", " << stops[0];
  }
}

TEST_F(ResumeExact, ASignalAfterTheLastUpdateLeavesTheFilesOfAnUninterruptedRun) {
  // 11 updates, off the checkpoint schedule: the signal's checkpoint is the run's last, and
  // finish() writes it again without the mark, as the uninterrupted run writes its last.
  const std::string a = path("a"), b = path("b");
  tr::TrainOptions o = run_options(a);
  o.steps = 11;
  {
    tr::Trainer t(o, split());
    t.train();
    t.finish();
  }
  o.model_dir = b;
  {
    tr::Trainer t(o, split());
    t.train();
    tr::set_stop_request(SIGINT);
    t.train();
    tr::set_stop_request(0);
    ASSERT_EQ(t.interrupted_by(), SIGINT);
  }
  o.resume = true;
  {
    tr::Trainer t(o, split());
    t.train();
    t.finish();
  }
  for (const std::string file :
       {"checkpoint_8.safetensors", "checkpoint_11.safetensors", "model.safetensors"})
    EXPECT_EQ(read_file(a + "/" + file), read_file(b + "/" + file)) << file;
}

TEST_F(ResumeExact, ASignalBeforeTheFirstUpdateLeavesTheUntrainedWeightsOutOfTheAverage) {
  // With --checkpoint-every 0 a signal during start-up wrote checkpoint_0, the untrained weights,
  // and the resumed run averaged them into model.safetensors with its final checkpoint.
  tr::TrainOptions o = run_options(path("a"));
  o.checkpoint_every = 0;
  {
    tr::Trainer t(o, split());
    t.train();
    t.finish();
    EXPECT_EQ(t.averaged(), 0);  // one checkpoint: the model is its weights
  }
  o.model_dir = path("b");
  {
    tr::Trainer t(o, split());
    tr::set_stop_request(SIGTERM);
    t.train();
    tr::set_stop_request(0);
    ASSERT_EQ(t.interrupted_by(), SIGTERM);
    ASSERT_EQ(tr::list_checkpoints(o.model_dir).size(), 1u);
    EXPECT_EQ(tr::list_checkpoints(o.model_dir)[0].first, 0);
  }
  o.resume = true;
  {
    tr::Trainer t(o, split());
    t.train();
    t.finish();
    EXPECT_EQ(t.averaged(), 0);
  }
  const auto ckpts = tr::list_checkpoints(o.model_dir);
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].first, 12);
  for (const std::string file : {"checkpoint_12.safetensors", "model.safetensors"})
    EXPECT_EQ(read_file(path("a") + "/" + file), read_file(o.model_dir + "/" + file)) << file;
}

TEST_F(ResumeExact, FinishHandsOverOnceTheFinalCheckpointIsOnDisk) {
  // attn-translate ends its signal handling there (end_stop_handling): a signal after that point
  // ends the process at once, and must find the last update validated and in a checkpoint, from
  // which `train --resume` writes the model. Before, a signal in the final validation, averaging
  // or test report was ignored for minutes.
  const std::string m = path("m");
  tr::TrainOptions o = run_options(m);
  o.steps = 11;  // off the checkpoint schedule: finish() writes the last checkpoint
  tr::Trainer t(o, split());
  t.train();
  int calls = 0;
  t.finish([&] {
    ++calls;
    const auto ckpts = tr::list_checkpoints(m);
    ASSERT_FALSE(ckpts.empty());
    EXPECT_EQ(ckpts.back().first, 11);
    ASSERT_FALSE(t.curves().empty());
    EXPECT_EQ(t.curves().back().step, 11);  // the final validation came first
    EXPECT_FALSE(fs::exists(m + "/model.safetensors"));
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(fs::exists(m + "/model.safetensors"));
  EXPECT_EQ(t.averaged(), 2);
}

TEST_F(ResumeExact, TheCommandEndsOnASignalWhileItTranslatesTheTestSet) {
  // cli_train.cpp hands the signals back to their default action once the final checkpoint is on
  // disk (trainer.finish(end_stop_handling)): a SIGTERM while the test set is translated ends the
  // process by that signal, which the shell reports as 143. Without it the handler notes the
  // request, nothing looks at it, and the report runs to its end: exit 0.
  const tr::CorpusSplit d = split();
  std::vector<std::string> test_src, test_tgt;  // 2,000 sentences: half a minute of beam search
  for (int copy = 0; copy < 10; ++copy) {
    test_src.insert(test_src.end(), d.train.src.begin(), d.train.src.end());
    test_tgt.insert(test_tgt.end(), d.train.tgt.begin(), d.train.tgt.end());
  }
  const std::string m = path("m"), err = path("err"), rc = path("rc");
  tr::write_lines(path("train.en"), d.train.src);
  tr::write_lines(path("train.de"), d.train.tgt);
  tr::write_lines(path("test.en"), test_src);
  tr::write_lines(path("test.de"), test_tgt);
  const std::string train =
      std::string(ATTN_TRANSLATE_BIN) + " train --threads 1 --preset tiny --vocab-size 60 " +
      "--max-len 32 --steps 2 --valid-every 0 --svg 0 --src " + path("train.en") + " --tgt " +
      path("train.de") + " --test-src " + path("test.en") + " --test-tgt " + path("test.de") +
      " --model-dir " + m;
  // The signal goes once the model is written (the line before the test report), or after 60 s.
  const std::string cmd = "sh -c '" + train + " > /dev/null 2> " + err +
                          " & pid=$!; i=0; while ! grep -qs \"model written to\" " + err +
                          " && kill -0 $pid && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); " +
                          "done; kill -TERM $pid; wait $pid; echo $? > " + rc + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(read_file(rc), "143\n") << read_file(err);
  EXPECT_TRUE(contains(read_file(err), "model written to")) << read_file(err);
  EXPECT_TRUE(fs::exists(m + "/model.safetensors"));
}

TEST_F(ResumeExact, ACheckpointThatCannotBeSetAsideIsNamedAsSuch) {
  const std::string m = path("m");
  tr::TrainOptions o = run_options(m);
  o.steps = 8;
  {
    tr::Trainer t(o, split());
    t.train();
  }
  const auto ckpts = tr::list_checkpoints(m);
  ASSERT_EQ(ckpts.size(), 2u);
  const std::string newest = ckpts.back().second;
  write_file(newest, "junk");
  // Where the rename would put it: a directory that is not empty, so the rename fails (as on a
  // read-only file system, which root's tests cannot make).
  fs::create_directories(newest + ".unloadable/x");
  o.resume = true;
  const std::string msg = error_of([&] { tr::Trainer t(o, split()); });
  EXPECT_TRUE(contains(msg, "cannot rename the checkpoint that does not load, '" + newest + "'"))
      << msg;
  EXPECT_FALSE(contains(msg, "no checkpoint of")) << msg;
}

TEST(StopSignal, AfterTheLastUpdateASignalEndsTheProcessAtOnce) {
  // In child processes: the first signal after end_stop_handling ends the process, and so does
  // one that came before it and that no update looked for.
  for (const bool pending : {false, true}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      tr::install_stop_handlers();
      if (pending) ::raise(SIGTERM);  // asks to stop; the process goes on
      tr::end_stop_handling();
      if (!pending) ::raise(SIGTERM);
      ::_exit(3);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit code " << WEXITSTATUS(status) << ", " << pending;
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
  }
}

}  // namespace
