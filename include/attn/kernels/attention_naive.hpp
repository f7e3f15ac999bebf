// Scaled dot-product attention, the obvious way: per (batch row, head), materialise the [T, S]
// logits and probabilities, softmax each row, multiply V. The oracle the fast kernel
// (attention.hpp) is tested against and the baseline it is benchmarked against; written to be
// read, not to be fast. Layout, masks and dropout: attention_common.hpp and attn/mask.hpp.
//
// The paper's Eq. 1, Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, per (batch row b, head h),
// with scale = 1 / sqrt(d_k) and the masks and dropout added:
//
//   logits = scale * Q_bh K_bh^T + bias     (blocked keys -infinity)     [T, S]
//   P      = softmax_rows(logits)                                        [T, S]
//   Pd     = P * M / (1 - p)                (M = dropout keep mask)      [T, S]
//   O_bh   = Pd V_bh                                                     [T, K]
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "attn/kernels/attention_common.hpp"
#include "attn/kernels/softmax.hpp"

namespace attn::kernels {
namespace detail {

template <class T>
using HeadMap = Eigen::Map<const RowMatrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutableHeadMap = Eigen::Map<RowMatrix<T>, 0, Eigen::OuterStride<>>;

/// P [T, S] of head (b, h), recomputed from scratch; returns each row's log-sum-exp in lse_bh.
template <class T>
RowMatrix<T> naive_probabilities(T* lse_bh, const T* q, Index ldq, const T* k, Index ldk, Index b,
                                 Index h, const AttentionShape& shape, const AttentionMask<T>& mask,
                                 T scale) {
  const Index Tq = shape.queries, S = shape.keys, K = shape.head_dim;
  HeadMap<T> qh(q + b * Tq * ldq + h * K, Tq, K, Eigen::OuterStride<>(ldq));
  HeadMap<T> kh(k + b * S * ldk + h * K, S, K, Eigen::OuterStride<>(ldk));
  RowMatrix<T> p = scale * (qh * kh.transpose());
  for (Index t = 0; t < Tq; ++t) {
    for (Index s = 0; s < S; ++s) {
      if (mask.allows(b, t, s, Tq, S))
        p(t, s) += mask.additive.at(t, s);
      else
        p(t, s) = -std::numeric_limits<T>::infinity();
    }
    lse_bh[t] = softmax_row_forward(p.data() + t * S, S);
  }
  return p;
}

/// Pd = P * M / (1 - p) of head (b, h).
template <class T>
RowMatrix<T> naive_dropped(const RowMatrix<T>& p, Index b, Index h, const AttentionShape& shape,
                           const AttentionDropout& dropout) {
  if (dropout.p == 0.0) return p;
  RowMatrix<T> pd(p.rows(), p.cols());
  const T inv_keep = T(1 / (1 - dropout.p));
  for (Index t = 0; t < p.rows(); ++t)
    for (Index s = 0; s < p.cols(); ++s) {
      const auto index =
          static_cast<std::uint64_t>(((b * shape.heads + h) * shape.queries + t) * shape.keys + s);
      pd(t, s) = attention_keeps(dropout, index) ? p(t, s) * inv_keep : T(0);
    }
  return pd;
}

}  // namespace detail

/// out [B*T rows, ldo] <- attention; lse [B, H, T] the log-sum-exp of each row's scaled, masked
/// logits (+infinity for a fully blocked row); weights (nullptr = not wanted) [B, H, T, S] the
/// probabilities before dropout.
template <class T>
void attention_forward_naive(T* out, Index ldo, T* lse, T* weights, const T* q, Index ldq,
                             const T* k, Index ldk, const T* v, Index ldv,
                             const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                             const AttentionDropout& dropout = {}) {
  detail::check_attention("attention_forward_naive", shape, mask, dropout,
                          {{"ldq", ldq}, {"ldk", ldk}, {"ldv", ldv}, {"ldo", ldo}});
  const Index B = shape.batch, H = shape.heads, Tq = shape.queries, S = shape.keys,
              K = shape.head_dim;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index bh = b * H + h;
      RowMatrix<T> p =
          detail::naive_probabilities(lse + bh * Tq, q, ldq, k, ldk, b, h, shape, mask, scale);
      if (weights != nullptr) Eigen::Map<RowMatrix<T>>(weights + bh * Tq * S, Tq, S) = p;
      detail::HeadMap<T> vh(v + b * S * ldv + h * K, S, K, Eigen::OuterStride<>(ldv));
      detail::MutableHeadMap<T> oh(out + b * Tq * ldo + h * K, Tq, K, Eigen::OuterStride<>(ldo));
      oh = detail::naive_dropped(p, b, h, shape, dropout) * vh;
    }
}

