// End-to-end pipeline of attn-translate through its C++ entry points (Trainer, Translator) on a
// tiny synthetic corpus: bit-exact resume, gradient clipping, translation (greedy and beam),
// BLEU, averaging, and every bad input the trainer and translator must refuse with a message
// that names what was expected and what came. The same through the binary: test_cli.cpp and
// test_cli_input.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <attn/strict_number.hpp>
#include <attn/train/clip.hpp>
#include <attn/train/safetensors.hpp>
#include <attn/train/schedule.hpp>

#include "corpus_io.hpp"
#include "model_average.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using attn::Index;
using namespace attn::translate::testing;

namespace {

using Pipeline = TempDirTest;

void expect_same_parameters(attn::Transformer<float>& a, attn::Transformer<float>& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t k = 0; k < pa.size(); ++k) {
    ASSERT_EQ(pa[k].name, pb[k].name);
    ASSERT_EQ(pa[k].value.numel(), pb[k].value.numel());
    for (Index i = 0; i < pa[k].value.numel(); ++i)
      ASSERT_EQ(pa[k].value.data()[i], pb[k].value.data()[i]) << pa[k].name << " element " << i;
  }
}

bool same_parameters(attn::Transformer<float>& a, attn::Transformer<float>& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t k = 0; k < pa.size(); ++k)
    if (pa[k].value.vector() != pb[k].value.vector()) return false;
  return true;
}

// Two checkpoint files hold the same tensors (weights, Adam moments, RNG state) bit for bit and
// the same metadata (configuration, training options, data position, loss curves).
void expect_same_checkpoint(const std::string& a, const std::string& b) {
  const auto fa = attn::load_safetensors(a), fb = attn::load_safetensors(b);
  EXPECT_EQ(fa.metadata(), fb.metadata());
  ASSERT_EQ(fa.names(), fb.names());
  for (const std::string& name : fa.names()) {
    const auto& ia = fa.info(name);
    const auto& ib = fb.info(name);
    ASSERT_EQ(ia.dtype, ib.dtype) << name;
    ASSERT_EQ(ia.shape, ib.shape) << name;
    ASSERT_EQ(ia.end - ia.begin, ib.end - ib.begin) << name;
    EXPECT_EQ(std::memcmp(fa.bytes(name), fb.bytes(name), ia.end - ia.begin), 0) << name;
  }
}

// Trains one update into `dir` and saves it: a model directory for the error-path tests.
void train_one_step(const tr::TrainOptions& o) {
  tr::Trainer t(o, split());
  t.train(1);
  t.save_checkpoint();
}

}  // namespace

TEST_F(Pipeline, ResumeContinuesBitExactly) {
  const std::string a = path("a"), b = path("b");
  tr::TrainOptions o = tiny_options(a);
  o.log_every = 1;  // every update's loss goes into the curves and so into the comparison
  {
    tr::Trainer first(o, split());
    first.train(3);
    EXPECT_EQ(first.step(), 3);
    first.save_checkpoint();
  }
  tr::TrainOptions resume = o;
  resume.resume = true;
  resume.warmup = 999;  // ignored: the checkpoint's training options win on --resume
  tr::Trainer resumed(resume, split());
  EXPECT_EQ(resumed.step(), 3);
  EXPECT_EQ(resumed.options().warmup, o.warmup);
  resumed.train(3);
  o.model_dir = b;
  tr::Trainer straight(o, split());
  straight.train(6);
  ASSERT_EQ(resumed.step(), 6);
  ASSERT_EQ(straight.step(), 6);
  EXPECT_EQ(resumed.vocab().fingerprint(), straight.vocab().fingerprint());
  // The loss of every update, restored ones included, is the same double.
  ASSERT_EQ(resumed.curves().size(), 6u);
  ASSERT_EQ(straight.curves().size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed.curves()[i].step, straight.curves()[i].step);
    EXPECT_EQ(resumed.curves()[i].train_loss, straight.curves()[i].train_loss) << "update " << i;
  }
  expect_same_parameters(resumed.model(), straight.model());
  EXPECT_EQ(resumed.model().random_state().counter, straight.model().random_state().counter);
  // Adam's moments, the data position and the metadata too: both checkpoints are identical.
  expect_same_checkpoint(resumed.save_checkpoint(), straight.save_checkpoint());
  // A step further the weights have moved: the comparison above compares something that changes.
  const float before = straight.model().parameters()[0].value.data()[0];
  straight.train(1);
  EXPECT_NE(before, straight.model().parameters()[0].value.data()[0]);
}

