// The Trainer at work: updates with gradient accumulation, progress lines, validation, test BLEU,
// checkpoints and the final model with its reports. How it starts is in trainer_setup.cpp.
#include "trainer.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include <attn/decode/options.hpp>  // detail::EvalGuard
#include <attn/train/checkpoint.hpp>
#include <attn/train/clip.hpp>
#include <attn/train/schedule.hpp>

#include "distributed.hpp"
#include "model_average.hpp"
#include "model_metadata.hpp"
#include "stop_signal.hpp"
#include "train_report.hpp"
#include "train_state.hpp"
#include "translator.hpp"  // translate_ids

namespace attn::translate {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kDiverged = " (try a lower --lr-factor, a longer --warmup or --clip-norm)";

}  // namespace

Index Trainer::step() const { return adam_->steps(); }

std::size_t Trainer::skipped_pairs() const { return stream_->whole_batches().skipped(); }

std::map<std::string, std::string> Trainer::metadata() const {
  std::map<std::string, std::string> m = model_->config().to_metadata();
  store_vocab_metadata(vocab_, m);
  store_options(opt_, m);
  return m;
}

LossStats Trainer::update() {
  const Index step = adam_->steps() + 1;
  model_->train();
  adam_->zero_grad();
  LossStats stats;          // this rank's share
  Index update_tokens = 0;  // every rank's: the whole batches' target tokens
  std::string error;        // this rank's failure, for every rank to stop on (distributed.hpp)
  // Gradients of several batches add up in Parameter::grad; dividing by the token count at the
  // end makes the update the per-token mean over everything seen, as one large batch would.
  do {
    const Batch& whole = stream_->next();
    update_tokens += whole.tgt_tokens;
    if (update_tokens >= opt_.tokens_per_update) replicas_->last_batch_of_update();
    const Batch& b = replicas_->share(whole);
    if (!error.empty() || b.rows() == 0) continue;
    try {
      // Logits of the non-padding targets only, and the gradient overwrites them (a handle to
      // the model's buffer): one [n, V] buffer instead of two [B, T, V].
      Tensor<float> logits = model_->forward_scored(b.src, b.tgt_in, b.tgt_out);
      const LossStats s = loss_and_gradient(logits, step);
      ATTN_CHECK(step != faults_.loss_step, NumericError, "loss is NaN at step ", step,
                 " (made so by ATTN_TRANSLATE_FAULT_STEP)");
      check_finite(s, step);
      model_->backward(logits);
      stats += s;
    } catch (const Error& e) {
      if (replicas_->size() == 1) throw;
      error = e.what();
    }
  } while (update_tokens < opt_.tokens_per_update);
  stats = replicas_->finish_update(stats, error, *model_);  // sums gradients over the ranks
  scale_gradients(adam_->parameters(), 1.0 / static_cast<double>(stats.tokens));
  if (step == faults_.grad_step)
    model_->parameters()[0].grad.data()[0] = std::numeric_limits<float>::quiet_NaN();
  // A finite loss can still have a NaN or Inf gradient; Adam would spread it into every weight.
  last_grad_norm_ = grad_norm(adam_->parameters());
  if (!std::isfinite(last_grad_norm_)) {
    const std::string message =
        attn::detail::concat("step ", step, ": the gradient norm is ", last_grad_norm_, kDiverged);
    // The sums made the gradients, and so this error, the same on every rank: rank 0 reports it.
    if (replicas_->size() > 1) throw AgreedError(message);
    throw NumericError(message);
  }
  if (opt_.clip_norm > 0) clip_grad_norm(adam_->parameters(), opt_.clip_norm);
  adam_->step(learning_rate(step));
  return stats;
}

// The loss's NumericError for logits that are not finite: after an update of this run, the
// weights it made so with a learning rate too high (--lr-factor 1e30 failed at step 2 naming only
// a logits row), with what to change; at the first step of a run nothing of it is to blame.
LossStats Trainer::loss_and_gradient(Tensor<float>& logits, Index step) {
  try {
    return loss_->forward_backward_in_place(logits, model_->scored_targets(), 1.0, step);
  } catch (const NumericError& e) {
    if (step <= first_step_) throw;
    throw NumericError(attn::detail::concat(e.what(), kDiverged));
  }
}

