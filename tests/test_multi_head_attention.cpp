// MultiHeadAttention beyond its gradients: torch's parameter names and initialisation, PyTorch
// golden outputs and gradients, attention weights, incremental decoding against the full causal
// forward, buffer reuse, float against double, and every error path. Gradients and kernel
// agreement: test_multi_head_attention_gradients.cpp.
#include "error_helpers.hpp"
#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "multi_head_attention_testing.hpp"
#include "pch.hpp"

#include <attn/nn/multi_head_attention.hpp>

namespace attn {
namespace {

using testing::D;
using testing::error_of;
using testing::H;
using testing::init;
using testing::padding;
using testing::randn;

TEST(MultiHeadAttention, ParametersHaveTorchNamesAndShapes) {
  MultiHeadAttention<float> mha(16, 4);
  auto ps = mha.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].name, "in_proj_weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({48, 16}));
  EXPECT_EQ(ps[1].name, "in_proj_bias");
  EXPECT_EQ(ps[1].value.shape(), Shape({48}));
  EXPECT_EQ(ps[2].name, "out_proj.weight");
  EXPECT_EQ(ps[2].value.shape(), Shape({16, 16}));
  EXPECT_EQ(ps[3].name, "out_proj.bias");
  EXPECT_EQ(ps[3].value.shape(), Shape({16}));
}

TEST(MultiHeadAttention, ResetParametersIsXavierOnTheWholeInProjection) {
  MultiHeadAttention<double> mha(16, 4);
  Rng rng(3);
  mha.reset_parameters(rng);
  const double a = std::sqrt(6.0 / (48 + 16));  // fan_in 16, fan_out 48, as PyTorch
  double max_abs = 0;
  for (double v : mha.in_proj_weight.value) max_abs = std::max(max_abs, std::abs(v));
  EXPECT_LE(max_abs, a);
  EXPECT_GT(max_abs, 0.9 * a);  // 768 draws reach close to the bound
  for (double v : mha.in_proj_bias.value) EXPECT_EQ(v, 0.0);
  for (double v : mha.out_proj.bias.value) EXPECT_EQ(v, 0.0);
}

/// Loads a golden MultiheadAttention case and compares output, weights and all gradients.
void check_golden(const std::string& file, bool cross, bool fast) {
  testing::GoldenFile g(file);
  MultiHeadAttention<double> mha(D, H, 0.0, fast);
  auto loaded = testing::load_state_dict(
      mha, g, {"x", "memory", "lengths", "memory_lengths", "R", "out", "weights"});
  EXPECT_EQ(loaded.size(), mha.parameters().size());
  mha.keep_attention_weights(true);
  const Tensor<double>& x = g["x"];
  const Tensor<double>& out =
      cross ? mha.forward_cross(x, g["memory"],
                                padding(g.lengths("memory_lengths"), g["memory"].size(1)))
            : mha.forward_self(x, padding(g.lengths("lengths"), x.size(1), true));
  EXPECT_LT(testing::max_abs_diff(out, g["out"]), 1e-12);
  EXPECT_LT(testing::max_abs_diff(mha.attention_weights(), g["weights"]), 1e-12);
  mha.zero_grad();
  EXPECT_LT(testing::max_abs_diff(mha.backward(g["R"]), g["grad.x"]), 1e-11);
  if (cross) {
    EXPECT_LT(testing::max_abs_diff(mha.dmemory(), g["grad.memory"]), 1e-11);
  }
  for (const auto& p : mha.parameters())
    EXPECT_LT(testing::max_abs_diff(p.grad, g["grad." + p.name]), 1e-11) << p.name;
}

TEST(MultiHeadAttention, MatchesPyTorchSelfAttention) {
  check_golden("mha_self.txt", false, false);
  check_golden("mha_self.txt", false, true);
}

TEST(MultiHeadAttention, MatchesPyTorchCrossAttention) {
  check_golden("mha_cross.txt", true, false);
  check_golden("mha_cross.txt", true, true);
}

TEST(MultiHeadAttention, AttentionWeightsAreDistributionsOverAllowedKeys) {
  MultiHeadAttention<double> mha(D, H);
  init(mha, 21);
  mha.keep_attention_weights(true);
  Tensor<double> x = randn({2, 4, D}, 22);
  const std::vector<Index> lengths = {4, 0};
  mha.forward_self(x, padding(lengths, 4, true));
  const Tensor<double>& w = mha.attention_weights();
  ASSERT_EQ(w.shape(), Shape({2, H, 4, 4}));
  for (Index h = 0; h < H; ++h)
    for (Index t = 0; t < 4; ++t) {
      double row = 0;
      for (Index s = 0; s < 4; ++s) {
        row += w(0, h, t, s);
        if (s > t)
          EXPECT_EQ(w(0, h, t, s), 0.0);  // causal
        else
          EXPECT_GT(w(0, h, t, s), 0.0);
        EXPECT_EQ(w(1, h, t, s), 0.0);  // fully padded batch row
      }
      EXPECT_NEAR(row, 1.0, 1e-14);
    }
  Tensor<double> memory = randn({2, 3, D}, 23);
  mha.forward_cross(x, memory, padding({2, 3}, 3));
  ASSERT_EQ(mha.attention_weights().shape(), Shape({2, H, 4, 3}));
  for (Index h = 0; h < H; ++h)
    for (Index t = 0; t < 4; ++t) {
      EXPECT_EQ(mha.attention_weights()(0, h, t, 2), 0.0);
      EXPECT_NEAR(mha.attention_weights()(1, h, t, 0) + mha.attention_weights()(1, h, t, 1) +
                      mha.attention_weights()(1, h, t, 2),
                  1.0, 1e-14);
    }
}

TEST(MultiHeadAttention, AttentionWeightsMustBeAskedFor) {
  MultiHeadAttention<double> mha(D, H);
  mha.forward_self(randn({1, 2, D}, 1), {});
  EXPECT_NE(error_of([&] { mha.attention_weights(); }).find("keep_attention_weights(true)"),
            std::string::npos);
  mha.keep_attention_weights(true);
  EXPECT_NE(error_of([&] { mha.attention_weights(); }).find("no forward"), std::string::npos);
}

TEST(MultiHeadAttention, SelfStepsWithCacheEqualTheFullCausalForward) {
  MultiHeadAttention<double> mha(D, H);
  init(mha, 31);
  mha.eval();
  mha.keep_attention_weights(true);
  const Index B = 2, L = 5;
  Tensor<double> x = randn({B, L, D}, 32);
  Tensor<double> full = mha.forward_self(x, AttentionMask<double>::causal_only()).clone();
  Tensor<double> full_w = mha.attention_weights().clone();
  KVCache<double> cache;
  cache.allocate(B, L, D);
  const double* keys_storage = cache.keys.data();
  Tensor<double> xt({B, 1, D});
  for (Index t = 0; t < L; ++t) {
    for (Index b = 0; b < B; ++b)
      for (Index d = 0; d < D; ++d) xt(b, 0, d) = x(b, t, d);
    const Tensor<double>& y = mha.forward_self_step(xt, cache);
    EXPECT_EQ(cache.length, t + 1);
    ASSERT_EQ(mha.attention_weights().shape(), Shape({B, H, 1, t + 1}));
    for (Index b = 0; b < B; ++b) {
      for (Index d = 0; d < D; ++d) EXPECT_NEAR(y(b, 0, d), full(b, t, d), 1e-13) << t;
      for (Index h = 0; h < H; ++h)
        for (Index s = 0; s <= t; ++s)
          EXPECT_NEAR(mha.attention_weights()(b, h, 0, s), full_w(b, h, t, s), 1e-14);
    }
  }
  EXPECT_EQ(cache.keys.data(), keys_storage);  // reserved once, never reallocated
  EXPECT_NE(error_of([&] { mha.forward_self_step(xt, cache); }).find("cache full, capacity 5"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mha.backward(randn({B, 1, D}, 1));
            }).find("no backward"),
            std::string::npos);
}

