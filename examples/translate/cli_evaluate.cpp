#include "cli_evaluate.hpp"

#include <cerrno>
#include <iostream>
#include <vector>

#include <attn/error.hpp>

#include "cli_common.hpp"
#include "corpus_io.hpp"

namespace attn::translate {

namespace {

BleuScore score_hypotheses(const EvaluateCommand& c, const BleuOptions& b) {
  ATTN_CHECK(c.model_dir.empty() && c.src.empty(), ConfigError,
             "evaluate: --hyp scores existing translations; it excludes --model-dir and --src");
  // An empty hypothesis is a legitimate (bad) translation, so no empty-line check here.
  const std::vector<std::string> hyps = read_lines(c.hyp), refs = read_lines(c.ref);
  ATTN_CHECK(hyps.size() == refs.size(), DataError,
             "evaluate: expected one reference per hypothesis: '", c.hyp, "' has ", hyps.size(),
             " lines, '", c.ref, "' has ", refs.size());
  ATTN_CHECK(!refs.empty(), DataError, "evaluate: '", c.ref, "' is empty: nothing to score");
  // A blank reference is refused as in the --model-dir path (read_parallel): it matches nothing.
  for (std::size_t i = 0; i < refs.size(); ++i)
    ATTN_CHECK(refs[i].find_first_not_of(" \t") != std::string::npos, DataError, "evaluate: '",
               c.ref, "' line ", i + 1, ": expected a reference sentence, found an empty line");
  return corpus_bleu(hyps, refs, b);
}

BleuScore score_model(const EvaluateCommand& c, const BleuOptions& b) {
  ATTN_CHECK(!c.model_dir.empty() && !c.src.empty(), ConfigError,
             "evaluate: give --model-dir and --src (or --hyp), got --model-dir '", c.model_dir,
             "', --src '", c.src, "'");
  const ParallelCorpus corpus = read_parallel(c.src, c.ref);
  ATTN_CHECK(!corpus.src.empty(), DataError, "evaluate: '", c.src, "' is empty: nothing to score");
  Translator translator(c.model_dir);
  return translator.evaluate(corpus.src, corpus.tgt, c.decode, b, nullptr, "'" + c.src + "'");
}

}  // namespace

CLI::App* add_evaluate(CLI::App& app, EvaluateCommand& c, int& threads) {
  CLI::App* evaluate = app.add_subcommand(
      "evaluate", "BLEU of a model's translations of --src, or of the translations in --hyp");
  add_threads(evaluate, threads);
  evaluate->add_option("--model-dir", c.model_dir,
                       "trained model directory (default: none; required without --hyp)");
  evaluate->add_option("--src", c.src, "source file (default: none; required without --hyp)");
  evaluate->add_option("--hyp", c.hyp,
                       "score these translations, one a line, instead of translating --src "
                       "(default: none)");
  evaluate->add_option("--ref", c.ref, "reference translations, line-aligned")->required();
  evaluate->add_flag("--lowercase", c.lowercase, "case-insensitive BLEU (default: off)");
  evaluate->add_option("--tokenize", c.tokenize, "BLEU tokenizer")
      ->capture_default_str()
      ->check(CLI::IsMember({"13a", "none"}));
  add_decode_flags(evaluate, c.decode);
  return evaluate;
}

int run_evaluate(const EvaluateCommand& c) {
  BleuOptions b;
  b.lowercase = c.lowercase;
  b.tokenize = c.tokenize == "none" ? BleuTokenizer::kNone : BleuTokenizer::k13a;
  const BleuScore bleu = c.hyp.empty() ? score_model(c, b) : score_hypotheses(c, b);
  errno = 0;
  std::cout << bleu.str() << '\n';
  check_stdout("the BLEU score");
  return 0;
}

}  // namespace attn::translate