double Trainer::learning_rate(Index step) const {
  const double noam = noam_lr(step, model_->config().d_model, opt_.warmup, opt_.lr_factor);
  if (opt_.cooldown == 0) return noam;
  return noam * linear_cooldown(step, opt_.cooldown_end, opt_.cooldown);
}

Index Trainer::last_update() const {
  // A resumed run's --steps is at most the cooldown's end (checked at start), so --steps, when
  // given, is the sooner.
  if (opt_.steps > 0) return opt_.steps;
  return opt_.cooldown > 0 ? opt_.cooldown_end : 0;
}

BleuOptions Trainer::bleu_options() const {
  BleuOptions o;
  o.tokenize = opt_.tokenize_none ? BleuTokenizer::kNone : BleuTokenizer::k13a;
  return o;
}

Trainer::Validation Trainer::validate() {
  Validation v;
  if (!valid_batches_) return v;
  detail::EvalGuard<float> guard(*model_);
  for (const Batch& b : valid_batches_->batches())
    v.loss += loss_->evaluate(model_->forward_scored(b.src, b.tgt_in, b.tgt_out),
                              model_->scored_targets(), step());
  TranslateOptions t;
  t.greedy = true;
  t.batch_size = 64;
  const auto out = translate_ids(*model_, valid_src_ids_, t);
  std::vector<std::string> hyps(out.size()), refs(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    hyps[i] = vocab_.decode(out[i]);
    refs[i] = data_.valid.tgt[i];
  }
  v.bleu = corpus_bleu(hyps, refs, bleu_options());
  return v;
}

std::string Trainer::save_checkpoint() { return write_checkpoint(false); }

std::string Trainer::write_checkpoint(bool resume_point) {
  if (replicas_->rank() != 0) return {};  // one writer; the ranks' states are the same
  auto meta = metadata();
  store_data_position(stream_->position(), meta);
  store_data_fingerprint(stream_->data_fingerprint(), meta);
  store_curves(curves_, meta);
  store_log_window(log_window_.state(), meta);
  if (resume_point) store_resume_point(meta);
  const std::string path = checkpoint_path(opt_.model_dir, step());
  const AtomicWriteResult written =
      save_training_checkpoint(path, model_->parameters(), *adam_, model_->random_state(), meta);
  if (!written.warning.empty()) std::cerr << "train: warning: " << written.warning << '\n';
  // Any newer checkpoint replaces the one a signal left to resume from (a second signal's too);
  // the same step's is that one, written again.
  if (resume_step_ >= 0 && resume_step_ != step())
    fs::remove(checkpoint_path(opt_.model_dir, resume_step_));
  resume_step_ = resume_point ? step() : -1;
  prune_checkpoints(opt_.model_dir, opt_.keep, resume_step_);
  return path;
}

bool Trainer::checkpoint_is_current() const {
  const auto ckpts = list_checkpoints(opt_.model_dir);
  return !ckpts.empty() && ckpts.back().first == step();
}

void Trainer::train(Index max_updates) {
  const auto start = Clock::now();
  const Index first = step();
  log_window_.restart_clock();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (;;) {
    // Between updates, so the last one is complete; a signal that reached any rank stops every
    // rank here, or one would wait for the others in the next update's sums.
    if (const int signal = replicas_->max_over_ranks(stop_requested()); signal != 0) {
      if (!checkpoint_is_current()) write_checkpoint(true);
      // Every rank exits 128 + signal, and mpirun ends the job at the first non-zero exit: no
      // rank leaves before rank 0's checkpoint is on disk.
      replicas_->barrier();
      interrupted_by_ = signal;
      break;
    }
    if (last_update() > 0 && step() >= last_update()) break;
    if (max_updates > 0 && step() - first >= max_updates) break;
    // Clocks differ between ranks; rank 0's decides, or one rank would wait for the others.
    if (opt_.minutes > 0 && replicas_->rank0_decides(elapsed() >= opt_.minutes * 60)) break;
    const LossStats loss = update();
    log_window_.add(loss.mean_loss(), loss.tokens);
    report_progress(first, elapsed());
    const Index s = step();
    if (opt_.evaluate && opt_.valid_every > 0 && s % opt_.valid_every == 0) run_validation();
    if (opt_.checkpoint_every > 0 && s % opt_.checkpoint_every == 0) save_checkpoint();
  }
  progress_.finish();
}

