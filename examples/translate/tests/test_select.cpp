// attn-translate select (model_select.hpp): the average of the last N checkpoints and the length
// penalty chosen on a validation set, written as the model file with its length penalty, which
// translate and evaluate then use; and what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "model_average.hpp"
#include "model_dir.hpp"
#include "model_metadata.hpp"
#include "model_select.hpp"
#include "safetensors_edit.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

namespace {

class Select : public TrainedModelTest {
 protected:
  // Checkpoints at steps 20, 30 and 40 (--keep 3).
  static void SetUpTestSuite() { train_suite_model("attn_translate_select", 40, 10); }

  void SetUp() override {
    TrainedModelTest::SetUp();
    dir_copy_ = model_copy();
    model_before_ = read_file(tr::final_model_path(dir_copy_));
  }

  const tr::ParallelCorpus valid_ = split().valid;
  std::string dir_copy_;      // a model directory of the test's own
  std::string model_before_;  // its model.safetensors (the last weights), which a refusal keeps
};

// Each average's BLEU at each alpha, scored afresh by a Translator of its own.
tr::BleuScore score_of(const std::string& dir, int last, double alpha,
                       const tr::ParallelCorpus& valid) {
  tr::Translator t(dir);
  t.load_average(tr::last_checkpoints(dir, last));
  tr::TranslateOptions o;
  o.alpha = alpha;
  o.alpha_given = true;
  return t.evaluate(valid.src, valid.tgt, o, {});
}

std::vector<float> first_parameter(const std::string& file, const std::string& name) {
  const auto t = attn::load_safetensors(file).tensor<float>(name);
  return {t.data(), t.data() + t.numel()};
}

}  // namespace

TEST_F(Select, ScoresEveryAverageAtEveryAlphaAndWritesTheBest) {
  tr::SelectOptions o;
  o.lasts = {3, 1, 7, 2, 1};  // unsorted, a repeat, one beyond the 3 checkpoints
  o.alphas = {2.0, 0.0, 0.6};
  std::vector<tr::SelectScore> reported;
  const tr::Selection s = tr::select_average(
      dir_copy_, valid_, o, "", "valid", [&](const tr::SelectScore& x) { reported.push_back(x); });
  ASSERT_EQ(s.scores.size(), 9u);
  EXPECT_EQ(s.skipped, std::vector<int>{7});
  ASSERT_EQ(reported.size(), 9u);
  const auto ckpts = tr::list_checkpoints(dir_copy_);
  ASSERT_EQ(ckpts.size(), 3u);
  std::size_t best = 0;
  for (std::size_t i = 0; i < s.scores.size(); ++i) {
    const tr::SelectScore& x = s.scores[i];
    SCOPED_TRACE("last " + std::to_string(x.last) + " alpha " + tr::alpha_text(x.alpha));
    EXPECT_EQ(x.last, 1 + static_cast<int>(i / 3));  // N ascending, then alpha
    EXPECT_EQ(x.alpha, (std::vector<double>{0.0, 0.6, 2.0}[i % 3]));
    EXPECT_EQ(x.first_step, ckpts[ckpts.size() - static_cast<std::size_t>(x.last)].first);
    EXPECT_EQ(x.last_step, 40);
    EXPECT_EQ(reported[i].bleu.str(), x.bleu.str());
    EXPECT_EQ(x.bleu.str(), score_of(dir_copy_, x.last, x.alpha, valid_).str());
    if (x.bleu.score > s.scores[best].bleu.score) best = i;
  }
  EXPECT_EQ(s.best, best);  // the highest, the first of equals

  // This model prefers a length penalty other than the default (last 2 at 2.0 when this was
  // written), so what follows tells the stored alpha from the default.
  const tr::SelectScore& chosen = s.scores[s.best];
  ASSERT_NE(chosen.alpha, tr::TranslateOptions{}.alpha);

  // The model file is the chosen average, byte for byte, with the chosen alpha; not another.
  const std::string model = tr::final_model_path(dir_copy_), expected = path("expected");
  tr::average_files(tr::last_checkpoints(dir_copy_, chosen.last), expected,
                    {{tr::kAlphaKey, tr::alpha_text(chosen.alpha)}});
  EXPECT_TRUE(read_file(model) == read_file(expected));
  const std::string name = tr::Translator(dir_copy_).model().parameters()[0].name;
  const int other = chosen.last == 1 ? 3 : 1;
  tr::average_files(tr::last_checkpoints(dir_copy_, other), path("other"));
  EXPECT_NE(first_parameter(model, name), first_parameter(path("other"), name));
  const auto meta = attn::load_safetensors(model).metadata();
  EXPECT_EQ(meta.at(tr::kAlphaKey), tr::alpha_text(chosen.alpha));
  EXPECT_EQ(meta.at("averaged_from"), std::to_string(chosen.last));

  // Translate and evaluate decode with it unless told otherwise, and score what select said.
  tr::Translator t(dir_copy_);
  ASSERT_TRUE(t.stored_alpha().has_value());
  EXPECT_EQ(*t.stored_alpha(), chosen.alpha);
  EXPECT_EQ(t.resolve({}).alpha, chosen.alpha);
  tr::TranslateOptions given;
  given.alpha = 3.5;
  given.alpha_given = true;
  EXPECT_EQ(t.resolve(given).alpha, 3.5);
  EXPECT_EQ(t.evaluate(valid_.src, valid_.tgt, {}, {}).str(), chosen.bleu.str());
}

