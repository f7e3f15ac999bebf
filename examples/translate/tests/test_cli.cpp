// The attn-translate binary itself: every subcommand's --help shows every option's default, the
// whole pipeline (train, resume, translate, evaluate, average) runs from the command line and
// resumes bit-exactly, and bad input ends the process with exit code 1, one line
// "attn-translate: error: ..." naming what was expected and what came, and nothing written.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "corpus_io.hpp"
#include "gettext_corpus.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

namespace {

// ---------------------------------------------------------------------------- --help parsing

// One option of a CLI11 help page: "  --name TYPE=default REQUIRED   description", where the
// description may continue on the next lines.
struct HelpEntry {
  std::string name;          // "--beam"
  std::string type;          // "INT:POSITIVE=4", empty for a flag
  bool has_default = false;  // "=value" in the type
  std::string default_value;
  bool required = false;
  std::string description;
};

std::map<std::string, HelpEntry> parse_help(const std::string& text) {
  static const std::regex option(
      R"(^  (-[^ ]+)(?: ((?:INT|UINT|FLOAT|TEXT|BOOLEAN)[^ ]*))?(?: (REQUIRED))?(?: \.\.\.)? *(.*)$)");
  std::map<std::string, HelpEntry> entries;
  HelpEntry* last = nullptr;
  std::istringstream in(text);
  bool in_options = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "Options:") {
      in_options = true;
      continue;
    }
    if (!in_options) continue;
    if (line.empty() || line.back() == ':') break;  // "Subcommands:"
    std::smatch m;
    if (std::regex_match(line, m, option)) {
      std::string name = m[1];
      name = name.substr(name.rfind(',') == std::string::npos ? 0 : name.rfind(',') + 1);
      HelpEntry e;
      e.name = name;
      e.type = m[2];
      const std::size_t eq = e.type.rfind('=');
      e.has_default = eq != std::string::npos;
      if (e.has_default) e.default_value = e.type.substr(eq + 1);
      e.required = m[3].matched;
      e.description = m[4];
      last = &(entries[name] = e);
    } else if (last != nullptr) {
      last->description += " " + line.substr(line.find_first_not_of(' '));
    } else {
      ADD_FAILURE() << "unexpected help line: " << line;
    }
  }
  return entries;
}

template <class T>
std::string str(T v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// The defaults of the option structs as --help must show them.
std::map<std::string, std::string> train_defaults() {
  const tr::TrainOptions o;
  return {{"--preset", o.preset},
          {"--d-model", str(o.d_model)},
          {"--layers", str(o.layers)},
          {"--heads", str(o.heads)},
          {"--d-ff", str(o.d_ff)},
          {"--dropout", str(o.dropout)},
          {"--label-smoothing", str(o.label_smoothing)},
          {"--warmup", str(o.warmup)},
          {"--lr-factor", str(o.lr_factor)},
          {"--clip-norm", str(o.clip_norm)},
          {"--max-tokens", str(o.max_tokens)},
          {"--tokens-per-update", str(o.tokens_per_update)},
          {"--vocab-size", str(o.vocab_size)},
          {"--max-len", str(o.max_len)},
          {"--steps", str(o.steps)},
          {"--minutes", str(o.minutes)},
          {"--valid-every", str(o.valid_every)},
          {"--checkpoint-every", str(o.checkpoint_every)},
          {"--keep", str(o.keep)},
          {"--average", str(o.average)},
          {"--seed", str(o.seed)},
          {"--svg", str(o.svg)},
          {"--log-every", str(o.log_every)},
          {"--bleu-sentences", str(o.bleu_sentences)},
          {"--gettext-dir", tr::GettextCorpusOptions{}.directory},
          {"--threads", str(o.threads)}};
}

std::map<std::string, std::string> decode_defaults() {
  const tr::TranslateOptions o;
  return {{"--beam", str(o.beam)},
          {"--alpha", str(o.alpha)},
          {"--batch-size", str(o.batch_size)},
          {"--max-extra-length", str(o.max_extra_length)},
          {"--threads", "2"}};
}

}  // namespace

class Cli : public TempDirTest {
 protected:
  // One small trained model for the translate and evaluate tests of the whole suite.
  static void SetUpTestSuite() {
    suite_dir_ = fs::temp_directory_path() / ("attn_translate_cli_" + std::to_string(::getpid()));
    fs::remove_all(suite_dir_);
    tr::TrainOptions o = tiny_options((suite_dir_ / "model").string());
    tr::Trainer t(o, split());
    t.train(5);
    t.finish();
  }
  static void TearDownTestSuite() { fs::remove_all(suite_dir_); }
  static std::string model() { return (suite_dir_ / "model").string(); }

