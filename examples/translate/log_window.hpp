// The log window: the updates since the trainer's last log point, whose mean loss and tokens per
// second the next progress line shows.
#pragma once

#include <chrono>

#include <attn/tensor.hpp>  // Index

namespace attn::translate {

/// The updates since the last log point: the sum of their mean losses and their count, whose mean
/// the next log line and curve point show. Training checkpoints store it (train_state.hpp).
struct LogWindowState {
  double loss_sum = 0;
  Index updates = 0;
};

/// The log window at work: its stored state, and the target tokens and time since the window (or,
/// resumed, this process's training) began, for the tokens per second of the next log line.
class LogWindow {
 public:
  using Clock = std::chrono::steady_clock;

  /// An update's mean loss and the target tokens it trained on (every rank's).
  void add(double loss, Index tokens) {
    state_.loss_sum += loss;
    ++state_.updates;
    tokens_ += tokens;
  }
  double mean_loss() const { return state_.loss_sum / static_cast<double>(state_.updates); }
  double tokens_per_second() const {
    return static_cast<double>(tokens_) /
           std::chrono::duration<double>(Clock::now() - start_).count();
  }
  /// Counts tokens and time from now: when training (again) begins, the window's losses kept.
  void restart_clock() {
    start_ = Clock::now();
    tokens_ = 0;
  }
  /// At a log point: an empty window from now.
  void clear() {
    state_ = LogWindowState{};
    restart_clock();
  }
  const LogWindowState& state() const { return state_; }
  void restore(const LogWindowState& state) { state_ = state; }

 private:
  LogWindowState state_;
  Clock::time_point start_ = Clock::now();
  Index tokens_ = 0;
};

}  // namespace attn::translate
