// The residual connection's elementwise work (section 5.4: "LayerNorm(x + Sublayer(x))", with
// dropout applied to the sublayer's output before the add), fused so that each element is read
// and written once instead of once per step (dropout, add, norm):
//   post-norm:  s = x + dropout(f),  y = LayerNorm(s)     residual_layer_norm_forward
//   pre-norm:   y = x + dropout(f)                        residual_add
// The results are bitwise those of the separate kernels (dropout.hpp, layer_norm.hpp): the same
// mask of (key, flat index), the same products and sums in the same order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/kernels/dropout.hpp"
#include "attn/kernels/layer_norm.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

namespace detail {

/// s[i] = x[i] + dropout(f)[i] for i in [0, n), element `first` of the flat tensor at i = 0 (no
/// dropout when p = 0). `s` may alias `f`, not `x`.
template <class T>
void residual_add_span(T* s, const T* x, const T* f, Index n, std::uint64_t first, double p,
                       std::uint64_t key) {
  if (p > 0) {
    dropout_mask_span(s, f, n, first, key, p);
    for (Index i = 0; i < n; ++i) s[i] = x[i] + s[i];
  } else {
    for (Index i = 0; i < n; ++i) s[i] = x[i] + f[i];
  }
}

}  // namespace detail

/// s[n] = x[n] + dropout(f[n]) with drop probability p (0: none) and mask key `key`, in parallel
/// chunks. `s` may alias `f`, not `x`.
template <class T>
void residual_add(T* s, const T* x, const T* f, Index n, double p, std::uint64_t key) {
  parallel_for_chunks(n, detail::kDropoutChunk, kParallelMinElementwise,
                      [&](Index begin, Index len) {
                        detail::residual_add_span(s + begin, x + begin, f + begin, len,
                                                  static_cast<std::uint64_t>(begin), p, key);
                      });
}

/// The post-norm connection, one pass per row: s[N, D] = x + dropout(f) (p, key as residual_add),
/// y[N, D] = LayerNorm(s) with gamma[D], beta[D]; writes s, mean[N] and rstd[N] for backward
/// (layer_norm_backward takes s as its input).
template <class T>
void residual_layer_norm_forward(T* y, T* s, T* mean, T* rstd, const T* x, const T* f, double p,
                                 std::uint64_t key, const T* gamma, const T* beta, Index rows,
                                 Index D, double eps) {
  parallel_for(rows, D, kParallelMinRowwise, [&](Index r) {
    const Index at = r * D;
    detail::residual_add_span(s + at, x + at, f + at, D, static_cast<std::uint64_t>(at), p, key);
    detail::layer_norm_row(y + at, mean[r], rstd[r], s + at, gamma, beta, D, eps);
  });
}

}  // namespace attn::kernels
