// Hostile input to attn-translate (issue 10): tampered model files, absurd command-line values,
// malformed checkpoint metadata, a byte order mark. Each case is run the way a user meets it
// (the CLI, or the Trainer/Translator the CLI wraps) and the message is checked.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <attn/train/safetensors.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "corpus_io.hpp"
#include "model_average.hpp"
#include "model_dir.hpp"
#include "safetensors_edit.hpp"
#include "stop_signal.hpp"
#include "train_state.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;

namespace {

class Reliability : public TrainedModelTest {
 protected:
  static void SetUpTestSuite() { train_suite_model("attn_reliability", 4, 2); }
  void expect_error(const CliResult& r, const std::vector<std::string>& expected) {
    expect_cli_error(r, expected);
  }
};

TEST_F(Reliability, AbsurdDecodeFlagsAreRefusedWithTheirBounds) {
  // These crashed with SIGSEGV (beam rows and cache sizes overflowed) or printed blank lines
  // (the output length limit overflowed in greedy decoding).
  const std::string m = (suite_dir_ / "model").string(), in = input("the red cat\n");
  expect_error(run("translate --threads 1 --model-dir " + m + " --beam 4611686018427387904", in),
               {"beam_size must be in [1, 256], got 4611686018427387904"});
  expect_error(
      run("translate --threads 1 --model-dir " + m + " --max-extra-length 36028797018963961", in),
      {"max_extra_length must be in [0, 4096], got 36028797018963961"});
  expect_error(run("translate --threads 1 --greedy --model-dir " + m +
                       " --max-extra-length 9223372036854775807",
                   in),
               {"max_extra_length must be in [0, 4096]"});
  expect_error(run("translate --threads 1 --model-dir " + m + " --max-extra-length -1", in),
               {"max_extra_length must be in [0, 4096], got -1"});
}

TEST_F(Reliability, TamperedModelConfigIsRefusedBeforeTheModelIsBuilt) {
  struct Case {
    std::map<std::string, std::string> set;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      // SIGSEGV and std::bad_alloc before: the model was built from these first.
      {{{"config.src_vocab", "144115188075855872"}, {"config.tgt_vocab", "144115188075855872"}},
       {"model.safetensors: metadata config.src_vocab = 144115188075855872 is outside [0, "
        "16777216]"}},
      {{{"config.d_model", "1099511627776"}}, {"config.d_model = 1099511627776 is outside"}},
      // Within every bound, but a model far larger than the file's tensors.
      {{{"config.d_model", "65536"}, {"config.d_ff", "1048576"}},
       {"model.safetensors: its config.* metadata describes a model of at least",
        "but the file holds only"}},
      {{{"config.d_model", "64abc"}}, {"config.d_model = \"64abc\" is not a decimal integer"}},
      {{{"config.seed", "-1"}}, {"config.seed = \"-1\" is not a non-negative decimal integer"}},
      {{{"config.dropout", "nan"}}, {"config.dropout = \"nan\" is not a finite number"}},
      {{{"config.heads", "3"}}, {"model.safetensors", "must be divisible by heads (3)"}},
      // Accepted before: a padding mask on the wrong id, or a vocabulary other than spm.model's.
      {{{"config.pad_id", "2"}},
       {"model.safetensors: metadata config.pad_id = 2, expected the vocabulary's pad id, 0"}},
      {{{"config.src_vocab", "100"}, {"config.tgt_vocab", "100"}},
       {"model.safetensors: metadata config.src_vocab = 100 and config.tgt_vocab = 100, expected "
        "both to be the vocabulary's size"}},
      // Read as 12 before.
      {{{"translate.max_len", "12abc"}},
       {"model.safetensors: metadata translate.max_len = \"12abc\" is not a decimal integer"}},
      {{{"translate.max_len", "0"}}, {"translate.max_len = 0 is outside [1, 65536]"}},
  };
  for (const Case& c : cases) {
    const std::string m = model_copy();
    rewrite(m + "/model.safetensors", [&](auto& meta) {
      for (const auto& [k, v] : c.set) meta[k] = v;
    });
    SCOPED_TRACE(c.set.begin()->first + " = " + c.set.begin()->second);
    expect_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")), c.expected);
    fs::remove_all(m);
  }
}

TEST_F(Reliability, NonFiniteWeightsAreRefused) {
  // A NaN weight used to translate every line to an empty one, with exit code 0.
  const std::string m = model_copy();
  rewrite(
      m + "/model.safetensors", [](auto&) {},
      [](const std::string& name, std::vector<unsigned char>& bytes) {
        if (name != "encoder.layers.0.linear1.weight") return;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(bytes.data() + 4 * 5, &nan, 4);
      });
  expect_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")),
               {"model.safetensors: parameter encoder.layers.0.linear1.weight holds a non-finite "
                "value (nan) at element 5"});
}

