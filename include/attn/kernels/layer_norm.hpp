// Layer normalisation over the last axis, as torch.nn.LayerNorm: per row, the mean and the BIASED
// variance (divide by D, not D - 1), eps inside the square root, then a per-feature affine map.
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)
#pragma once

#include <algorithm>
#include <cmath>

#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

namespace detail {

/// One row of layer_norm_forward: y[D] from x[D]; writes the row's mean and rstd.
template <class T>
void layer_norm_row(T* y, T& mean, T& rstd, const T* x, const T* gamma, const T* beta, Index D,
                    double eps) {
  const ArrayMap<const T> xr(x, D);
  // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
  // catastrophically in float when |mean| >> std.
  const T mu = xr.mean();
  const T var = (xr - mu).square().mean();
  const T rs = T(1) / std::sqrt(var + static_cast<T>(eps));
  mean = mu;
  rstd = rs;
  ArrayMap<T>(y, D) = (xr - mu) * rs * ArrayMap<const T>(gamma, D) + ArrayMap<const T>(beta, D);
}

}  // namespace detail

/// y[N, D] = LayerNorm(x[N, D]) with gamma[D], beta[D]; writes mean[N] and rstd[N], which is
/// all backward needs besides x and gamma. Rows are independent, so they run in parallel.
template <class T>
void layer_norm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                        Index rows, Index D, double eps) {
  parallel_for(rows, D, kParallelMinRowwise, [&](Index r) {
    detail::layer_norm_row(y + r * D, mean[r], rstd[r], x + r * D, gamma, beta, D, eps);
  });
}

/// Backward of y = xhat * gamma + beta, xhat = (x - mean) * rstd. With g = dy * gamma:
///   dx      = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   (overwritten)
///   dgamma += sum_rows(dy * xhat)                                 (accumulated)
///   dbeta  += sum_rows(dy)                                        (accumulated)
/// dx is parallel over rows; dgamma/dbeta are parallel over columns, each column summed in row
/// order by one thread, so the result does not depend on the thread count.
template <class T>
void layer_norm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                         const T* rstd, const T* gamma, Index rows, Index D) {
  const ArrayMap<const T> g(gamma, D);
  parallel_for(rows, D, kParallelMinRowwise, [&](Index r) {
    const ArrayMap<const T> dyr(dy + r * D, D), xr(x + r * D, D);
    const T mu = mean[r], rs = rstd[r];
    const T inv_d = T(1) / static_cast<T>(D);
    // mean_j(g) and mean_j(g * xhat), then dx without materialising g or xhat.
    const T mean_g = (dyr * g).sum() * inv_d;
    const T mean_gx = (dyr * g * (xr - mu)).sum() * rs * inv_d;
    ArrayMap<T>(dx + r * D, D) = rs * (dyr * g - mean_g - (xr - mu) * rs * mean_gx);
  });
  // Column blocks of kBlock keep the inner loop contiguous (vectorisable) while each column is
  // still owned by exactly one thread.
  constexpr Index kBlock = 64;
  const Index blocks = (D + kBlock - 1) / kBlock;
  // Each block's work is its columns over every row: the same rows * D in total.
  parallel_for(blocks, rows * kBlock, kParallelMinRowwise, [&](Index blk) {
    const Index j0 = blk * kBlock, w = std::min(kBlock, D - j0);
    Eigen::Array<T, 1, kBlock> sg = Eigen::Array<T, 1, kBlock>::Zero();
    Eigen::Array<T, 1, kBlock> sb = Eigen::Array<T, 1, kBlock>::Zero();
    for (Index r = 0; r < rows; ++r) {
      const ArrayMap<const T> dyr(dy + r * D + j0, w), xr(x + r * D + j0, w);
      sg.head(w) += dyr * (xr - mean[r]) * rstd[r];
      sb.head(w) += dyr;
    }
    ArrayMap<T>(dgamma + j0, w) += sg.head(w);
    ArrayMap<T>(dbeta + j0, w) += sb.head(w);
  });
}

}  // namespace attn::kernels
