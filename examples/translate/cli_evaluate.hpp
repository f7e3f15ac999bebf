// `attn-translate evaluate`: corpus BLEU of a model's translations of --src, or of the existing
// translations in --hyp, against --ref.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "translator.hpp"

namespace attn::translate {

struct EvaluateCommand {
  std::string model_dir, src;  ///< translate src with the model of model_dir ...
  std::string hyp;             ///< ... or score these translations
  std::string ref;
  std::string tokenize = "13a";  ///< 13a | none
  bool lowercase = false;
  TranslateOptions decode;
};

/// Adds the evaluate subcommand to `app`, its flags bound to `c` and `threads`; returns it.
CLI::App* add_evaluate(CLI::App& app, EvaluateCommand& c, int& threads);

/// Prints the BLEU line to stdout; ConfigError for --hyp together with --model-dir or --src, or
/// for neither; DataError if the line counts differ. Returns 0.
int run_evaluate(const EvaluateCommand& c);

}  // namespace attn::translate
