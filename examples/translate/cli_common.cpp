#include "cli_common.hpp"

namespace attn::translate {

void add_threads(CLI::App* app, int& threads) {
  app->add_option("--threads", threads, "worker threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

bool threads_given(const CLI::App& sub) {
  const CLI::App* parent = sub.get_parent();
  return sub.count("--threads") + (parent ? parent->count("--threads") : 0) > 0;
}

void add_decode_flags(CLI::App* app, TranslateOptions& o) {
  app->add_option("--beam", o.beam, "beam size")->capture_default_str()->check(CLI::PositiveNumber);
  app->add_option("--alpha", o.alpha, "length penalty alpha of ((5+|Y|)/6)^alpha")
      ->capture_default_str();
  app->add_flag("--greedy", o.greedy, "greedy decoding instead of beam search (default: off)");
  app->add_option("--batch-size", o.batch_size, "sentences per decoding batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app->add_option("--max-extra-length", o.max_extra_length,
                  "output may be this many tokens longer than the input")
      ->capture_default_str();
}

}  // namespace attn::translate
