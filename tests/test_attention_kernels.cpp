// Attention kernels: the fast kernel against the naive one over a grid of shapes, masks, dropout
// and packed layouts; both against central differences; exact zeros where masks block; errors;
// determinism across thread counts.
#include <attn/kernels/attention.hpp>
#include <attn/kernels/attention_naive.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using kernels::AttentionDropout;
using kernels::AttentionShape;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// One attention call's inputs: Q [B*T, ldq], K [B*S, ldk], V [B*S, ldv], dO [B*T, ldo].
template <class T>
struct Problem {
  AttentionShape shape{};
  Index ldq = 0, ldk = 0, ldv = 0, ldo = 0;
  Tensor<T> q, k, v, dout;
  AttentionMask<T> mask;
  AttentionDropout dropout;
  T scale = 1;
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
  forward(r.out.data(), pb.ldo, r.lse.data(), w, pb.q.data(), pb.ldq, pb.k.data(), pb.ldk,
          pb.v.data(), pb.ldv, s, pb.mask, pb.scale, pb.dropout);
  if (!backward) return r;
  r.dq = Tensor<T>::full(pb.q.shape(), nan);
  r.dk = Tensor<T>::full(pb.k.shape(), nan);
  r.dv = Tensor<T>::full(pb.v.shape(), nan);
  auto bwd = fast ? kernels::attention_backward<T> : kernels::attention_backward_naive<T>;
  bwd(r.dq.data(), pb.ldq, r.dk.data(), pb.ldk, r.dv.data(), pb.ldv, pb.dout.data(), pb.ldo,
      pb.q.data(), pb.ldq, pb.k.data(), pb.ldk, pb.v.data(), pb.ldv, r.out.data(), pb.ldo,
      r.lse.data(), s, pb.mask, pb.scale, pb.dropout);
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

template <class T>
class AttentionKernels : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AttentionKernels, Scalars);

TYPED_TEST(AttentionKernels, FastMatchesNaiveOverShapesMasksDropoutAndLayouts) {
  using T = TypeParam;
  const double tol = std::is_same<T, float>::value ? 1e-5 : 1e-12;
  struct Case {
    Index B, H, Tq, S, K, extra;
  };
  const Case cases[] = {
      {2, 3, 5, 5, 4, 0},
      {1, 2, 1, 7, 3, 1},
      {2, 2, 1, 1, 4, 0},
      {2, 2, 6, 1, 5, 2},
      {2, 2, 70, 70, 8, 0},
      {1, 2, 67, 131, 5, 3},
      {2, 1, 130, 97, 4, 1},
      {3, 2, 9, 4, 6, 0},
      {2, 2, 0, 5, 4, 1},  // no queries: dK and dV are zero (the fast kernel runs no query block)
      // several query blocks, the last one partial, with causal key ranges that differ per block
      {1, 2, kernels::kAttentionQueryBlock + 5, kernels::kAttentionQueryBlock + 9, 3, 1},
  };
  int compared = 0;
  for (const Case& c : cases)
    for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll}) {
      if ((kind & kCausal) && c.S < c.Tq) continue;  // causal needs S >= T (error path tested)
      for (double p : {0.0, 0.3})
        for (bool want_weights : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "B=" << c.B << " H=" << c.H << " T=" << c.Tq << " S=" << c.S
                       << " K=" << c.K << " extra=" << c.extra << " mask=" << kind << " p=" << p
                       << " weights=" << want_weights);
          Problem<T> pb = make_problem<T>(c.B, c.H, c.Tq, c.S, c.K, c.extra, 7);
          pb.mask = make_mask<T>(kind, pb.shape);
          pb.dropout = {p, 0x5eedULL};
          const Result<T> ref = run(pb, false, want_weights, true);
          const Result<T> got = run(pb, true, want_weights, true);
          const Index hk = c.H * c.K;
          EXPECT_LT(rel_diff(ref.out, got.out, hk), tol);
          EXPECT_LT(rel_diff(ref.lse, got.lse), tol);
          if (want_weights) {
            EXPECT_LT(rel_diff(ref.weights, got.weights), tol);
          }
          EXPECT_LT(rel_diff(ref.dq, got.dq, hk), tol);
          EXPECT_LT(rel_diff(ref.dk, got.dk, hk), tol);
          EXPECT_LT(rel_diff(ref.dv, got.dv, hk), tol);
          for (const Tensor<T>* t : {&got.out, &got.dq, &got.dk, &got.dv, &ref.out, &ref.dq}) {
            EXPECT_TRUE(padding_untouched(*t, hk));
            EXPECT_FALSE(has_nan(*t, hk));
          }
          if (!want_weights) {
            // Asking for the weights must not change anything else, to the bit.
            const Result<T> with = run(pb, true, true, false);
            EXPECT_EQ(rel_diff(with.out, got.out, hk), 0.0);
          }
          ++compared;
        }
    }
  EXPECT_EQ(compared,
            176);  // 7 cases x 5 masks + 3 cases (S < T) x 3 masks, x 2 dropout x 2 weights
}

