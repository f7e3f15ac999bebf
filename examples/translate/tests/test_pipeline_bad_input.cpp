// The bad input attn-translate's Trainer and Translator refuse, with a message that names what was
// expected and what came: overlong or invalid lines, a model directory of another vocabulary,
// missing or truncated model files, a model overwritten without --resume, overlong training pairs,
// a diverging loss. The pipeline that works: test_pipeline.cpp; the same through the binary:
// test_cli.cpp and test_cli_input.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <attn/strict_number.hpp>

#include "corpus_io.hpp"
#include "model_average.hpp"
#include "pipeline_fixture.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

TEST_F(Pipeline, TranslatorRefusesBadLinesBeforeDecoding) {
  const std::string a = path("a");
  train_one_step(tiny_options(a));
  tr::Translator translator(a);
  ASSERT_EQ(translator.max_len(), 32);
  tr::TranslateOptions greedy;
  greedy.greedy = true;

  std::string long_line;
  for (int i = 0; i < 40; ++i) long_line += "house ";
  const std::size_t tokens = translator.vocab().encode(long_line).size();
  ASSERT_GT(tokens, 32u);
  const std::string msg = error_of<attn::DataError>([&] {
    translator.translate({"the cat", long_line}, greedy, "'in.txt'");
  });
  EXPECT_TRUE(contains(msg, "'in.txt' line 2 has " + std::to_string(tokens) +
                                " subword tokens, more than the model's max_len 32"))
      << msg;

  // More than 64 bytes per token of max_len: refused by length, not encoded (sentencepiece took
  // 230 bytes of memory per byte). Spaces collapse to nothing, yet the line is refused all the
  // same.
  for (const std::string& huge : {std::string(64 * 32 + 1, 'a'), std::string(1 << 20, ' ')}) {
    const std::string bytes = error_of<attn::DataError>([&] {
      translator.translate({"the cat", huge}, greedy, "'in.txt'");
    });
    EXPECT_TRUE(contains(bytes, "'in.txt' line 2 has " + std::to_string(huge.size()) +
                                    " bytes, more than the 64 per subword token of the model's "
                                    "max_len 32"))
        << bytes;
  }
  EXPECT_EQ(translator.translate({std::string(64 * 32, ' ')}, greedy).size(), 1u);

  const std::string utf8 = error_of<attn::DataError>([&] {
    translator.translate({"the cat", "red \xc3\x28 dog"}, greedy);
  });
  EXPECT_TRUE(contains(
      utf8, "input line 2: expected UTF-8 text, found an invalid byte sequence at byte offset 4"))
      << utf8;

  // evaluate: one reference per source line, and the source lines pass the same checks.
  const std::string count = error_of<attn::DataError>([&] {
    translator.evaluate({"the cat", "a dog", "red"}, {"die Katze", "ein Hund"}, greedy, {});
  });
  EXPECT_TRUE(contains(count, "got 3 source lines and 2 reference lines")) << count;
  const std::string eval_long = error_of<attn::DataError>(
      [&] { translator.evaluate({long_line}, {"Haus"}, greedy, {}, nullptr, "'test.en'"); });
  EXPECT_TRUE(contains(eval_long, "'test.en' line 1 has " + std::to_string(tokens))) << eval_long;
}

TEST_F(Pipeline, RefusesModelDirectoryOfAnotherVocabulary) {
  const std::string a = path("a"), b = path("b");
  tr::TrainOptions oa = tiny_options(a), ob = tiny_options(b);
  ob.vocab_size = 70;
  train_one_step(oa);
  train_one_step(ob);
  const tr::SubwordVocab va = tr::SubwordVocab::load(a), vb = tr::SubwordVocab::load(b);
  ASSERT_NE(va.fingerprint(), vb.fingerprint());
  const std::string fa = "size 60, spm.model hash " + attn::hex16(va.fingerprint().hash);
  const std::string fb = "size 70, spm.model hash " + attn::hex16(vb.fingerprint().hash);

  // Weights of b with a's vocabulary: refused by the translator and by --resume.
  const std::string ckpt = a + "/checkpoint_1.safetensors";
  fs::copy_file(b + "/checkpoint_1.safetensors", ckpt, fs::copy_options::overwrite_existing);
  const std::string msg = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(msg, ckpt +
                                " was trained with a different vocabulary: expected the "
                                "directory's " +
                                fa + ", found " + fb))
      << msg;
  tr::TrainOptions r = oa;
  r.resume = true;
  const std::string resume = error_of<attn::FormatError>([&] { tr::Trainer t(r, split()); });
  EXPECT_TRUE(contains(resume, "expected the directory's " + fa + ", found " + fb)) << resume;

  // vocab.txt of b beside a's spm.model.
  fs::copy_file(b + "/vocab.txt", a + "/vocab.txt", fs::copy_options::overwrite_existing);
  const std::string txt = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(txt, "its vocab.txt says " + fb + ", this vocabulary has " + fa)) << txt;
}

