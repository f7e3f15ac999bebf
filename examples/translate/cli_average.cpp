#include "cli_average.hpp"

#include <iostream>

#include <attn/error.hpp>

#include "cli_common.hpp"
#include "model_average.hpp"

namespace attn::translate {

CLI::App* add_average(CLI::App& app, AverageCommand& c, int& threads) {
  CLI::App* average = app.add_subcommand("average", "average checkpoints into one model file");
  add_threads(average, threads);
  average->add_option("--model-dir", c.model_dir, "model directory, with --last (default: none)");
  int_option(average->add_option("--last", c.last,
                                 "average the last N checkpoints of --model-dir into its "
                                 "model.safetensors, or into --output (0: use --inputs)"))
      ->capture_default_str();
  average->add_option("--inputs", c.inputs, "checkpoint files to average (default: none)");
  average->add_option("--output", c.output,
                      "output file: required with --inputs; with --last, written instead of "
                      "the directory's model.safetensors (default: none)");
  return average;
}

int run_average(const AverageCommand& c) {
  ATTN_CHECK((c.last > 0) != !c.inputs.empty(), ConfigError,
             "average: give either --model-dir with --last N, or --inputs with --output");
  if (c.last > 0) {
    ATTN_CHECK(!c.model_dir.empty(), ConfigError, "average: --last needs --model-dir");
    const auto used = average_last(c.model_dir, c.last, c.output);
    std::cerr << "averaged " << used.size() << " checkpoints into "
              << (c.output.empty() ? c.model_dir + "/model.safetensors" : c.output) << "\n";
  } else {
    ATTN_CHECK(!c.output.empty(), ConfigError, "average: --inputs needs --output");
    ATTN_CHECK(c.model_dir.empty(), ConfigError, "average: --model-dir goes with --last, not with ",
               "--inputs (got --model-dir ", c.model_dir, ")");
    average_files(c.inputs, c.output);
  }
  return 0;
}

}  // namespace attn::translate
