// The training loss of the paper (section 5.4): cross-entropy against label-smoothed targets,
// eps = 0.1, summed over the non-padding target tokens.
//
// Smoothed target distribution (PyTorch / fairseq convention, as
// torch.nn.functional.cross_entropy(logits, t, ignore_index=pad, label_smoothing=eps,
// reduction='sum')): for a target t among V classes,
//   q_j = (1 - eps) [j == t] + eps / V
// so the target keeps 1 - eps + eps/V and every other class gets eps/V. Padding targets contribute
// nothing, neither loss nor gradient.
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "attn/kernels/cross_entropy.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// Sums over the non-padding tokens of one batch (or several: operator+= accumulates).
struct LossStats {
  double smoothed_loss = 0;  // sum over tokens of -sum_j q_j log p_j, what is optimised
  double nll = 0;            // sum over tokens of -log p(target), for perplexity
  Index tokens = 0;          // non-padding targets

  /// exp(nll / tokens); NaN when there were no tokens (no evidence either way).
  double perplexity() const {
    return tokens > 0 ? std::exp(nll / static_cast<double>(tokens))
                      : std::numeric_limits<double>::quiet_NaN();
  }
  double mean_loss() const {
    return tokens > 0 ? smoothed_loss / static_cast<double>(tokens)
                      : std::numeric_limits<double>::quiet_NaN();
  }
  LossStats& operator+=(const LossStats& o) {
    smoothed_loss += o.smoothed_loss;
    nll += o.nll;
    tokens += o.tokens;
    return *this;
  }
};

/// Throws NumericError "loss is NaN at step 1234" (or Inf) unless both sums are finite.
inline void check_finite(const LossStats& stats, Index step) {
  for (double v : {stats.smoothed_loss, stats.nll})
    ATTN_CHECK(std::isfinite(v), NumericError, "loss is ", std::isnan(v) ? "NaN" : "Inf",
               " at step ", step);
}

/// The number of targets that are not `pad_id`; 1.0 / count_tokens(...) is the grad_scale of a
/// per-token mean.
inline Index count_tokens(const Tensor<TokenId>& targets, TokenId pad_id) {
  Index n = 0;
  for (TokenId t : targets) n += t != pad_id;
  return n;
}

template <class T>
class LabelSmoothedCrossEntropy {
 public:
  /// smoothing in [0, 1); pad_id is the target id to ignore (any value, as PyTorch's
  /// ignore_index: -100 ignores nothing that a vocabulary can hold).
  LabelSmoothedCrossEntropy(double smoothing, TokenId pad_id) : eps_(smoothing), pad_id_(pad_id) {
    detail::check_probability("", "label smoothing", smoothing);
  }

  /// logits [..., V] (e.g. [B, T, V] or [N, V]), targets [...] (the logits' shape without V).
  /// Returns the sums; writes dlogits [..., V] = grad_scale * d(smoothed_loss)/d(logits),
  /// overwriting it (resized to the logits' shape). `step` >= 0 is named in error messages.
  /// Throws IndexError for a target outside [0, V) that is not pad_id, NumericError for a
  /// non-finite logit.
  LossStats forward_backward(const Tensor<T>& logits, const Tensor<TokenId>& targets,
                             double grad_scale, Tensor<T>& dlogits, Index step = -1) {
    dlogits.resize(logits.shape());
    // resize() keeps storage that is large enough, shared or not: a dlogits overlapping the logits
    // elsewhere than exactly on them overwrote rows still to be read, and the loss was wrong in
    // silence. The very same elements are the in-place gradient, which the kernel supports.
    T* d = dlogits.data();
    const T* x = logits.data();
    const Index n = logits.numel();
    const bool apart = !dlogits.shares_storage(logits) || d + n <= x || x + n <= d;
    ATTN_CHECK(apart || d == x, ConfigError,
               "LabelSmoothedCrossEntropy: dlogits shares part of the storage of logits ",
               logits.shape(), " (it starts ", d < x ? x - d : d - x, " elements ",
               d < x ? "before" : "after",
               " them): pass the logits themselves for an in-place gradient, or a tensor of its "
               "own");
    return run(logits, targets, grad_scale, d, step);
  }

