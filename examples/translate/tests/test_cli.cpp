// The attn-translate binary itself: every subcommand's --help shows every option's default, the
// whole pipeline (train, resume, translate, evaluate, average) runs from the command line and
// resumes bit-exactly, --no-eval trains the same weights without the final evaluation, and
// translate answers each line of an interactive session at once. Bad input is test_cli_input.cpp.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "corpus_io.hpp"
#include "gettext_corpus.hpp"
#include "model_dir.hpp"  // list_checkpoints
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
          {"--attention-dropout", str(o.attention_dropout)},
          {"--relu-dropout", str(o.relu_dropout)},
          {"--label-smoothing", str(o.label_smoothing)},
          {"--warmup", str(o.warmup)},
          {"--lr-factor", str(o.lr_factor)},
          {"--cooldown", str(o.cooldown)},
          {"--clip-norm", str(o.clip_norm)},
          {"--max-tokens", str(o.max_tokens)},
          {"--tokens-per-update", str(o.tokens_per_update)},
          {"--vocab-size", str(o.vocab_size)},
          {"--max-len", str(o.max_len)},
          {"--bpe-dropout", str(o.bpe_dropout)},
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

// select decodes as evaluate does, with a list of length penalties instead of one (their default
// and --last's are in the descriptions, checked below).
std::map<std::string, std::string> select_defaults() {
  auto d = decode_defaults();
  d.erase("--alpha");
  d["--tokenize"] = "13a";
  return d;
}

// ----------------------------------------------------------------------- interactive session

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

TEST_F(Cli, EverySubcommandHelpShowsThreadsAndEveryDefault) {
  const std::map<std::string, std::map<std::string, std::string>> expected = {
      {"", {{"--threads", "2"}}},
      {"train", train_defaults()},
      {"translate", decode_defaults()},
      {"evaluate", decode_defaults()},
      {"average", {{"--threads", "2"}, {"--last", "0"}}},
      {"select", select_defaults()}};
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
  const std::string src = path("train.en"), tgt = path("train.de");
  const std::string test_src = path("test.en"), test_tgt = path("test.de");
  tr::write_lines(src, d.train.src);
  tr::write_lines(tgt, d.train.tgt);
  tr::write_lines(test_src, d.test.src);
  tr::write_lines(test_tgt, d.test.tgt);
  const std::string common =
      "--threads 1 --src " + src + " --tgt " + tgt +
      " --preset tiny --dropout 0.1 --attention-dropout 0.05 --relu-dropout 0.15 --vocab-size 60 "
      "--max-tokens 128 --tokens-per-update 300 --max-len 32 --valid-every 0 "
      "--checkpoint-every 0 --svg 0 --log-every 1";
  const std::string clip = " --warmup 20 --clip-norm 0.5";
  const std::string a = path("a"), b = path("b");
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
  const std::string in = path("in.txt");
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
  const std::string out = path("out.txt");
  r = run("translate --threads 1 --model-dir " + a + " --input " + test_src + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  tr::Translator translator(a);
  EXPECT_EQ(tr::read_lines(out), translator.translate(d.test.src, tr::TranslateOptions{}));
  // The dropout flags reached the model, whose file stores them (and the resumed run kept them:
  // its files are the uninterrupted run's).
  EXPECT_EQ(translator.model().config().dropout, 0.1);
  EXPECT_EQ(translator.model().config().attention_dropout, 0.05);
  EXPECT_EQ(translator.model().config().relu_dropout, 0.15);

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

// `average --last N --output F` writes the average to F and leaves the directory's model alone;
// a flag of the other form is refused, not ignored (--output was, and the average replaced the
// directory's model.safetensors).
TEST_F(Cli, AverageWritesItsOutputAndRefusesAFlagItWouldIgnore) {
  const std::string dir = model_copy(), out = path("last.safetensors");
  const std::string model_before = read_file(dir + "/model.safetensors");
  CliResult r = run("average --model-dir " + dir + " --last 1 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "averaged 1 checkpoints into " + out)) << r.err;
  EXPECT_TRUE(read_file(dir + "/model.safetensors") == model_before);
  // The same checkpoint given by name averages to the same bytes.
  const std::string ckpt = tr::list_checkpoints(dir).back().second, named = path("named");
  r = run("average --inputs " + ckpt + " --output " + named);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(read_file(out).empty());
  EXPECT_TRUE(read_file(out) == read_file(named));
  r = run("average --model-dir " + dir + " --inputs " + ckpt + " --output " + path("both"));
  expect_error(r, {"--model-dir goes with --last, not with --inputs", dir});
  EXPECT_FALSE(fs::exists(path("both")));
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
    tr::write_lines(path(name + "src"), corpus->src);
    tr::write_lines(path(name + "tgt"), corpus->tgt);
    data += " --" + name + "src " + path(name + "src") + " --" + name + "tgt " + path(name + "tgt");
  }
  const std::string evaluated = path("evaluated"), timed = path("timed");
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
  r = run("train --model-dir " + path("both") + data + " --no-eval --valid-every 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.err, "--valid-every excludes --no-eval")) << r.err;
  EXPECT_FALSE(fs::exists(path("both")));
}

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
