// Label-smoothed cross-entropy over the rows of a logits matrix, fused with its log-softmax and
// its gradient: one read of the logits for the statistics, one write of the gradient.
//
// For a row x[V] with target t and smoothing eps, the target distribution is
//   q_j = (1 - eps) [j == t] + eps / V
// (PyTorch's CrossEntropyLoss(label_smoothing=eps): the uniform mass eps/V also lands on t, so
// q_t = 1 - eps + eps/V). With lse = log sum_j exp(x_j) and log p_j = x_j - lse:
//   nll  = lse - x_t
//   loss = -sum_j q_j log p_j = (1 - eps) nll + eps (lse - mean_j x_j)
//   dloss/dx_j = p_j - q_j
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "attn/kernels/detail/double_sums.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

namespace detail {

/// A row's sum in double and its maximum (unspecified where the sum is not finite).
template <class T>
std::pair<double, T> row_sum_and_max(const T* x, Index n) {
  if constexpr (std::is_same_v<T, float>) {
    const SumAndMax s = sum_and_max(x, n);
    return {s.sum, s.max};
  } else {
    const ArrayMap<const T> row(x, n);
    return {row.template cast<double>().sum(), row.maxCoeff()};
  }
}

}  // namespace detail

/// For each row r of logits[N, V] with target targets[r]:
///   targets[r] == pad_id: loss[r] = nll[r] = 0 and dlogits row r = 0.
///   otherwise:            loss[r], nll[r] as above (in double); dlogits row r = scale (p - q).
/// A row with a NaN or Inf logit gets loss[r] = nll[r] = NaN (padding rows included) and its
/// dlogits row is left unspecified; the caller finds and reports it after the parallel loop,
/// where throwing is allowed. `dlogits` may be null (evaluation: no gradient pass), or equal to
/// `logits` (the gradient overwrites the logits in place: each row is read whole before its
/// gradient is written, and one buffer of [N, V] is saved). Targets must
/// already be in [0, V) or pad_id. Rows are independent and run in parallel; each row's numbers
/// are computed by one thread in a fixed order, so results do not depend on the thread count.
template <class T>
void cross_entropy_forward_backward(T* dlogits, double* loss, double* nll, const T* logits,
                                    const TokenId* targets, Index N, Index V, TokenId pad_id,
                                    double eps, double scale) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr Index kChunk = 256;
  parallel_for(N, V, kParallelMinRowwise, [&](Index r) {
    const ArrayMap<const T> x(logits + r * V, V);
    // The sum in double cannot overflow for finite float logits, so it is NaN or Inf exactly when
    // some logit is; it also gives mean_j x_j for the smoothing term. The maximum comes from the
    // same read.
    const auto [sum_x, m] = detail::row_sum_and_max(logits + r * V, V);
    if (!std::isfinite(sum_x)) {
      loss[r] = nll[r] = nan;
      return;
    }
    const TokenId t = targets[r];
    if (t == pad_id) {
      loss[r] = nll[r] = 0.0;
      if (dlogits != nullptr) ArrayMap<T>(dlogits + r * V, V).setZero();
      return;
    }
    const T x_t = x(t);  // read before the gradient pass, which may overwrite x (in place)
    // e_j = exp(x_j - max) <= 1, so the sum cannot overflow. The exponentials are computed with
    // Eigen's vectorised exp a chunk at a time (into the gradient row when there is one, so the
    // gradient reuses them) and each chunk's float sum is accumulated in double.
    T chunk_buffer[kChunk];
    double sum_exp = 0.0;
    for (Index c = 0; c < V; c += kChunk) {
      const Index n = std::min(kChunk, V - c);
      T* e_ptr = dlogits != nullptr ? dlogits + r * V + c : chunk_buffer;
      ArrayMap<T> e(e_ptr, n);
      e = (x.segment(c, n) - m).exp();
      sum_exp += static_cast<double>(e.sum());
    }
    const double lse = static_cast<double>(m) + std::log(sum_exp);
    nll[r] = lse - static_cast<double>(x_t);
    loss[r] = (1.0 - eps) * nll[r] + eps * (lse - sum_x / static_cast<double>(V));
    if (dlogits != nullptr) {
      // dx_j = scale (e_j / sum_exp - eps/V) - scale (1 - eps) [j == t]
      ArrayMap<T> d(dlogits + r * V, V);
      const T s = static_cast<T>(scale / sum_exp);
      const T uniform = static_cast<T>(scale * eps / static_cast<double>(V));
      d = d * s - uniform;
      d(t) -= static_cast<T>(scale * (1.0 - eps));
    }
  });
}

}  // namespace attn::kernels