/// Gradient check of q, k, v through one kernel, L = sum(out * R).
template <bool Fast>
testing::GradCheckResult attention_gradcheck(Problem<double>& pb) {
  const auto& s = pb.shape;
  const Tensor<double> r = testing::randn({s.batch * s.queries, pb.ldo}, 4321);
  Tensor<double> out({s.batch * s.queries, pb.ldo}), lse({s.batch, s.heads, s.queries});
  auto forward = [&] {
    auto f = Fast ? kernels::attention_forward<double> : kernels::attention_forward_naive<double>;
    f(out.data(), pb.ldo, lse.data(), nullptr, pb.q.data(), pb.ldq, pb.k.data(), pb.ldk,
      pb.v.data(), pb.ldv, s, pb.mask, pb.scale, pb.dropout);
  };
  forward();
  Tensor<double> dq(pb.q.shape()), dk(pb.k.shape()), dv(pb.v.shape());
  auto bwd = Fast ? kernels::attention_backward<double> : kernels::attention_backward_naive<double>;
  bwd(dq.data(), pb.ldq, dk.data(), pb.ldk, dv.data(), pb.ldv, r.data(), pb.ldo, pb.q.data(),
      pb.ldq, pb.k.data(), pb.ldk, pb.v.data(), pb.ldv, out.data(), pb.ldo, lse.data(), s, pb.mask,
      pb.scale, pb.dropout);
  return testing::gradcheck({{"q", pb.q}, {"k", pb.k}, {"v", pb.v}}, {dq, dk, dv}, [&] {
    forward();
    return testing::dot(out, r);
  });
}

TEST(AttentionKernels, GradientsMatchCentralDifferences) {
  for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll})
    for (double p : {0.0, 0.25})
      for (Index extra : {0, 1}) {
        // T != S exercises the causal offset; T = 3 > block would be too slow for a gradcheck,
        // the blocked paths are covered by the comparison with the naive kernel.
        Problem<double> pb = make_problem<double>(2, 2, 3, 5, 3, extra, 11);
        pb.mask = make_mask<double>(kind, pb.shape);
        pb.dropout = {p, 77};
        SCOPED_TRACE(::testing::Message() << "mask=" << kind << " p=" << p << " extra=" << extra);
        auto naive = attention_gradcheck<false>(pb);
        EXPECT_GRADIENTS_MATCH(naive);
        auto fast = attention_gradcheck<true>(pb);
        EXPECT_GRADIENTS_MATCH(fast);
      }
}

