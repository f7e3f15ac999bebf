// The defects a second hostile pass over attn-translate found (session 18): paths that are not
// regular files (a FIFO hung the reader; an --output onto a FIFO, a symlink or a device was
// replaced by a regular file), model-directory files of any size, train flags that hung
// (--tokens-per-update beyond the data), allocated without bound (--layers 100000) or silently
// meant something else (negative, NaN), a full standard output taken for success, a byte order
// mark kept on interactive input, a wrong averaged-checkpoint count, nothing to score, and an
// unknown ATTN_GEMM. Each is run as a user meets it, through the CLI; the train flags also
// through the Trainer that the CLI wraps.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "sanitizers.hpp"
#include "train_state.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;

namespace {

class HostilePaths : public TrainedModelTest {
 protected:
  static void SetUpTestSuite() { train_suite_model("attn_hostile", 2, 0); }
  // A FIFO at `path`, with no writer: a reader that opens it blocking waits for ever.
  static void make_fifo(const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0); }
  static bool is_fifo(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
  }
};

TEST_F(HostilePaths, OutputOntoAFifoOrASymlinkIsRefusedAndLeftAsItWas) {
  // Both were replaced by a regular file, exit 0 (as root, --output /dev/full replaced the device).
  const std::string fifo = path("fifo"), target = path("target.txt"), link = path("link");
  make_fifo(fifo);
  write_file(target, "keep me\n");
  fs::create_symlink(target, link);
  const std::string in = input("the red cat\n");
  expect_cli_error(
      run("translate --threads 1 --model-dir " + model() + " --input " + in + " --output " + fifo),
      {"refusing to write " + fifo + ": it is a FIFO"});
  expect_cli_error(
      run("translate --threads 1 --model-dir " + model() + " --input " + in + " --output " + link),
      {"refusing to write " + link + ": it is a symbolic link"});
  expect_cli_error(run("average --inputs " + model() + "/model.safetensors --output " + fifo),
                   {"refusing to write " + fifo + ": it is a FIFO"});
  EXPECT_TRUE(is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_file(target), "keep me\n");
}

TEST_F(HostilePaths, AFifoInPlaceOfAModelFileIsRefusedAtOnce) {
  // Each hung in open() or read() (timeout's exit 124 here before).
  for (const std::string name : {"spm.model", "vocab.txt", "model.safetensors"}) {
    SCOPED_TRACE(name);
    const std::string m = model_copy();
    fs::remove(m + "/" + name);
    make_fifo(m + "/" + name);
    expect_cli_error(run_command("timeout 60 " + std::string(ATTN_TRANSLATE_BIN) +
                                     " translate --threads 1 --model-dir " + m,
                                 dir_, input("the red cat\n")),
                     {m + "/" + name + ": expected a regular file, found a FIFO"});
    fs::remove_all(m);
  }
}

