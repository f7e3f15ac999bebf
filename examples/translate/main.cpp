// attn-translate: train a Transformer translation model, translate with it, score it, average it.
// The subcommands only parse flags; the work is in trainer.cpp and translator.cpp. Every option's
// --help line shows its default: CLI11's "=value" where there is one, "(default: ...)" in the
// description for flags and for options whose absence means something (tests/test_cli.cpp).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <attn/error.hpp>
#include <attn/parallel.hpp>

#include "builtin_corpus.hpp"
#include "corpus_io.hpp"
#include "distributed.hpp"
#include "gettext_corpus.hpp"
#include "stop_signal.hpp"
#include "trainer.hpp"
#include "translator.hpp"

namespace tr = attn::translate;

namespace {

std::vector<std::string> read_input(const std::string& path) {
  if (path != "-") return tr::read_lines(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lines.empty()) tr::strip_utf8_bom(line);
    const std::size_t bad = tr::find_invalid_utf8(line);
    ATTN_CHECK(bad == std::string::npos, attn::DataError, "<stdin> line ", lines.size() + 1,
               ": expected UTF-8 text, found an invalid byte sequence at byte offset ", bad,
               " of the line");
    lines.push_back(std::move(line));
  }
  return lines;
}

void write_output(const std::string& path, const std::vector<std::string>& lines) {
  if (path != "-") return tr::write_lines(path, lines);
  for (const auto& l : lines) std::cout << l << '\n';
  std::cout.flush();
}

// The built-in corpus's sources, from --mix: a comma-separated subset of
// descriptions, sentences, phrases, words, gettext.
void apply_mix(const std::string& mix, tr::BuiltinCorpusOptions& b) {
  b.descriptions = b.dictionary_sentences = b.dictionary_phrases = b.dictionary_words = false;
  b.gettext = false;
  std::size_t start = 0;
  while (start <= mix.size()) {
    std::size_t end = mix.find(',', start);
    if (end == std::string::npos) end = mix.size();
    const std::string item = mix.substr(start, end - start);
    bool* flag = item == "descriptions" ? &b.descriptions
                 : item == "sentences"  ? &b.dictionary_sentences
                 : item == "phrases"    ? &b.dictionary_phrases
                 : item == "words"      ? &b.dictionary_words
                 : item == "gettext"    ? &b.gettext
                                        : nullptr;
    ATTN_CHECK(flag != nullptr, attn::ConfigError, "--mix: unknown source '", item,
               "', expected a comma-separated list of descriptions, sentences, phrases, words, "
               "gettext");
    *flag = true;
    start = end + 1;
  }
}

tr::BuiltinCorpus load_builtin(const tr::BuiltinCorpusOptions& b) {
  tr::BuiltinCorpusStats stats;
  tr::BuiltinCorpus corpus = tr::load_builtin_corpus(b, &stats);
  for (const auto& m : stats.missing) std::cerr << "built-in corpus: left out " << m << '\n';
  const auto& s = corpus.split;
  std::cerr << "built-in corpus (English -> German): " << s.train.size() << " training pairs ("
            << stats.train_by_source[0] << " from package descriptions, "
            << stats.train_by_source[1] << " from the dictionary, " << stats.train_by_source[2]
            << " from gettext), " << s.valid.size() << " validation and " << s.test.size()
            << " test sentences held out; " << stats.duplicates << " repeated sources and "
            << stats.removed_overlap << " pairs overlapping the held-out sets removed\n";
  return corpus;
}

tr::BuiltinCorpus load_data(const tr::BuiltinCorpusOptions& builtin, const std::string& src,
                            const std::string& tgt, const std::string& vsrc,
                            const std::string& vtgt, const std::string& tsrc,
                            const std::string& ttgt) {
  ATTN_CHECK(src.empty() == tgt.empty(), attn::ConfigError,
             "train: --src and --tgt go together (got --src '", src, "', --tgt '", tgt, "')");
  ATTN_CHECK(vsrc.empty() == vtgt.empty() && tsrc.empty() == ttgt.empty(), attn::ConfigError,
             "train: --valid-src/--valid-tgt and --test-src/--test-tgt go in pairs");
  tr::BuiltinCorpus corpus;
  tr::CorpusSplit& data = corpus.split;
  if (src.empty()) {
    corpus = load_builtin(builtin);
  } else {
    data.train = tr::read_parallel(src, tgt);
  }
  if (!vsrc.empty()) data.valid = tr::read_parallel(vsrc, vtgt);
  if (!tsrc.empty()) {
    data.test = tr::read_parallel(tsrc, ttgt);
    corpus.showcase.clear();
  }
  return corpus;
}