TEST(AttentionKernels, DropoutChangesOutputAndIsReproducible) {
  Problem<double> pb = make_problem<double>(1, 2, 4, 6, 3, 0, 3);
  pb.dropout = {0.5, 123};
  const Result<double> a = run(pb, true, true, false), b = run(pb, true, true, false);
  EXPECT_EQ(rel_diff(a.out, b.out), 0.0);
  pb.dropout = {0.0, 123};
  const Result<double> none = run(pb, true, true, false);
  EXPECT_GT(rel_diff(a.out, none.out), 1e-3);
  // The weights are the probabilities before dropout.
  EXPECT_EQ(rel_diff(a.weights, none.weights), 0.0);
}

/// Both kernels, with and without dropout: padded keys get weight 0.0 and gradient 0.0 exactly;
/// a batch row whose keys are all padding gives exactly zero everywhere and no NaN.
TEST(AttentionKernels, PaddedKeysAndFullyMaskedRowsAreExactlyZero) {
  for (bool fast : {false, true})
    for (double p : {0.0, 0.3}) {
      SCOPED_TRACE(::testing::Message() << "fast=" << fast << " p=" << p);
      Problem<double> pb = make_problem<double>(2, 2, 4, 5, 3, 1, 5);
      pb.mask.key_padding = KeyPaddingMask::from_lengths({3, 0}, 5);
      pb.dropout = {p, 9};
      const Result<double> r = run(pb, fast, true, true);
      const Index hk = 6;
      for (const Tensor<double>* t : {&r.out, &r.dq, &r.dk, &r.dv, &r.weights})
        EXPECT_FALSE(has_nan(*t, t == &r.weights ? 5 : hk));
      for (Index h = 0; h < 2; ++h)
        for (Index t = 0; t < 4; ++t) {
          EXPECT_EQ(r.lse(1, h, t), kInf);
          EXPECT_TRUE(std::isfinite(r.lse(0, h, t)));
          for (Index s = 0; s < 5; ++s) {
            EXPECT_EQ(r.weights(1, h, t, s), 0.0);
            if (s >= 3) {
              EXPECT_EQ(r.weights(0, h, t, s), 0.0);
            }
          }
        }
      for (Index c = 0; c < hk; ++c) {
        for (Index t = 0; t < 4; ++t) {
          EXPECT_EQ(r.out(4 + t, c), 0.0);  // batch row 1
          EXPECT_EQ(r.dq(4 + t, c), 0.0);
          EXPECT_NE(r.dq(t, c), 0.0);  // batch row 0 does get a gradient
        }
        for (Index s : {3, 4, 5, 6, 7, 8, 9}) {  // padded keys of row 0, every key of row 1
          EXPECT_EQ(r.dk(s, c), 0.0);
          EXPECT_EQ(r.dv(s, c), 0.0);
        }
      }
    }
}

TEST(AttentionKernels, AdditiveRowOfMinusInfinityGivesZeroRow) {
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast" : "naive");
    Problem<double> pb = make_problem<double>(2, 2, 3, 4, 2, 0, 8);
    Tensor<double> bias = testing::randn({3, 4}, 1);
    for (Index s = 0; s < 4; ++s) bias(1, s) = -kInf;
    pb.mask.additive = AdditiveMask<double>(bias);
    const Result<double> r = run(pb, fast, true, true);
    for (Index b = 0; b < 2; ++b) {
      for (Index c = 0; c < 4; ++c) {
        EXPECT_EQ(r.out(b * 3 + 1, c), 0.0);
        EXPECT_EQ(r.dq(b * 3 + 1, c), 0.0);
        EXPECT_NE(r.out(b * 3, c), 0.0);
      }
      for (Index h = 0; h < 2; ++h) {
        EXPECT_EQ(r.lse(b, h, 1), kInf);
        for (Index s = 0; s < 4; ++s) EXPECT_EQ(r.weights(b, h, 1, s), 0.0);
      }
    }
    for (const Tensor<double>* t : {&r.out, &r.dq, &r.dk, &r.dv}) EXPECT_FALSE(has_nan(*t, 4));
  }
}