TEST_F(HostilePaths, ATextFifoIsWaitedForBrieflyAndNamedIfNoWriterComes) {
  // --src naming a FIFO that no process writes to hung in open() (timeout's exit 124 here).
  const std::string src = path("src_fifo"), tgt = path("tgt_fifo"), in = path("in_fifo");
  make_fifo(src);
  make_fifo(tgt);
  const std::string bin = "timeout 60 " + std::string(ATTN_TRANSLATE_BIN);
  expect_cli_error(
      run_command(bin + " train --threads 1 --preset tiny --model-dir " + path("m") + " --src " +
                      src + " --tgt " + tgt,
                  dir_),
      {"cannot read '" + src + "': it is a FIFO that no process opened for writing within 10 s"});
  // A writer that starts after the reader: its line is translated, not taken for an empty input.
  // (The outer timeout ends the writer too, should translate leave the FIFO without a reader.)
  make_fifo(in);
  const CliResult r =
      run_command("timeout 90 sh -c '" + std::string(ATTN_TRANSLATE_BIN) +
                      " translate --threads 1 --model-dir " + model() + " --input " + in +
                      " --output - & p=$!; sleep 1; echo the red cat > " + in + "; wait $p'",
                  dir_);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(HostilePaths, ADanglingModelLinkIsNamed) {
  // Reported as "has neither model.safetensors nor checkpoint_<step>.safetensors" before, and a
  // fresh train into the directory would have failed only when it wrote its final model.
  const std::string m = model_copy(), final_model = m + "/model.safetensors";
  fs::remove(final_model);
  fs::create_symlink(m + "/missing.safetensors", final_model);
  expect_cli_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")),
                   {"cannot open " + final_model + ": No such file or directory"});
  for (const auto& entry : fs::directory_iterator(m))
    if (entry.path().filename().string().rfind("checkpoint_", 0) == 0) fs::remove(entry.path());
  const std::string src = path("s.txt"), tgt = path("t.txt");
  write_file(src, "a cat\n");
  write_file(tgt, "eine katze\n");
  expect_cli_error(run("train --threads 1 --model-dir " + m + " --src " + src + " --tgt " + tgt),
                   {"model directory '" + m + "' already holds a model (model.safetensors)"});
  fs::remove_all(m);
}

TEST_F(HostilePaths, VocabularyFilesOfAnySizeAreCheckedBeforeTheyAreRead) {
  // vocab.txt and spm.model were read to their end whatever their size (1 GiB: 2.1 GB resident).
  std::string m = model_copy();
  fs::resize_file(m + "/spm.model", std::uintmax_t{300} << 20);  // sparse: no disk used
  expect_cli_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")),
                   {"spm.model: it holds 314572800 bytes, more than the 268435456"});
  fs::remove_all(m);
  m = model_copy();
  write_file(m + "/vocab.txt", read_file(m + "/vocab.txt") + std::string(5000, '\n'));
  expect_cli_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")),
                   {"vocab.txt: it holds", "more than the 4096"});
  write_file(m + "/vocab.txt", read_file(model() + "/vocab.txt") + "junk\n");
  expect_cli_error(run("translate --threads 1 --model-dir " + m, input("the red cat\n")),
                   {"vocab.txt': unexpected 'junk' after the hash line"});
}

