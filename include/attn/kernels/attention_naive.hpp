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

/// P [T, S] of the head, recomputed from scratch; returns each row's log-sum-exp in lse_bh.
template <class T>
RowMatrix<T> naive_probabilities(T* lse_bh, const AttentionInputs<T>& in, const AttentionHead& head,
                                 const AttentionMask<T>& mask, T scale) {
  const Index Tq = head.shape.queries, S = head.shape.keys;
  RowMatrix<T> p = scale * (head.queries(in.q, in.ldq) * head.keys(in.k, in.ldk).transpose());
  for (Index t = 0; t < Tq; ++t) {
    for (Index s = 0; s < S; ++s) {
      if (mask.allows(head.b, t, s, Tq, S))
        p(t, s) += mask.additive.at(t, s);
      else
        p(t, s) = -std::numeric_limits<T>::infinity();
    }
    lse_bh[t] = softmax_row_forward(p.data() + t * S, S);
  }
  return p;
}

/// x * M / (1 - p) for a [T, S] matrix x of the head (P in forward, dPd in backward), with the
/// flat (b,h,t,s) index of the weights written out here rather than taken from the fast kernel.
template <class T>
RowMatrix<T> naive_dropped(const RowMatrix<T>& x, const AttentionHead& head,
                           const DropoutMask& dropout) {
  if (dropout.p == 0.0) return x;
  const AttentionShape& shape = head.shape;
  RowMatrix<T> xd(x.rows(), x.cols());
  const T inv_keep = T(1 / (1 - dropout.p));
  for (Index t = 0; t < x.rows(); ++t)
    for (Index s = 0; s < x.cols(); ++s) {
      const auto index = static_cast<std::uint64_t>(
          ((head.b * shape.heads + head.h) * shape.queries + t) * shape.keys + s);
      xd(t, s) = dropout.keeps(index) ? x(t, s) * inv_keep : T(0);
    }
  return xd;
}

}  // namespace detail

/// out [B*T rows, ldo] <- attention; lse [B, H, T] the log-sum-exp of each row's scaled, masked
/// logits (+infinity for a fully blocked row); weights (nullptr = not wanted) [B, H, T, S] the
/// probabilities before dropout.
template <class T>
void attention_forward_naive(T* out, Index ldo, T* lse, T* weights, const AttentionInputs<T>& in,
                             const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                             const DropoutMask& dropout = {}) {
  detail::check_attention("attention_forward_naive", shape, mask, dropout,
                          {{"ldq", in.ldq}, {"ldk", in.ldk}, {"ldv", in.ldv}, {"ldo", ldo}});
  for (Index b = 0; b < shape.batch; ++b)
    for (Index h = 0; h < shape.heads; ++h) {
      const detail::AttentionHead head{shape, b, h};
      const Index first = head.query_index(0);  // of the head's T rows in [B, H, T]
      RowMatrix<T> p = detail::naive_probabilities(lse + first, in, head, mask, scale);
      if (weights != nullptr)
        Eigen::Map<RowMatrix<T>>(weights + first * shape.keys, shape.queries, shape.keys) = p;
      head.queries(out, ldo) = detail::naive_dropped(p, head, dropout) * head.keys(in.v, in.ldv);
    }
}

/// Backward of attention_forward_naive; `grads` are OVERWRITTEN. Recomputes the softmax from
/// scratch and takes the textbook softmax derivative, independently of `out` and `lse` (accepted
/// for the fast kernel's signature), so it checks the fast kernel's shortcuts rather than
/// sharing them:
///   dV = Pd^T dO;  dPd = dO V^T;  dP = dPd * M / (1 - p);
///   dlogits = P * (dP - rowsum(P * dP));  dQ = scale dlogits K;  dK = scale dlogits^T Q.
template <class T>
void attention_backward_naive(const AttentionGradients<T>& grads, const T* dout, Index lddo,
                              const AttentionInputs<T>& in, const T* out, Index ldo, const T* lse,
                              const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                              const DropoutMask& dropout = {}) {
  (void)out;
  (void)lse;
  detail::check_attention_backward("attention_backward_naive", shape, mask, dropout, grads, lddo,
                                   in, ldo);
  const Index Tq = shape.queries, S = shape.keys;
  std::vector<T> lse_bh(static_cast<std::size_t>(Tq));
  for (Index b = 0; b < shape.batch; ++b)
    for (Index h = 0; h < shape.heads; ++h) {
      const detail::AttentionHead head{shape, b, h};
      const RowMatrix<T> p = detail::naive_probabilities(lse_bh.data(), in, head, mask, scale);
      const auto doh = head.queries(dout, lddo);
      head.keys(grads.dv, grads.lddv) = detail::naive_dropped(p, head, dropout).transpose() * doh;
      const RowMatrix<T> dpd = doh * head.keys(in.v, in.ldv).transpose();
      const RowMatrix<T> dp = detail::naive_dropped(dpd, head, dropout);
      RowMatrix<T> dlogits(Tq, S);
      for (Index t = 0; t < Tq; ++t)
        softmax_row_backward(dlogits.data() + t * S, p.data() + t * S, dp.data() + t * S, S);
      head.queries(grads.dq, grads.lddq) = scale * (dlogits * head.keys(in.k, in.ldk));
      head.keys(grads.dk, grads.lddk) = scale * (dlogits.transpose() * head.queries(in.q, in.ldq));
    }
}

}  // namespace attn::kernels
