// Numerically stable softmax of one row, forward and backward, as the attention kernels use it.
//
// A row holds scaled, masked logits; -infinity marks a blocked key. A row whose keys are all
// blocked has no distribution: its probabilities are defined as zero and its log-sum-exp as
// +infinity, so that exp(x - lse) recomputes exactly zero for every key in backward.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <limits>

#include "attn/tensor.hpp"

namespace attn::kernels {

/// In place: x[0, n) <- exp(x[0, n)), vectorised, with results below the smallest normal number
/// flushed to exactly 0. Eigen's vectorised exp clamps its argument near -88.7 (float) or -709.8
/// (double), so exp(-infinity) would be a tiny denormal instead of 0, and a blocked key must get
/// exactly 0. Flushing also spares later products denormal arithmetic; a probability below
/// 1e-38 of the row's largest (which is 1 here) changes no result.
template <class T>
void exp_flush_denormals(T* x, Index n) {
  ArrayMap<T> a(x, n);
  a = a.exp();
  const T tiny = std::numeric_limits<T>::min();
  for (Index i = 0; i < n; ++i) x[i] = x[i] < tiny ? T(0) : x[i];  // compiles to a blend
}

/// In place: x[0, n) <- softmax(x[0, n)). Returns log(sum(exp(x))) of the input row, or
/// +infinity (and an all-zero row) when every entry is -infinity or n == 0.
template <class T>
T softmax_row_forward(T* x, Index n) {
  if (n == 0) return std::numeric_limits<T>::infinity();
  ArrayMap<T> a(x, n);
  const T m = a.maxCoeff();
  if (m == -std::numeric_limits<T>::infinity()) {
    a.setZero();
    return std::numeric_limits<T>::infinity();
  }
  // Subtracting the maximum keeps exp() in range; Eigen vectorises the exp.
  a -= m;
  exp_flush_denormals(x, n);
  const T sum = a.sum();
  a *= T(1) / sum;
  return m + std::log(sum);
}

/// Backward of p = softmax(x) over one row of n: dx = p * (dp - sum(p * dp)). `dx` may alias
/// `dp`. A zero row p (fully blocked) gives dx = 0.
template <class T>
void softmax_row_backward(T* dx, const T* p, const T* dp, Index n) {
  if (n == 0) return;
  ArrayMap<const T> pa(p, n), dpa(dp, n);
  const T dot = (pa * dpa).sum();
  ArrayMap<T>(dx, n) = pa * (dpa - dot);
}

}  // namespace attn::kernels
