// Shared by the attn-translate pipeline and CLI tests: a tiny synthetic corpus, options that train
// on it in milliseconds, a per-test temporary directory, a runner for the attn-translate binary
// (its path comes from CMake as ATTN_TRANSLATE_BIN), and the Cli fixture of test_cli.cpp and
// test_cli_input.cpp.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <attn/random.hpp>

#include "corpus_io.hpp"
#include "error_helpers.hpp"
#include "temp_paths.hpp"
#include "trainer.hpp"

namespace attn::translate::testing {

namespace fs = std::filesystem;

// A toy "language pair": every word has a fixed translation and the target reverses the word
// order, so the model must learn both a lexicon and attention that moves tokens.
inline ParallelCorpus synthetic(std::size_t n, std::uint64_t seed) {
  static const char* kSrc[] = {"red", "blue",  "green", "cat",    "dog", "house",
                               "big", "small", "runs",  "sleeps", "the", "a"};
  static const char* kTgt[] = {"rot",   "blau",  "gruen",  "Katze",    "Hund", "Haus",
                               "gross", "klein", "laeuft", "schlaeft", "der",  "ein"};
  Rng rng(seed);
  ParallelCorpus c;
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

inline CorpusSplit split() {
  CorpusSplit d;
  d.train = synthetic(200, 1);
  d.valid = synthetic(10, 2);
  d.test = synthetic(10, 3);
  return d;
}

inline TrainOptions tiny_options(const std::string& dir) {
  TrainOptions o;
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

/// A fresh directory per test, removed afterwards: path(name) inside it, dir_ itself.
using attn::testing::TempDirTest;

using attn::testing::contains;
using attn::testing::error_of;

struct CliResult {
  int exit_code = -1;
  std::string out, err;
  /// The lines of stderr.
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < err.size()) {
      std::size_t end = err.find('\n', start);
      if (end == std::string::npos) end = err.size();
      lines.push_back(err.substr(start, end - start));
      start = end + 1;
    }
    return lines;
  }
};

/// Runs the shell command `command` with stdin from `stdin_path`; `scratch` is a directory for
/// the captured output.
inline CliResult run_command(const std::string& command, const std::string& scratch,
                             const std::string& stdin_path = "/dev/null") {
  const std::string out = scratch + "/cli.stdout", err = scratch + "/cli.stderr";
  const std::string cmd = command + " < " + stdin_path + " > " + out + " 2> " + err;
  const int rc = std::system(cmd.c_str());
  CliResult r;
  if (WIFEXITED(rc)) r.exit_code = WEXITSTATUS(rc);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

/// Runs `attn-translate <args>` (run_command). Arguments go through the shell: keep them free of
/// spaces.
inline CliResult run_cli(const std::string& args, const std::string& scratch,
                         const std::string& stdin_path = "/dev/null") {
  return run_command(std::string(ATTN_TRANSLATE_BIN) + " " + args, scratch, stdin_path);
}

/// Each file of `names` is in directory a, not empty, and the same bytes in directory b.
inline void expect_same_files(const std::string& a, const std::string& b,
                              const std::vector<std::string>& names) {
  for (const std::string& f : names) {
    const std::string x = read_file(a + "/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == read_file(b + "/" + f)) << f;
  }
}

/// Exit code 1 and exactly one stderr line: "attn-translate: error: " + a message holding every
/// part of `expected`; nothing on stdout.
inline void expect_cli_error(const CliResult& r, const std::vector<std::string>& expected) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("attn-translate: error: ", 0), 0u) << lines[0];
  for (const std::string& part : expected) EXPECT_TRUE(contains(lines[0], part)) << lines[0];
  EXPECT_TRUE(r.out.empty()) << r.out;
}

/// A model trained once per test suite, in a directory of its own, for the tests to read or to
/// copy and tamper with; and the CLI runner in the test's directory.
class TrainedModelTest : public TempDirTest {
 protected:
  /// For SetUpTestSuite: tiny_options, `updates` updates, a checkpoint every `checkpoint_every`.
  static void train_suite_model(const std::string& name, Index updates, Index checkpoint_every) {
    suite_dir_ = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    fs::remove_all(suite_dir_);
    TrainOptions o = tiny_options((suite_dir_ / "model").string());
    o.checkpoint_every = checkpoint_every;
    Trainer t(o, split());
    t.train(updates);
    t.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(suite_dir_); }

  static std::string model() { return (suite_dir_ / "model").string(); }
  /// A copy of the suite's model directory, to tamper with.
  std::string model_copy() {
    const std::string d = path("model");
    fs::copy(suite_dir_ / "model", d, fs::copy_options::recursive);
    return d;
  }
  CliResult run(const std::string& args, const std::string& stdin_path = "/dev/null") {
    return run_cli(args, dir_, stdin_path);
  }
  /// A file in the test's directory holding `text`.
  std::string input(const std::string& text) {
    const std::string p = path("in.txt");
    write_file(p, text);
    return p;
  }

  inline static fs::path suite_dir_;
};

/// The attn-translate binary run as a user runs it (test_cli.cpp, test_cli_input.cpp).
class Cli : public TrainedModelTest {
 protected:
  // One small trained model for the translate and evaluate tests of the whole suite.
  static void SetUpTestSuite() { train_suite_model("attn_translate_cli", 5, 0); }

  void expect_error(const CliResult& r, const std::vector<std::string>& expected) {
    expect_cli_error(r, expected);
  }
};

}  // namespace attn::translate::testing

// The short names every translate test uses.
namespace tr = attn::translate;
namespace fs = std::filesystem;
