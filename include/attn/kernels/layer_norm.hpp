// Layer normalisation over the last axis, as torch.nn.LayerNorm: per row, the mean and the BIASED
// variance (divide by D, not D - 1), eps inside the square root, then a per-feature affine map.
//   y = (x - mean) * rstd * gamma + beta,   rstd = 1 / sqrt(var + eps)
#pragma once

#include <algorithm>
#include <cmath>

#include "attn/kernels/detail/growing_buffer.hpp"
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

namespace detail {

/// Rows per block of layer_norm_backward: fixed, so that dgamma and dbeta are summed in the same
/// order on any number of threads. A block's sums (2 D floats) stay in L1 while it runs, and the
/// block sums added afterwards are 1/32 of the numbers the pass reads; at the 200 rows of the
/// thread-count test it is still 7 blocks for 2 threads.
inline constexpr Index kLayerNormRowBlock = 32;

/// The calling thread's buffer for layer_norm_backward's block sums: at least n numbers, 64-byte
/// aligned, only ever grown (a training loop allocates it in its first step).
template <class T>
T* layer_norm_block_sums(Index n) {
  thread_local GrowingBuffer<T> sums;
  sums.grow(n);
  return sums.data();
}

}  // namespace detail

/// Backward of y = xhat * gamma + beta, xhat = (x - mean) * rstd. With g = dy * gamma:
///   dx      = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))   (overwritten)
///   dgamma += sum_rows(dy * xhat)                                 (accumulated)
///   dbeta  += sum_rows(dy)                                        (accumulated)
/// One pass over dy and x, in parallel over blocks of kLayerNormRowBlock rows: each block writes
/// its rows of dx and its own sums of dy * xhat and dy, which are then added in block order. Blocks
/// are cut by rows only, so the result does not depend on the thread count. (Until session 34 a
/// second pass read dy and x again, by column blocks, for dgamma and dbeta: 432 against 324 us at
/// [2048, 512], 132 against 126 at [3072, 128], 2 threads, data in cache.)
template <class T>
void layer_norm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                         const T* rstd, const T* gamma, Index rows, Index D) {
  constexpr Index kBlock = detail::kLayerNormRowBlock;
  const Index blocks = (rows + kBlock - 1) / kBlock;
  if (blocks == 0) return;
  T* sums = detail::layer_norm_block_sums<T>(blocks * 2 * D);  // block b: [dgamma | dbeta]
  const ArrayMap<const T> g(gamma, D);
  const T inv_d = T(1) / static_cast<T>(D);
  parallel_for(blocks, kBlock * D, kParallelMinRowwise, [&](Index b) {
    ArrayMap<T> sg(sums + b * 2 * D, D), sb(sums + b * 2 * D + D, D);
    sg.setZero();
    sb.setZero();
    for (Index r = b * kBlock; r < std::min(rows, (b + 1) * kBlock); ++r) {
      const ArrayMap<const T> dyr(dy + r * D, D), xr(x + r * D, D);
      const T mu = mean[r], rs = rstd[r];
      // mean_j(g) and mean_j(g * xhat), then dx without materialising g or xhat.
      const T mean_g = (dyr * g).sum() * inv_d;
      const T mean_gx = (dyr * g * (xr - mu)).sum() * rs * inv_d;
      sg += dyr * (xr - mu) * rs;
      sb += dyr;
      ArrayMap<T>(dx + r * D, D) = rs * (dyr * g - mean_g - (xr - mu) * rs * mean_gx);
    }
  });
  ArrayMap<T> total(sums, 2 * D);  // block 0's sums, then each later block's added in order
  for (Index b = 1; b < blocks; ++b) total += ArrayMap<const T>(sums + b * 2 * D, 2 * D);
  ArrayMap<T>(dgamma, D) += total.head(D);
  ArrayMap<T>(dbeta, D) += total.tail(D);
}

}  // namespace attn::kernels