void Trainer::report_progress(Index first, double seconds) {
  const Index s = step();
  const bool log_point = opt_.log_every > 0 && s % opt_.log_every == 0;
  if (!log_point && !progress_.terminal()) return;
  const double mean = log_window_.mean_loss();
  if (!opt_.quiet) {
    StepProgress p;
    p.step = s;
    p.loss = mean;
    p.lr = learning_rate(s);
    p.tokens_per_second = log_window_.tokens_per_second();
    p.seconds = seconds;
    p.eta = kNaN;  // the sooner of the last update and --minutes
    if (const Index end = last_update(); end > 0)
      p.eta = seconds / static_cast<double>(s - first) * static_cast<double>(end - s);
    if (opt_.minutes > 0)
      p.eta = std::isfinite(p.eta) ? std::min(p.eta, opt_.minutes * 60 - seconds)
                                   : opt_.minutes * 60 - seconds;
    const std::string line = format_step_progress(p);
    if (log_point)
      progress_.line(line);
    else
      progress_.status(line);
  }
  if (log_point) {
    curves_.push_back({s, mean, kNaN, kNaN});
    log_window_.clear();
  }
}

void Trainer::run_validation() {
  if (replicas_->rank() != 0) return;  // the same weights on every rank: rank 0 reports
  const Validation v = validate();
  if (!valid_batches_) return;
  const Index s = step();
  if (!curves_.empty() && curves_.back().step == s) {
    curves_.back().valid_loss = v.loss.mean_loss();
    curves_.back().valid_bleu = v.bleu.score;
  } else {
    curves_.push_back({s, kNaN, v.loss.mean_loss(), v.bleu.score});
  }
  if (!opt_.quiet) {
    std::ostringstream line;
    line << "valid step " << s << " | loss " << std::fixed << std::setprecision(3)
         << v.loss.mean_loss() << " | ppl " << std::setprecision(2) << v.loss.perplexity() << " | "
         << v.bleu.str();
    progress_.line(line.str());
  }
}

void Trainer::finish(const std::function<void()>& checkpointed) {
  if (replicas_->rank() != 0) return;
  const bool validated =
      !curves_.empty() && curves_.back().step == step() && !std::isnan(curves_.back().valid_loss);
  if (opt_.evaluate && !validated && valid_batches_) run_validation();
  if (!checkpoint_is_current() || resume_step_ >= 0) save_checkpoint();
  if (checkpointed) checkpointed();
  const int available = static_cast<int>(list_checkpoints(opt_.model_dir).size());
  averaged_ = 0;
  if (opt_.average > 1 && available > 1) {
    averaged_ = std::min(opt_.average, available);
    if (averaged_ < opt_.average && !opt_.quiet)
      std::cerr << "averaging the " << averaged_ << " checkpoints on disk (asked for "
                << opt_.average << "; --keep is " << opt_.keep << ")\n";
    average_last(opt_.model_dir, averaged_);
  } else {
    save_model(final_model_path(opt_.model_dir), *model_, metadata());
  }
  if (opt_.svg) {
    write_curves_svg((fs::path(opt_.model_dir) / "curves.svg").string(), curves_);
    write_attention_svg((fs::path(opt_.model_dir) / "attention.svg").string(), *model_, vocab_,
                        valid_src_ids_, data_.valid.src);
  }
}

}  // namespace attn::translate