TEST_F(Select, AlphaTextReadsBackAsTheSameNumber) {
  for (const double a : {0.0, 0.6, 1.0, 1.4, 0.1 + 0.2, 1e-300, 123456.789}) {
    const std::string text = tr::alpha_text(a);
    EXPECT_EQ(attn::parse_number<double>(text), std::optional<double>(a)) << text;
  }
  EXPECT_EQ(tr::alpha_text(1.4), "1.4");
  EXPECT_EQ(tr::alpha_text(1.0), "1");
}

TEST_F(Select, StoresMinusZeroAsZero) {
  tr::SelectOptions o;
  o.lasts = {1};
  o.alphas = {-0.0};
  const tr::Selection s = tr::select_average(dir_copy_, valid_, o);
  EXPECT_FALSE(std::signbit(s.scores[s.best].alpha));
  EXPECT_EQ(attn::load_safetensors(tr::final_model_path(dir_copy_)).metadata().at(tr::kAlphaKey),
            "0");
}

TEST_F(Select, AnAverageDropsTheLengthPenaltyOfItsInputs) {
  tr::SelectOptions o;
  o.lasts = {1};
  o.alphas = {1.5};
  tr::select_average(dir_copy_, valid_, o);
  const std::string model = tr::final_model_path(dir_copy_);
  EXPECT_EQ(attn::load_safetensors(model).metadata().at(tr::kAlphaKey), "1.5");
  tr::average_files({model, tr::last_checkpoints(dir_copy_, 2).front()}, path("avg"));
  EXPECT_EQ(attn::load_safetensors(path("avg")).metadata().count(tr::kAlphaKey), 0u);
  tr::Translator t(dir_copy_);
  EXPECT_EQ(t.stored_alpha(), std::optional<double>(1.5));
  EXPECT_EQ(t.resolve({}).alpha, 1.5);
  t.load_average({path("avg")});  // the weights scored are no longer those the alpha was chosen for
  EXPECT_FALSE(t.stored_alpha().has_value());
  EXPECT_EQ(t.resolve({}).alpha, tr::TranslateOptions{}.alpha);
}

TEST_F(Select, RefusesOptionsItCannotScore) {
  const auto error = [&](std::vector<int> lasts, std::vector<double> alphas) {
    tr::SelectOptions o;
    o.lasts = std::move(lasts);
    o.alphas = std::move(alphas);
    return error_of<attn::ConfigError>([&] { tr::select_average(dir_copy_, valid_, o); });
  };
  EXPECT_TRUE(contains(error({}, {0.6}), "expected at least one --last, got none"));
  EXPECT_TRUE(contains(error({1}, {}), "expected at least one --alpha, got none"));
  EXPECT_TRUE(contains(error({2, 0}, {0.6}), "--last must be >= 1, got 0"));
  EXPECT_TRUE(contains(error({1}, {-0.5}), "--alpha must be finite and >= 0, got -0.5"));
  EXPECT_TRUE(contains(error({1}, {std::nan("")}), "--alpha must be finite and >= 0, got nan"));
  const std::string few = error({9, 4}, {0.6});
  EXPECT_TRUE(contains(few, "'" + dir_copy_ +
                                "' has 3 checkpoints, fewer than the smallest "
                                "--last, 4"))
      << few;
  EXPECT_EQ(read_file(tr::final_model_path(dir_copy_)), model_before_);
}