TEST(AttentionKernels, WeightsAreDistributionsOverAllowedKeys) {
  for (bool fast : {false, true})
    for (Index S : {5, 8}) {  // T == S and T < S (the causal offset S - T)
      SCOPED_TRACE(::testing::Message() << "fast=" << fast << " S=" << S);
      const Index Tq = 5;
      Problem<double> pb = make_problem<double>(2, 2, Tq, S, 3, 0, 21);
      pb.mask.causal = true;
      pb.mask.key_padding = KeyPaddingMask::from_lengths({S, S - 1}, S);
      const Result<double> r = run(pb, fast, true, false);
      for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 2; ++h)
          for (Index t = 0; t < Tq; ++t) {
            double sum = 0;
            for (Index s = 0; s < S; ++s) {
              const double w = r.weights(b, h, t, s);
              const bool allowed = s <= t + (S - Tq) && (b == 0 || s < S - 1);
              if (allowed) {
                EXPECT_GT(w, 0.0);
              } else {
                EXPECT_EQ(w, 0.0) << "b=" << b << " t=" << t << " s=" << s;
              }
              sum += w;
            }
            EXPECT_NEAR(sum, 1.0, 1e-12);
          }
    }
}

/// Calls forward and backward of both kernels with `pb`; each must throw ErrorType with every
/// string of `expect` in its message.
template <class ErrorType>
void expect_all_throw(const Problem<float>& pb, const std::vector<std::string>& expect) {
  for (bool fast : {false, true})
    for (bool backward : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "fast=" << fast << " backward=" << backward);
      try {
        if (backward) {
          Tensor<float> out(pb.dout.shape()),
              lse({pb.shape.batch, pb.shape.heads, pb.shape.queries});
          Tensor<float> dq(pb.q.shape()), dk(pb.k.shape()), dv(pb.v.shape());
          auto bwd =
              fast ? kernels::attention_backward<float> : kernels::attention_backward_naive<float>;
          bwd(dq.data(), pb.ldq, dk.data(), pb.ldk, dv.data(), pb.ldv, pb.dout.data(), pb.ldo,
              pb.q.data(), pb.ldq, pb.k.data(), pb.ldk, pb.v.data(), pb.ldv, out.data(), pb.ldo,
              lse.data(), pb.shape, pb.mask, pb.scale, pb.dropout);
        } else {
          run(pb, fast, false, false);
        }
        ADD_FAILURE() << "no exception";
      } catch (const ErrorType& e) {
        for (const auto& s : expect)
          EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
      }
    }
}

TEST(AttentionKernels, RejectsMismatchedMasksLeadingDimsAndDropout) {
  const Problem<float> base = make_problem<float>(2, 2, 4, 5, 3, 0, 1);
  {
    Problem<float> pb = base;
    pb.mask.key_padding = KeyPaddingMask::from_lengths({4, 4}, 4);
    expect_all_throw<ShapeError>(pb, {"[B, S] = [2, 5]", "got [2, 4]"});
    pb.mask.key_padding = KeyPaddingMask::from_lengths({5, 5, 5}, 5);
    expect_all_throw<ShapeError>(pb, {"[B, S] = [2, 5]", "got [3, 5]"});
  }
  {
    Problem<float> pb = base;
    pb.mask.additive = AdditiveMask<float>(Tensor<float>({4, 6}));
    expect_all_throw<ShapeError>(pb, {"[T, S] = [4, 5]", "got [4, 6]"});
  }
  {
    Problem<float> pb = base;
    pb.ldq = 5;
    expect_all_throw<ShapeError>(pb, {"dq >= H*K = 2*3 = 6", "got 5"});
    pb = base;
    pb.ldk = 4;
    expect_all_throw<ShapeError>(pb, {"dk >= H*K = 2*3 = 6", "got 4"});
    pb = base;
    pb.ldv = 2;
    expect_all_throw<ShapeError>(pb, {"dv >= H*K = 2*3 = 6", "got 2"});
    pb = base;
    pb.ldo = 3;
    expect_all_throw<ShapeError>(pb, {"do >= H*K = 2*3 = 6", "got 3"});
  }
  {
    Problem<float> pb = make_problem<float>(2, 2, 6, 5, 3, 0, 1);
    pb.mask.causal = true;
    expect_all_throw<ShapeError>(pb, {"T = 6", "S = 5"});
  }
  {
    Problem<float> pb = base;
    pb.shape.head_dim = -1;
    expect_all_throw<ShapeError>(pb, {"[B, H, T, S, K] = [2, 2, 4, 5, -1]"});
  }
  {
    Problem<float> pb = base;
    pb.dropout.p = 1.0;
    expect_all_throw<ConfigError>(pb, {"[0, 1)", "got 1"});
  }
}

