// The defects a third hostile pass over attn-translate found (session 41) in the files it reads: a
// model file longer than its header says (read whole before it was refused), a NUL byte that ended
// the header early, weights whose activations overflow (empty translations, exit 0), and training
// checkpoints whose Adam moments are not finite, whose step count overflows, or whose options the
// flags would refuse. The .mo, dictionary and spm.model readers' cases are in test_text.cpp,
// test_corpora.cpp and test_batching.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "model_dir.hpp"
#include "safetensors_edit.hpp"
#include "safetensors_testing.hpp"
#include "sanitizers.hpp"
#include "train_state.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"

using namespace attn::translate::testing;

namespace {

class HostileFiles : public TrainedModelTest {
 protected:
  static void SetUpTestSuite() { train_suite_model("attn_hostile_files", 4, 2); }

  CliResult translate(const std::string& model_dir, const std::string& shell_prefix = "") {
    return run_command(
        shell_prefix + ATTN_TRANSLATE_BIN + " translate --threads 1 --model-dir " + model_dir, dir_,
        input("the red cat\n"));
  }
};

/// Every float of the tensors whose name contains `part` (or, with `suffix`, ends with it) set to
/// `value`.
void fill_tensors(const std::string& path, const std::string& part, float value,
                  bool suffix = false) {
  rewrite(
      path, [](auto&) {},
      [&](const std::string& name, std::vector<unsigned char>& bytes) {
        const std::size_t at = name.rfind(part);
        if (at == std::string::npos || (suffix && at + part.size() != name.size())) return;
        for (std::size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float))
          std::memcpy(bytes.data() + i, &value, sizeof(float));
      });
}

TEST_F(HostileFiles, AModelFileLongerThanItsHeaderSaysIsRefusedBeforeItIsRead) {
  // Extended by a sparse hole, the file was read whole first: 4 GiB here, which the 2 GB address
  // space below cannot hold (std::bad_alloc, no path); at 2 GB, 2.1 GB resident and 10 s.
  if (attn::testing::kSanitized)
    GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  const std::string m = model_copy(), file = m + "/model.safetensors";
  const auto size = fs::file_size(file);
  fs::resize_file(file, size + (std::uintmax_t{4} << 30));
  expect_cli_error(translate(m, "ulimit -v 2000000; "),
                   {file + ": the tensors cover ", "bytes but the data buffer holds ",
                    "(trailing bytes or truncated file)"});
}

