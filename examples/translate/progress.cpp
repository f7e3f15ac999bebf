#include "progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace attn::translate {

bool ProgressLine::stderr_is_terminal() { return isatty(fileno(stderr)) != 0; }

void ProgressLine::status(const std::string& text) {
  if (!terminal_) return;
  *out_ << '\r' << text << "\033[K" << std::flush;
  pending_ = true;
}

void ProgressLine::line(const std::string& text) {
  if (terminal_ && pending_) *out_ << '\r' << "\033[K";
  pending_ = false;
  *out_ << text << '\n' << std::flush;
}

void ProgressLine::finish() {
  if (terminal_ && pending_) *out_ << '\n' << std::flush;
  pending_ = false;
}

}  // namespace attn::translate