TEST(AttentionKernels, BackwardLeadingDimsOfGradientsAreChecked) {
  const Problem<float> pb = make_problem<float>(1, 2, 3, 3, 2, 0, 1);
  Tensor<float> out(pb.dout.shape()), lse({1, 2, 3}), dq(pb.q.shape()), dk(pb.k.shape()),
      dv(pb.v.shape());
  const Index good = 4;
  const Index lds[4][4] = {
      {3, good, good, good}, {good, 2, good, good}, {good, good, 1, good}, {good, good, good, 0}};
  const char* names[4] = {"lddq >= H*K = 2*2 = 4, got 3", "lddk >= H*K = 2*2 = 4, got 2",
                          "lddv >= H*K = 2*2 = 4, got 1", "lddo >= H*K = 2*2 = 4, got 0"};
  for (int i = 0; i < 4; ++i)
    for (bool fast : {false, true}) {
      auto bwd =
          fast ? kernels::attention_backward<float> : kernels::attention_backward_naive<float>;
      try {
        bwd(dq.data(), lds[i][0], dk.data(), lds[i][1], dv.data(), lds[i][2], pb.dout.data(),
            lds[i][3], pb.q.data(), pb.ldq, pb.k.data(), pb.ldk, pb.v.data(), pb.ldv, out.data(),
            pb.ldo, lse.data(), pb.shape, pb.mask, pb.scale, pb.dropout);
        ADD_FAILURE() << "no exception for " << names[i];
      } catch (const ShapeError& e) {
        EXPECT_NE(std::string(e.what()).find(names[i]), std::string::npos) << e.what();
      }
    }
}

// The (batch, head) pairs go to the threads through a StealingLoop, so which thread computes a
// pair changes from run to run; 3 threads on 2 cores make it likely that pairs are taken from
// another thread's share.
TEST(AttentionKernels, FastKernelIsBitwiseIdenticalOnOneTwoAndThreeThreads) {
  Problem<float> pb = make_problem<float>(2, 3, 70, 75, 8, 2, 31);
  pb.mask = make_mask<float>(kAll, pb.shape);
  pb.dropout = {0.2, 5};
  const int saved = num_threads();
  set_num_threads(1);
  const Result<float> one = run(pb, true, true, true);
  for (const int threads : {2, 3, 3}) {
    set_num_threads(threads);
    const Result<float> many = run(pb, true, true, true);
    const Index hk = 24;
    EXPECT_EQ(rel_diff(one.out, many.out, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.lse, many.lse), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.weights, many.weights), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dq, many.dq, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dk, many.dk, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dv, many.dv, hk), 0.0) << threads << " threads";
  }
  set_num_threads(saved);
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

/// Sets the GEMM path for its lifetime, then back to automatic (also when an ASSERT returns).
struct GemmPathScope {
  explicit GemmPathScope(kernels::GemmPath path) { kernels::set_gemm_path(path); }
  ~GemmPathScope() { kernels::set_gemm_path(kernels::GemmPath::automatic); }
};