  /// As above, in place: the gradient overwrites `logits` (a handle to what model.forward
  /// returned), which then goes to model.backward. Saves a [..., V] buffer, the largest of a
  /// training step, and a pass over it; the numbers are those of the other overloads.
  LossStats forward_backward_in_place(Tensor<T>& logits, const Tensor<TokenId>& targets,
                                      double grad_scale, Index step = -1) {
    return run(logits, targets, grad_scale, logits.data(), step);
  }

  /// As above, into the loss's own buffer, returned by dlogits().
  LossStats forward_backward(const Tensor<T>& logits, const Tensor<TokenId>& targets,
                             double grad_scale, Index step = -1) {
    return forward_backward(logits, targets, grad_scale, dlogits_, step);
  }

  /// The loss only, without writing a gradient (validation).
  LossStats evaluate(const Tensor<T>& logits, const Tensor<TokenId>& targets, Index step = -1) {
    return run(logits, targets, 0.0, nullptr, step);
  }

  const Tensor<T>& dlogits() const { return dlogits_; }
  double smoothing() const { return eps_; }
  TokenId pad_id() const { return pad_id_; }

 private:
  LossStats run(const Tensor<T>& logits, const Tensor<TokenId>& targets, double grad_scale,
                T* dlogits, Index step) {
    ATTN_CHECK(logits.rank() >= 2, ShapeError,
               "LabelSmoothedCrossEntropy: expected logits [..., V] of rank >= 2, got ",
               logits.shape());
    const Index V = logits.size(logits.rank() - 1);
    ATTN_CHECK(V >= 1, ShapeError,
               "LabelSmoothedCrossEntropy: expected logits [..., V] with V >= 1, got ",
               logits.shape());
    const Shape expected(logits.shape().begin(), logits.shape().end() - 1);
    ATTN_CHECK(targets.shape() == expected, ShapeError, "LabelSmoothedCrossEntropy: logits ",
               logits.shape(), " need targets of shape ", expected, ", got ", targets.shape());
    ATTN_CHECK(detail::fits_in<T>(grad_scale), NumericError,
               "LabelSmoothedCrossEntropy: grad_scale must be finite in the logits' type, got ",
               grad_scale, where(step));
    const Index N = targets.numel();
    LossStats stats;
    for (Index i = 0; i < N; ++i) {
      const TokenId t = targets.data()[i];
      if (t == pad_id_) continue;
      ATTN_CHECK(t >= 0 && t < V, IndexError, "LabelSmoothedCrossEntropy: target id ", t,
                 " at position ", i, " is outside the vocabulary [0, ", V, ")", where(step));
      ++stats.tokens;
    }
    row_loss_.resize(static_cast<std::size_t>(N));
    row_nll_.resize(static_cast<std::size_t>(N));
    kernels::cross_entropy_forward_backward<T>(dlogits, row_loss_.data(), row_nll_.data(),
                                               logits.data(), targets.data(), N, V, pad_id_, eps_,
                                               grad_scale);
    // Summed serially in row order: the total does not depend on the thread count.
    for (Index r = 0; r < N; ++r) {
      ATTN_CHECK(std::isfinite(row_loss_[static_cast<std::size_t>(r)]), NumericError,
                 "LabelSmoothedCrossEntropy: logits row ", r, " (of ", N, ") contains NaN or Inf",
                 where(step));
      stats.smoothed_loss += row_loss_[static_cast<std::size_t>(r)];
      stats.nll += row_nll_[static_cast<std::size_t>(r)];
    }
    // Every row is finite by now; only a sum overflowing can make the totals not so.
    ATTN_CHECK(std::isfinite(stats.smoothed_loss) && std::isfinite(stats.nll), NumericError,
               "LabelSmoothedCrossEntropy: loss is not finite (", stats.smoothed_loss, ")",
               where(step));
    return stats;
  }

  static std::string where(Index step) {
    return step >= 0 ? detail::concat(" at step ", step) : std::string();
  }

  double eps_;
  TokenId pad_id_;
  Tensor<T> dlogits_;             // [..., V] gradient buffer of the overloads without one
  std::vector<double> row_loss_;  // [N] per-row smoothed loss, summed serially
  std::vector<double> row_nll_;   // [N] per-row -log p(target)
};

}  // namespace attn