TEST_F(Pipeline, ClipNormBoundsTheGradientAndSurvivesResume) {
  tr::TrainOptions plain = tiny_options(path("plain"));
  tr::Trainer unclipped(plain, split());
  unclipped.train(1);
  const double norm = unclipped.last_grad_norm();
  ASSERT_TRUE(std::isfinite(norm));
  EXPECT_NEAR(attn::grad_norm(unclipped.model().parameters()), norm, 1e-6 * norm);

  // A tenth of the first update's norm: every update is clipped.
  tr::TrainOptions o = tiny_options(path("clipped"));
  o.clip_norm = norm / 10;
  {  // ends before the resume: one trainer per directory at a time (the lock)
    tr::Trainer clipped(o, split());
    clipped.train(1);
    EXPECT_EQ(clipped.last_grad_norm(), norm);  // reported before clipping
    EXPECT_LE(attn::grad_norm(clipped.model().parameters()), o.clip_norm * (1 + 1e-5));
    EXPECT_GT(attn::grad_norm(clipped.model().parameters()), o.clip_norm * (1 - 1e-4));
    clipped.train(1);
    clipped.save_checkpoint();
  }

  tr::TrainOptions r = o;
  r.resume = true;
  r.clip_norm = 0;  // ignored: the checkpoint's --clip-norm wins
  tr::Trainer resumed(r, split());
  EXPECT_EQ(resumed.options().clip_norm, o.clip_norm);
  resumed.train(2);
  o.model_dir = path("straight");
  tr::Trainer straight(o, split());
  straight.train(4);
  expect_same_parameters(resumed.model(), straight.model());
  // Clipping changed the result, so the resumed run really kept it.
  unclipped.train(3);
  EXPECT_FALSE(same_parameters(unclipped.model(), straight.model()));

  tr::TrainOptions bad = tiny_options(path("bad"));
  bad.clip_norm = -1;
  const std::string msg = error_of<attn::ConfigError>([&] { tr::Trainer t(bad, split()); });
  EXPECT_TRUE(contains(msg, "--clip-norm must be finite and >= 0 (0: off), got -1")) << msg;
}

TEST_F(Pipeline, CooldownTakesTheRateToZeroAtStepsAndResumesExactly) {
  tr::TrainOptions o = tiny_options(path("cool"));
  o.steps = 6;
  o.cooldown = 3;
  {
    tr::Trainer first(o, split());
    EXPECT_EQ(first.options().cooldown_end, 6);
    auto noam = [&](Index s) {
      return attn::noam_lr(s, first.model().config().d_model, o.warmup, o.lr_factor);
    };
    for (Index s = 1; s <= 3; ++s) EXPECT_EQ(first.learning_rate(s), noam(s)) << s;
    // (7 - s) / 4: 3/4, 2/4 and 1/4 of the Noam rate.
    for (Index s = 4; s <= 6; ++s)
      EXPECT_DOUBLE_EQ(first.learning_rate(s), noam(s) * static_cast<double>(7 - s) / 4.0) << s;
    first.train(4);  // into the cooldown
    first.save_checkpoint();
  }
  // Resumed without --steps and with another --cooldown: the checkpoint's cooldown wins and ends
  // the run at step 6, where the rate would reach zero.
  tr::TrainOptions r = tiny_options(path("cool"));
  r.resume = true;
  r.cooldown = 0;
  o.model_dir = path("straight");
  tr::Trainer straight(o, split());
  straight.train();
  EXPECT_EQ(straight.step(), 6);
  {  // ends before the next resume: one trainer per directory at a time (the lock)
    tr::Trainer resumed(r, split());
    EXPECT_EQ(resumed.options().cooldown, 3);
    EXPECT_EQ(resumed.options().cooldown_end, 6);
    resumed.train(10);  // bounded: a lost cooldown fails here instead of training on for ever
    EXPECT_EQ(resumed.step(), 6);
    expect_same_parameters(resumed.model(), straight.model());
  }
  tr::TrainOptions plain = tiny_options(path("plain"));
  tr::Trainer uncooled(plain, split());
  uncooled.train(6);
  EXPECT_FALSE(same_parameters(uncooled.model(), straight.model()));

  // A longer run than the cooldown was planned for is refused.
  r.steps = 7;
  EXPECT_TRUE(contains(error_of<attn::ConfigError>([&] { tr::Trainer t(r, split()); }),
                       "--steps 7 goes past step 6, where this run's --cooldown 3 ends its "
                       "learning rate at zero"));
  tr::TrainOptions no_steps = tiny_options(path("no_steps"));
  no_steps.cooldown = 2;
  EXPECT_TRUE(contains(error_of<attn::ConfigError>([&] { tr::Trainer t(no_steps, split()); }),
                       "--cooldown 2 needs --steps of at least as many updates"));
}

TEST_F(Pipeline, NormFirstBuildsAPreNormModelThatResumesAsOne) {
  tr::TrainOptions o = tiny_options(path("pre"));
  EXPECT_FALSE(tr::make_config(o, 100).norm_first);  // the paper's post-norm by default
  o.norm_first = true;
  EXPECT_TRUE(tr::make_config(o, 100).norm_first);
  train_one_step(o);
  tr::TrainOptions r = tiny_options(path("pre"));  // norm_first off: the checkpoint's model wins
  r.resume = true;
  tr::Trainer resumed(r, split());
  EXPECT_TRUE(resumed.model().config().norm_first);
  resumed.train(1);
  EXPECT_EQ(resumed.step(), 2);
}