TEST_F(Reliability, AByteOrderMarkIsNotPartOfTheFirstWord) {
  const std::string m = (suite_dir_ / "model").string();
  const CliResult plain =
      run("translate --threads 1 --greedy --model-dir " + m, input("the red cat\nthe dog\n"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string bom_file = path("bom.txt");
  write_file(bom_file, "\xEF\xBB\xBFthe red cat\nthe dog\n");
  EXPECT_EQ(tr::read_lines(bom_file), (std::vector<std::string>{"the red cat", "the dog"}));
  for (const std::string& args : {"--input " + bom_file, std::string()}) {
    const CliResult r =
        run("translate --threads 1 --greedy --model-dir " + m + " " + args, bom_file);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << args;
  }
}

TEST_F(Reliability, AStrayCheckpointNameIsIgnoredNotABareStoll) {
  const std::string m = model_copy();
  write_file(m + "/checkpoint_99999999999999999999.safetensors", "junk");
  write_file(m + "/checkpoint_-3.safetensors", "junk");
  const auto ckpts = tr::list_checkpoints(m);
  ASSERT_EQ(ckpts.size(), 2u);
  EXPECT_EQ(ckpts.back().first, 4);
  const CliResult r = run("translate --threads 1 --greedy --model-dir " + m, input("a dog\n"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Reliability, MalformedTrainingStateNamesFileAndKey) {
  struct Case {
    const char* key;
    const char* value;
    const char* expected;
    const char* key2 = nullptr;  // and a second key, for values that disagree
    const char* value2 = nullptr;
  };
  const std::vector<Case> cases = {
      {"data.epoch", "x", "metadata data.epoch = \"x\" is not a non-negative decimal integer"},
      {"data.epoch", "99999999999999999999", "data.epoch = \"99999999999999999999\" is not"},
      {"data.batch", "100000", "metadata data.batch = 100000 is outside [0, "},
      {"train.warmup", "4000.5", "metadata train.warmup = \"4000.5\" is not a decimal integer"},
      {"train.max_tokens", "1e300", "train.max_tokens = \"1e300\" is not a decimal integer"},
      {"train.label_smoothing", "1.5", "train.label_smoothing = 1.5 is outside [0, "},
      {"train.seed", "", "train.seed = \"\" is not"},
      {"curves", "4,1.5,nan", "curves does not end with ';'"},
      {"curves", "4,1.5;", "item \"4,1.5\" is not step,train_loss,valid_loss,valid_bleu"},
      {"curves", "4,1,2,3,5;", "is not step,train_loss,valid_loss,valid_bleu"},
      {"curves", "x,1,2,3;", "curves step = \"x\" is not a decimal integer"},
      {"curves", "4,1,inf,3;", "curves: \"inf\" is not a number or nan"},
      {"step", "18446744073709551616", "metadata \"step\" must be a non-negative decimal integer"},
      {"data.fingerprint", "12g4", "data.fingerprint: expected 16 hex digits, got '12g4'"},
      {"data.fingerprint", "-000000000000001", "expected 16 hex digits, got '-000000000000001'"},
      // Each in range, but no run saves them: a cooldown without its end, an end without a
      // cooldown, one that ended before the checkpoint's step 4.
      {"train.cooldown", "3",
       "metadata train.cooldown 3 and train.cooldown_end 0 at step 4 are not a schedule a run "
       "saves"},
      {"train.cooldown_end", "9", "train.cooldown 0 and train.cooldown_end 9 at step 4"},
      {"train.cooldown", "2", "train.cooldown 2 and train.cooldown_end 3 at step 4",
       "train.cooldown_end", "3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value);
    const std::string m = model_copy();
    const std::string newest = tr::list_checkpoints(m).back().second;
    rewrite(newest, [&](auto& meta) {
      meta[c.key] = c.value;
      if (c.key2 != nullptr) meta[c.key2] = c.value2;
    });
    for (const auto& [step, path] : tr::list_checkpoints(m))
      if (path != newest) fs::remove(path);  // no older checkpoint to fall back to
    tr::TrainOptions o = tiny_options(m);
    o.resume = true;
    const std::string msg = error_of([&] { tr::Trainer t(o, split()); });
    EXPECT_TRUE(contains(msg, newest)) << msg;
    EXPECT_TRUE(contains(msg, c.expected)) << msg;
    fs::remove_all(m);
  }
}

TEST_F(Reliability, ASecondTrainerOnTheDirectoryIsRefused) {
  // Two trainers used to share a directory, each pruning the other's checkpoints.
  const std::string m = path("locked");
  tr::Trainer first(tiny_options(m), split());
  const std::string msg = error_of([&] { tr::Trainer second(tiny_options(m), split()); });
  EXPECT_TRUE(
      contains(msg, "model directory '" + m + "' is in use by another attn-translate train"))
      << msg;
}

TEST_F(Reliability, LeftoverTemporaryFilesOfDeadWritersAreRemoved) {
  const std::string m = model_copy();
  std::ifstream pid_max_file("/proc/sys/kernel/pid_max");
  long pid_max = 4194304;
  pid_max_file >> pid_max;
  const std::string dead = m + "/checkpoint_6.safetensors.tmp." + std::to_string(pid_max + 1);
  const std::string alive = m + "/vocab.txt.tmp.1";  // pid 1 exists: its writer may be running
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

TEST(TrainState, CurvesRoundTripWithNaNAndRefuseWhatTheyDoNotHold) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<tr::CurvePoint> curves = {{1, 2.5, nan, nan}, {20, 0.125, 1.0 / 3, 12.5}};
  const auto back = tr::decode_curves(tr::encode_curves(curves), "f");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].step, 20);
  EXPECT_EQ(back[1].valid_loss, 1.0 / 3);
  EXPECT_TRUE(std::isnan(back[0].valid_bleu));
  EXPECT_TRUE(tr::decode_curves("", "f").empty());
  // The old decoder stepped past the end of an item without commas (reading beyond the string).
  for (const char* bad : {"7", "7;", "7,", "7,1,2,", ",,,;", "7,1,2,3;8"})
    EXPECT_TRUE(contains(error_of([&] { tr::decode_curves(bad, "ck.safetensors"); }),
                         "ck.safetensors: metadata curves"))
        << bad;
}

}  // namespace