  CliResult run(const std::string& args, const std::string& stdin_path = "/dev/null") {
    return run_cli(args, root_.string(), stdin_path);
  }
  void expect_error(const CliResult& r, const std::vector<std::string>& expected) {
    expect_cli_error(r, expected);
  }

  static fs::path suite_dir_;
};
fs::path Cli::suite_dir_;

TEST_F(Cli, EverySubcommandHelpShowsThreadsAndEveryDefault) {
  const std::map<std::string, std::map<std::string, std::string>> expected = {
      {"", {{"--threads", "2"}}},
      {"train", train_defaults()},
      {"translate", decode_defaults()},
      {"evaluate", decode_defaults()},
      {"average", {{"--threads", "2"}, {"--last", "0"}}}};
  for (const auto& [sub, defaults] : expected) {
    SCOPED_TRACE("attn-translate " + sub + " --help");
    const CliResult r = run(sub + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto entries = parse_help(r.out);
    ASSERT_GE(entries.size(), 2u) << r.out;
    for (const auto& [name, value] : defaults) {
      auto it = entries.find(name);
      ASSERT_NE(it, entries.end()) << name << " missing from\n" << r.out;
      EXPECT_TRUE(it->second.has_default) << name << " shows no default";
      EXPECT_EQ(it->second.default_value, value) << name;
    }
    // Whatever else is listed says its default too: a value, REQUIRED, or "(default: ...)" for
    // flags and for options whose absence means something.
    for (const auto& [name, e] : entries) {
      if (name == "--help") continue;
      EXPECT_TRUE(e.has_default || e.required || contains(e.description, "(default: "))
          << name << " " << e.type << " " << e.description;
      if (e.type.empty()) {
        EXPECT_TRUE(contains(e.description, "(default: off)")) << name;
      }
    }
  }
}

TEST_F(Cli, TrainResumeTranslateEvaluateAverage) {
  const tr::CorpusSplit d = split();
  const std::string src = dir("train.en"), tgt = dir("train.de");
  const std::string test_src = dir("test.en"), test_tgt = dir("test.de");
  tr::write_lines(src, d.train.src);
  tr::write_lines(tgt, d.train.tgt);
  tr::write_lines(test_src, d.test.src);
  tr::write_lines(test_tgt, d.test.tgt);
  const std::string common =
      "--threads 1 --src " + src + " --tgt " + tgt +
      " --preset tiny --dropout 0.1 --vocab-size 60 --max-tokens 128 "
      "--tokens-per-update 300 --max-len 32 --valid-every 0 --checkpoint-every 0 "
      "--svg 0 --log-every 1";
  const std::string clip = " --warmup 20 --clip-norm 0.5";
  const std::string a = dir("a"), b = dir("b");
  CliResult r = run("train --model-dir " + a + " --steps 2 " + common + clip);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The stored training options win on --resume: a different --clip-norm and --warmup are ignored.
  r = run("train --model-dir " + a + " --steps 4 --resume " + common + " --clip-norm 0 --warmup 7");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run("train --model-dir " + b + " --steps 4 " + common + clip);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "step 4 | loss ")) << r.err;
  // stderr is a file here: plain progress lines, no carriage returns or escape codes.
  EXPECT_EQ(r.err.find_first_of("\r\033"), std::string::npos) << r.err;
  // Interrupted and uninterrupted runs write the same bytes: weights, Adam, RNG, data position,
  // options and every update's loss.
  expect_same_files(a, b, {"checkpoint_4.safetensors", "model.safetensors", "spm.model"});

  // translate: stdin to stdout keeps one line per line, empty ones included.
  const std::string in = dir("in.txt");
  write_file(in, "the red cat\n\na big dog sleeps\n");
  r = run("translate --threads 1 --greedy --model-dir " + a, in);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> v;
    std::istringstream s(r.out);
    for (std::string l; std::getline(s, l);) v.push_back(l);
    return v;
  }();
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[1], "");
  // Files in and out, beam search: the same model gives what the library gives.
  const std::string out = dir("out.txt");
  r = run("translate --threads 1 --model-dir " + a + " --input " + test_src + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  tr::Translator translator(a);
  EXPECT_EQ(tr::read_lines(out), translator.translate(d.test.src, tr::TranslateOptions{}));

  // evaluate: with the model, and of the hypotheses just written.
  r = run("evaluate --threads 1 --model-dir " + a + " --src " + test_src + " --ref " + test_tgt);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("BLEU = ", 0), 0u) << r.out;
  const CliResult hyp = run("evaluate --hyp " + out + " --ref " + test_tgt);
  ASSERT_EQ(hyp.exit_code, 0) << hyp.err;
  EXPECT_EQ(hyp.out, r.out);  // the same translations, the same score
  r = run("evaluate --hyp " + test_tgt + " --ref " + test_tgt);
  EXPECT_EQ(r.out.rfind("BLEU = 100.00", 0), 0u) << r.out;

  // average: the last two checkpoints (steps 2 and 4) into model.safetensors.
  r = run("average --model-dir " + a + " --last 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "averaged 2 checkpoints")) << r.err;
  EXPECT_FALSE(read_file(a + "/model.safetensors") == read_file(b + "/model.safetensors"));
}

