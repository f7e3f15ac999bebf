// `attn-translate select`: the number of last checkpoints to average and the length penalty that
// score best on a validation set, written as the model directory's model.safetensors (or --output)
// with that length penalty (model_select.hpp).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "model_select.hpp"

namespace attn::translate {

struct SelectCommand {
  std::string model_dir, src, ref, output;
  std::string tokenize = "13a";  ///< 13a | none
  bool lowercase = false;
  SelectOptions options;
};

/// Adds the select subcommand to `app`, its flags bound to `c` and `threads`; returns it.
CLI::App* add_select(CLI::App& app, SelectCommand& c, int& threads);

/// Prints each average's score as it comes, then the choice, to stdout; returns 0.
int run_select(const SelectCommand& c);

}  // namespace attn::translate