// Blocks of heads of 16-64 dimensions against at most 64 keys run in AVX-512 register tiles
// (detail/attention_tile_avx512.hpp): forward with at least kTileMinRows (8) queries, backward
// with at least 8 queries and 8 keys. They must give the bits of the packed GEMMs they replace.
// That path is what the AVX2 GEMM runs (the same bits as the AVX-512 GEMM, tests/test_gemm.cpp),
// so the two are compared bit for bit, and both against the naive kernel; the tiles' block
// counters show that they ran. Shapes: 1 to 64 keys across one to four 16-key registers (22: a
// Multi30k batch), query blocks of 8 and 9 rows (the fewest the tiles take; 9 against 5 keys:
// forward in tiles, backward not), 3 and 7 (none in tiles) to 130 (a block of 128 rows, then one
// of 2 on the few-row path), 136 (then one of 8 in tiles) and 160 (a second block of 32 rows,
// whose dK and dV add to the first's), every mask, dropout and the weights. Blocks that never
// take the tiles, 12 queries against 80 keys and heads of 24, must still give the same bits on
// both paths: their products of 8 or more rows take the packed order on both.
TEST(AttentionKernels, RegisterTilesGiveTheBitsOfThePackedPath) {
  if (!kernels::gemm_path_available(kernels::GemmPath::avx512) ||
      !kernels::gemm_path_available(kernels::GemmPath::avx2))
    GTEST_SKIP() << "this CPU or build has no AVX-512 GEMM: the register tiles never run";
  struct Case {
    Index B, H, Tq, S, K, extra;
  };
  // Blocks of as few as kTileMinRows (8) queries and keys run in tiles; the rest take the GEMMs:
  // the packed kernel's order from 8 rows, the few-row kernels below.
  const Case cases[] = {{2, 2, 16, 1, 16, 0},  {1, 3, 17, 15, 32, 1},  {2, 1, 23, 16, 48, 0},
                        {2, 2, 22, 22, 32, 1}, {1, 2, 40, 40, 64, 3},  {2, 2, 64, 64, 64, 0},
                        {1, 1, 20, 64, 16, 2}, {1, 2, 130, 49, 32, 0}, {1, 2, 160, 48, 32, 1},
                        {3, 2, 8, 8, 32, 0},   {2, 2, 12, 9, 32, 1},   {2, 1, 9, 5, 16, 0},
                        {2, 2, 7, 12, 32, 0},  {1, 2, 136, 30, 32, 0}, {2, 1, 3, 3, 64, 0},
                        {2, 2, 12, 80, 32, 0}, {2, 2, 12, 10, 24, 1}};
  int tiled = 0;
  for (const Case& c : cases)
    for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll}) {
      if ((kind & kCausal) && c.S < c.Tq) continue;
      for (double p : {0.0, 0.3}) {
        SCOPED_TRACE(::testing::Message() << "B=" << c.B << " H=" << c.H << " T=" << c.Tq << " S="
                                          << c.S << " K=" << c.K << " mask=" << kind << " p=" << p);
        Problem<float> pb = make_problem<float>(c.B, c.H, c.Tq, c.S, c.K, c.extra, 11);
        pb.mask = make_mask<float>(kind, pb.shape);
        pb.dropout = {p, 0xab5eULL};
        // Blocks of 128 queries; a last block of fewer than kTileMinRows takes the GEMMs.
        const Index min_rows = kernels::detail::kTileMinRows;
        const Index full = c.Tq / kernels::kAttentionQueryBlock,
                    rest = c.Tq % kernels::kAttentionQueryBlock;
        const bool fits = c.S <= 64 && c.K % 16 == 0 && c.K <= 64;  // heads and keys of a tile
        const Index blocks = fits ? c.B * c.H * (full + (rest >= min_rows ? 1 : 0)) : 0;
        // The fast kernel on `path`, which must run `forward` and `backward` blocks in tiles.
        const auto run_on = [&](kernels::GemmPath path, Index forward, Index backward) {
          GemmPathScope scope(path);
          const auto fwd = kernels::detail::tile_blocks(false).load();
          const auto bwd = kernels::detail::tile_blocks(true).load();
          Result<float> r = run(pb, true, true, true);
          EXPECT_EQ(kernels::detail::tile_blocks(false).load() - fwd, forward);
          EXPECT_EQ(kernels::detail::tile_blocks(true).load() - bwd, backward);
          return r;
        };
        const Result<float> tiles =
            run_on(kernels::GemmPath::avx512, blocks, c.S >= min_rows ? blocks : 0);
        const Result<float> packed = run_on(kernels::GemmPath::avx2, 0, 0);
        const Result<float> naive = run(pb, false, true, true);
        const Index hk = c.H * c.K;
        EXPECT_TRUE(same_bits(packed.out, tiles.out, hk));
        EXPECT_TRUE(same_bits(packed.lse, tiles.lse));
        EXPECT_TRUE(same_bits(packed.weights, tiles.weights));
        EXPECT_TRUE(same_bits(packed.dq, tiles.dq, hk));
        EXPECT_TRUE(same_bits(packed.dk, tiles.dk, hk));
        EXPECT_TRUE(same_bits(packed.dv, tiles.dv, hk));
        for (const auto& [want, got] : {std::pair{&naive.out, &tiles.out},
                                        {&naive.dq, &tiles.dq},
                                        {&naive.dk, &tiles.dk},
                                        {&naive.dv, &tiles.dv}}) {
          EXPECT_LT(rel_diff(*want, *got, hk), 1e-5);
          EXPECT_TRUE(padding_untouched(*got, hk));
        }
        EXPECT_LT(rel_diff(naive.weights, tiles.weights), 1e-5);
        ++tiled;
      }
    }
  EXPECT_EQ(tiled, 134);  // 8 cases x 5 masks + 9 cases (S < T) x 3 masks, x 2 dropout
}

