// The options of attn-translate train, and the one table that lists them. For each option the
// table gives its flag and help (cli_train.cpp adds the flags from it), the values it may take
// (validate() checks them, and --resume checks a checkpoint's against them), the metadata key a
// checkpoint stores it under if it changes what training computes (train_state.cpp), whether the
// ranks of an MPI job must be given the same value (distributed.cpp), and the model fields it
// overrides (make_config sets them, and names the flag when the model is too big). A new option is
// one row of the table.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include <attn/error.hpp>
#include <attn/nn/transformer_config.hpp>

#include "bpe.hpp"  // kMaxVocabSize
#include "option_table.hpp"

namespace attn::translate {

/// The most target tokens a batch (--max-tokens) or an update (--tokens-per-update) may hold.
inline constexpr Index kMaxBatchTokens = Index(1) << 40;
/// The largest --bpe-dropout: at 1 no merge is made and every word is spelled out in characters.
inline constexpr double kMaxBpeDropout = 0.99;

struct TrainOptions {
  std::string model_dir;
  std::string preset = "small";  ///< tiny | small | base | big
  // Overrides of the preset; 0 (or < 0 for the dropouts) keeps the preset's value.
  Index d_model = 0;
  Index layers = 0;
  Index heads = 0;
  Index d_ff = 0;
  double dropout = -1;
  double attention_dropout = -1;  ///< on the attention weights
  double relu_dropout = -1;       ///< inside the feed-forward layer, after the ReLU
  bool norm_first = false;  ///< pre-norm sublayers (LayerNorm before each sublayer) instead of post
  double label_smoothing = 0.1;
  Index warmup = 4000;
  double lr_factor = 1.0;
  Index cooldown = 0;       ///< the last N updates up to `steps` take the lr linearly to 0; 0: off
  Index cooldown_end = 0;   ///< the `steps` the cooldown ends at: set when training starts
  double clip_norm = 0;     ///< clip the global gradient norm to this before Adam; 0: off
  Index max_tokens = 4096;  ///< per batch
  Index tokens_per_update = 0;  ///< accumulate batches until this many target tokens; 0: one
  int vocab_size = 8000;
  Index max_len = 128;       ///< subword tokens per side; longer training pairs are skipped
  double bpe_dropout = 0;    ///< each epoch's training pairs encoded with merges dropped; 0: off
  Index steps = 0;           ///< stop after this many updates; 0: no limit
  double minutes = 0;        ///< stop after this wall time; 0: no limit
  Index valid_every = 1000;  ///< 0: only at the end
  bool evaluate = true;      ///< false: no validation and no test BLEU at all (timing runs)
  Index checkpoint_every = 1000;  ///< 0: only at the end
  int keep = 5;                   ///< training checkpoints kept on disk
  int average = 0;                ///< average the last N checkpoints into model.safetensors
  std::uint64_t seed = 1;
  bool resume = false;
  bool svg = true;
  Index log_every = 100;       ///< progress lines when stderr is not a terminal
  Index bleu_sentences = 0;    ///< validation sentences decoded for BLEU; 0: all
  bool tokenize_none = false;  ///< BLEU on whitespace tokens instead of 13a
  int threads = 2;
  bool quiet = false;  ///< no progress output (tests)

  /// ConfigError naming the flag of the first option outside its range (the table's), then
  /// without --resume a --cooldown longer than --steps and a --max-tokens below --max-len, and
  /// an --average of more checkpoints than --keep keeps. The Trainer checks its options with it
  /// before anything else; the CLI at once, before any data is read. The model the options
  /// describe is make_config's to check.
  void validate() const;

  /// f(info, field, range) for every option, in the table's order (--help's).
  template <class F>
  void visit_options(F&& f) {
    visit(*this, f);
  }
  template <class F>
  void visit_options(F&& f) const {
    visit(*this, f);
  }

  /// f(key, field, required, range) for the options a checkpoint stores: those that change what
  /// training computes, so that a resumed run continues exactly as the interrupted one would have.
  template <class F>
  void visit_saved(F&& f) {
    visit_options(saved_only(f));
  }
  template <class F>
  void visit_saved(F&& f) const {
    visit_options(saved_only(f));
  }

