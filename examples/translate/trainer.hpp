// The training loop of attn-translate: vocabulary, batching, Adam with the paper's schedule,
// gradient accumulation, progress output, validation (loss, perplexity, greedy BLEU), checkpoints
// that resume bit-exactly (parameters, Adam moments, dropout RNG, step and data position) and the
// final model (trainer.cpp; how it starts, afresh or resumed: trainer_setup.cpp). Beside it: what
// a checkpoint's metadata holds (train_state.hpp), the model directory's files and policy
// (model_dir.hpp), the progress line (progress.hpp) and the SVG reports (train_report.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <attn/nn/transformer.hpp>
#include <attn/train/adam.hpp>
#include <attn/train/label_smoothed_loss.hpp>

#include "batching.hpp"
#include "bleu.hpp"
#include "bpe.hpp"
#include "corpus_io.hpp"
#include "model_dir.hpp"
#include "progress.hpp"
#include "train_report.hpp"  // CurvePoint, LogWindowState
#include "training_pairs.hpp"

namespace attn::translate {

class Replicas;  // distributed.hpp

/// The most target tokens a batch (--max-tokens) or an update (--tokens-per-update) may hold.
inline constexpr Index kMaxBatchTokens = Index(1) << 40;
/// The largest --bpe-dropout: at 1 no merge is made and every word is spelled out in characters.
inline constexpr double kMaxBpeDropout = 0.99;

struct TrainOptions {
  std::string model_dir;
  std::string preset = "small";  ///< tiny | small | base | big
  // Overrides of the preset; 0 (or < 0 for dropout) keeps the preset's value.
  Index d_model = 0;
  Index layers = 0;
  Index heads = 0;
  Index d_ff = 0;
  double dropout = -1;
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
  int threads = 2;
  std::uint64_t seed = 1;
  bool resume = false;
  bool svg = true;
  bool tokenize_none = false;  ///< BLEU on whitespace tokens instead of 13a
  Index bleu_sentences = 0;    ///< validation sentences decoded for BLEU; 0: all
  Index log_every = 100;       ///< progress lines when stderr is not a terminal
  bool quiet = false;          ///< no progress output (tests)

  /// ConfigError naming the flag of the first option out of its range: the ranges of visit_saved
  /// (which --resume also applies to a checkpoint's values) and the others'; without --resume also
  /// a --cooldown longer than --steps and a --max-tokens below --max-len. The Trainer checks its
  /// options with it before anything else; the CLI at once, before any data is read. The model
  /// the options describe is make_config's to check.
  void validate() const;

  /// f(metadata key, field, required, lo, hi) for the options that change what training
  /// computes: the one list that every checkpoint stores and --resume restores (refusing a value
  /// outside [lo, hi]), so that a resumed run continues exactly as the interrupted one would have.
  /// `required` is false for options added after checkpoints existed (absent: the value they were
  /// trained with, the field's default off).
  template <class F>
  void visit_saved(F&& f) {
    visit_saved_fields(*this, f);
  }
  template <class F>
  void visit_saved(F&& f) const {
    visit_saved_fields(*this, f);
  }

 private:
  template <class Self, class F>
  static void visit_saved_fields(Self& o, F& f) {
    constexpr Index kMaxIndex = std::numeric_limits<Index>::max();
    constexpr double kHuge = std::numeric_limits<double>::max();
    f("train.label_smoothing", o.label_smoothing, true, 0.0, 0.999999);
    f("train.warmup", o.warmup, true, Index(1), kMaxIndex);
    // > 0, as --lr-factor and noam_lr need: a checkpoint's 0 was taken, and the first update
    // failed in noam_lr without naming the file.
    f("train.lr_factor", o.lr_factor, true, std::numeric_limits<double>::min(), kHuge);
    f("train.clip_norm", o.clip_norm, false, 0.0, kHuge);
    f("train.bpe_dropout", o.bpe_dropout, false, 0.0, kMaxBpeDropout);
    f("train.cooldown", o.cooldown, false, Index(0), kMaxIndex);
    f("train.cooldown_end", o.cooldown_end, false, Index(0), kMaxIndex);
    f("train.max_tokens", o.max_tokens, true, Index(1), kMaxBatchTokens);
    f("train.tokens_per_update", o.tokens_per_update, true, Index(0), kMaxBatchTokens);
    f("train.seed", o.seed, true, std::uint64_t(0), std::numeric_limits<std::uint64_t>::max());
    // kMaxLenKey: the translator reads it too; kMaxTranslateLength (model_metadata.hpp) bounds it.
    f("translate.max_len", o.max_len, true, Index(2), Index(1) << 16);  // BOS + a token
  }
};

class Trainer {
 public:
  /// Validates `options` (TrainOptions::validate), then trains the vocabulary on data.train (both
  /// sides) or, with options.resume, loads the directory's vocabulary and the newest checkpoint
  /// (whose stored training options win over `options` for everything that changes the result,
  /// so that resuming is exact).
  /// `replicas`: the ranks of a data-parallel job (distributed.hpp); null: one process alone.
  Trainer(const TrainOptions& options, CorpusSplit data,
          std::shared_ptr<Replicas> replicas = nullptr);
  ~Trainer();

