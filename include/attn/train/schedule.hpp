// The learning-rate schedule of the paper (section 5.3, "Noam"): linear warmup for `warmup` steps,
// then decay with the inverse square root of the step number,
//   lr(step) = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
// which peaks at step == warmup with factor * (d_model * warmup)^-0.5.
//
// Not in the paper: linear_cooldown, a factor that takes any schedule linearly down to zero over
// the last updates of a run of known length. A run of fixed budget ends on a low learning rate
// instead of where the inverse square root happens to be ("warmup-stable-decay" and budgeted
// training schedules do the same).
#pragma once

#include <algorithm>
#include <cmath>

#include "attn/tensor.hpp"

namespace attn {

/// `step` counts from 1 (the first update); d_model, warmup > 0; factor > 0.
inline double noam_lr(Index step, Index d_model, Index warmup = 4000, double factor = 1.0) {
  ATTN_CHECK(step >= 1, ConfigError, "noam_lr: step counts from 1, got ", step);
  ATTN_CHECK(d_model > 0, ConfigError, "noam_lr: d_model must be > 0, got ", d_model);
  ATTN_CHECK(warmup > 0, ConfigError, "noam_lr: warmup must be > 0, got ", warmup);
  ATTN_CHECK(factor > 0 && std::isfinite(factor), ConfigError,
             "noam_lr: factor must be finite and > 0, got ", factor);
  const double s = static_cast<double>(step), w = static_cast<double>(warmup);
  return factor * std::pow(static_cast<double>(d_model), -0.5) *
         std::min(std::pow(s, -0.5), s * std::pow(w, -1.5));
}

/// The factor of update `step` (counting from 1) in a run of `end` updates whose last `cooldown`
/// decay linearly: 1 up to step end - cooldown, then (end + 1 - step) / (cooldown + 1), so that
/// the line would reach 0 at step end + 1 and every update of the run still moves the weights.
/// cooldown == 0: always 1. Needs 0 <= cooldown <= end and 1 <= step <= end.
inline double linear_cooldown(Index step, Index end, Index cooldown) {
  ATTN_CHECK(cooldown >= 0 && cooldown <= end, ConfigError,
             "linear_cooldown: cooldown must be in [0, end = ", end, "], got ", cooldown);
  ATTN_CHECK(step >= 1 && step <= end, ConfigError, "linear_cooldown: step must be in [1, ", end,
             "], got ", step);
  if (step <= end - cooldown) return 1.0;
  // In double: end + 1 would overflow at the largest Index.
  return (static_cast<double>(end - step) + 1.0) / (static_cast<double>(cooldown) + 1.0);
}

}  // namespace attn
