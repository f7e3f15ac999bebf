// The learning-rate schedule of the paper (section 5.3, "Noam"): linear warmup for `warmup` steps,
// then decay with the inverse square root of the step number,
//   lr(step) = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
// which peaks at step == warmup with factor * (d_model * warmup)^-0.5.
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

}  // namespace attn
