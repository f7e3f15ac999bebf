// End-to-end pipeline of attn-translate on a tiny synthetic corpus: training through the Trainer
// API, bit-exact resume, translation (greedy and beam), BLEU, averaging, and the error paths a
// user meets (mismatched files, a model directory of another vocabulary, NaN loss).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <attn/train/safetensors.hpp>

#include "corpus_io.hpp"
#include "trainer.hpp"
#include "translator.hpp"

namespace tr = attn::translate;
namespace fs = std::filesystem;
using attn::Index;

namespace {

// A toy "language pair": every word has a fixed translation and the target reverses the word
// order, so the model must learn both a lexicon and attention that moves tokens.
tr::ParallelCorpus synthetic(std::size_t n, std::uint64_t seed) {
  static const char* kSrc[] = {"red", "blue",  "green", "cat",    "dog", "house",
                               "big", "small", "runs",  "sleeps", "the", "a"};
  static const char* kTgt[] = {"rot",   "blau",  "gruen",  "Katze",    "Hund", "Haus",
                               "gross", "klein", "laeuft", "schlaeft", "der",  "ein"};
  attn::Rng rng(seed);
  tr::ParallelCorpus c;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t len = 2 + rng.below(4);
    std::string s, t;
    std::vector<std::size_t> words(len);
    for (auto& w : words) w = rng.below(12);
    for (std::size_t k = 0; k < len; ++k) {
      s += (k ? " " : "") + std::string(kSrc[words[k]]);
      t += (k ? " " : "") + std::string(kTgt[words[len - 1 - k]]);
    }
    c.src.push_back(s);
    c.tgt.push_back(t);
  }
  return c;
}

tr::CorpusSplit split() {
  tr::CorpusSplit d;
  d.train = synthetic(200, 1);
  d.valid = synthetic(10, 2);
  d.test = synthetic(10, 3);
  return d;
}

tr::TrainOptions tiny_options(const std::string& dir) {
  tr::TrainOptions o;
  o.model_dir = dir;
  o.preset = "tiny";
  o.dropout = 0.1;  // so that resuming must restore the dropout stream too
  o.vocab_size = 60;
  o.max_tokens = 128;
  o.tokens_per_update = 300;  // several batches per update: accumulation is exercised
  o.max_len = 32;
  o.warmup = 20;
  o.valid_every = 0;
  o.checkpoint_every = 0;
  o.keep = 3;
  o.svg = false;
  o.quiet = true;
  o.log_every = 10;
  o.threads = 1;  // tiny matrices: a second thread costs more than it gives
  return o;
}

class Pipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("attn_pipeline_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string dir(const std::string& name) const { return (root_ / name).string(); }
  fs::path root_;
};

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

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

}  // namespace

TEST_F(Pipeline, ResumeContinuesBitExactly) {
  const std::string a = dir("a"), b = dir("b");
  {
    tr::Trainer first(tiny_options(a), split());
    first.train(3);
    EXPECT_EQ(first.step(), 3);
    first.save_checkpoint();
  }
  tr::TrainOptions resume = tiny_options(a);
  resume.resume = true;
  resume.warmup = 999;  // ignored: the checkpoint's training options win on --resume
  tr::Trainer resumed(resume, split());
  EXPECT_EQ(resumed.step(), 3);
  resumed.train(3);
  tr::Trainer straight(tiny_options(b), split());
  straight.train(6);
  ASSERT_EQ(resumed.step(), 6);
  ASSERT_EQ(straight.step(), 6);
  EXPECT_EQ(resumed.vocab().fingerprint(), straight.vocab().fingerprint());
  expect_same_parameters(resumed.model(), straight.model());
  EXPECT_EQ(resumed.model().random_state().counter, straight.model().random_state().counter);
  // A step further the weights have moved: the comparison above compares something that changes.
  const float before = straight.model().parameters()[0].value.data()[0];
  straight.train(1);
  EXPECT_NE(before, straight.model().parameters()[0].value.data()[0]);
}