 private:
  template <class F>
  static auto saved_only(F& f) {
    return [&f](const OptionInfo& info, auto& field, const auto& range) {
      using V = std::decay_t<decltype(field)>;
      if constexpr (kIsNumber<V>) {
        if (info.key) f(info.key, field, info.required, range);
      } else {
        ATTN_CHECK(!info.key, InternalError, info.key, ": a checkpoint stores numbers only");
      }
    };
  }

  // The table, in four parts (--help's order). In the header: every reader instantiates it with
  // its own visitor.
  template <class Self, class F>
  static void visit(Self& o, F& f) {
    using namespace option_rows;
    f(flag("--model-dir", "output directory"), o.model_dir, anything<std::string>());
    visit_model(o, f);
    visit_optimisation(o, f);
    visit_run(o, f);
    visit_report(o, f);
    f(flag("--threads", "worker threads").not_a_train_flag(), o.threads, at_least(1));
    f(OptionInfo{}, o.quiet, anything<bool>());  // tests: no progress output
  }

  template <class Self, class F>
  static void visit_model(Self& o, F& f) {
    using namespace option_rows;
    f(flag("--preset", "model size"), o.preset, anything<std::string>());
    const char* preset = "0: the preset's";
    f(flag("--d-model", "override d_model (0: preset)").means(preset).overrides("d_model"),
      o.d_model, at_least(Index(0)));
    f(flag("--layers", "override encoder and decoder layers (0: preset)")
          .means(preset)
          .overrides("encoder_layers", "decoder_layers"),
      o.layers, at_least(Index(0)));
    f(flag("--heads", "override attention heads (0: preset)").means(preset).overrides("heads"),
      o.heads, at_least(Index(0)));
    f(flag("--d-ff", "override feed-forward width (0: preset)").means(preset).overrides("d_ff"),
      o.d_ff, at_least(Index(0)));
    const char* preset_dropout = "< 0: the preset's";
    f(flag("--dropout",
           "override P_drop, on each sublayer's output and on the embedding sums "
           "(< 0: preset)")
          .means(preset_dropout)
          .overrides("dropout"),
      o.dropout, below(-1.0, 1.0));
    f(flag("--attention-dropout", "override the dropout on the attention weights (< 0: preset)")
          .means(preset_dropout)
          .overrides("attention_dropout"),
      o.attention_dropout, below(-1.0, 1.0));
    f(flag("--relu-dropout", "override the dropout after the feed-forward ReLU (< 0: preset)")
          .means(preset_dropout)
          .overrides("relu_dropout"),
      o.relu_dropout, below(-1.0, 1.0));
    f(flag("--norm-first",
           "pre-norm: LayerNorm before each sublayer, not after the residual sum "
           "as in the paper")
          .overrides("norm_first"),
      o.norm_first, anything<bool>());
  }

