// Inverted dropout with a counter-based mask: element i is dropped iff uniform_at(key, i) < p, and
// kept elements are scaled by 1 / (1 - p) so evaluation needs no rescaling. The mask is a pure
// function of (key, i), so backward regenerates it instead of storing it, and it does not depend
// on how the loop is split across threads. For float the hash runs on sixteen elements at a time
// on a CPU with AVX-512 (detail/dropout_avx512.hpp) and on eight with AVX2 (dropout_avx2.hpp),
// with bitwise the same result as the scalar loop, which stays as the path for double and other
// CPUs and as the tests' reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attn/kernels/detail/dropout_avx2.hpp"
#include "attn/kernels/detail/dropout_avx512.hpp"
#include "attn/parallel.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

namespace detail {

/// Elements per task of the parallel loop: a multiple of the 16 the vector kernels take at a time.
inline constexpr Index kDropoutChunk = 4096;

/// out[i] = uniform_at(key, first + i) < p ? 0 : in[i] * scale, for i in [0, n), one at a time.
template <class T>
void dropout_mask_scalar(T* out, const T* in, Index n, std::uint64_t first, std::uint64_t key,
                         double p, T scale) {
  for (Index i = 0; i < n; ++i)
    out[i] = uniform_at(key, first + static_cast<std::uint64_t>(i)) < p ? T(0) : in[i] * scale;
}

/// out[i] = uniform_at(key, first + i) < p ? 0 : in[i] / (1 - p), for i in [0, n), on the calling
/// thread: a vector kernel for float where the CPU has AVX-512 or AVX2 (unless `vectorized` is
/// false, or p is within 2^-32 of 1, where every element is dropped), the scalar loop otherwise.
/// `out` may alias `in`.
template <class T>
void dropout_mask_span(T* out, const T* in, Index n, std::uint64_t first, std::uint64_t key,
                       double p, bool vectorized = true) {
  const T scale = static_cast<T>(1.0 / (1.0 - p));
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    // Drawn bits below ceil(p 2^32) are dropped; at 2^32 (p within 2^-32 of 1) all are, which the
    // scalar loop does.
    const auto drop_below = static_cast<std::uint64_t>(std::ceil(std::ldexp(p, 32)));
    if (vectorized && drop_below < (std::uint64_t{1} << 32)) {
      const auto below = static_cast<std::uint32_t>(drop_below);
      if (cpu_has_avx512()) return avx512::dropout_mask(out, in, n, first, key, below, scale);
      if (cpu_has_avx2_fma()) return avx2::dropout_mask(out, in, n, first, key, below, scale);
    }
  }
#endif
  (void)vectorized;
  dropout_mask_scalar(out, in, n, first, key, p, scale);
}

/// Dropout in place on the block of rows [first_row, first_row + rows) and columns [first_col,
/// first_col + cols) of a [*, width] matrix whose rows start `ld` apart (c points at the block's
/// first element): element (r, j) is element r * width + j of the flat tensor, as if the rows were
/// contiguous. On the calling thread.
template <class T>
void dropout_block(T* c, Index rows, Index cols, Index ld, Index first_row, Index first_col,
                   Index width, double p, std::uint64_t key) {
  for (Index r = 0; r < rows; ++r)
    dropout_mask_span(c + r * ld, c + r * ld, cols,
                      static_cast<std::uint64_t>((first_row + r) * width + first_col), key, p);
}

/// dropout_block over whole rows of a [*, cols] matrix.
template <class T>
void dropout_rows(T* c, Index rows, Index cols, Index ld, Index first_row, double p,
                  std::uint64_t key) {
  dropout_block(c, rows, cols, ld, first_row, Index(0), cols, p, key);
}

/// out[i] = uniform_at(key, i) < p ? 0 : in[i] / (1 - p), for i in [0, n), in parallel chunks.
/// `out` may alias `in`. `vectorized` = false forces the scalar loop (the tests' reference).
template <class T>
void apply_dropout_mask(T* out, const T* in, Index n, double p, std::uint64_t key,
                        bool vectorized = true) {
  parallel_for_chunks(n, kDropoutChunk, kParallelMinElementwise, [&](Index begin, Index len) {
    dropout_mask_span(out + begin, in + begin, len, static_cast<std::uint64_t>(begin), key, p,
                      vectorized);
  });
}

/// The checks of the public entry points, once per call: p >= 1 zeroed every output (or scaled by
/// infinity), NaN or a negative p was taken for no dropout, and a negative n for no elements, all
/// in silence.
inline void check_dropout_call(const char* who, Index n, double p) {
  ATTN_CHECK(n >= 0, ShapeError, who, ": n must be >= 0, got ", n);
  DropoutMask{p, 0}.check(who);
}

}  // namespace detail

/// y[n] = dropout(x[n]) with drop probability p in [0, 1) and mask key `key`.
template <class T>
void dropout_forward(T* y, const T* x, Index n, double p, std::uint64_t key) {
  detail::check_dropout_call("kernels::dropout_forward", n, p);
  detail::apply_dropout_mask(y, x, n, p, key);
}

/// Backward of y = mask * x / (1 - p): dx = mask * dy / (1 - p), the same mask regenerated from
/// the key forward used (overwritten, not accumulated).
template <class T>
void dropout_backward(T* dx, const T* dy, Index n, double p, std::uint64_t key) {
  detail::check_dropout_call("kernels::dropout_backward", n, p);
  detail::apply_dropout_mask(dx, dy, n, p, key);
}

}  // namespace attn::kernels