// On every subcommand too, so that each subcommand's --help lists it.
void add_threads(CLI::App* app, int& threads) {
  app->add_option("--threads", threads, "worker threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

void add_decode_flags(CLI::App* app, tr::TranslateOptions& o) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn-translate: Transformer (Vaswani et al. 2017) translation on the CPU"};
  app.require_subcommand(1);
  app.fallthrough();
  int threads = 2;
  add_threads(&app, threads);

  // train
  tr::TrainOptions t;
  std::string src, tgt, vsrc, vtgt, tsrc, ttgt;
  tr::BuiltinCorpusOptions builtin;
  std::string mix = "descriptions,sentences";  // the winner of README's comparison
  int show = 8;
  auto* train =
      app.add_subcommand("train", "train a model (default data: the built-in English->German corpus)");
  add_threads(train, threads);
  train->add_option("--model-dir", t.model_dir, "output directory")->required();
  train->add_option("--src", src,
                    "training source file, one sentence a line, plain or gzip (default: none, "
                    "train on the built-in corpus of --mix)");
  train->add_option("--tgt", tgt, "training target file, line-aligned with --src (default: none)");
  train->add_option("--valid-src", vsrc,
                    "validation source file (default: none; the built-in split with --src unset)");
  train->add_option("--valid-tgt", vtgt, "validation target file (default: none)");
  train->add_option("--test-src", tsrc,
                    "test source file (default: none; the built-in split with --src unset)");
  train->add_option("--test-tgt", ttgt, "test target file (default: none)");
  train
      ->add_option("--mix", mix,
                   "sources of the built-in corpus, comma-separated: descriptions (Debian package "
                   "descriptions), sentences, phrases, words (of the trans-de-en dictionary), "
                   "gettext")
      ->capture_default_str();
  train
      ->add_option("--sentence-weight", builtin.sentence_weight,
                   "copies of each dictionary sentence in the built-in training set")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--apt-lists-dir", builtin.apt_lists_dir,
                    "where apt keeps *_i18n_Translation-{en,de} (built-in corpus)")
      ->capture_default_str();
  train->add_option("--dictionary", builtin.dictionary_path,
                    "the trans-de-en dictionary (built-in corpus)")
      ->capture_default_str();
  train->add_option("--gettext-dir", builtin.gettext_dir,
                    "the .mo catalogs (built-in corpus, with --mix gettext)")
      ->capture_default_str();
  train->add_option("--preset", t.preset, "model size")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "small", "base", "big"}));
  train->add_option("--d-model", t.d_model, "override d_model (0: preset)")->capture_default_str();
  train->add_option("--layers", t.layers, "override encoder and decoder layers (0: preset)")
      ->capture_default_str();
  train->add_option("--heads", t.heads, "override attention heads (0: preset)")
      ->capture_default_str();
  train->add_option("--d-ff", t.d_ff, "override feed-forward width (0: preset)")
      ->capture_default_str();
  train->add_option("--dropout", t.dropout, "override P_drop (< 0: preset)")->capture_default_str();
  train->add_flag("--norm-first", t.norm_first,
                  "pre-norm: LayerNorm before each sublayer, not after the residual sum as "
                  "in the paper (default: off)");
  train->add_option("--label-smoothing", t.label_smoothing, "epsilon_ls")->capture_default_str();
  train->add_option("--warmup", t.warmup, "warmup steps of the Noam schedule")
      ->capture_default_str();
  train->add_option("--lr-factor", t.lr_factor, "factor of the Noam schedule")
      ->capture_default_str();
  train
      ->add_option("--clip-norm", t.clip_norm,
                   "clip the global gradient norm to this before each update (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  train->add_option("--max-tokens", t.max_tokens, "padded tokens per batch")->capture_default_str();
  bool max_tokens_per_rank = false;
  train->add_flag("--max-tokens-per-rank", max_tokens_per_rank,
                  "under mpirun, --max-tokens is one rank's share of a batch, not the whole "
                  "batch (default: off)");
  train
      ->add_option("--tokens-per-update", t.tokens_per_update,
                   "accumulate batches until this many target tokens (0: one batch)")
      ->capture_default_str();
  train->add_option("--vocab-size", t.vocab_size, "shared BPE vocabulary size")
      ->capture_default_str();
  train->add_option("--max-len", t.max_len, "subword tokens per side (longer pairs skipped)")
      ->capture_default_str();
  train->add_option("--steps", t.steps, "stop after this many updates (0: no limit)")
      ->capture_default_str();
  train->add_option("--minutes", t.minutes, "stop after this wall time (0: no limit)")
      ->capture_default_str();
  train->add_option("--valid-every", t.valid_every, "validate every N updates (0: at the end)")
      ->capture_default_str();
  train
      ->add_option("--checkpoint-every", t.checkpoint_every,
                   "checkpoint every N updates (0: at the end)")
      ->capture_default_str();
  train->add_option("--keep", t.keep, "training checkpoints kept")->capture_default_str();
  train
      ->add_option("--average", t.average,
                   "average the last N checkpoints into model.safetensors (0: last weights)")
      ->capture_default_str();
  train->add_option("--seed", t.seed, "initialisation, dropout and data order")
      ->capture_default_str();
  train->add_flag("--resume", t.resume,
                  "continue from the newest checkpoint of --model-dir, with its training "
                  "options (default: off)");
  train->add_option("--svg", t.svg, "write curves.svg and attention.svg")->capture_default_str();
  train->add_option("--log-every", t.log_every, "progress line every N updates")
      ->capture_default_str();
  train
      ->add_option("--bleu-sentences", t.bleu_sentences,
                   "validation sentences decoded for BLEU (0: all)")
      ->capture_default_str();
  train->add_flag("--tokenize-none", t.tokenize_none,
                  "BLEU on whitespace tokens, not 13a (default: off)");
  train->add_option("--show", show, "test translations printed at the end")->capture_default_str();

  // translate
  std::string model_dir, input = "-", output = "-";
  tr::TranslateOptions d;
  auto* translate = app.add_subcommand("translate", "translate lines with a trained model");
  add_threads(translate, threads);
  translate->add_option("--model-dir", model_dir, "trained model directory")->required();
  translate->add_option("--input", input, "input file, - for stdin")->capture_default_str();
  translate->add_option("--output", output, "output file, - for stdout")->capture_default_str();
  add_decode_flags(translate, d);

  // evaluate
  std::string ref, hyp, tokenize = "13a";
  bool lowercase = false;
  auto* evaluate = app.add_subcommand(
      "evaluate", "BLEU of a model's translations of --src, or of the translations in --hyp");
  add_threads(evaluate, threads);
  evaluate->add_option("--model-dir", model_dir,
                       "trained model directory (default: none; required without --hyp)");
  evaluate->add_option("--src", src, "source file (default: none; required without --hyp)");
  evaluate->add_option("--hyp", hyp,
                       "score these translations, one a line, instead of translating --src "
                       "(default: none)");
  evaluate->add_option("--ref", ref, "reference translations, line-aligned")->required();
  evaluate->add_flag("--lowercase", lowercase, "case-insensitive BLEU (default: off)");
  evaluate->add_option("--tokenize", tokenize, "BLEU tokenizer")
      ->capture_default_str()
      ->check(CLI::IsMember({"13a", "none"}));
  add_decode_flags(evaluate, d);

  // average
  int last = 0;
  std::vector<std::string> inputs;
  std::string avg_out;
  auto* average = app.add_subcommand("average", "average checkpoints into one model file");
  add_threads(average, threads);
  average->add_option("--model-dir", model_dir, "model directory, with --last (default: none)");
  average
      ->add_option("--last", last,
                   "average the last N checkpoints of --model-dir into its model.safetensors "
                   "(0: use --inputs)")
      ->capture_default_str();
  average->add_option("--inputs", inputs, "checkpoint files to average (default: none)");
  average->add_option("--output", avg_out, "output file, with --inputs (default: none)");

  CLI11_PARSE(app, argc, argv);
  std::shared_ptr<tr::Replicas> replicas;  // the ranks of an mpirun job (distributed.hpp)
  try {
    attn::set_num_threads(threads);
    if (*train) {
      t.threads = threads;
      apply_mix(mix, builtin);
      replicas = tr::join_replicas(t, app.count("--threads") + train->count("--threads") > 0,
                                   max_tokens_per_rank);
      tr::BuiltinCorpus corpus = load_data(builtin, src, tgt, vsrc, vtgt, tsrc, ttgt);
      std::vector<std::size_t> showcase = std::move(corpus.showcase);
      tr::install_stop_handlers();  // Ctrl-C / SIGTERM: checkpoint, then exit 130 / 143
      tr::Trainer trainer(t, std::move(corpus.split), replicas);
      trainer.train();
      if (trainer.interrupted()) {
        std::cerr << "attn-translate: interrupted by "
                  << (tr::stop_requested() == SIGINT ? "SIGINT" : "SIGTERM") << " at step "
                  << trainer.step() << "; checkpoint written, continue with train --resume\n";
        return 128 + tr::stop_requested();
      }
      trainer.finish();
      if (replicas->rank() != 0) return 0;  // rank 0 writes and reports
      std::cerr << "model written to " << t.model_dir << "/model.safetensors\n";
      if (!trainer.data().test.empty()) {
        // Scored as saved: model.safetensors holds the averaged weights when --average > 1.
        const auto& test = trainer.data().test;
        std::vector<std::string> hyps;
        tr::Translator saved(t.model_dir);
        const tr::BleuScore bleu = saved.evaluate(test.src, test.tgt, tr::TranslateOptions{},
                                                  trainer.bleu_options(), &hyps, "test");
        std::cout << "test BLEU (beam 4, alpha 0.6, model.safetensors = "
                  << (t.average > 1
                          ? "average of the last " + std::to_string(t.average) + " checkpoints"
                          : std::string("last weights"))
                  << "): " << bleu.str() << '\n';
        // The everyday sentences of the built-in test set first, then the others in order.
        std::vector<std::size_t> shown(showcase.begin(), showcase.end());
        for (std::size_t i = 0; i < hyps.size(); ++i)
          if (std::find(shown.begin(), shown.end(), i) == shown.end()) shown.push_back(i);
        shown.resize(std::min(shown.size(), static_cast<std::size_t>(show)));
        for (std::size_t i : shown)
          std::cout << "  English:   " << test.src[i] << "\n  attn:      " << hyps[i]
                    << "\n  reference: " << test.tgt[i] << "\n\n";
      }
    } else if (*translate) {
      if (input == "-" && output == "-") {
        // Interactive: each line is answered as soon as it is read.
        tr::Translator translator(model_dir);
        std::size_t n = 0;
        for (std::string line; std::getline(std::cin, line);) {
          if (!line.empty() && line.back() == '\r') line.pop_back();
          std::cout << translator.translate({line}, d, "<stdin>", ++n)[0] << std::endl;
        }
        return 0;
      }
      // Input first: a bad input file is reported without waiting for the model to load.
      const std::vector<std::string> lines = read_input(input);
      tr::Translator translator(model_dir);
      write_output(output,
                   translator.translate(lines, d, input == "-" ? "<stdin>" : "'" + input + "'"));
    } else if (*evaluate) {
      tr::BleuOptions b;
      b.lowercase = lowercase;
      b.tokenize = tokenize == "none" ? tr::BleuTokenizer::kNone : tr::BleuTokenizer::k13a;
      if (!hyp.empty()) {
        ATTN_CHECK(model_dir.empty() && src.empty(), attn::ConfigError,
                   "evaluate: --hyp scores existing translations; it excludes --model-dir and "
                   "--src");
        // An empty hypothesis is a legitimate (bad) translation, so no empty-line check here.
        const std::vector<std::string> hyps = tr::read_lines(hyp), refs = tr::read_lines(ref);
        ATTN_CHECK(hyps.size() == refs.size(), attn::DataError,
                   "evaluate: expected one reference per hypothesis: '", hyp, "' has ", hyps.size(),
                   " lines, '", ref, "' has ", refs.size());
        std::cout << tr::corpus_bleu(hyps, refs, b).str() << '\n';
      } else {
        ATTN_CHECK(!model_dir.empty() && !src.empty(), attn::ConfigError,
                   "evaluate: give --model-dir and --src (or --hyp), got --model-dir '", model_dir,
                   "', --src '", src, "'");
        const tr::ParallelCorpus corpus = tr::read_parallel(src, ref);
        tr::Translator translator(model_dir);
        std::cout
            << translator.evaluate(corpus.src, corpus.tgt, d, b, nullptr, "'" + src + "'").str()
            << '\n';
      }
    } else if (*average) {
      ATTN_CHECK((last > 0) != !inputs.empty(), attn::ConfigError,
                 "average: give either --model-dir with --last N, or --inputs with --output");
      if (last > 0) {
        ATTN_CHECK(!model_dir.empty(), attn::ConfigError, "average: --last needs --model-dir");
        const auto used = tr::average_last(model_dir, last);
        std::cerr << "averaged " << used.size() << " checkpoints into " << model_dir
                  << "/model.safetensors\n";
      } else {
        ATTN_CHECK(!avg_out.empty(), attn::ConfigError, "average: --inputs needs --output");
        tr::average_files(inputs, avg_out);
      }
    }
  } catch (const attn::Error& e) {
    if (!replicas || replicas->report_here(e))
      std::cerr << "attn-translate: error: " << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    if (!replicas || replicas->report_here(e))
      std::cerr << "attn-translate: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