TEST_F(HostileFiles, TensorsOutsideTheModelAreRefusedBeforeTheyAreRead) {
  // Declared in the header over a sparse hole, so that the tensors still tile the file: a name the
  // model does not have was refused only once the file had been read whole, and the training
  // state translate skips (adam.*, extra.*) was read whatever its size (1 GiB: 1.06 GB resident).
  // Under a 2 GB address space, reading the 4 GiB would fail with std::bad_alloc.
  if (attn::testing::kSanitized)
    GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  const std::uint64_t hole = std::uint64_t{4} << 30;
  {
    const std::string m = path("junk");
    fs::copy(suite_dir_ / "model", m, fs::copy_options::recursive);
    const std::string file = m + "/model.safetensors";
    attn::testing::append_sparse_tensor(file, "junk", hole);
    expect_cli_error(translate(m, "ulimit -v 2000000; "),
                     {file + " has unexpected tensor junk [4294967296], which is not a parameter"});
  }
  const std::string m = model_copy(), file = m + "/model.safetensors";
  attn::testing::append_sparse_tensor(file, "extra.pad", hole);
  const std::string outside =
      ": its tensors outside the model, up to extra.pad, hold 4294967296 "
      "bytes, more than the ";
  expect_cli_error(translate(m, "ulimit -v 2000000; "), {file + outside});
  const std::string out = path("avg.safetensors");
  expect_cli_error(run_command(std::string("ulimit -v 2000000; ") + ATTN_TRANSLATE_BIN +
                                   " average --threads 1 --inputs " + file + " --output " + out,
                               dir_),
                   {file + outside});
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(HostileFiles, ANulByteInTheHeaderIsRefused) {
  // nlohmann's lexer took the NUL for the end of its input: the bytes after it went unread, and
  // translate and average took the file (exit 0).
  const std::string m = model_copy(), file = m + "/model.safetensors";
  const std::string bytes = read_file(file);
  std::uint64_t old_length = 0;
  std::memcpy(&old_length, bytes.data(), 8);
  std::string header = bytes.substr(8, old_length);
  header.erase(header.find_last_not_of(' ') + 1);
  const std::size_t nul_at = header.size();
  header += std::string(1, '\0') + "THIS IS NOT JSON {{{";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  const std::uint64_t length = header.size();
  std::string head(8, '\0');
  std::memcpy(head.data(), &length, 8);
  write_file(file, head + header + bytes.substr(8 + old_length));
  expect_cli_error(translate(m), {file + ": header holds a NUL byte at offset " +
                                  std::to_string(nul_at) + " (JSON text has none)"});
}

TEST_F(HostileFiles, AModelWhoseActivationsOverflowIsRefusedWhileTranslating) {
  // Finite weights pass the load's check, but embeddings of 3e38 overflow: the logits were NaN,
  // and every sentence came out empty, exit 0.
  const std::string m = model_copy();
  fill_tensors(m + "/model.safetensors", "embed", 3e38f);
  expect_cli_error(translate(m), {"decode: the logit of token 0 for sentence 0 at step 0 is ",
                                  "the model's activations overflow"});
}

// A newest checkpoint that resumed and then failed, or went on wrong, is skipped for the next
// older one, named with the reason (the fallback of test_reliability_interrupts.cpp's
// ResumeFallsBackToTheNewestCheckpointThatLoads): Adam moments that are not finite (the first
// update wrote NaN weights into the next checkpoint), a second moment below zero, a step count that
// overflowed at the next update (undefined behaviour), and a learning-rate factor of 0 (the first
// update failed in noam_lr, naming no file).
TEST_F(HostileFiles, ResumeSkipsACheckpointWhoseStateCannotContinue) {
  const std::string m = model_copy();
  const auto ckpts = tr::list_checkpoints(m);
  ASSERT_EQ(ckpts.size(), 2u);  // steps 2 and 4
  const std::string newest = ckpts.back().second, older = ckpts.front().second;
  const std::string bytes = read_file(newest);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::function<void()> tamper;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {[&] { fill_tensors(newest, ".exp_avg", nan, /*suffix=*/true); },
       ".exp_avg holds nan at element 0, expected a finite number"},
      {[&] { fill_tensors(newest, ".exp_avg_sq", -1.0f, true); },
       ".exp_avg_sq holds -1 at element 0, expected a finite number >= 0"},
      {[&] { rewrite(newest, [](auto& meta) { meta["step"] = "9223372036854775807"; }); },
       "metadata \"step\" must be a non-negative decimal integer, got \"9223372036854775807\""},
      {[&] { rewrite(newest, [](auto& meta) { meta["train.lr_factor"] = "0"; }); },
       newest + ": metadata train.lr_factor = 0 must be finite and > 0"},
  };
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    write_file(newest, bytes);
    fs::remove(newest + ".unloadable");
    c.tamper();
    {
      tr::Trainer t(o, split());
      EXPECT_EQ(t.resumed_from(), older);
      ASSERT_EQ(t.skipped_checkpoints().size(), 1u);
      EXPECT_TRUE(contains(t.skipped_checkpoints()[0], newest + " ("))
          << t.skipped_checkpoints()[0];
      EXPECT_TRUE(contains(t.skipped_checkpoints()[0], c.reason)) << t.skipped_checkpoints()[0];
    }
    fs::rename(newest + ".unloadable", newest);  // set aside by the resume
  }
}

TEST_F(HostileFiles, ACheckpointsTokensPerUpdateBeyondTheDataNamesTheCheckpoint) {
  // It blamed --tokens-per-update, a flag the user had not given.
  const std::string m = model_copy();
  const std::string newest = tr::list_checkpoints(m).back().second;
  rewrite(newest, [](auto& meta) { meta["train.tokens_per_update"] = "1099511627776"; });
  tr::TrainOptions o = tiny_options(m);
  o.resume = true;
  const std::string msg = error_of([&] { tr::Trainer t(o, split()); });
  EXPECT_TRUE(contains(msg, newest + ": metadata train.tokens_per_update (its run's "
                                     "--tokens-per-update) 1099511627776 is more than the "))
      << msg;
}

}  // namespace