TEST_F(HostilePaths, TrainFlagsOutOfRangeAreRefusedBeforeAnyDataIsRead) {
  struct Case {
    std::string flags, expected;
  };
  const std::vector<Case> cases = {
      // std::bad_alloc, or 15 GB resident before it (and deaf to SIGTERM meanwhile).
      {"--layers 100000", "--layers 100000 is more than the 1024 a model file may hold"},
      {"--d-model 2147483648", "--d-model 2147483648 is more than the 65536"},
      {"--d-model 16384 --d-ff 1048576 --heads 8",
       "GiB for its weights, gradients and Adam's moments, more than the "},
      // Negative or NaN: the preset's value, or no limit, without a word.
      {"--d-model -16", "--d-model must be >= 0 (0: the preset's), got -16"},
      {"--steps -1", "--steps must be >= 0 (0: no limit), got -1"},
      {"--minutes nan", "--minutes must be finite and >= 0 (0: no limit), got nan"},
      {"--dropout nan", "--dropout must be in [-1, 1) (< 0: the preset's), got nan"},
      {"--attention-dropout -2",
       "--attention-dropout must be in [-1, 1) (< 0: the preset's), got -2"},
      {"--keep 0", "--keep must be >= 1, got 0"},
      {"--lr-factor 0", "--lr-factor must be finite and > 0, got 0"},
      {"--cooldown -1", "--cooldown must be >= 0 (0: off), got -1"},
      {"--cooldown 10",
       "--cooldown 10 needs --steps of at least as many updates (the run's "
       "length, where the learning rate reaches zero), got --steps 0"},
      {"--cooldown 10 --steps 9", "--cooldown 10 needs --steps of at least as many updates"},
      {"--max-len 1", "--max-len must be in [2, 65536], got 1"},
      {"--bpe-dropout 1", "--bpe-dropout must be in [0, 0.99] (0: off), got 1"},
      {"--bpe-dropout nan", "--bpe-dropout must be in [0, 0.99] (0: off), got nan"},
      // Found only after the vocabulary was trained.
      {"--max-tokens 1", "--max-tokens 1 must be at least --max-len 128 so that a pair"},
      // Out of 64 bits: CLI11 clamped them (and wrapped -1 to 2^64 - 1) without a word.
      {"--seed -1", "expected a decimal integer in [0, 18446744073709551615], got -1"},
      {"--seed 18446744073709551616", "expected a decimal integer in [0, 18446744073709551615]"},
      {"--steps 9223372036854775808",
       "expected a decimal integer in [-9223372036854775808, 9223372036854775807], got "
       "9223372036854775808"},
      {"--steps 12abc", "expected a decimal integer in [-9223372036854775808"},
      // CLI11 read a leading 0 as octal (--steps 010 ran 8 steps) and 0x as hexadecimal, and int
      // fields out of 32 bits were "Could not convert" without a range.
      {"--keep 010 --average 11",
       "--average 11 averages the last 11 checkpoints, but --keep 10 keeps only 10"},
      {"--steps 0x10", "--steps: expected a decimal integer in [-9223372036854775808"},
      {"--keep 9223372036854775807",
       "--keep: expected a decimal integer in [-2147483648, 2147483647], got 9223372036854775807"},
      {"--show 2147483648", "--show: expected a decimal integer in [-2147483648, 2147483647]"},
      {"--keep 99999999999999999999",
       "--keep: expected a decimal integer in [-2147483648, 2147483647]"},
      {"--vocab-size 3000000", "--vocab-size must be in [1, 2097152], got 3000000"},
      {"--average 2 --keep 1",
       "--average 2 averages the last 2 checkpoints, but --keep 1 keeps only 1"},
      // Found only after the vocabulary was trained (21 s on the built-in corpus).
      {"--warmup 0", "--warmup must be >= 1, got 0"},
      {"--d-model 15", "divisible"},
      // Beyond the data: the update never ended.
      {"--tokens-per-update 9223372036854775807",
       "--tokens-per-update must be in [0, 1099511627776] (0: one batch), got 9223372036854775807"},
      // Session 41: under an address-space limit libgomp failed to create 1000 threads and exited
      // on its own; sentencepiece's trainer refused more than 128 with an error naming no flag.
      {"--threads 1000", "--threads: expected a number in [1,256], got 1000"},
      // The model config's message, which named its src_vocab.
      {"--vocab-size 0", "--vocab-size must be in [1, 2097152], got 0"},
      // CLI11's bound of DBL_MAX, printed in 310 digits.
      {"--threads 0", "expected a number > 0, got 0"},
      {"--clip-norm inf", "--clip-norm must be finite and >= 0 (0: off), got inf"},
      {"--sentence-weight 100000", "expected a number in [1,1000], got 100000"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const std::string m = path("m");
    const CliResult r = run("train --preset tiny --model-dir " + m + " " + c.flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.err, c.expected)) << r.err;
    EXPECT_FALSE(fs::exists(m + "/spm.model"));  // refused before the vocabulary was trained
  }
}

// Sized against physical memory alone, a model that fits in it but not under the process's
// address-space limit passed, and training ended in "std::bad_alloc" with the vocabulary written.
TEST_F(HostilePaths, AModelBeyondTheAddressSpaceLimitIsRefusedBeforeAnyDataIsRead) {
  if (attn::testing::kSanitized)
    GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  const std::string m = path("m");
  const CliResult r =
      run_command("ulimit -v 4000000; " + std::string(ATTN_TRANSLATE_BIN) +
                      " train --preset tiny --model-dir " + m + " --d-model 4096 --d-ff 16384",
                  dir_);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "GiB this process may use (its machine's memory or its "
                       "address-space or data limit;"))
      << r.err;
  EXPECT_FALSE(fs::exists(m + "/spm.model"));
}