TEST_F(Select, RefusesToRunBesideATrainer) {
  const tr::ModelDirLock trainer(dir_copy_);
  const std::string e = error_of<attn::ConfigError>(
      [&] { tr::select_average(dir_copy_, valid_, tr::SelectOptions{}); });
  EXPECT_TRUE(
      contains(e, "'" + dir_copy_ + "' is in use by another attn-translate train or select"))
      << e;
}

// The oldest checkpoint is only in the widest window, which is scored last; it is refused before
// the first decoding all the same.
TEST_F(Select, RefusesACheckpointOfAnotherModelBeforeScoringAnything) {
  const auto ckpts = tr::list_checkpoints(dir_copy_);
  const std::string oldest = ckpts.front().second, newest = ckpts.back().second;
  rewrite(oldest, [](auto& m) { m["config.d_ff"] = "64"; });
  tr::SelectOptions o;
  o.lasts = {1, 3};
  int scored = 0;
  const std::string e = error_of<attn::FormatError>([&] {
    tr::select_average(dir_copy_, valid_, o, "", "valid", [&](const auto&) { ++scored; });
  });
  EXPECT_TRUE(contains(e, oldest + ": metadata config.d_ff is \"64\" but \"128\" in " + newest))
      << e;
  EXPECT_EQ(scored, 0);
  EXPECT_EQ(read_file(tr::final_model_path(dir_copy_)), model_before_);
}

TEST_F(Select, RefusesANonFiniteCheckpointBeforeScoringAnything) {
  const auto ckpts = tr::list_checkpoints(dir_copy_);
  const std::string name = tr::Translator(dir_copy_).model().parameters()[0].name;
  rewrite(
      ckpts.front().second, [](auto&) {},
      [&name](const std::string& tensor, std::vector<unsigned char>& bytes) {
        if (tensor != name) return;
        const float nan = std::nanf("");
        std::memcpy(bytes.data(), &nan, sizeof nan);
      });
  tr::SelectOptions o;
  o.lasts = {1, 3};
  int scored = 0;
  const std::string e = error_of<attn::NumericError>([&] {
    tr::select_average(dir_copy_, valid_, o, "", "valid", [&](const auto&) { ++scored; });
  });
  EXPECT_TRUE(contains(e, "the average of 3 checkpoints ending with " + ckpts.back().second +
                              ": parameter " + name + " holds a non-finite value"))
      << e;
  EXPECT_EQ(scored, 0);
}

TEST_F(Select, RefusesAnOutputThatIsADirectoryBeforeScoringAnything) {
  tr::SelectOptions o;
  o.lasts = {1};
  int scored = 0;
  const std::string out = path("adir");
  fs::create_directory(out);
  const std::string e = error_of<attn::IOError>([&] {
    tr::select_average(dir_copy_, valid_, o, out, "valid", [&](const auto&) { ++scored; });
  });
  EXPECT_TRUE(contains(e, "refusing to write " + out + ": it is a directory")) << e;
  EXPECT_EQ(scored, 0);
  EXPECT_TRUE(fs::is_directory(out));
}

TEST_F(Select, RefusesAnOutputItCannotWriteBeforeScoringAnything) {
  tr::SelectOptions o;
  o.lasts = {1};
  int scored = 0;
  const std::string out = path("missing") + "/model.safetensors";
  const std::string e = error_of<attn::IOError>([&] {
    tr::select_average(dir_copy_, valid_, o, out, "valid", [&](const auto&) { ++scored; });
  });
  EXPECT_TRUE(contains(e, "select: cannot write '" + out + "': its directory '" + path("missing") +
                              "': No such file or directory"))
      << e;
  EXPECT_EQ(scored, 0);
}