TEST_F(Pipeline, RefusesMissingOrTruncatedModelFiles) {
  const std::string a = path("a");
  tr::TrainOptions o = tiny_options(a);
  {
    tr::Trainer t(o, split());
    t.train(1);
    t.finish();  // checkpoint_1 and model.safetensors
  }
  const std::string model = a + "/model.safetensors", ckpt = a + "/checkpoint_1.safetensors";
  const std::string bytes = read_file(model);

  write_file(model, bytes.substr(0, bytes.size() / 2));
  const std::string cut = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(cut, model)) << cut;

  write_file(model, bytes.substr(0, 5));  // not even the header length
  const std::string header = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(header, model)) << header;

  // Without model.safetensors the newest checkpoint serves; without either, the directory is
  // named.
  fs::remove(model);
  EXPECT_NO_THROW(tr::Translator t(a));

  // A truncated newest checkpoint is named, not silently replaced by an older one.
  const std::string ckpt_bytes = read_file(ckpt);
  write_file(ckpt, ckpt_bytes.substr(0, ckpt_bytes.size() - 100));
  tr::TrainOptions r = o;
  r.resume = true;
  const std::string resume = error_of<attn::FormatError>([&] { tr::Trainer t(r, split()); });
  EXPECT_TRUE(contains(resume, ckpt)) << resume;
  const std::string translate = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(translate, ckpt)) << translate;
  fs::remove(ckpt);
  const std::string none = error_of<attn::IOError>([&] { tr::Translator t(a); });
  EXPECT_TRUE(contains(none, "model directory '" + a +
                                 "' has neither model.safetensors nor "
                                 "checkpoint_<step>.safetensors"))
      << none;

  const std::string missing = path("missing");
  const std::string gone = error_of<attn::IOError>([&] { tr::Translator t(missing); });
  EXPECT_TRUE(contains(gone, missing + "/spm.model")) << gone;
}

TEST_F(Pipeline, RefusesToOverwriteAModelWithoutResume) {
  const std::string a = path("a");
  train_one_step(tiny_options(a));
  const std::string msg =
      error_of<attn::ConfigError>([&] { tr::Trainer t(tiny_options(a), split()); });
  EXPECT_TRUE(contains(msg, "already holds checkpoints; pass --resume")) << msg;

  // A model whose checkpoints were averaged away keeps its vocabulary too.
  const std::string vocab_before = read_file(a + "/spm.model");
  tr::average_last(a, 1);
  fs::remove(a + "/checkpoint_1.safetensors");
  tr::TrainOptions other = tiny_options(a);
  other.vocab_size = 70;
  const std::string model = error_of<attn::ConfigError>([&] { tr::Trainer t(other, split()); });
  EXPECT_TRUE(contains(model, "'" + a +
                                  "' already holds a model (model.safetensors); pass "
                                  "--resume"))
      << model;
  EXPECT_EQ(read_file(a + "/spm.model"), vocab_before);
  EXPECT_NO_THROW(tr::Translator t(a));

  tr::TrainOptions r = tiny_options(path("empty"));
  r.resume = true;
  EXPECT_THROW(tr::Trainer t(r, split()), attn::IOError);
}

TEST_F(Pipeline, OverlongTrainingPairsAreCountedOrRefused) {
  tr::CorpusSplit d = split();
  std::string long_src;
  for (int i = 0; i < 40; ++i) long_src += "green house ";
  d.train.src[7] = long_src;
  // A side of more bytes than 32 tokens can hold (64 each) is left out without being encoded,
  // though these spaces would collapse to a few tokens.
  d.train.tgt[9] = "green" + std::string(4000, ' ') + "house";
  tr::Trainer t(tiny_options(path("a")), d);
  EXPECT_EQ(t.skipped_pairs(), 2u);

  // The sources that BLEU translates are checked before anything is trained, not when the test
  // set is translated at the end. Without evaluation the test set is not translated, and not
  // refused; the validation sources are still encoded (attention.svg draws the first), and
  // refused.
  tr::CorpusSplit e = split();
  e.test.src[3] = std::string(1 << 20, ' ');
  const std::string test =
      error_of<attn::DataError>([&] { tr::Trainer u(tiny_options(path("c")), e); });
  EXPECT_TRUE(contains(test,
                       "the test set's source line 4 has 1048576 bytes, more than the 64 "
                       "per subword token of --max-len 32"))
      << test;
  EXPECT_FALSE(fs::exists(path("c") + "/spm.model"));
  tr::TrainOptions no_eval = tiny_options(path("e"));
  no_eval.evaluate = false;
  EXPECT_NO_THROW(tr::Trainer u(no_eval, e));
  e.valid.src[1] = e.test.src[3];
  for (const bool evaluate : {true, false}) {
    tr::TrainOptions o = tiny_options(path(evaluate ? "d" : "f"));
    o.evaluate = evaluate;
    const std::string valid = error_of<attn::DataError>([&] { tr::Trainer u(o, e); });
    EXPECT_TRUE(contains(valid, "the validation set's source line 2 has 1048576 bytes")) << valid;
  }

  for (auto& s : d.train.src) s = long_src;
  const std::string msg =
      error_of<attn::DataError>([&] { tr::Trainer u(tiny_options(path("b")), d); });
  EXPECT_TRUE(contains(msg,
                       "every one of the 200 training pairs is longer than max_len 32 "
                       "subword tokens"))
      << msg;
}

TEST_F(Pipeline, DivergingLossNamesTheStep) {
  tr::TrainOptions o = tiny_options(path("a"));
  o.lr_factor = 1e30;
  o.warmup = 1;
  tr::Trainer t(o, split());
  const std::string msg = error_of<attn::NumericError>([&] { t.train(20); });
  EXPECT_TRUE(std::regex_search(msg, std::regex("step [0-9]+"))) << msg;
}