// The Trainer checks its options as the CLI checks the flags (TrainOptions::validate, in its
// first member's initializer): the flag's message, before the model directory is even made. It
// used to check a few, after the vocabulary was trained; --keep 0, --average over more than
// --keep or a NaN --minutes it took.
TEST_F(HostilePaths, ATrainerRefusesBadOptionsWithTheFlagsMessage) {
  struct Case {
    std::string flags;
    std::function<void(tr::TrainOptions&)> set;
  };
  const std::vector<Case> cases = {
      {"--keep 0", [](tr::TrainOptions& o) { o.keep = 0; }},
      {"--average 2 --keep 1",
       [](tr::TrainOptions& o) {
         o.average = 2;
         o.keep = 1;
       }},
      {"--minutes nan", [](tr::TrainOptions& o) { o.minutes = std::nan(""); }},
      {"--steps -1", [](tr::TrainOptions& o) { o.steps = -1; }},
      {"--max-len 1", [](tr::TrainOptions& o) { o.max_len = 1; }},
      {"--bpe-dropout -0.1", [](tr::TrainOptions& o) { o.bpe_dropout = -0.1; }},
      {"--tokens-per-update -1", [](tr::TrainOptions& o) { o.tokens_per_update = -1; }},
      {"--cooldown 10", [](tr::TrainOptions& o) { o.cooldown = 10; }},
      {"--lr-factor 0", [](tr::TrainOptions& o) { o.lr_factor = 0; }},
      {"--vocab-size 0", [](tr::TrainOptions& o) { o.vocab_size = 0; }},
      {"--max-tokens 1", [](tr::TrainOptions& o) { o.max_tokens = 1; }},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].flags);
    const std::string m = path("m" + std::to_string(i));
    tr::TrainOptions o;  // the flags' defaults
    o.model_dir = m;
    o.preset = "tiny";
    o.quiet = true;
    cases[i].set(o);
    const std::string msg = error_of<attn::ConfigError>([&] { tr::Trainer t(o, split()); });
    EXPECT_FALSE(msg.empty());
    EXPECT_FALSE(fs::exists(m));
    const CliResult r = run("train --preset tiny --model-dir " + m + " " + cases[i].flags);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.err, msg)) << "Trainer: " << msg << "\nCLI: " << r.err;
  }
  tr::TrainOptions no_dir;
  no_dir.quiet = true;
  EXPECT_TRUE(contains(error_of<attn::ConfigError>([&] { tr::Trainer t(no_dir, split()); }),
                       "train: --model-dir is required"));
}

TEST_F(HostilePaths, TokensPerUpdateBeyondTheTrainingDataIsRefused) {
  const tr::CorpusSplit data = split();
  tr::write_lines(path("train.en"), data.train.src);
  tr::write_lines(path("train.de"), data.train.tgt);
  expect_cli_error(run("train --threads 1 --preset tiny --vocab-size 60 --model-dir " + path("m") +
                       " --src " + path("train.en") + " --tgt " + path("train.de") +
                       " --tokens-per-update 1000000000 --steps 1 --no-eval"),
                   {"--tokens-per-update 1000000000 is more than the ",
                    " target tokens of all the training data"});
}

TEST_F(HostilePaths, AFullStandardOutputIsAnError) {
  // Exit 0 before, the translations and the score lost. 2,000 lines overflow the stream's
  // buffer, so the write fails before the final flush and its reason must still be named.
  const std::string bin = ATTN_TRANSLATE_BIN, one = input("the red cat\n");
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "the red cat\n";
  const std::string in = path("many.txt"), refs = path("refs.txt");
  write_file(in, many);
  write_file(refs, "die rote Katze\n");
  for (const std::string& args : {"translate --threads 1 --model-dir " + model() + " --input " + in,
                                  "translate --threads 1 --model-dir " + model() + " < " + one,
                                  "evaluate --hyp " + refs + " --ref " + refs}) {
    SCOPED_TRACE(args);
    const CliResult r = run_command("sh -c '" + bin + " " + args + " > /dev/full'", dir_);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "to standard output: No space left on device")) << r.err;
  }
}

