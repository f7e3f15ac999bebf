// Progress output of the trainer that reads well both on a terminal and in a log file.
//
// On a terminal a status line is redrawn in place ('\r' and "erase to end of line", ESC[K), so
// the screen shows the newest step without scrolling. Anywhere else (a file, a pipe, CI) escape
// codes and carriage returns are noise: status lines are dropped and only the lines meant to stay
// are written, each a plain line ending in '\n'.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace attn::translate {

class ProgressLine {
 public:
  /// `terminal`: whether `out` is a terminal (see stderr_is_terminal()).
  ProgressLine(std::ostream& out, bool terminal) : out_(&out), terminal_(terminal) {}

  /// True if the process's stderr is a terminal.
  static bool stderr_is_terminal();

  bool terminal() const { return terminal_; }
  /// A transient status, redrawn in place on a terminal; nothing elsewhere.
  void status(const std::string& text);
  /// A line that stays (replacing the status line on a terminal), flushed.
  void line(const std::string& text);
  /// Ends a pending status line on a terminal.
  void finish();

 private:
  std::ostream* out_;
  bool terminal_;
  bool pending_ = false;  // a status line is on screen without its '\n'
};

/// "1h02m", "3m05s" or "42s", rounded to the second; "?" for a negative or non-finite time, and
/// beyond a million hours (an ETA for --steps near 2^63).
std::string format_duration(double seconds);

/// What the trainer's progress line shows after an update.
struct StepProgress {
  std::int64_t step = 0;
  double loss = 0;  ///< mean smoothed loss per token since the last log point
  double lr = 0;
  double tokens_per_second = 0;  ///< target tokens
  double seconds = 0;            ///< since training (or resuming) started
  double eta = 0;                ///< seconds left; NaN if unknown
};

/// "step 100 | loss 4.321 | ppl 75.3 | lr 1.23e-04 | 5000 tok/s | 1m40s | ETA 3m20s".
std::string format_step_progress(const StepProgress& p);

}  // namespace attn::translate
