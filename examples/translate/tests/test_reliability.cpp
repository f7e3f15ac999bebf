// Hostile input to attn-translate (issue 10): tampered model files, absurd command-line values,
// malformed checkpoint metadata, a byte order mark. Each case is run the way a user meets it
// (the CLI, or the Trainer/Translator the CLI wraps) and the message is checked. Interrupted,
// concurrent and resumed runs: test_reliability_interrupts.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <attn/decode/options.hpp>
#include <attn/train/safetensors.hpp>

#include "corpus_io.hpp"
#include "model_dir.hpp"
#include "reliability_fixture.hpp"
#include "safetensors_edit.hpp"
#include "train_state.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

namespace {

TEST_F(Reliability, AbsurdDecodeFlagsAreRefusedWithTheirBounds) {
  // These crashed with SIGSEGV (beam rows and cache sizes overflowed) or printed blank lines
  // (the output length limit overflowed in greedy decoding). They are refused as the flags are
  // parsed, with the flag's name: an interactive translate (stdin to stdout; here an empty stdin)
  // took them and exited 0, and refused only its first line, naming DecodeOptions' fields.
  const std::string m = (suite_dir_ / "model").string(), in = input("the red cat\n");
  const std::pair<std::string, std::string> cases[] = {
      {"--beam 4611686018427387904",
       "--beam: expected a decimal integer in [-2147483648, 2147483647], got 4611686018427387904"},
      {"--beam 0", "--beam: expected a number in [1,256], got 0"},
      {"--max-extra-length 36028797018963961",
       "--max-extra-length: expected a number in [0,4096], got 36028797018963961"},
      {"--greedy --max-extra-length 9223372036854775807",
       "--max-extra-length: expected a number in [0,4096]"},
      {"--max-extra-length -1", "--max-extra-length: expected a number in [0,4096], got -1"},
      {"--alpha nan", "--alpha: expected a finite number >= 0, got nan"},
      {"--alpha -0.5", "--alpha: expected a finite number >= 0, got -0.5"},
      {"--batch-size 0", "--batch-size: expected a number > 0, got 0"},
      // CLI11 read 0x as hexadecimal and clamped a number past 64 bits (the check of the integer
      // flags missed those with a named range check, whose type reads INT:[1,256]).
      {"--beam 0x10", "--beam: expected a decimal integer in [-2147483648, 2147483647]"},
      {"--batch-size 99999999999999999999",
       "--batch-size: expected a decimal integer in [-9223372036854775808"}};
  for (const auto& [flags, expected] : cases) {
    for (const std::string& stdin_path : {std::string("/dev/null"), in}) {
      SCOPED_TRACE(flags + " < " + stdin_path);
      const CliResult r = run("translate --threads 1 --model-dir " + m + " " + flags, stdin_path);
      EXPECT_NE(r.exit_code, 0);
      EXPECT_TRUE(contains(r.err, expected)) << r.err;
      EXPECT_EQ(r.out, "");
    }
    const CliResult r = run("evaluate --threads 1 --model-dir " + m + " --src " + in + " --ref " +
                            in + " " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_TRUE(contains(r.err, expected)) << r.err;
  }
}

// A batch of sentences times a beam times the output length whose key/value caches, activations
// and logits would not fit in this machine's memory is refused before decoding, naming the flags
// that size it: it failed with "std::bad_alloc" under an address-space limit, and without one grew
// until the OOM killer. (The caches alone were counted until session 53: a batch estimated at
// 1.91 GiB took 5.49.)
TEST_F(Reliability, DecodingBeyondTheMachinesMemoryIsRefusedNamingTheFlags) {
  const std::string m = (suite_dir_ / "model").string(), out = path("out.txt");
  const attn::TransformerConfig c = tr::Translator(m).model().config();
  // Enough one-word sentences (at least one token each) for beam 256 and 4,096 extra tokens.
  const attn::detail::DecodeMemory one = attn::detail::decode_memory(c, 1, true, 256, 1, 4097, 4);
  ASSERT_GT(one.available, 0.0);
  ASSERT_GT(one.buffers, 0.0);
  const auto batch = static_cast<std::size_t>(std::ceil(one.available / one.total())) + 1;
  std::string text;
  for (std::size_t i = 0; i < batch; ++i) text += "cat\n";
  const CliResult r =
      run("translate --threads 1 --model-dir " + m + " --input " + input(text) + " --output " +
          out + " --beam 256 --max-extra-length 4096 --batch-size " + std::to_string(batch));
  expect_error(r, {"decode: " + std::to_string(batch) + " sentences x 256 beam rows",
                   "GiB of key/value caches, ", " of activations and logits), more than the",
                   "lower --batch-size, --beam or --max-extra-length"});
  EXPECT_FALSE(fs::exists(out));
}

// OMP_STACKSIZE beyond the machine's memory: libgomp ended attn-translate on its own when it
// started its threads, exit 1 with only "libgomp: Thread creation failed: ...".
TEST_F(Reliability, ThreadStacksBeyondTheMachinesMemoryAreRefusedWithAttnsError) {
  const std::string m = (suite_dir_ / "model").string();
  expect_error(run_command("OMP_STACKSIZE=1000000G " + std::string(ATTN_TRANSLATE_BIN) +
                               " translate --threads 2 --greedy --model-dir " + m,
                           dir_, input("the red cat\n")),
               {"OMP_STACKSIZE=1000000G asks for a 1e+06 GiB stack for each of the 1 threads"});
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
      {"data.batch", "100000", "metadata data.batch = 100000 must be in [0, "},
      {"train.warmup", "4000.5", "metadata train.warmup = \"4000.5\" is not a decimal integer"},
      {"train.max_tokens", "1e300", "train.max_tokens = \"1e300\" is not a decimal integer"},
      {"train.label_smoothing", "1.5", "train.label_smoothing = 1.5 must be in [0, 0.999999]"},
      {"train.bpe_dropout", "1", "train.bpe_dropout = 1 must be in [0, 0.99]"},
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

// A learning rate that blows the weights up makes the next step's logits NaN: the loss's message
// named only a logits row (--lr-factor 1e30 on the CLI), now it says what to change.
TEST_F(Reliability, LogitsMadeNotFiniteByTheLastUpdateNameTheFlagsToChange) {
  tr::TrainOptions o = tiny_options(path("m"));
  o.lr_factor = 1e30;
  o.steps = 5;
  tr::Trainer t(o, split());
  const std::string message = error_of<attn::NumericError>([&] { t.train(); });
  EXPECT_TRUE(contains(message, "contains NaN or Inf at step ")) << message;
  EXPECT_TRUE(contains(message, "(try a lower --lr-factor, a longer --warmup or --clip-norm)"))
      << message;
}

}  // namespace