TEST(MultiHeadAttention, CachedCrossAttentionEqualsTheFullForward) {
  MultiHeadAttention<double> mha(D, H, 0.0, false);
  init(mha, 41);
  mha.eval();
  const Index B = 2, T = 3, S = 4;
  Tensor<double> x = randn({B, T, D}, 42), memory = randn({B, S, D}, 43);
  const auto mask = padding({4, 2}, S);
  Tensor<double> full = mha.forward_cross(x, memory, mask).clone();
  KVCache<double> cache;
  Tensor<double> xt({B, 1, D});
  for (Index t = 0; t < T; ++t) {
    for (Index b = 0; b < B; ++b)
      for (Index d = 0; d < D; ++d) xt(b, 0, d) = x(b, t, d);
    const Tensor<double>& y = mha.forward_cross_cached(xt, memory, cache, mask);
    EXPECT_EQ(cache.length, S);
    for (Index b = 0; b < B; ++b)
      for (Index d = 0; d < D; ++d) EXPECT_NEAR(y(b, 0, d), full(b, t, d), 1e-13);
    if (t == 0) memory.fill(1e3);  // the cache is used from the second step on, not the memory
  }
  // All queries at once through the same cache.
  Tensor<double> all = mha.forward_cross_cached(x, memory, cache, mask).clone();
  EXPECT_LT(testing::max_abs_diff(all, full), 1e-13);
  EXPECT_THROW(mha.forward_cross_cached(x, randn({B, S + 1, D}, 1), cache, padding({4, 2}, S + 1)),
               ShapeError);
}

