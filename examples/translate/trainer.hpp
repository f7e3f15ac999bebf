// The training loop of attn-translate: vocabulary, batching, Adam with the paper's schedule,
// gradient accumulation, progress output, validation (loss, perplexity, greedy BLEU), checkpoints
// that resume bit-exactly (parameters, Adam moments, dropout RNG, step and data position) and the
// final model (trainer.cpp; how it starts, afresh or resumed: trainer_setup.cpp). Beside it: its
// options and their table (train_options.hpp), the training batches and the data position
// (epoch_stream.hpp), what a checkpoint's metadata holds (train_state.hpp), the model directory's
// files and policy (model_dir.hpp), the progress line (progress.hpp) and its log window
// (log_window.hpp), and the SVG reports (train_report.hpp).
#pragma once

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
#include "epoch_stream.hpp"
#include "log_window.hpp"
#include "model_dir.hpp"
#include "progress.hpp"
#include "train_options.hpp"
#include "train_report.hpp"  // CurvePoint
#include "training_pairs.hpp"

namespace attn::translate {

class Replicas;  // distributed.hpp

/// The failures a test makes the trainer meet, each at one step (0: none), read from the
/// environment so that a test can fail one rank of an MPI job: ATTN_TRANSLATE_FAULT_STEP=N fails
/// this process's update N as a NaN loss would, naming the variable;
/// ATTN_TRANSLATE_FAULT_GRAD_STEP=N makes a gradient NaN after update N's sums (on every rank that
/// sets it); ATTN_TRANSLATE_FAULT_UNREADABLE_STEP=N fails this process's read of
/// checkpoint_N.safetensors on --resume, as a rank whose file system cannot read it would.
struct InjectedFaults {
  Index loss_step = 0;
  Index grad_step = 0;
  Index unreadable_step = 0;
  static InjectedFaults from_environment();
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
  std::uint64_t epoch() const { return stream_->epoch(); }
  const Batcher& epoch_batches() const { return stream_->epoch_batches(); }
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
  /// The update count, data position, Adam moments and dropout stream, for the ranks to compare.
  std::uint64_t state_fingerprint() const;
  /// The label-smoothed loss of `logits`, its gradient written over them.
  LossStats loss_and_gradient(Tensor<float>& logits, Index step);
  BatchingOptions batching_options() const;
  LossStats update();  // one optimiser step; returns its smoothed loss over every rank
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
  const InjectedFaults faults_;
  std::unique_ptr<Transformer<float>> model_;
  std::unique_ptr<Adam<float>> adam_;
  std::unique_ptr<LabelSmoothedCrossEntropy<float>> loss_;
  std::unique_ptr<EpochStream> stream_;  // the training batches and the data position
  std::unique_ptr<Batcher> valid_batches_;
  std::vector<std::vector<TokenId>> valid_src_ids_;
  std::vector<CurvePoint> curves_;
  LogWindow log_window_;  // the updates since the last log point (checkpoints store its state)
  double last_grad_norm_ = std::numeric_limits<double>::quiet_NaN();
  int interrupted_by_ = 0;  // the signal that stopped train(), agreed by every rank
  int averaged_ = 0;        // by finish()
  Index first_step_ = 1;    // the first update of this run (after the checkpoint resumed)
  Index resume_step_ = -1;  // the step of the resume point on disk (write_checkpoint), or -1
  std::string resumed_from_;
  struct SkippedCheckpoint {
    std::string path, why;  // why it does not load
  };
  std::vector<SkippedCheckpoint> skipped_;  // newest first
};

}  // namespace attn::translate
