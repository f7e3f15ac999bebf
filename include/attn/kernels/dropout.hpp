// Inverted dropout with a counter-based mask: element i is dropped iff uniform_at(key, i) < p, and
// kept elements are scaled by 1 / (1 - p) so evaluation needs no rescaling. The mask is a pure
// function of (key, i), so backward regenerates it instead of storing it, and it does not depend
// on how the loop is split across threads.
#pragma once

#include <cstdint>

#include "attn/parallel.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

namespace detail {

/// out[i] = uniform_at(key, i) < p ? 0 : in[i] / (1 - p), for i in [0, n). `out` may alias `in`.
template <class T>
void apply_dropout_mask(T* out, const T* in, Index n, double p, std::uint64_t key) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  parallel_for(n, 1, kParallelMinElementwise, [&](Index i) {
    out[i] = uniform_at(key, static_cast<std::uint64_t>(i)) < p ? T(0) : in[i] * scale;
  });
}

}  // namespace detail

/// y[n] = dropout(x[n]) with drop probability p in [0, 1) and mask key `key`.
template <class T>
void dropout_forward(T* y, const T* x, Index n, double p, std::uint64_t key) {
  detail::apply_dropout_mask(y, x, n, p, key);
}

/// Backward of y = mask * x / (1 - p): dx = mask * dy / (1 - p), the same mask regenerated from
/// the key forward used (overwritten, not accumulated).
template <class T>
void dropout_backward(T* dx, const T* dy, Index n, double p, std::uint64_t key) {
  detail::apply_dropout_mask(dx, dy, n, p, key);
}

}  // namespace attn::kernels
