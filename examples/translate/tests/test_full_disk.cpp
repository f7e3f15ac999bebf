// Full disk (issue 10): the files attn-translate writes besides checkpoints and models (those are
// in test_full_disk_models.cpp), each written while the file size limit (RLIMIT_FSIZE, with
// SIGXFSZ ignored, so write() fails with EFBIG as it fails with ENOSPC on a full disk) is below
// the size of the new file. Each must fail with an error naming the file, leave the old file byte
// for byte as it was, and leave no temporary file beside it.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <attn/error.hpp>
#include <attn/train/atomic_file.hpp>

#include "bpe.hpp"
#include "full_disk.hpp"
#include "train_report.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

namespace {

/// Runs `write` (which replaces `path`) under a file size limit of `limit` bytes and returns the
/// message of the IOError it must throw; checks that `path` and its directory are as before, and
/// that the same write without the limit does replace `path` with more than `limit` bytes (so the
/// limit was what stopped it).
std::string full_disk_error(const std::string& path, rlim_t limit,
                            const std::function<void()>& write) {
  const std::string before = read_file(path);
  EXPECT_FALSE(before.empty()) << path;
  const fs::path dir = fs::path(path).parent_path();
  const std::set<std::string> names = listing(dir);
  std::string message = "(no IOError)";
  {
    FileSizeLimit full(limit);
    try {
      write();
    } catch (const attn::IOError& e) {
      message = e.what();
    }
  }
  EXPECT_EQ(read_file(path), before) << path << " changed by a failed write";
  EXPECT_EQ(listing(dir), names) << "a failed write left a file behind in " << dir;
  write();
  const std::string after = read_file(path);
  EXPECT_NE(after, before) << "the write does not change " << path;
  EXPECT_GT(after.size(), limit) << "the new " << path << " fits under the limit";
  return message;
}

/// Both sides of the test corpus, and the options of a second vocabulary (60 pieces) to write
/// over the first (50 pieces), which train_first_vocabulary has written into `dir`.
struct VocabularyPair {
  std::vector<std::string> text;
  tr::BpeTrainOptions second;
};

VocabularyPair train_first_vocabulary(const std::string& dir) {
  const tr::CorpusSplit data = split();
  VocabularyPair v{data.train.src, {}};
  v.text.insert(v.text.end(), data.train.tgt.begin(), data.train.tgt.end());
  tr::BpeTrainOptions first;
  first.vocab_size = 50;
  v.second.vocab_size = 60;
  first.num_threads = v.second.num_threads = 1;
  tr::SubwordVocab::train(v.text, dir, first);
  return v;
}

class FullDisk : public TempDirTest {
 protected:
  static void SetUpTestSuite() {
    suite_dir_ = fs::temp_directory_path() / (temp_prefix() + "full_disk_model");
    fs::remove_all(suite_dir_);
    tr::TrainOptions o = tiny_options(model_dir());
    tr::Trainer t(o, split());
    t.train(2);
    t.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(suite_dir_); }
  static std::string model_dir() { return (suite_dir_ / "model").string(); }
  static inline fs::path suite_dir_;
};

TEST_F(FullDisk, ANewVocabularyKeepsTheOldSpmModelAndVocabTxt) {
  // SubwordVocab::train writes spm.model (kilobytes), then vocab.txt (tens of bytes): any limit
  // stops spm.model first, so a full disk must leave the old pair, which still loads together.
  const std::string d = path("vocab");
  const VocabularyPair v = train_first_vocabulary(d);
  const std::string vocab_txt = read_file(d + "/vocab.txt");
  const std::string m =
      full_disk_error(d + "/spm.model", 256, [&] { tr::SubwordVocab::train(v.text, d, v.second); });
  EXPECT_TRUE(contains(m, "cannot write " + d + "/spm.model (via ")) << m;
  EXPECT_TRUE(contains(m, "File too large")) << m;
  // full_disk_error ends with the successful write: the new pair replaced the old one.
  EXPECT_NE(read_file(d + "/vocab.txt"), vocab_txt);
  EXPECT_EQ(tr::SubwordVocab::load(d).size(), 60);
}

TEST_F(FullDisk, AFailedVocabTxtKeepsTheOldOne) {
  // vocab.txt (tens of bytes) is written after spm.model (kilobytes): no file size limit stops it
  // alone, since any that stops vocab.txt stops spm.model first. The writer's test hook
  // (before_atomic_write, atomic_file.hpp) lowers the limit once spm.model is in place, before
  // vocab.txt's temporary is created; the write then fails in the kernel, as on a disk that
  // filled up between the two files.
  const std::string d = path("vocab"), vocab_txt = d + "/vocab.txt";
  const VocabularyPair v = train_first_vocabulary(d);
  const std::string old_vocab_txt = read_file(vocab_txt), old_spm = read_file(d + "/spm.model");
  const std::set<std::string> names = listing(d);
  std::optional<FileSizeLimit> full;
  attn::detail::before_atomic_write() = [&](const std::string& path) {
    if (path == vocab_txt) full.emplace(16);
  };
  const std::string m =
      error_of<attn::IOError>([&] { tr::SubwordVocab::train(v.text, d, v.second); });
  attn::detail::before_atomic_write() = nullptr;
  ASSERT_TRUE(full.has_value()) << "vocab.txt was not written";
  full.reset();
  EXPECT_TRUE(contains(m, "cannot write " + vocab_txt + " (via " + vocab_txt + ".attn-tmp.")) << m;
  EXPECT_TRUE(contains(m, "File too large")) << m;
  EXPECT_EQ(read_file(vocab_txt), old_vocab_txt);
  EXPECT_EQ(listing(d), names) << "a failed write left a file behind in " << d;
  // spm.model is the new one, so the pair no longer matches, and loading says so. A vocabulary is
  // trained only in a directory without weights (check_fresh_model_dir), and training there again
  // writes both.
  EXPECT_NE(read_file(d + "/spm.model"), old_spm);
  EXPECT_TRUE(contains(error_of([&] { tr::SubwordVocab::load(d); }),
                       "was trained with a different vocabulary"));
  tr::SubwordVocab::train(v.text, d, v.second);
  EXPECT_EQ(tr::SubwordVocab::load(d).size(), 60);
}

TEST_F(FullDisk, CurvesSvgKeepsTheOldPlot) {
  const std::string svg = path("curves.svg");
  tr::write_curves_svg(svg, {{10, 5.0, 5.5, 0.5}});
  const std::vector<tr::CurvePoint> longer = {
      {10, 5.0, 5.5, 0.5}, {20, 4.0, 4.5, 1.5}, {30, 3.0, 3.5, 2.5}, {40, 2.5, 3.0, 4.0}};
  const std::string m = full_disk_error(svg, 512, [&] { tr::write_curves_svg(svg, longer); });
  EXPECT_TRUE(contains(m, "cannot write " + svg + " (via ")) << m;
  EXPECT_TRUE(contains(m, "File too large")) << m;
}

TEST_F(FullDisk, AttentionSvgKeepsTheOldPlot) {
  const std::string svg = path("attention.svg");
  tr::Translator translator(model_dir());
  auto plot = [&](const std::string& sentence) {
    tr::write_attention_svg(svg, translator.model(), translator.vocab(),
                            {translator.vocab().encode(sentence)}, {sentence});
  };
  plot("the cat");
  const std::string m = full_disk_error(svg, 512, [&] { plot("the big red dog sleeps"); });
  EXPECT_TRUE(contains(m, "cannot write " + svg + " (via ")) << m;
  EXPECT_TRUE(contains(m, "File too large")) << m;
}

TEST_F(FullDisk, TranslateOutputKeepsTheOldFile) {
  // The CLI as a user runs it: exit 1, one error line naming the file, the old results kept.
  const std::string out = path("out.txt"), in = path("in.txt");
  write_file(out, "previous results\n");
  std::string lines;
  for (int i = 0; i < 1200; ++i) lines += "the red cat\n";  // at least 1200 bytes of output
  write_file(in, lines);
  const std::string args = "translate --threads 1 --greedy --model-dir " + model_dir() +
                           " --input " + in + " --output " + out;
  for (const char* capture : {"cli.stdout", "cli.stderr"}) write_file(path(capture), "");
  CliResult failed;
  const std::string m = full_disk_error(out, 1024, [&] {
    const CliResult r = run_cli(args, dir_);
    if (failed.exit_code == -1) failed = r;  // the run under the limit
    if (r.exit_code != 0) throw attn::IOError(r.err);
  });
  expect_cli_error(failed,
                   {"cannot write " + out + " (via " + out + ".attn-tmp.", "File too large"});
  EXPECT_TRUE(contains(m, "cannot write " + out)) << m;
}

}  // namespace
