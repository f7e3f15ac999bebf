#include "cli_select.hpp"

#include <cerrno>
#include <iostream>
#include <type_traits>
#include <vector>

#include <attn/error.hpp>

#include "cli_common.hpp"
#include "corpus_io.hpp"
#include "model_dir.hpp"

namespace attn::translate {

namespace {

/// "the last 10 checkpoints (steps 16876-21376) at alpha 1.4".
std::string describe(const SelectScore& s) {
  std::string steps =
      s.last == 1 ? "step " + std::to_string(s.last_step)
                  : "steps " + std::to_string(s.first_step) + "-" + std::to_string(s.last_step);
  return detail::concat("the last ", s.last, s.last == 1 ? " checkpoint (" : " checkpoints (",
                        steps, ") at alpha ", alpha_text(s.alpha));
}

/// "1,5,10": how a list option is written on the command line.
template <class T>
std::string joined(const std::vector<T>& values) {
  std::string text;
  for (const T& v : values) {
    if (!text.empty()) text += ',';
    if constexpr (std::is_floating_point_v<T>)
      text += alpha_text(v);
    else
      text += std::to_string(v);
  }
  return text;
}

}  // namespace

CLI::App* add_select(CLI::App& app, SelectCommand& c, int& threads) {
  CLI::App* select = app.add_subcommand(
      "select",
      "choose on a validation set how many of the last checkpoints to average and the length "
      "penalty; write that average, with its length penalty, as the model file");
  add_threads(select, threads);
  select->add_option("--model-dir", c.model_dir, "model directory with checkpoints")->required();
  select->add_option("--src", c.src, "validation source file")->required();
  select->add_option("--ref", c.ref, "validation references, line-aligned")->required();
  const SelectOptions defaults;
  int_option(select->add_option("--last", c.options.lasts,
                                "numbers of last checkpoints to average, comma-separated; those "
                                "above the number of checkpoints are skipped (default: " +
                                    joined(defaults.lasts) + ")"))
      ->delimiter(',')
      ->check(positive());
  select
      ->add_option("--alpha", c.options.alphas,
                   "length penalties alpha of ((5+|Y|)/6)^alpha, comma-separated (default: " +
                       joined(defaults.alphas) + ")")
      ->delimiter(',')
      ->check(finite_non_negative());
  select->add_option("--output", c.output,
                     "write the chosen model here instead of the directory's model.safetensors "
                     "(default: none)");
  select->add_flag("--lowercase", c.lowercase, "case-insensitive BLEU (default: off)");
  select->add_option("--tokenize", c.tokenize, "BLEU tokenizer")
      ->capture_default_str()
      ->check(CLI::IsMember({"13a", "none"}));
  add_decode_flags(select, c.options.decode, false);
  return select;
}

int run_select(const SelectCommand& c) {
  SelectOptions options = c.options;
  options.bleu.lowercase = c.lowercase;
  options.bleu.tokenize = c.tokenize == "none" ? BleuTokenizer::kNone : BleuTokenizer::k13a;
  const ParallelCorpus valid = read_parallel(c.src, c.ref);
  ATTN_CHECK(!valid.src.empty(), DataError, "select: '", c.src, "' is empty: nothing to score");
  // Each score is printed as it comes (a validation decode takes a while), and checked at once.
  const auto print = [](const std::string& line) {
    errno = 0;
    std::cout << line << std::endl;
    check_stdout("the validation scores");
  };
  const Selection s = select_average(
      c.model_dir, valid, options, c.output, "'" + c.src + "'",
      [&print](const SelectScore& score) { print(describe(score) + ": " + score.bleu.str()); });
  for (const int n : s.skipped)
    std::cerr << "select: skipped --last " << n << ": '" << c.model_dir << "' has " << s.checkpoints
              << " checkpoints\n";
  const SelectScore& best = s.scores[s.best];
  print("chose " + describe(best) + ": " + best.bleu.str() + "; wrote " +
        (c.output.empty() ? final_model_path(c.model_dir) : c.output));
  return 0;
}

}  // namespace attn::translate
