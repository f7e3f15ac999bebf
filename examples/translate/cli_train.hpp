// `attn-translate train`: its flags, and the run: data, training (under mpirun on every rank),
// the final model, and the test set's BLEU with a few translations.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

#include "train_data.hpp"
#include "trainer.hpp"

namespace attn::translate {

class Replicas;  // distributed.hpp

struct TrainCommand {
  TrainOptions options;
  TrainDataFlags data;
  bool max_tokens_per_rank = false;
  bool no_overlap_all_reduce = false;
  int show = 8;  ///< test translations printed at the end
  CLI::App* app = nullptr;
};

/// Adds the train subcommand to `app`, its flags bound to `c` and `threads`; returns it.
CLI::App* add_train(CLI::App& app, TrainCommand& c, int& threads);

/// Trains as the flags say; returns the exit code: 0, or 128 + the signal after a checkpoint on
/// SIGINT/SIGTERM. `replicas` is set as soon as the ranks of an mpirun job are joined, so that
/// the caller reports an error on one rank once (Replicas::report_here).
int run_train(TrainCommand& c, int threads, std::shared_ptr<Replicas>& replicas);

}  // namespace attn::translate
