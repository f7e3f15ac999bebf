// The trainer's progress line (progress.hpp): durations, the per-update line, and ProgressLine's
// plain lines (a log file) and redrawn status line (a terminal).
#include <cmath>
#include <limits>
#include <sstream>

#include <gtest/gtest.h>

#include "progress.hpp"

namespace attn::translate {
namespace {

TEST(ProgressFormat, DurationsRoundToTheSecondInTheLargestUnit) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(59.5), "1m00s");
  EXPECT_EQ(format_duration(61), "1m01s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(100 * 3600 + 5 * 60 + 59), "100h05m");
}

TEST(ProgressFormat, UnknownOrAbsurdDurationsAreAQuestionMark) {
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(format_duration(1e19), "?");  // --steps near 2^63: a cast to long would overflow
  EXPECT_EQ(format_duration(3.6e9), "1000000h00m");
}

TEST(ProgressFormat, StepLineShowsLossPerplexityRateSpeedTimeAndEta) {
  StepProgress p;
  p.step = 100;
  p.loss = std::log(75.3);
  p.lr = 1.234e-4;
  p.tokens_per_second = 4999.6;
  p.seconds = 100;
  p.eta = 200;
  EXPECT_EQ(format_step_progress(p),
            "step 100 | loss 4.321 | ppl 75.3 | lr 1.23e-04 | 5000 tok/s | 1m40s | ETA 3m20s");
  p.eta = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(format_step_progress(p),
            "step 100 | loss 4.321 | ppl 75.3 | lr 1.23e-04 | 5000 tok/s | 1m40s | ETA ?");
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::ostringstream out;
  ProgressLine p(out, false);
  p.status("step 1 | loss 9");
  p.line("step 2 | loss 8");
  p.status("step 3 | loss 7");
  p.line("valid step 3");
  p.finish();
  EXPECT_EQ(out.str(), "step 2 | loss 8\nvalid step 3\n");
  EXPECT_EQ(out.str().find_first_of("\r\033"), std::string::npos);
}

TEST(Progress, RedrawsInPlaceOnATerminal) {
  std::ostringstream out;
  ProgressLine p(out, true);
  p.status("step 1");
  p.line("valid");
  p.status("step 2");
  p.finish();
  EXPECT_EQ(out.str(), "\rstep 1\033[K\r\033[Kvalid\n\rstep 2\033[K\n");
}

}  // namespace
}  // namespace attn::translate