  // The loss, the schedule and what one update sees: batches, their accumulation, the vocabulary
  // and the length limit.
  template <class Self, class F>
  static void visit_optimisation(Self& o, F& f) {
    using namespace option_rows;
    f(flag("--label-smoothing", "epsilon_ls").stored("train.label_smoothing"), o.label_smoothing,
      within(0.0, 0.999999));
    f(flag("--warmup", "warmup steps of the Noam schedule").stored("train.warmup"), o.warmup,
      at_least(Index(1)));
    // > 0, as noam_lr needs: a checkpoint's 0 was taken, and the first update failed in noam_lr
    // without naming the file.
    f(flag("--lr-factor", "factor of the Noam schedule").stored("train.lr_factor"), o.lr_factor,
      above(0.0));
    f(flag("--cooldown",
           "take the learning rate linearly toward zero over the last N updates of "
           "--steps, the last at 1/(N+1) of the schedule's (0: off; end the run by "
           "--steps, not --minutes)")
          .means("0: off")
          .stored_if_present("train.cooldown"),
      o.cooldown, at_least(Index(0)));
    // The trainer's, from --steps: not a flag.
    f(OptionInfo{}.stored_if_present("train.cooldown_end"), o.cooldown_end, at_least(Index(0)));
    f(flag("--clip-norm", "clip the global gradient norm to this before each update (0: off)")
          .means("0: off")
          .stored_if_present("train.clip_norm"),
      o.clip_norm, at_least(0.0));
    f(flag("--max-tokens", "padded tokens per batch").stored("train.max_tokens").agreed_by_ranks(),
      o.max_tokens, within(Index(1), kMaxBatchTokens));
    f(flag("--tokens-per-update", "accumulate batches until this many target tokens (0: one batch)")
          .means("0: one batch")
          .stored("train.tokens_per_update"),
      o.tokens_per_update, within(Index(0), kMaxBatchTokens));
    f(flag("--vocab-size", "shared BPE vocabulary size").sizes("src_vocab", "tgt_vocab"),
      o.vocab_size, within(1, kMaxVocabSize));
    // kMaxLenKey: the translator reads it too; kMaxTranslateLength (model_metadata.hpp) bounds
    // it. At least BOS and one token.
    f(flag("--max-len", "subword tokens per side (longer pairs skipped)")
          .stored("translate.max_len"),
      o.max_len, within(Index(2), Index(1) << 16));
    f(flag("--bpe-dropout",
           "BPE-dropout: encode each epoch's training pairs afresh, each merge "
           "skipped with this probability, so that words also come in smaller "
           "pieces (0: off; 0.1 in the paper)")
          .means("0: off")
          .stored_if_present("train.bpe_dropout"),
      o.bpe_dropout, within(0.0, kMaxBpeDropout));
  }

  // How long training runs, and what it leaves in --model-dir.
  template <class Self, class F>
  static void visit_run(Self& o, F& f) {
    using namespace option_rows;
    using Seed = std::uint64_t;
    const char* at_the_end = "0: at the end";
    f(flag("--steps", "stop after this many updates (0: no limit)")
          .means("0: no limit")
          .agreed_by_ranks(),
      o.steps, at_least(Index(0)));
    f(flag("--minutes", "stop after this wall time (0: no limit)")
          .means("0: no limit")
          .agreed_by_ranks(),
      o.minutes, at_least(0.0));
    f(flag("--valid-every", "validate every N updates (0: at the end)").means(at_the_end),
      o.valid_every, at_least(Index(0)));
    f(flag("!--no-eval",
           "no validation and no test BLEU, during training or after it: for timing runs"),
      o.evaluate, anything<bool>());
    f(flag("--checkpoint-every", "checkpoint every N updates (0: at the end)").means(at_the_end),
      o.checkpoint_every, at_least(Index(0)));
    f(flag("--keep", "training checkpoints kept"), o.keep, at_least(1));
    f(flag("--average", "average the last N checkpoints into model.safetensors (0: last weights)")
          .means("0: the last weights"),
      o.average, at_least(0));
    f(flag("--seed", "initialisation, dropout and data order").stored("train.seed"), o.seed,
      within(Seed(0), std::numeric_limits<Seed>::max()));
    f(flag("--resume",
           "continue from the newest checkpoint of --model-dir, with its training options")
          .agreed_by_ranks(),
      o.resume, anything<bool>());
  }

  template <class Self, class F>
  static void visit_report(Self& o, F& f) {
    using namespace option_rows;
    f(flag("--svg", "write curves.svg and attention.svg").takes_value(), o.svg, anything<bool>());
    f(flag("--log-every", "progress line every N updates").means("0: none"), o.log_every,
      at_least(Index(0)));
    f(flag("--bleu-sentences", "validation sentences decoded for BLEU (0: all)").means("0: all"),
      o.bleu_sentences, at_least(Index(0)));
    f(flag("--tokenize-none", "BLEU on whitespace tokens, not 13a"), o.tokenize_none,
      anything<bool>());
  }
};

/// Builds a TransformerConfig from the preset name and overrides; ConfigError for an unknown
/// preset, and naming the flag for a model beyond ConfigLimits or this machine's memory.
TransformerConfig make_config(const TrainOptions& options, Index vocab);

}  // namespace attn::translate
