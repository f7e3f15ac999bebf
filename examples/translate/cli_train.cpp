#include "cli_train.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "cli_common.hpp"
#include "distributed.hpp"
#include "stop_signal.hpp"
#include "translator.hpp"

namespace attn::translate {

namespace {

void add_data_flags(CLI::App* train, TrainDataFlags& f) {
  train->add_option("--src", f.src,
                    "training source file, one sentence a line, plain or gzip (default: none, "
                    "train on the built-in corpus of --mix)");
  train->add_option("--tgt", f.tgt,
                    "training target file, line-aligned with --src (default: none)");
  train->add_option("--valid-src", f.valid_src,
                    "validation source file (default: none; the built-in split with --src unset)");
  train->add_option("--valid-tgt", f.valid_tgt, "validation target file (default: none)");
  train->add_option("--test-src", f.test_src,
                    "test source file (default: none; the built-in split with --src unset)");
  train->add_option("--test-tgt", f.test_tgt, "test target file (default: none)");
  train
      ->add_option("--mix", f.mix,
                   "sources of the built-in corpus, comma-separated: descriptions (Debian package "
                   "descriptions), sentences, phrases, words (of the trans-de-en dictionary), "
                   "gettext")
      ->capture_default_str();
  int_option(train->add_option("--sentence-weight", f.builtin.sentence_weight,
                               "copies of each dictionary sentence in the built-in training set"))
      ->capture_default_str()
      ->check(in_range(1, 1000));
  train
      ->add_option("--apt-lists-dir", f.builtin.apt_lists_dir,
                   "where apt keeps *_i18n_Translation-{en,de} (built-in corpus)")
      ->capture_default_str();
  train
      ->add_option("--dictionary", f.builtin.dictionary_path,
                   "the trans-de-en dictionary (built-in corpus)")
      ->capture_default_str();
  train
      ->add_option("--gettext-dir", f.builtin.gettext_dir,
                   "the .mo catalogs (built-in corpus, with --mix gettext)")
      ->capture_default_str();
}

// Every flag of the option table (train_options.hpp), in its order: a bool is a switch unless it
// takes a value ("!--no-eval" sets its field to false); --help shows every default.
void add_option_flags(CLI::App* train, TrainOptions& t) {
  t.visit_options([&](const OptionInfo& info, auto& field, const auto&) {
    if (!info.cli || *info.flag == '\0') return;
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, bool>) {
      if (!info.valued) {
        const bool on = field != (info.flag[0] == '!');
        train->add_flag(info.flag, field,
                        std::string(info.help) + (on ? " (default: on)" : " (default: off)"));
        return;
      }
    }
    CLI::Option* option = train->add_option(info.flag, field, info.help)->capture_default_str();
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, int>) int_option(option);
  });
  train->get_option("--model-dir")->required();
  train->get_option("--preset")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(TransformerConfig::kPresetNames),
                                                     std::end(TransformerConfig::kPresetNames))));
  train->get_option("--no-eval")->excludes("--valid-every");
}

// The flags of the command, not of the training: how an MPI job shares its batches and sums, and
// what is shown at the end.
void add_command_flags(CLI::App* train, TrainCommand& c) {
  train->add_flag("--max-tokens-per-rank", c.max_tokens_per_rank,
                  "under mpirun, --max-tokens is one rank's share of a batch, not the whole "
                  "batch (default: off)");
  train->add_flag("--no-overlap-allreduce", c.no_overlap_all_reduce,
                  "under mpirun, sum the gradients over the ranks after backward, not during it "
                  "(the same result; for comparison) (default: off)");
  int_option(train->add_option("--show", c.show, "test translations printed at the end"))
      ->capture_default_str();
}

