// Full disk (issue 10) for the weight files, through the real file system and the CLI as a user
// runs it: `train --resume` writing a checkpoint beside the old ones, `train` writing
// model.safetensors over the old one when it finishes, and `average` doing the same. The file size
// limit (full_disk.hpp) is below the size of the new file. Each run must exit 1 with an error
// naming the file, and leave every file of the model directory byte for byte as it was, with
// nothing added (no temporary, no partial checkpoint). The same run without the limit then
// succeeds, and writes more bytes than the limit (so the limit was what stopped it).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "corpus_io.hpp"
#include "full_disk.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;

namespace {

/// Every regular file of `dir` with its bytes, by name.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    files[e.path().filename().string()] = read_file(e.path().string());
  return files;
}

/// A model directory trained by the CLI once per suite: checkpoints of steps 2 and 4 and
/// model.safetensors (the last weights).
class FullDiskModels : public TempDirTest {
 protected:
  static void SetUpTestSuite() {
    suite_dir_ = fresh_temp_path("full_disk_models");
    fs::create_directories(suite_dir_);
    const tr::CorpusSplit d = split();
    tr::write_lines((suite_dir_ / "train.en").string(), d.train.src);
    tr::write_lines((suite_dir_ / "train.de").string(), d.train.tgt);
    const CliResult r = run_cli("train --model-dir " + model() + " --steps 4 " + common_flags(),
                                suite_dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(suite_dir_); }
  static std::string model() { return (suite_dir_ / "model").string(); }
  static std::string common_flags() {
    return "--threads 1 --src " + (suite_dir_ / "train.en").string() + " --tgt " +
           (suite_dir_ / "train.de").string() +
           " --preset tiny --dropout 0.1 --vocab-size 60 --max-tokens 128 --tokens-per-update 300"
           " --max-len 32 --valid-every 0 --checkpoint-every 2 --keep 3 --svg 0 --log-every 1";
  }

  /// Runs `attn-translate <args>` on a copy of the suite's model directory, whose path replaces
  /// "MODEL" in `args`, under a file size limit of half the size of the copy's file `sized_like`;
  /// checks the failure and returns the copy. `written` is the file the run fails to write.
  std::string expect_full_disk(std::string args, const std::string& sized_like,
                               const std::string& written) {
    const std::string m = path("model");
    fs::copy(model(), m, fs::copy_options::recursive);
    args.replace(args.find("MODEL"), 5, m);
    const std::string target = m + "/" + written;
    const auto limit = static_cast<rlim_t>(fs::file_size(m + "/" + sized_like) / 2);
    const std::map<std::string, std::string> before = snapshot(m);
    for (const char* capture : {"cli.stdout", "cli.stderr"}) write_file(path(capture), "");
    CliResult r;
    {
      FileSizeLimit full(limit);
      r = run_cli(args, dir_);
    }
    EXPECT_EQ(r.exit_code, 1) << r.err;
    const auto lines = r.err_lines();
    EXPECT_FALSE(lines.empty());
    const std::string last = lines.empty() ? "" : lines.back();
    EXPECT_EQ(
        last.rfind(
            "attn-translate: error: cannot write " + target + " (via " + target + ".attn-tmp.", 0),
        0u)
        << r.err;
    EXPECT_TRUE(contains(last, "): File too large")) << last;
    const std::map<std::string, std::string> after = snapshot(m);
    EXPECT_TRUE(after == before) << "the failed run changed or added files in " << m;
    for (const auto& [name, bytes] : after)
      EXPECT_TRUE(before.count(name) && before.at(name) == bytes) << name;
    r = run_cli(args, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(fs::file_size(target), limit) << "the new " << target << " fits under the limit";
    return m;
  }

  inline static fs::path suite_dir_;
};

TEST_F(FullDiskModels, TrainResumeKeepsTheOldCheckpointsWhenANewOneDoesNotFit) {
  const std::string m =
      expect_full_disk("train --model-dir MODEL --resume --steps 6 " + common_flags(),
                       "checkpoint_4.safetensors", "checkpoint_6.safetensors");
  EXPECT_EQ(tr::list_checkpoints(m).back().first, 6);
}

TEST_F(FullDiskModels, TrainKeepsTheOldModelWhenTheFinalOneDoesNotFit) {
  // Resumed at its last step: no update, and finish() writes the average of the last two
  // checkpoints over the last weights in model.safetensors.
  expect_full_disk("train --model-dir MODEL --resume --steps 4 --average 2 " + common_flags(),
                   "model.safetensors", "model.safetensors");
}

TEST_F(FullDiskModels, AverageKeepsTheOldModel) {
  expect_full_disk("average --threads 1 --model-dir MODEL --last 2", "model.safetensors",
                   "model.safetensors");
}

}  // namespace