TEST(MultiHeadAttention, BuffersAreReusedAcrossSteps) {
  MultiHeadAttention<double> mha(D, H);
  init(mha, 61);
  Tensor<double> x = randn({2, 4, D}, 62), dy = randn({2, 4, D}, 63);
  const double* y1 = mha.forward_self(x, {}).data();
  const double* dx1 = mha.backward(dy).data();
  Tensor<double> small = randn({2, 3, D}, 64);  // a shorter batch fits the same storage
  EXPECT_EQ(mha.forward_self(small, {}).data(), y1);
  EXPECT_EQ(mha.backward(randn({2, 3, D}, 65)).data(), dx1);
}

TEST(MultiHeadAttention, FloatAgreesWithDouble) {
  MultiHeadAttention<double> md(D, H);
  MultiHeadAttention<float> mf(D, H);
  init(md, 51);
  testing::copy_parameters(md, mf);
  Tensor<double> x = randn({2, 3, D}, 52);
  const Tensor<float> xf = testing::to_float(x);
  AttentionMask<float> mask;
  mask.causal = true;
  const Tensor<double>& yd = md.forward_self(x, AttentionMask<double>::causal_only());
  const Tensor<float>& yf = mf.forward_self(xf, mask);
  for (Index i = 0; i < yd.numel(); ++i) EXPECT_NEAR(yf.data()[i], yd.data()[i], 1e-5);
  md.zero_grad();
  mf.zero_grad();
  const Tensor<double>& dxd = md.backward(Tensor<double>::full({2, 3, D}, 1.0));
  const Tensor<float>& dxf = mf.backward(Tensor<float>::full({2, 3, D}, 1.0f));
  ASSERT_EQ(dxf.shape(), dxd.shape());
  for (Index i = 0; i < dxd.numel(); ++i) EXPECT_NEAR(dxf.data()[i], dxd.data()[i], 1e-5);
  const auto pd = md.parameters();
  const auto pf = mf.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i)
    for (Index j = 0; j < pd[i].grad.numel(); ++j)
      EXPECT_NEAR(pf[i].grad.data()[j], pd[i].grad.data()[j], 1e-5)
          << pd[i].name << "[" << j << "]";
}

TEST(MultiHeadAttention, RejectsBadShapesMasksAndConfigurations) {
  MultiHeadAttention<double> mha(D, H);
  EXPECT_EQ(error_of([&] {
              mha.forward_self(Tensor<double>({2, 3, 5}), {});
            }),
            "MultiHeadAttention: expected x [B, L, 8], got [2, 3, 5]");
  EXPECT_THROW(mha.forward_self(Tensor<double>({6, 8}), {}), ShapeError);
  EXPECT_EQ(error_of([&] {
              mha.forward_cross(Tensor<double>({2, 3, D}), Tensor<double>({3, 4, D}), {});
            }),
            "MultiHeadAttention: expected memory [2, S, 8] (B of x), got [3, 4, 8]");
  EXPECT_THROW(mha.forward_cross(Tensor<double>({2, 3, D}), Tensor<double>({2, 4, 7}), {}),
               ShapeError);
  EXPECT_EQ(error_of([&] {
              mha.forward_self(Tensor<double>({2, 4, D}), padding({3, 3}, 3));
            }),
            "KeyPaddingMask: expected [B, S] = [2, 4], got [2, 3]");
  EXPECT_THROW(
      mha.forward_cross(Tensor<double>({2, 3, D}), Tensor<double>({2, 4, D}), padding({3, 3}, 3)),
      ShapeError);
  EXPECT_NE(error_of([&] {
              mha.backward(Tensor<double>({2, 3, D}));
            }).find("forward_self"),
            std::string::npos);
  mha.forward_self(Tensor<double>({2, 4, D}), {});
  EXPECT_EQ(error_of([&] {
              mha.backward(Tensor<double>({2, 3, D}));
            }),
            "MultiHeadAttention::backward: expected dy of shape [2, 4, 8], got [2, 3, 8]");
  EXPECT_NE(error_of([&] { mha.dmemory(); }).find("forward_cross"), std::string::npos);

  EXPECT_EQ(error_of([] { MultiHeadAttention<double>(500, 8); }),
            "d_model (500) must be divisible by heads (8)");
  EXPECT_THROW(MultiHeadAttention<double>(500, 8), ConfigError);
  EXPECT_THROW(MultiHeadAttention<double>(0, 8), ConfigError);
  EXPECT_THROW(MultiHeadAttention<double>(8, 2, 1.0), ConfigError);
  EXPECT_THROW(MultiHeadAttention<double>(8, 2, -0.1), ConfigError);

  KVCache<double> cache;
  EXPECT_NE(error_of([&] {
              mha.forward_self_step(Tensor<double>({2, 1, D}), cache);
            }).find("expected a cache allocated for [B, *, D] = [2, *, 8]"),
            std::string::npos);
  cache.allocate(2, 4, D);
  EXPECT_EQ(error_of([&] {
              mha.forward_self_step(Tensor<double>({2, 2, D}), cache);
            }),
            "MultiHeadAttention::forward_self_step: expected x [B, 1, 8], got [2, 2, 8]");
}

}  // namespace
}  // namespace attn