// --no-eval, for timing runs: training ends after its updates, without the validation and the
// test BLEU that end a run which has validation and test sets, and trains the same weights.
TEST_F(Cli, NoEvalEndsTrainingWithoutValidationOrTestBleu) {
  const tr::CorpusSplit d = split();
  std::string data =
      " --threads 1 --preset tiny --vocab-size 60 --max-tokens 128 --max-len 32 --steps 2 "
      "--checkpoint-every 0 --svg 0 --show 1";
  for (const auto& [name, corpus] :
       {std::pair<std::string, const tr::ParallelCorpus*>{"", &d.train},
        {"valid-", &d.valid},
        {"test-", &d.test}}) {
    ASSERT_FALSE(corpus->empty()) << name;
    tr::write_lines(dir(name + "src"), corpus->src);
    tr::write_lines(dir(name + "tgt"), corpus->tgt);
    data += " --" + name + "src " + dir(name + "src") + " --" + name + "tgt " + dir(name + "tgt");
  }
  const std::string evaluated = dir("evaluated"), timed = dir("timed");
  CliResult r = run("train --model-dir " + evaluated + data);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "valid step 2 | loss ")) << r.err;
  EXPECT_TRUE(contains(r.out, "test BLEU (beam 4")) << r.out;
  r = run("train --model-dir " + timed + data + " --no-eval");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "valid step")) << r.err;
  EXPECT_EQ(r.out, "");
  expect_same_files(evaluated, timed, {"model.safetensors"});
  // Validating every N updates and not at all contradict each other: CLI11's parse error.
  r = run("train --model-dir " + dir("both") + data + " --no-eval --valid-every 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--valid-every excludes --no-eval")) << r.err;
  EXPECT_FALSE(fs::exists(dir("both")));
}

