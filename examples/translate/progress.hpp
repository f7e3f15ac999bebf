// Progress output of the trainer that reads well both on a terminal and in a log file.
//
// On a terminal a status line is redrawn in place ('\r' and "erase to end of line", ESC[K), so
// the screen shows the newest step without scrolling. Anywhere else (a file, a pipe, CI) escape
// codes and carriage returns are noise: status lines are dropped and only the lines meant to stay
// are written, each a plain line ending in '\n'.
#pragma once

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

}  // namespace attn::translate