// The saved model's test BLEU, then `show` translations: the short sentences of the built-in
// test set first (`showcase`), then the others in order.
void report_test(Trainer& trainer, const TrainOptions& t, const std::vector<std::size_t>& showcase,
                 int show) {
  // Scored as saved: model.safetensors holds the averaged weights when --average > 1.
  const auto& test = trainer.data().test;
  std::vector<std::string> hyps;
  Translator saved(t.model_dir);
  const BleuScore bleu =
      saved.evaluate(test.src, test.tgt, TranslateOptions{}, trainer.bleu_options(), &hyps, "test");
  errno = 0;
  std::cout << "test BLEU (beam 4, alpha 0.6, model.safetensors = "
            << (trainer.averaged() > 1
                    ? "average of the last " + std::to_string(trainer.averaged()) + " checkpoints"
                    : std::string("last weights"))
            << "): " << bleu.str() << '\n';
  std::vector<std::size_t> shown(showcase.begin(), showcase.end());
  for (std::size_t i = 0; i < hyps.size(); ++i)
    if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
  shown.resize(std::min(shown.size(), static_cast<std::size_t>(show)));
  for (std::size_t i : shown) {
    if (!std::cout) break;  // check_stdout names the first failure
    std::cout << "  English:   " << test.src[i] << "\n  attn:      " << hyps[i]
              << "\n  reference: " << test.tgt[i] << "\n\n";
  }
  check_stdout("the test BLEU and translations");
}

// report_test translates the test set with the saved model, and Translator refuses a line of more
// than the max_len it was trained with: such a line is named before training, not after it. On
// every rank, so that none waits for another that stopped.
void check_test_sources(const Trainer& trainer) {
  const std::vector<std::string>& src = trainer.data().test.src;
  for (std::size_t i = 0; i < src.size(); ++i)
    encode_source(trainer.vocab(), src[i], trainer.options().max_len,
                  detail::concat("test line ", i + 1));
}

}  // namespace

CLI::App* add_train(CLI::App& app, TrainCommand& c, int& threads) {
  CLI::App* train = app.add_subcommand(
      "train", "train a model (default data: the built-in English->German corpus)");
  add_threads(train, threads);
  add_data_flags(train, c.data);
  add_option_flags(train, c.options);
  add_command_flags(train, c);
  c.app = train;
  return train;
}

int run_train(TrainCommand& c, int threads, std::shared_ptr<Replicas>& replicas) {
  TrainOptions& t = c.options;
  t.threads = threads;
  // Before any data is read or a vocabulary trained: the flags, and the model they describe (the
  // real vocabulary may come out smaller than --vocab-size, never larger; a resumed run takes its
  // model from the checkpoint).
  t.validate();
  if (!t.resume) make_config(t, t.vocab_size);
  ATTN_CHECK(c.show >= 0, ConfigError, "--show must be >= 0, got ", c.show);
  apply_mix(c.data.mix, c.data.builtin);
  replicas =
      join_replicas(t, {threads_given(*c.app), c.max_tokens_per_rank, !c.no_overlap_all_reduce});
  replicas->agree_on_flags(t);
  BuiltinCorpus corpus = load_train_data(c.data, replicas->rank() == 0);
  install_stop_handlers();  // Ctrl-C / SIGTERM: checkpoint, then exit 130 / 143
  Trainer trainer(t, std::move(corpus.split), replicas);
  if (t.evaluate) check_test_sources(trainer);
  if (trainer.last_update() == 0 && t.minutes <= 0 && replicas->rank() == 0)
    std::cerr << "train: no --steps or --minutes: training until Ctrl-C or SIGTERM, "
                 "which write a checkpoint to continue from with train --resume\n";
  trainer.train();
  if (const int signal = trainer.interrupted_by(); signal != 0) {
    // One write: every rank of an MPI job prints it, and stderr is unbuffered, so pieces written
    // one by one interleaved with the other rank's into one garbled line.
    std::cerr << attn::detail::concat(
        "attn-translate: interrupted by ", signal == SIGINT ? "SIGINT" : "SIGTERM", " at step ",
        trainer.step(), "; checkpoint written, continue with train --resume\n");
    return 128 + signal;
  }
  // From the final checkpoint on, a signal ends the run at once (train --resume then writes the
  // model); until then, during the final validation, it waits for that checkpoint.
  trainer.finish(end_stop_handling);
  if (replicas->rank() != 0) return 0;  // rank 0 writes and reports
  std::cerr << "model written to " << t.model_dir << "/model.safetensors\n";
  if (t.evaluate && !trainer.data().test.empty()) report_test(trainer, t, corpus.showcase, c.show);
  return 0;
}

}  // namespace attn::translate