/// Backward of attention_forward_naive; dq, dk, dv are OVERWRITTEN. Recomputes the softmax from
/// scratch and takes the textbook softmax derivative, independently of `out` and `lse` (accepted
/// for the fast kernel's signature), so it checks the fast kernel's shortcuts rather than
/// sharing them:
///   dV = Pd^T dO;  dPd = dO V^T;  dP = dPd * M / (1 - p);
///   dlogits = P * (dP - rowsum(P * dP));  dQ = scale dlogits K;  dK = scale dlogits^T Q.
template <class T>
void attention_backward_naive(T* dq, Index lddq, T* dk, Index lddk, T* dv, Index lddv,
                              const T* dout, Index lddo, const T* q, Index ldq, const T* k,
                              Index ldk, const T* v, Index ldv, const T* out, Index ldo,
                              const T* lse, const AttentionShape& shape,
                              const AttentionMask<T>& mask, T scale,
                              const AttentionDropout& dropout = {}) {
  (void)out;
  (void)lse;
  detail::check_attention_backward("attention_backward_naive", shape, mask, dropout, lddq, lddk,
                                   lddv, lddo, ldq, ldk, ldv, ldo);
  const Index B = shape.batch, H = shape.heads, Tq = shape.queries, S = shape.keys,
              K = shape.head_dim;
  std::vector<T> lse_bh(static_cast<std::size_t>(Tq));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const RowMatrix<T> p =
          detail::naive_probabilities(lse_bh.data(), q, ldq, k, ldk, b, h, shape, mask, scale);
      const RowMatrix<T> pd = detail::naive_dropped(p, b, h, shape, dropout);
      detail::HeadMap<T> qh(q + b * Tq * ldq + h * K, Tq, K, Eigen::OuterStride<>(ldq));
      detail::HeadMap<T> kh(k + b * S * ldk + h * K, S, K, Eigen::OuterStride<>(ldk));
      detail::HeadMap<T> vh(v + b * S * ldv + h * K, S, K, Eigen::OuterStride<>(ldv));
      detail::HeadMap<T> doh(dout + b * Tq * lddo + h * K, Tq, K, Eigen::OuterStride<>(lddo));
      detail::MutableHeadMap<T> dqh(dq + b * Tq * lddq + h * K, Tq, K, Eigen::OuterStride<>(lddq));
      detail::MutableHeadMap<T> dkh(dk + b * S * lddk + h * K, S, K, Eigen::OuterStride<>(lddk));
      detail::MutableHeadMap<T> dvh(dv + b * S * lddv + h * K, S, K, Eigen::OuterStride<>(lddv));

      dvh = pd.transpose() * doh;
      RowMatrix<T> dp = doh * vh.transpose();
      if (dropout.p != 0.0) {
        const T inv_keep = T(1 / (1 - dropout.p));
        for (Index t = 0; t < Tq; ++t)
          for (Index s = 0; s < S; ++s) {
            const auto index = static_cast<std::uint64_t>(((b * H + h) * Tq + t) * S + s);
            dp(t, s) = detail::attention_keeps(dropout, index) ? dp(t, s) * inv_keep : T(0);
          }
      }
      RowMatrix<T> dlogits(Tq, S);
      for (Index t = 0; t < Tq; ++t)
        softmax_row_backward(dlogits.data() + t * S, p.data() + t * S, dp.data() + t * S, S);
      dqh = scale * (dlogits * kh);
      dkh = scale * (dlogits.transpose() * qh);
    }
}

}  // namespace attn::kernels
