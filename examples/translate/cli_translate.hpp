// `attn-translate translate`: lines in, translations out, from a file or stdin to a file or stdout.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "translator.hpp"

namespace attn::translate {

struct TranslateCommand {
  std::string model_dir;
  std::string input = "-";   ///< - for stdin
  std::string output = "-";  ///< - for stdout
  TranslateOptions decode;
};

/// Adds the translate subcommand to `app`, its flags bound to `c` and `threads`; returns it.
CLI::App* add_translate(CLI::App& app, TranslateCommand& c, int& threads);

/// stdin to stdout answers each line as soon as it is read; otherwise the whole input is read
/// and checked before the model loads, and the output is written at once. Returns 0.
int run_translate(const TranslateCommand& c);

}  // namespace attn::translate