// The final report translates the test set with the saved model, which refuses a line longer than
// its max_len: that used to end a finished training run with an error.
TEST_F(Cli, ATestLineLongerThanMaxLenIsNamedBeforeTraining) {
  tr::CorpusSplit d = split();
  for (int i = 0; i < 40; ++i) d.test.src[1] += " green house";
  std::string data =
      " --threads 1 --preset tiny --vocab-size 60 --max-tokens 128 --max-len 32 --steps 2 "
      "--checkpoint-every 1 --svg 0";
  for (const auto& [name, corpus] :
       {std::pair<std::string, const tr::ParallelCorpus*>{"", &d.train}, {"test-", &d.test}}) {
    tr::write_lines(dir(name + "src"), corpus->src);
    tr::write_lines(dir(name + "tgt"), corpus->tgt);
    data += " --" + name + "src " + dir(name + "src") + " --" + name + "tgt " + dir(name + "tgt");
  }
  const std::string model = dir("model");
  expect_error(run("train --model-dir " + model + data),
               {"test line 2 has ", " subword tokens, more than the model's max_len 32"});
  EXPECT_FALSE(fs::exists(model + "/checkpoint_1.safetensors"));
  const CliResult r = run("train --model-dir " + dir("timed") + data + " --no-eval");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Cli, BadTrainingDataIsRefusedAndNothingIsWritten) {
  const std::string model = dir("model"), good_en = dir("good.en"), good_de = dir("good.de");
  write_file(good_en, "one\ntwo\nthree\n");
  write_file(good_de, "eins\nzwei\ndrei\n");
  auto train = [&](const std::string& src, const std::string& tgt) {
    return run("train --threads 1 --model-dir " + model + " --src " + src + " --tgt " + tgt +
               " --steps 1");
  };

  const std::string missing = dir("missing.en");
  expect_error(train(missing, good_de), {"cannot open '" + missing + "' for reading"});

  const std::string directory = dir("a_directory");
  fs::create_directories(directory);
  expect_error(train(good_en, directory), {"cannot read '" + directory + "'"});

  const std::string two = dir("two.de");
  write_file(two, "eins\nzwei\n");
  expect_error(train(good_en, two), {"parallel files must have the same number of lines",
                                     "'" + good_en + "' has 3", "'" + two + "' has 2"});

  const std::string empty = dir("empty.de");
  write_file(empty, "eins\n \ndrei\n");
  expect_error(train(good_en, empty),
               {"'" + empty + "' line 2: expected a sentence, found an empty line"});

  const std::string bad = dir("bad.en");
  write_file(bad,
             "one\ntwo\nthr\xe9"
             "e\n");  // Latin-1, not UTF-8
  expect_error(train(bad, good_de),
               {"'" + bad +
                "' line 3: expected UTF-8 text, found an invalid byte sequence at "
                "byte offset 3 of the line (byte 0xe9)"});

  expect_error(run("train --threads 1 --model-dir " + model + " --src " + good_en),
               {"--src and --tgt go together"});
  // Validation or test sets given but empty: refused, not skipped.
  const std::string nothing = dir("nothing.txt");
  write_file(nothing, "");
  for (const std::string set : {"valid", "test"})
    expect_error(
        run("train --threads 1 --model-dir " + model + " --src " + good_en + " --tgt " + good_de +
            " --steps 1 --" + set + "-src " + nothing + " --" + set + "-tgt " + nothing),
        {"--" + set + "-src/--" + set + "-tgt '" + nothing + "' and '" + nothing +
         "' hold no sentence pair: nothing to score"});
  EXPECT_FALSE(fs::exists(model));
}

TEST_F(Cli, CorruptGettextCatalogIsNamed) {
  const std::string model = dir("model"), mo = dir("mo");
  // The built-in corpus's other sources absent, so that the catalogs are all there is.
  const std::string no_other_sources =
      " --mix gettext --apt-lists-dir " + dir("no_lists") + " --dictionary " + dir("no_dictionary");
  fs::create_directories(mo);
  auto train = [&] {
    return run("train --threads 1 --model-dir " + model + no_other_sources + " --gettext-dir " +
               mo + " --steps 1");
  };
  const std::string file = mo + "/broken.mo";
  write_file(file, "0123456789");
  expect_error(train(), {"'" + file + "': expected a .mo header of 28 bytes, the file has 10"});
  write_file(file, std::string(28, 'X'));
  expect_error(train(),
               {"'" + file + "': not a .mo file: expected magic 0x950412de", "found 0x58585858"});
  // A valid header announcing 5 strings in a file that ends after the header.
  std::string header(28, '\0');
  const unsigned char fields[] = {0xde, 0x12, 0x04, 0x95, 0, 0, 0, 0, 5, 0, 0,  0, 28, 0,
                                  0,    0,    68,   0,    0, 0, 0, 0, 0, 0, 28, 0, 0,  0};
  for (std::size_t i = 0; i < header.size(); ++i) header[i] = static_cast<char>(fields[i]);
  write_file(file, header);
  expect_error(train(), {"'" + file +
                         "': the original table of 5 entries at offset 28 ends at "
                         "byte 68, beyond the end of the file (28 bytes)"});
  EXPECT_FALSE(fs::exists(model));
  expect_error(run("train --threads 1 --model-dir " + model + no_other_sources + " --gettext-dir " +
                   dir("none")),
               {"no source of the built-in corpus could be read: ",
                "trans-de-en dictionary: cannot open the dictionary",
                "gettext catalogs: cannot list the gettext catalogs in '" + dir("none") + "'"});
}

namespace {

// Reads from `fd` until a '\n' arrives; fails the test after `seconds` without one.
std::string read_line_within(int fd, int seconds) {
  std::string line;
  char c = 0;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, seconds * 1000);
    if (ready <= 0) {
      ADD_FAILURE() << "no answer within " << seconds << " s, got '" << line << "'";
      return line;
    }
    if (::read(fd, &c, 1) != 1) {
      ADD_FAILURE() << "the translator closed its output after '" << line << "'";
      return line;
    }
    if (c == '\n') return line;
    line += c;
  }
}

}  // namespace

