// attn-translate: train a Transformer translation model, translate with it, score it, average it,
// choose its average and length penalty on validation data.
// main parses, dispatches to one subcommand and maps exceptions to exit codes; each subcommand's
// flags and run are in cli_<subcommand>.cpp, the work in trainer.cpp and translator.cpp. Every
// option's --help line shows its default: CLI11's "=value" where there is one, "(default: ...)"
// in the description for flags and for options whose absence means something (tests/test_cli.cpp).
#include <exception>
#include <iostream>
#include <memory>

#include <CLI/CLI.hpp>
#include <attn/kernels/gemm.hpp>
#include <attn/parallel.hpp>

#include "cli_average.hpp"
#include "cli_common.hpp"
#include "cli_evaluate.hpp"
#include "cli_select.hpp"
#include "cli_train.hpp"
#include "cli_translate.hpp"
#include "distributed.hpp"

namespace tr = attn::translate;

int main(int argc, char** argv) {
  CLI::App app{"attn-translate: Transformer (Vaswani et al. 2017) translation on the CPU"};
  app.require_subcommand(1);
  app.fallthrough();
  int threads = 2;
  tr::add_threads(&app, threads);
  tr::TrainCommand train;
  tr::TranslateCommand translate;
  tr::EvaluateCommand evaluate;
  tr::AverageCommand average;
  tr::SelectCommand select;
  const CLI::App* train_app = tr::add_train(app, train, threads);
  const CLI::App* translate_app = tr::add_translate(app, translate, threads);
  const CLI::App* evaluate_app = tr::add_evaluate(app, evaluate, threads);
  const CLI::App* average_app = tr::add_average(app, average, threads);
  const CLI::App* select_app = tr::add_select(app, select, threads);
  tr::check_integers(app);
  CLI11_PARSE(app, argc, argv);

  std::shared_ptr<tr::Replicas> replicas;  // the ranks of an mpirun job (distributed.hpp)
  try {
    attn::set_num_threads(threads);
    attn::kernels::gemm_path();  // a bad ATTN_GEMM is reported here, not inside a product
    if (*train_app) return tr::run_train(train, threads, replicas);
    if (*translate_app) return tr::run_translate(translate);
    if (*evaluate_app) return tr::run_evaluate(evaluate);
    if (*average_app) return tr::run_average(average);
    if (*select_app) return tr::run_select(select);
  } catch (const std::exception& e) {  // attn::Error and the rest alike: one line, exit 1
    if (!replicas || replicas->report_here(e))
      std::cerr << std::string("attn-translate: error: ") + e.what() + '\n';  // one write
    return 1;
  }
  return 0;
}