/// Queries [t0, t0 + nt) of `pb` as a problem of their own, with the same keys, values and key
/// padding (no additive mask or dropout, which depend on a query's position). Under a causal mask,
/// with the keys those queries see, [0, t0 + nt + S - T), so that each sees the keys it saw.
Problem<float> query_rows(const Problem<float>& pb, Index t0, Index nt) {
  Problem<float> part = pb;
  const AttentionShape& s = pb.shape;
  part.shape.queries = nt;
  part.q = Tensor<float>({s.batch * nt, pb.ldq});
  part.dout = Tensor<float>({s.batch * nt, pb.ldo});
  for (Index b = 0; b < s.batch; ++b)
    for (Index i = 0; i < nt; ++i) {
      const Index from = b * s.queries + t0 + i, to = b * nt + i;
      for (Index j = 0; j < pb.ldq; ++j) part.q(to, j) = pb.q(from, j);
      for (Index j = 0; j < pb.ldo; ++j) part.dout(to, j) = pb.dout(from, j);
    }
  if (!pb.mask.causal) return part;
  const Index n = t0 + nt + s.keys - s.queries;
  part.shape.keys = n;
  part.k = Tensor<float>({s.batch * n, pb.ldk});
  part.v = Tensor<float>({s.batch * n, pb.ldv});
  std::vector<Index> lengths;
  for (Index b = 0; b < s.batch; ++b) {
    for (Index j = 0; j < n; ++j) {
      for (Index c = 0; c < pb.ldk; ++c) part.k(b * n + j, c) = pb.k(b * s.keys + j, c);
      for (Index c = 0; c < pb.ldv; ++c) part.v(b * n + j, c) = pb.v(b * s.keys + j, c);
    }
    Index real = 0;  // make_mask's padding is a prefix of real keys
    while (real < n && pb.mask.key_padding.is_real(b, real)) ++real;
    lengths.push_back(real);
  }
  if (!pb.mask.key_padding.empty())
    part.mask.key_padding = KeyPaddingMask::from_lengths(lengths, n);
  return part;
}

