#include "progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

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

std::string format_duration(double seconds) {
  // "?" beyond a million hours too, where the cast to long would overflow.
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3.6e9) return "?";
  const long s = static_cast<long>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600)
    o << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s / 60) % 60 << "m";
  else if (s >= 60)
    o << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    o << s << "s";
  return o.str();
}

std::string format_step_progress(const StepProgress& p) {
  std::ostringstream line;
  line << "step " << p.step << " | loss " << std::fixed << std::setprecision(3) << p.loss
       << " | ppl " << std::setprecision(1) << std::exp(p.loss) << " | lr " << std::scientific
       << std::setprecision(2) << p.lr << " | " << std::fixed << std::setprecision(0)
       << p.tokens_per_second << " tok/s | " << format_duration(p.seconds) << " | ETA "
       << format_duration(p.eta);
  return line.str();
}

}  // namespace attn::translate