TEST_F(Pipeline, TrainTranslateEvaluateAverage) {
  const std::string a = path("a");
  tr::TrainOptions o = tiny_options(a);
  o.checkpoint_every = 50;
  o.average = 2;
  o.svg = true;
  o.warmup = 100;  // peak lr 64^-0.5 * 100^-0.5 = 0.0125
  tr::Trainer trainer(o, split());
  trainer.train(200);
  trainer.finish();
  // Training learned something: the loss fell well below its start (ln 60 = 4.1) on both sets.
  ASSERT_GE(trainer.curves().size(), 2u);
  EXPECT_GT(trainer.curves().front().train_loss, 3.0);
  EXPECT_LT(trainer.curves().back().train_loss, 2.0);
  EXPECT_LT(trainer.curves().back().valid_loss, 2.0);
  for (const char* f :
       {"spm.model", "vocab.txt", "model.safetensors", "curves.svg", "attention.svg",
        "checkpoint_200.safetensors", "checkpoint_150.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(a) / f)) << f;
  EXPECT_FALSE(fs::exists(fs::path(a) / "checkpoint_50.safetensors"));
  EXPECT_EQ(tr::list_checkpoints(a).size(), 3u);  // --keep 3 of 50, 100, 150, 200

  // model.safetensors is the mean of the last two checkpoints.
  {
    const auto f150 = attn::load_safetensors(a + "/checkpoint_150.safetensors");
    const auto f200 = attn::load_safetensors(a + "/checkpoint_200.safetensors");
    const auto avg = attn::load_safetensors(a + "/model.safetensors");
    const std::string name = trainer.model().parameters()[0].name;
    const auto x = f150.tensor<float>(name), y = f200.tensor<float>(name),
               m = avg.tensor<float>(name);
    bool differ = false;
    for (Index i = 0; i < m.numel(); ++i) {
      EXPECT_NEAR(m.data()[i], 0.5 * (double(x.data()[i]) + y.data()[i]), 1e-6);
      differ |= x.data()[i] != y.data()[i];
    }
    EXPECT_TRUE(differ);
  }

  tr::Translator translator(a);
  const std::vector<std::string> lines = {"the red cat", "", "a big dog sleeps"};
  tr::TranslateOptions greedy;
  greedy.greedy = true;
  const auto g = translator.translate(lines, greedy);
  const auto b = translator.translate(lines, tr::TranslateOptions{});
  ASSERT_EQ(g.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(g[1], "");
  EXPECT_EQ(b[1], "");
  EXPECT_FALSE(g[0].empty());
  EXPECT_FALSE(b[2].empty());

  const tr::CorpusSplit d = split();
  const tr::BleuScore score = translator.evaluate(d.test.src, d.test.tgt, greedy, {});
  EXPECT_GT(score.ref_len, 0);
  EXPECT_GT(score.hyp_len, 0);
  EXPECT_GT(score.score, 0.0);

  // Averaging by hand gives the same file as the trainer's.
  const std::string out = path("avg.safetensors");
  tr::average_files({a + "/checkpoint_150.safetensors", a + "/checkpoint_200.safetensors"}, out);
  for (const auto& p : trainer.model().parameters())
    EXPECT_EQ(attn::load_safetensors(out).tensor<float>(p.name).vector(),
              attn::load_safetensors(a + "/model.safetensors").tensor<float>(p.name).vector())
        << p.name;
  const std::string too_many = error_of<attn::ConfigError>([&] { tr::average_last(a, 9); });
  EXPECT_TRUE(contains(too_many, "asked for the last 9 checkpoints but '" + a + "' has 3"))
      << too_many;
}

// ------------------------------------------------------------------------------ bad input

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
  // set is translated at the end; without evaluation they are not translated, and not refused.
  tr::CorpusSplit e = split();
  e.test.src[3] = std::string(1 << 20, ' ');
  const std::string test =
      error_of<attn::DataError>([&] { tr::Trainer u(tiny_options(path("c")), e); });
  EXPECT_TRUE(contains(test,
                       "the test set's source line 4 has 1048576 bytes, more than the 64 "
                       "per subword token of --max-len 32"))
      << test;
  EXPECT_FALSE(fs::exists(path("c") + "/spm.model"));
  e.valid.src[1] = e.test.src[3];
  const std::string valid =
      error_of<attn::DataError>([&] { tr::Trainer u(tiny_options(path("d")), e); });
  EXPECT_TRUE(contains(valid, "the validation set's source line 2 has 1048576 bytes")) << valid;
  tr::TrainOptions no_eval = tiny_options(path("e"));
  no_eval.evaluate = false;
  EXPECT_NO_THROW(tr::Trainer u(no_eval, e));

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
