// One call of the attention kernels as a test sets it up (test_attention_kernels.cpp,
// test_attention_paths.cpp): random inputs in packed layouts, masks, a run of the fast or the naive
// kernel into NaN-filled outputs, and the comparisons the tests make of their results.
#pragma once

#include <gtest/gtest.h>
#include <attn/kernels/attention.hpp>
#include <attn/kernels/attention_naive.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace attn {
namespace testing {

using kernels::AttentionShape;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// One attention call's inputs: Q [B*T, ldq], K [B*S, ldk], V [B*S, ldv], dO [B*T, ldo].
template <class T>
struct Problem {
  AttentionShape shape{};
  Index ldq = 0, ldk = 0, ldv = 0, ldo = 0;
  Tensor<T> q, k, v, dout;
  AttentionMask<T> mask;
  DropoutMask dropout;
  T scale = 1;

  kernels::AttentionInputs<T> inputs() const {
    return {q.data(), ldq, k.data(), ldk, v.data(), ldv};
  }
};

template <class T>
Tensor<T> random_matrix(Index rows, Index cols, std::uint64_t seed) {
  Tensor<T> t({rows, cols});
  Rng rng(seed);
  fill_normal(t, rng, 0.0, 1.0);
  return t;
}

/// `extra` > 0 makes every leading dimension wider than H*K, as in a packed [B*L, 3D] buffer.
template <class T>
Problem<T> make_problem(Index B, Index H, Index Tq, Index S, Index K, Index extra,
                        std::uint64_t seed) {
  Problem<T> pb;
  pb.shape = {B, H, Tq, S, K};
  pb.ldq = H * K + extra;
  pb.ldk = H * K + 2 * extra;
  pb.ldv = H * K + 3 * extra;
  pb.ldo = H * K + extra;
  pb.q = random_matrix<T>(B * Tq, pb.ldq, seed);
  pb.k = random_matrix<T>(B * S, pb.ldk, seed + 1);
  pb.v = random_matrix<T>(B * S, pb.ldv, seed + 2);
  pb.dout = random_matrix<T>(B * Tq, pb.ldo, seed + 3);
  pb.scale = T(1 / std::sqrt(static_cast<double>(std::max<Index>(K, 1))));
  return pb;
}

enum MaskKind { kNone = 0, kCausal = 1, kPadding = 2, kAdditive = 4, kAll = 7 };

/// Key padding: even batch rows real throughout, odd rows about half. Additive: N(0, 1) biases
/// with a sprinkling of -infinity.
template <class T>
AttentionMask<T> make_mask(int kind, const AttentionShape& s) {
  AttentionMask<T> m;
  m.causal = (kind & kCausal) != 0;
  if (kind & kPadding) {
    std::vector<Index> lengths;
    for (Index b = 0; b < s.batch; ++b)
      lengths.push_back(b % 2 == 0 ? s.keys : std::max<Index>(1, s.keys / 2));
    m.key_padding = KeyPaddingMask::from_lengths(lengths, s.keys);
  }
  if (kind & kAdditive) {
    Tensor<T> bias = random_matrix<T>(s.queries, s.keys, 99);
    for (Index t = 0; t < s.queries; ++t)
      for (Index j = 0; j < s.keys; ++j)
        if ((t * 7 + j * 3) % 5 == 0) bias(t, j) = -std::numeric_limits<T>::infinity();
    m.additive = AdditiveMask<T>(bias);
  }
  return m;
}

template <class T>
struct Result {
  Tensor<T> out, lse, weights, dq, dk, dv;
};

/// Runs forward (and backward) of the fast or the naive kernel. Output buffers start as NaN: a
/// kernel that accumulates instead of overwriting, or reads what it did not write, shows up.
template <class T>
Result<T> run(const Problem<T>& pb, bool fast, bool want_weights, bool backward) {
  const auto& s = pb.shape;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  Result<T> r;
  r.out = Tensor<T>::full({s.batch * s.queries, pb.ldo}, nan);
  r.lse = Tensor<T>::full({s.batch, s.heads, s.queries}, nan);
  if (want_weights) r.weights = Tensor<T>::full({s.batch, s.heads, s.queries, s.keys}, nan);
  T* w = want_weights ? r.weights.data() : nullptr;
  auto forward = fast ? kernels::attention_forward<T> : kernels::attention_forward_naive<T>;
  forward(r.out.data(), pb.ldo, r.lse.data(), w, pb.inputs(), s, pb.mask, pb.scale, pb.dropout);
  if (!backward) return r;
  r.dq = Tensor<T>::full(pb.q.shape(), nan);
  r.dk = Tensor<T>::full(pb.k.shape(), nan);
  r.dv = Tensor<T>::full(pb.v.shape(), nan);
  auto bwd = fast ? kernels::attention_backward<T> : kernels::attention_backward_naive<T>;
  bwd({r.dq.data(), pb.ldq, r.dk.data(), pb.ldk, r.dv.data(), pb.ldv}, pb.dout.data(), pb.ldo,
      pb.inputs(), r.out.data(), pb.ldo, r.lse.data(), s, pb.mask, pb.scale, pb.dropout);
  return r;
}

/// max |a - b| / max(|a|, |b|, 1) over columns [0, cols) of two equally shaped buffers (all
/// columns when cols < 0). The floor of 1 (inputs are N(0, 1)) keeps a gradient that is exactly
/// zero in one kernel and rounding noise in the other (S = 1: P = 1, dlogits = 0) from counting
/// as a relative error of 1. Equal infinities match; a NaN or a lone infinity gives +infinity.
template <class T>
double rel_diff(const Tensor<T>& a, const Tensor<T>& b, Index cols = -1) {
  EXPECT_EQ(a.shape(), b.shape());
  const Index width = a.rank() == 0 ? 1 : a.shape()[a.rank() - 1];
  const Index used = cols < 0 ? width : cols;
  double diff = 0, mag = 0;
  for (Index i = 0; i < a.numel(); ++i) {
    if (i % width >= used) continue;
    const double x = a.data()[i], y = b.data()[i];
    if (x == y) {
      if (std::isfinite(x)) mag = std::max(mag, std::abs(x));
      continue;
    }
    if (!std::isfinite(x) || !std::isfinite(y)) return kInf;
    diff = std::max(diff, std::abs(x - y));
    mag = std::max({mag, std::abs(x), std::abs(y)});
  }
  return diff / std::max(mag, 1.0);
}

/// Columns [cols, width) of a row-major buffer are still all NaN: the kernel kept to its heads.
template <class T>
bool padding_untouched(const Tensor<T>& a, Index cols) {
  const Index width = a.shape()[a.rank() - 1];
  for (Index i = 0; i < a.numel(); ++i)
    if (i % width >= cols && !std::isnan(a.data()[i])) return false;
  return true;
}

template <class T>
bool has_nan(const Tensor<T>& a, Index cols) {
  const Index width = a.shape()[a.rank() - 1];
  for (Index i = 0; i < a.numel(); ++i)
    if (i % width < cols && std::isnan(a.data()[i])) return true;
  return false;
}

/// Whether columns [0, cols) of two equally shaped buffers hold the same bits (+0 and -0 differ).
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b, Index cols = -1) {
  if (a.shape() != b.shape()) return false;
  const Index width = a.shape()[a.rank() - 1], used = cols < 0 ? width : cols;
  for (Index i = 0; i < a.numel(); ++i)
    if (i % width < used && std::memcmp(a.data() + i, b.data() + i, sizeof(T)) != 0) return false;
  return true;
}

/// Expects two runs' outputs to hold the same bits, on the columns [0, hk) the heads fill.
template <class T>
void expect_same_bits(const Result<T>& a, const Result<T>& b, Index hk) {
  EXPECT_TRUE(same_bits(a.out, b.out, hk)) << "out";
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(same_bits(a.weights, b.weights)) << "weights";
  EXPECT_TRUE(same_bits(a.dq, b.dq, hk)) << "dq";
  EXPECT_TRUE(same_bits(a.dk, b.dk, hk)) << "dk";
  EXPECT_TRUE(same_bits(a.dv, b.dv, hk)) << "dv";
}

/// Sets the GEMM path for its lifetime, then back to automatic (also when an ASSERT returns).
struct GemmPathScope {
  explicit GemmPathScope(kernels::GemmPath path) { kernels::set_gemm_path(path); }
  ~GemmPathScope() { kernels::set_gemm_path(kernels::GemmPath::automatic); }
};

}  // namespace testing
}  // namespace attn