TEST_F(Select, RefusesADirectoryThatIsNotThereWithoutMakingIt) {
  const std::string missing = path("nowhere");
  const std::string e = error_of<attn::ConfigError>(
      [&] { tr::select_average(missing, valid_, tr::SelectOptions{}); });
  EXPECT_TRUE(contains(e, "select: '" + missing + "' is not a model directory")) << e;
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(Select, NeedsNoModelFileAndReplacesABadOne) {
  const std::string model = tr::final_model_path(dir_copy_);
  rewrite(model, [](auto& m) { m[tr::kAlphaKey] = "nan"; });  // translate would refuse it
  tr::SelectOptions o;
  o.lasts = {2};
  o.alphas = {0.5};
  tr::select_average(dir_copy_, valid_, o);
  EXPECT_EQ(tr::Translator(dir_copy_).stored_alpha(), std::optional<double>(0.5));
  fs::remove(model);
  o.alphas = {0.7};
  tr::select_average(dir_copy_, valid_, o);
  EXPECT_EQ(tr::Translator(dir_copy_).stored_alpha(), std::optional<double>(0.7));
}

TEST_F(Select, AStoredAlphaThatIsNotALengthPenaltyIsRefused) {
  tr::average_files(tr::last_checkpoints(dir_copy_, 1), tr::final_model_path(dir_copy_));
  const std::string model = tr::final_model_path(dir_copy_);
  for (const char* bad : {"-1", "nan", "inf", "1e999", "0.6 ", "", "abc"}) {
    SCOPED_TRACE(std::string("decode.alpha = '") + bad + "'");
    rewrite(model, [bad](auto& m) { m[tr::kAlphaKey] = bad; });
    const std::string e = error_of<attn::FormatError>([&] { tr::Translator t(dir_copy_); });
    EXPECT_TRUE(contains(e, model)) << e;
    EXPECT_TRUE(contains(e, "decode.alpha")) << e;
  }
}

TEST_F(Select, TheCommandLineChoosesAndEvaluateUsesTheChoice) {
  const std::string src = path("valid.en"), ref = path("valid.de");
  tr::write_lines(src, valid_.src);
  tr::write_lines(ref, valid_.tgt);
  const std::string model =
      " --threads 1 --model-dir " + dir_copy_ + " --src " + src + " --ref " + ref;
  const CliResult r = run("select" + model + " --last 1,2,5 --alpha 2,0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "select: skipped --last 5: '" + dir_copy_ + "' has 3 checkpoints\n");
  std::vector<std::string> lines;
  for (std::size_t a = 0, b; (b = r.out.find('\n', a)) != std::string::npos; a = b + 1)
    lines.push_back(r.out.substr(a, b - a));
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0].rfind("the last 1 checkpoint (step 40) at alpha 0: BLEU = ", 0), 0u);
  EXPECT_EQ(lines[3].rfind("the last 2 checkpoints (steps 30-40) at alpha 2: BLEU = ", 0), 0u);
  EXPECT_EQ(lines[4].rfind("chose the last ", 0), 0u) << lines[4];
  EXPECT_TRUE(contains(lines[4], "; wrote " + tr::final_model_path(dir_copy_))) << lines[4];
  // The chosen window's two lines: evaluate prints the chosen one by default, either with --alpha.
  const auto bleu = [](const std::string& line) {
    const std::string b = line.substr(line.find("BLEU = "));
    return b.substr(0, b.find(';')) + "\n";
  };
  std::size_t chosen = 0;
  while (chosen < 4 &&
         lines[4].rfind("chose " + lines[chosen].substr(0, lines[chosen].find(':') + 1), 0))
    ++chosen;
  ASSERT_LT(chosen, 4u) << r.out;
  const std::size_t window = chosen / 2 * 2;  // the lines at alpha 0 and 2
  ASSERT_NE(bleu(lines[window]), bleu(lines[window + 1])) << "the alphas must differ here";
  const CliResult d = run("evaluate" + model);
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out, bleu(lines[chosen]));
  for (const std::size_t i : {window, window + 1}) {
    const CliResult e = run("evaluate" + model + " --alpha " + (i == window ? "0" : "2"));
    ASSERT_EQ(e.exit_code, 0) << e.err;
    EXPECT_EQ(e.out, bleu(lines[i]));
  }
}

TEST_F(Select, TheCommandLineRefusesBadLists) {
  const std::string src = path("valid.en");
  tr::write_lines(src, valid_.src);
  const std::string common = "select --model-dir " + dir_copy_ + " --src " + src + " --ref " + src;
  for (const char* bad : {" --last 0", " --last 1,x", " --last ''", " --last ,", " --alpha -1",
                          " --alpha 0.6,nan", " --alpha ''"}) {
    SCOPED_TRACE(bad);
    const CliResult r = run(common + bad);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_FALSE(contains(r.out, "chose")) << r.out;
  }
  EXPECT_EQ(read_file(tr::final_model_path(dir_copy_)), model_before_);
}

TEST_F(Select, HelpShowsTheDefaultLists) {
  const CliResult r = run("select --help");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(default: 1,5,10,16,24)")) << r.out;
  EXPECT_TRUE(contains(r.out, "(default: 0.6,1,1.4)")) << r.out;
  const tr::SelectOptions o;
  EXPECT_EQ(o.lasts, (std::vector<int>{1, 5, 10, 16, 24}));
  EXPECT_EQ(o.alphas, (std::vector<double>{0.6, 1.0, 1.4}));
}
