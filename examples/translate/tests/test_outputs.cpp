// What attn-translate leaves in the files it writes (issue 10): a killed writer's temporary is
// removed by the next write of the same file, and average refuses to write a model that
// translate would refuse to load.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "corpus_io.hpp"
#include "model_dir.hpp"
#include "safetensors_edit.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

namespace {

class Outputs : public TrainedModelTest {
 protected:
  static void SetUpTestSuite() { train_suite_model("attn_outputs", 4, 2); }

  /// The temporary that a writer of `path` killed by SIGKILL leaves: "<path>.attn-tmp.<its pid>",
  /// written by a shell that then kills itself.
  std::string killed_writer_leftover(const std::string& path) {
    run_command(
        "sh -c 'echo partial > \"$0.attn-tmp.$$\"; echo $$ > \"$0.pid\"; kill -KILL $$' " + path,
        dir_);
    const std::string leftover = path + ".attn-tmp." + tr::read_lines(path + ".pid").at(0);
    fs::remove(path + ".pid");
    EXPECT_TRUE(fs::exists(leftover)) << leftover;
    return leftover;
  }
};

TEST_F(Outputs, TranslateOutputRemovesTheTemporariesOfKilledWriters) {
  // A killed `translate --output f` left f.tmp.<pid> (as temporaries were named then) behind for
  // good.
  const std::string out = path("out.txt");
  const std::string killed = killed_writer_leftover(out);
  const std::string other = killed_writer_leftover(path("other.txt"));
  const std::string alive = out + ".attn-tmp.1";  // pid 1 exists: its writer may still be at work
  write_file(alive, "partial");
  const CliResult r = run("translate --threads 1 --greedy --model-dir " + model() + " --input " +
                          input("the red cat\n") + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tr::read_lines(out).size(), 1u);
  EXPECT_FALSE(fs::exists(killed)) << killed;
  EXPECT_TRUE(fs::exists(other)) << "a temporary of another file was removed";
  EXPECT_TRUE(fs::exists(alive)) << "the temporary of a live writer was removed";
}

TEST_F(Outputs, AverageRefusesToWriteANonFiniteModel) {
  // translate and --resume refuse a model with a NaN weight; average used to write one.
  const std::string m = model_copy(), out = path("averaged.safetensors");
  const auto ckpts = tr::list_checkpoints(m);
  ASSERT_EQ(ckpts.size(), 2u);  // steps 2 and 4
  const std::string poisoned = ckpts.back().second, final_model = tr::final_model_path(m);
  rewrite(
      poisoned, [](auto&) {},
      [](const std::string& name, std::vector<unsigned char>& bytes) {
        if (name != "decoder.layers.0.linear2.weight") return;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(bytes.data() + 4 * 7, &nan, 4);
      });
  const std::string old_model = read_file(final_model);
  const std::string why =
      "parameter decoder.layers.0.linear2.weight of the average is nan at "
      "element 7 (" +
      poisoned + " holds nan there)";
  expect_cli_error(run("average --threads 1 --model-dir " + m + " --last 2"),
                   {"average: not writing " + final_model + ": " + why});
  EXPECT_EQ(read_file(final_model), old_model);
  expect_cli_error(run("average --threads 1 --inputs " + ckpts.front().second + " " + poisoned +
                       " --output " + out),
                   {"average: not writing " + out + ": " + why});
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    EXPECT_FALSE(contains(e.path().filename().string(), ".attn-tmp.")) << e.path();
}

// translate_each decodes kChunkLines lines at a time and writes the lines as they come: the same
// lines as translate() of them all, in order, across chunk boundaries; and a bad line in a later
// chunk is still refused before any decoding.
TEST_F(Outputs, TranslationInChunksGivesTheLinesOfTranslationWhole) {
  tr::Translator t(model());
  tr::TranslateOptions greedy;
  greedy.greedy = true;
  const std::size_t chunk = tr::Translator::kChunkLines;
  std::vector<std::string> lines(chunk + 5);  // empty lines decode to empty lines, quickly
  const std::vector<std::size_t> at = {0, chunk - 1, chunk, chunk + 4};
  const std::vector<std::string> words = {"the red cat", "a dog", "the cat runs", "two dogs"};
  for (std::size_t i = 0; i < at.size(); ++i) lines[at[i]] = words[i];
  std::vector<std::string> each;
  t.translate_each(lines, greedy, "input", [&](std::string&& s) { each.push_back(std::move(s)); });
  ASSERT_EQ(each.size(), lines.size());
  const std::vector<std::string> whole = t.translate(words, greedy);
  for (std::size_t i = 0; i < at.size(); ++i) EXPECT_EQ(each[at[i]], whole[i]) << at[i];
  EXPECT_EQ(each[1], "");
  lines.back() = "\xff";
  std::size_t sunk = 0;
  const std::string message = error_of<attn::DataError>(
      [&] { t.translate_each(lines, greedy, "input", [&](std::string&&) { ++sunk; }); });
  EXPECT_NE(message.find("input line " + std::to_string(lines.size())), std::string::npos)
      << message;
  EXPECT_EQ(sunk, 0u);
}

}  // namespace