TEST_F(Pipeline, TrainTranslateEvaluateAverage) {
  const std::string a = dir("a");
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

  // A line longer than the model allows names the line and the limit.
  std::string long_line;
  for (int i = 0; i < 40; ++i) long_line += "house ";
  const std::string msg = error_of<attn::DataError>([&] {
    translator.translate({"the cat", long_line}, greedy);
  });
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_len 32"), std::string::npos) << msg;

  // Averaging by hand gives the same file as the trainer's.
  const std::string out = dir("avg.safetensors");
  tr::average_files({a + "/checkpoint_150.safetensors", a + "/checkpoint_200.safetensors"}, out);
  for (const auto& p : trainer.model().parameters())
    EXPECT_EQ(attn::load_safetensors(out).tensor<float>(p.name).vector(),
              attn::load_safetensors(a + "/model.safetensors").tensor<float>(p.name).vector())
        << p.name;
  const std::string too_many = error_of<attn::ConfigError>([&] { tr::average_last(a, 9); });
  EXPECT_NE(too_many.find("has 3"), std::string::npos) << too_many;
}

TEST_F(Pipeline, RefusesModelDirectoryOfAnotherVocabulary) {
  const std::string a = dir("a"), b = dir("b");
  tr::TrainOptions oa = tiny_options(a), ob = tiny_options(b);
  ob.vocab_size = 70;
  for (auto* o : {&oa, &ob}) {
    tr::Trainer t(*o, split());
    t.train(1);
    t.save_checkpoint();
  }
  // Weights of b with a's vocabulary.
  fs::copy_file(b + "/checkpoint_1.safetensors", a + "/checkpoint_1.safetensors",
                fs::copy_options::overwrite_existing);
  const std::string msg = error_of<attn::FormatError>([&] { tr::Translator t(a); });
  EXPECT_NE(msg.find("different vocabulary"), std::string::npos) << msg;
  // vocab.txt of b beside a's spm.model.
  fs::copy_file(b + "/vocab.txt", a + "/vocab.txt", fs::copy_options::overwrite_existing);
  EXPECT_THROW(tr::Translator t(a), attn::FormatError);
}

TEST_F(Pipeline, RefusesToOverwriteCheckpointsWithoutResume) {
  const std::string a = dir("a");
  {
    tr::Trainer t(tiny_options(a), split());
    t.train(1);
    t.save_checkpoint();
  }
  const std::string msg =
      error_of<attn::ConfigError>([&] { tr::Trainer t(tiny_options(a), split()); });
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
  tr::TrainOptions r = tiny_options(dir("empty"));
  r.resume = true;
  EXPECT_THROW(tr::Trainer t(r, split()), attn::IOError);
}

TEST_F(Pipeline, DivergingLossNamesTheStep) {
  tr::TrainOptions o = tiny_options(dir("a"));
  o.lr_factor = 1e30;
  o.warmup = 1;
  tr::Trainer t(o, split());
  const std::string msg = error_of<attn::NumericError>([&] { t.train(20); });
  EXPECT_TRUE(std::regex_search(msg, std::regex("step [0-9]+"))) << msg;
}

TEST_F(Pipeline, MismatchedParallelFilesAreAOneLineErrorFromTheCli) {
  const std::string src = dir("src.txt"), tgt = dir("tgt.txt"), model = dir("model");
  std::ofstream(src) << "one\ntwo\nthree\n";
  std::ofstream(tgt) << "eins\nzwei\n";
  EXPECT_THROW(tr::read_parallel(src, tgt), attn::DataError);
  const std::string log = dir("stderr.txt");
  const std::string cmd = std::string(ATTN_TRANSLATE_BIN) + " train --model-dir " + model +
                          " --src " + src + " --tgt " + tgt + " --steps 1 2> " + log;
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("attn-translate: error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("3"), std::string::npos) << lines[0];
  EXPECT_FALSE(fs::exists(model));
}