// A head's blocks of queries pack its K^T and V (forward), K^T, V^T and K (backward) once and reuse
// them (detail/gemm_pack_buffers.hpp); the copies' counter shows that they did. Each block must
// still give the bits it gives in a call of its own, which packs them anew: the output, log-sum-exp
// and dQ of the queries of a block of 128, another of 128 and a last of 40 (keys past 64, so no
// register tiles), without and with key padding and a causal mask, on each kernel. Under a causal
// mask each block sees more keys than the one before: the head's first block packs all of them,
// and each block reads those it sees (its call of its own has only those keys). dK and dV sum over
// the blocks, so they are checked against the naive kernel, and the whole call on two threads for
// its bits.
TEST(AttentionKernels, HeadOperandsPackedOnceGiveTheBitsOfEachBlockAlone) {
  const Index B = 2, H = 2, K = 32, block = kernels::kAttentionQueryBlock;
  const Index Tq = 2 * block + 40, blocks = 3, hk = H * K;
  if (!kernels::gemm_path_available(kernels::GemmPath::avx2) &&
      !kernels::gemm_path_available(kernels::GemmPath::avx512))
    GTEST_SKIP() << "no AVX2 or AVX-512 GEMM on this CPU: nothing reuses a packed operand";
  const int saved = num_threads();
  for (const auto path : {kernels::GemmPath::avx512, kernels::GemmPath::avx2}) {
    if (!kernels::gemm_path_available(path)) continue;
    GemmPathScope scope(path);
    for (int kind : {int(kNone), int(kPadding), int(kCausal), kCausal | kPadding}) {
      SCOPED_TRACE(::testing::Message() << kernels::gemm_path_name(path) << " mask=" << kind);
      // 300 keys; under a causal mask 310, so that the blocks see 142, 270 and 310 of them.
      const Index S = kind & kCausal ? Tq + 14 : 300;
      Problem<float> pb = make_problem<float>(B, H, Tq, S, K, 1, 41);
      pb.mask = make_mask<float>(kind, pb.shape);
      set_num_threads(1);  // the counter is the calling thread's
      const std::uint64_t before = kernels::detail::reused_b_cache().reuses;
      const Result<float> whole = run(pb, true, false, true);
      // Every block after a head's first reuses 2 copies in forward and 3 in backward.
      EXPECT_EQ(kernels::detail::reused_b_cache().reuses - before,
                static_cast<std::uint64_t>(B * H * (blocks - 1) * (2 + 3)));
      for (Index t0 = 0; t0 < Tq; t0 += block) {
        const Index nt = std::min(block, Tq - t0);
        const Result<float> alone = run(query_rows(pb, t0, nt), true, false, true);
        for (Index b = 0; b < B; ++b)
          for (Index i = 0; i < nt; ++i) {
            const Index row = b * Tq + t0 + i, own = b * nt + i;
            for (Index j = 0; j < hk; ++j) {
              ASSERT_EQ(whole.out(row, j), alone.out(own, j)) << "out " << row << ", " << j;
              ASSERT_EQ(whole.dq(row, j), alone.dq(own, j)) << "dq " << row << ", " << j;
            }
            for (Index h = 0; h < H; ++h)
              ASSERT_EQ(whole.lse.data()[(b * H + h) * Tq + t0 + i],
                        alone.lse.data()[(b * H + h) * nt + i]);
          }
      }
      const Result<float> naive = run(pb, false, false, true);
      EXPECT_LT(rel_diff(naive.dk, whole.dk, hk), 1e-5);
      EXPECT_LT(rel_diff(naive.dv, whole.dv, hk), 1e-5);
      set_num_threads(2);
      const Result<float> two = run(pb, true, false, true);
      EXPECT_TRUE(same_bits(whole.out, two.out, hk) && same_bits(whole.dq, two.dq, hk) &&
                  same_bits(whole.dk, two.dk, hk) && same_bits(whole.dv, two.dv, hk));
      set_num_threads(1);
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace attn