  /// Runs updates until last_update() or options.minutes (or `max_updates` more, if > 0), or
  /// until stop_requested() (SIGINT/SIGTERM) on any rank: then the update in progress finishes, a
  /// checkpoint is written and interrupted_by() is that signal, on every rank.
  void train(Index max_updates = 0);
  int interrupted_by() const { return interrupted_by_; }  // 0: not interrupted
  bool interrupted() const { return interrupted_by_ != 0; }
  /// The checkpoints finish() averaged into model.safetensors (0: it holds the last weights).
  int averaged() const { return averaged_; }
  /// Writes checkpoint_<step>.safetensors and drops all but the last `keep`, and the resume point
  /// of an earlier signal (kResumePointKey, train_state.hpp).
  std::string save_checkpoint();
  /// The final validation (unless options.evaluate is off), the final checkpoint, then
  /// `checkpointed` (if any), then model.safetensors (averaged or not), curves and attention
  /// plots. On rank 0 only; other ranks return at once.
  void finish(const std::function<void()>& checkpointed = {});

  struct Validation {
    LossStats loss;
    BleuScore bleu;
  };
  Validation validate();
  /// How BLEU is computed here: the options' tokenizer (13a or none) and case.
  BleuOptions bleu_options() const;

  Transformer<float>& model() { return *model_; }
  const SubwordVocab& vocab() const { return vocab_; }
  Index step() const;
  const TrainOptions& options() const { return opt_; }
  const CorpusSplit& data() const { return data_; }
  const std::vector<CurvePoint>& curves() const { return curves_; }
  /// The data position: the epoch under way, and its batches (with --bpe-dropout its own, else
  /// the same every epoch).
  std::uint64_t epoch() const { return epoch_; }
  const Batcher& epoch_batches() const;
  /// Training pairs left out because a side is longer than max_len subword tokens.
  std::size_t skipped_pairs() const;
  /// The global gradient norm of the last update, before clipping (NaN before the first).
  double last_grad_norm() const { return last_grad_norm_; }
  /// The learning rate of update `step` (from 1): the Noam schedule, times the linear cooldown
  /// over the last --cooldown updates when it is on.
  double learning_rate(Index step) const;
  /// The update training stops after: --steps, or on --resume without it the end of the run's
  /// cooldown, where the learning rate reaches zero; 0: no such limit.
  Index last_update() const;
  /// With --resume: the checkpoint resumed from, and each newer one skipped with the reason.
  const std::string& resumed_from() const { return resumed_from_; }
  std::vector<std::string> skipped_checkpoints() const;

 private:
  void build(const TransformerConfig& config);  // batchers, model, Adam, loss from opt_
  void resume_from(const std::string& path);    // build() from a checkpoint, then load it
  void resume_newest_loadable(const TrainOptions& given);
  void set_aside_skipped_checkpoints();  // rank 0, once the ranks agreed (start)
  std::map<std::string, std::string> metadata() const;
  BatchingOptions batching_options() const;
  // Moves the data position to the start of `epoch`: with --bpe-dropout, the epoch's own batches,
  // its training pairs encoded afresh with draws from (seed, epoch); returns its batch count.
  std::size_t start_epoch(std::uint64_t epoch);
  const Batch& next_batch();
  double update();  // one optimiser step; returns its mean smoothed loss
  // The progress line after an update; at a log point also a curve point, and a new window.
  void report_progress(Index first, double seconds);
  // save_checkpoint, or (resume_point) the checkpoint of a run a signal stopped
  std::string write_checkpoint(bool resume_point);
  void run_validation();               // validate(), print it and add it to the curves
  bool checkpoint_is_current() const;  // a checkpoint of this step is on disk

  TrainOptions opt_;
  CorpusSplit data_;
  std::shared_ptr<Replicas> replicas_;  // before vocab_: rank 0 makes the vocabulary, others wait
  std::unique_ptr<ModelDirLock> lock_;  // rank 0's, held from before the first write to the dir
  SubwordVocab vocab_;
  ProgressLine progress_;
  Index fault_step_ = 0;  // ATTN_TRANSLATE_FAULT_STEP: a test's NaN loss in this update (0: none)
  Index fault_grad_step_ = 0;  // ATTN_TRANSLATE_FAULT_GRAD_STEP: a NaN gradient after its sums
  Index fault_unreadable_step_ = 0;  // ATTN_TRANSLATE_FAULT_UNREADABLE_STEP: a checkpoint's read
                                     // fails on this rank (0: none)
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<Adam<float>> adam_;
  std::unique_ptr<LabelSmoothedCrossEntropy<float>> loss_;
  std::unique_ptr<Batcher> train_batches_, valid_batches_;
  std::unique_ptr<Batcher> sampled_batches_;  // epoch_'s, under --bpe-dropout (else null)
  std::uint64_t data_fingerprint_ = 0;  // of train_batches_ (checkpoints store it, --resume checks)
  std::vector<std::vector<TokenId>> valid_src_ids_;
  std::uint64_t epoch_ = 0;  // data position: epoch and index into its batch order
  std::size_t batch_index_ = 0;
  std::vector<std::size_t> order_;
  std::vector<CurvePoint> curves_;
  LogWindowState log_window_;  // the updates since the last log point (checkpoints store it)
  std::chrono::steady_clock::time_point log_window_start_;  // for tokens/s
  Index train_tokens_ = 0;  // target tokens since the last progress point, for tokens/s
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  int interrupted_by_ = 0;  // the signal that stopped train(), agreed by every rank
  int averaged_ = 0;        // by finish()
  Index resume_step_ = -1;  // the step of the resume point on disk (write_checkpoint), or -1
  std::string resumed_from_;
  struct SkippedCheckpoint {
    std::string path, why;  // why it does not load
  };
  std::vector<SkippedCheckpoint> skipped_;  // newest first
};

/// Builds a TransformerConfig from the preset name and overrides; ConfigError for an unknown
/// preset.
TransformerConfig make_config(const TrainOptions& options, Index vocab);

}  // namespace attn::translate