// An interactive session: each line is answered while stdin stays open, as a person typing
// into `attn-translate translate` would see it.
TEST_F(Cli, TranslateAnswersEachLineAtOnce) {
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const std::string bin = ATTN_TRANSLATE_BIN, dir_arg = model();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
    ::execl(bin.c_str(), bin.c_str(), "translate", "--threads", "1", "--greedy", "--model-dir",
            dir_arg.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  tr::Translator translator(model());
  tr::TranslateOptions greedy;
  greedy.greedy = true;
  for (const std::string line : {"the red cat", "", "a big dog sleeps"}) {
    const std::string in = line + "\n";
    ASSERT_EQ(::write(to_child[1], in.data(), in.size()), static_cast<ssize_t>(in.size()));
    EXPECT_EQ(read_line_within(from_child[0], 60), translator.translate({line}, greedy)[0]);
  }
  ::close(to_child[1]);  // end of input: the translator exits
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::close(from_child[0]);
}

TEST_F(Cli, BadTranslateInputIsRefusedAndTheOutputKept) {
  const std::string out = dir("out.txt");
  write_file(out, "previous results\n");
  auto translate = [&](const std::string& args, const std::string& in = "/dev/null") {
    return run(
        "translate --threads 1 --greedy --model-dir " + model() + " --output " + out + " " + args,
        in);
  };
  const std::string missing = dir("missing.txt");
  expect_error(translate("--input " + missing), {"cannot open '" + missing + "' for reading"});

  const std::string bad = dir("bad.txt");
  write_file(bad, "the cat\nred \xc3\x28 dog\n");
  expect_error(translate("", bad),
               {"<stdin> line 2: expected UTF-8 text, found an invalid byte sequence at byte "
                "offset 4"});
  expect_error(translate("--input " + bad),
               {"'" + bad +
                "' line 2: expected UTF-8 text, found an invalid byte sequence at "
                "byte offset 4"});

  std::string long_line;
  for (int i = 0; i < 40; ++i) long_line += "house ";
  const std::string too_long = dir("long.txt");
  write_file(too_long, "the cat\n\n" + long_line + "\n");
  const std::size_t tokens = tr::Translator(model()).vocab().encode(long_line).size();
  expect_error(translate("--input " + too_long),
               {"'" + too_long + "' line 3 has " + std::to_string(tokens) +
                " subword tokens, more than the model's max_len 32"});
  expect_error(translate("", too_long), {"<stdin> line 3 has " + std::to_string(tokens)});

  // A line of more bytes than max_len tokens can hold is refused unencoded; from an endless pipe
  // the stream mode stops reading it at that length.
  const std::string huge = dir("huge.txt");
  write_file(huge, "the cat\n" + std::string(1 << 20, 'a') + "\n");
  expect_error(translate("--input " + huge),
               {"'" + huge +
                "' line 2 has 1048576 bytes, more than the 64 per subword token of "
                "the model's max_len 32"});
  expect_error(run("translate --threads 1 --greedy --model-dir " + model(), "/dev/zero"),
               {"<stdin> line 1 is longer than 2048 bytes (64 per subword token of the model's "
                "max_len 32); it is refused unread"});

  const std::string no_model = dir("no_model");
  expect_error(run("translate --model-dir " + no_model),
               {"cannot open " + no_model + "/spm.model: No such file or directory"});
  EXPECT_EQ(read_file(out), "previous results\n");
}

TEST_F(Cli, EvaluateRefusesMisalignedFiles) {
  const std::string src = dir("test.en"), ref = dir("test.de"), hyp = dir("hyp.de");
  write_file(src, "the cat\na dog\nred\n");
  write_file(ref, "die Katze\nein Hund\n");
  write_file(hyp, "Katze\n\nrot\n");  // an empty hypothesis is allowed
  expect_error(run("evaluate --model-dir " + model() + " --src " + src + " --ref " + ref),
               {"'" + src + "' has 3", "'" + ref + "' has 2"});
  expect_error(
      run("evaluate --hyp " + hyp + " --ref " + ref),
      {"expected one reference per hypothesis: '" + hyp + "' has 3 lines, '" + ref + "' has 2"});
  expect_error(run("evaluate --ref " + ref), {"evaluate: give --model-dir and --src (or --hyp)"});
  expect_error(run("evaluate --hyp " + hyp + " --src " + src + " --ref " + ref),
               {"--hyp scores existing translations; it excludes --model-dir and --src"});
}
