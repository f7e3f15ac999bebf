// Attention kernels: the fast kernel against the naive one over a grid of shapes, masks, dropout
// and packed layouts; both against central differences; exact zeros where masks block; errors.
// Which path computes which block, and that each gives the same bits, is test_attention_paths.cpp.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention_problem.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using namespace testing;  // attention_problem.hpp

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
      // heads of the sizes models use: depth-16 to -64 products on full and edge panels
      {2, 1, 9, 17, 16, 2},
      {2, 2, 20, 30, 32, 1},
      {1, 2, kernels::kAttentionQueryBlock + 2, kernels::kAttentionQueryBlock + 12, 64, 0},
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
            236);  // 10 cases x 5 masks + 3 cases (S < T) x 3 masks, x 2 dropout x 2 weights
}

/// Gradient check of q, k, v through one kernel, L = sum(out * R).
template <bool Fast>
testing::GradCheckResult attention_gradcheck(Problem<double>& pb) {
  const auto& s = pb.shape;
  const Tensor<double> r = testing::randn({s.batch * s.queries, pb.ldo}, 4321);
  Tensor<double> out({s.batch * s.queries, pb.ldo}), lse({s.batch, s.heads, s.queries});
  auto forward = [&] {
    auto f = Fast ? kernels::attention_forward<double> : kernels::attention_forward_naive<double>;
    f(out.data(), pb.ldo, lse.data(), nullptr, pb.inputs(), s, pb.mask, pb.scale, pb.dropout);
  };
  forward();
  Tensor<double> dq(pb.q.shape()), dk(pb.k.shape()), dv(pb.v.shape());
  auto bwd = Fast ? kernels::attention_backward<double> : kernels::attention_backward_naive<double>;
  bwd({dq.data(), pb.ldq, dk.data(), pb.ldk, dv.data(), pb.ldv}, r.data(), pb.ldo, pb.inputs(),
      out.data(), pb.ldo, lse.data(), s, pb.mask, pb.scale, pb.dropout);
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
          bwd({dq.data(), pb.ldq, dk.data(), pb.ldk, dv.data(), pb.ldv}, pb.dout.data(), pb.ldo,
              pb.inputs(), out.data(), pb.ldo, lse.data(), pb.shape, pb.mask, pb.scale, pb.dropout);
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
        bwd({dq.data(), lds[i][0], dk.data(), lds[i][1], dv.data(), lds[i][2]}, pb.dout.data(),
            lds[i][3], pb.inputs(), out.data(), pb.ldo, lse.data(), pb.shape, pb.mask, pb.scale,
            pb.dropout);
        ADD_FAILURE() << "no exception for " << names[i];
      } catch (const ShapeError& e) {
        EXPECT_NE(std::string(e.what()).find(names[i]), std::string::npos) << e.what();
      }
    }
}

}  // namespace
}  // namespace attn