TEST_F(HostilePaths, InteractiveTranslateDropsAByteOrderMark) {
  // It was translated as part of the first word; --input dropped it.
  const CliResult plain = run("translate --threads 1 --model-dir " + model(), input("red cat\n"));
  const CliResult bom =
      run("translate --threads 1 --model-dir " + model(), input("\xEF\xBB\xBFred cat\n"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(bom.exit_code, 0) << bom.err;
  EXPECT_EQ(bom.out, plain.out);
}

TEST_F(HostilePaths, EvaluateRefusesNothingToScore) {
  // BLEU = 0.00 and exit 0 before.
  const std::string empty = path("empty.txt"), blank = path("blank.txt"), hyp = path("hyp.txt");
  write_file(empty, "");
  write_file(blank, "\n\n");
  write_file(hyp, "a b\nc d\n");
  expect_cli_error(run("evaluate --hyp " + empty + " --ref " + empty), {"is empty: nothing"});
  expect_cli_error(
      run("evaluate --threads 1 --model-dir " + model() + " --src " + empty + " --ref " + empty),
      {"is empty: nothing to score"});
  expect_cli_error(run("evaluate --hyp " + hyp + " --ref " + blank),
                   {"line 1: expected a reference sentence, found an empty line"});
}

TEST_F(HostilePaths, AnUnknownAttnGemmIsRefused) {
  // Ignored before: the automatic path ran, and a mistyped "eigen" tested nothing.
  const CliResult r = run_command("ATTN_GEMM=EIGEN " + std::string(ATTN_TRANSLATE_BIN) +
                                      " translate --threads 1 --model-dir " + model(),
                                  dir_, input("red cat\n"));
  expect_cli_error(r, {"ATTN_GEMM: expected eigen, avx2, avx512 or nothing (automatic), got "
                       "'EIGEN'"});
}

TEST_F(HostilePaths, TheReportNamesTheCheckpointsAveraged) {
  // The test-BLEU line said "average of the last 5 checkpoints" where 2 were averaged.
  const tr::CorpusSplit data = split();
  for (const char* side : {"src", "tgt"}) {
    tr::write_lines(path(std::string("train.") + side),
                    side[0] == 's' ? data.train.src : data.train.tgt);
    tr::write_lines(path(std::string("test.") + side),
                    side[0] == 's' ? data.test.src : data.test.tgt);
  }
  const CliResult r =
      run("train --threads 1 --preset tiny --vocab-size 60 --max-tokens 128 --max-len 32 "
          "--warmup 20 --model-dir " +
          path("m") + " --src " + path("train.src") + " --tgt " + path("train.tgt") +
          " --test-src " + path("test.src") + " --test-tgt " + path("test.tgt") +
          " --steps 2 --checkpoint-every 1 --keep 5 --average 5 --valid-every 0 --show 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "model.safetensors = average of the last 2 checkpoints")) << r.out;
}

// --resume on other, smaller data: the data is named, not every checkpoint as failing to load
// (the check of --tokens-per-update against the data came before the data's fingerprint).
TEST_F(HostilePaths, ResumeOnSmallerOtherDataNamesTheData) {
  tr::TrainOptions o = tiny_options(path("m"));  // 300 target tokens per update
  {
    tr::Trainer t(o, split());
    t.train(1);
    t.save_checkpoint();
  }
  o.resume = true;
  tr::CorpusSplit few = split();
  few.train = synthetic(5, 9);  // fewer than 300 target tokens in all
  try {
    tr::Trainer(o, few);
    FAIL() << "resumed on other data";
  } catch (const tr::OtherDataError& e) {
    EXPECT_TRUE(contains(e.what(), "was trained on other data")) << e.what();
  }
}

}  // namespace
