// `attn-translate average`: checkpoint averaging, of a model directory's last N checkpoints into
// its model.safetensors (or --output), or of given files into one.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace attn::translate {

struct AverageCommand {
  std::string model_dir;
  int last = 0;  ///< with model_dir; 0: use inputs
  std::vector<std::string> inputs;
  std::string output;  ///< required with inputs; with last, instead of model_dir/model.safetensors
};

/// Adds the average subcommand to `app`, its flags bound to `c` and `threads`; returns it.
CLI::App* add_average(CLI::App& app, AverageCommand& c, int& threads);

/// ConfigError unless exactly one of the two forms is given whole, and nothing of the other (a
/// flag that would be ignored is refused). Returns 0.
int run_average(const AverageCommand& c);

}  // namespace attn::translate
