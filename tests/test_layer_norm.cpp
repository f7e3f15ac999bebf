// LayerNorm: hand-computed values, the biased-variance convention, kernel vs module, gradients.
#include <attn/kernels/residual.hpp>
#include <attn/nn/layer_norm.hpp>

#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(LayerNorm, ForwardMatchesHandComputation) {
  LayerNorm<double> ln(4, 0.0 + 1e-5);
  ln.weight.value = Tensor<double>::from({4}, {1, 2, 0.5, -1});
  ln.bias.value = Tensor<double>::from({4}, {0, 1, -1, 3});
  auto x = Tensor<double>::from({2, 4}, {1, 2, 3, 4, -2, 0, 0, 2});
  const Tensor<double>& y = ln.forward(x);
  ASSERT_EQ(y.shape(), Shape({2, 4}));
  // Row 0: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  const double rs0 = 1.0 / std::sqrt(1.25 + 1e-5);
  const double xh0[4] = {-1.5 * rs0, -0.5 * rs0, 0.5 * rs0, 1.5 * rs0};
  // Row 1: mean 0, biased variance (4 + 0 + 0 + 4) / 4 = 2.
  const double rs1 = 1.0 / std::sqrt(2.0 + 1e-5);
  const double xh1[4] = {-2 * rs1, 0, 0, 2 * rs1};
  const double g[4] = {1, 2, 0.5, -1}, b[4] = {0, 1, -1, 3};
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(y(0, j), xh0[j] * g[j] + b[j], 1e-14) << j;
    EXPECT_NEAR(y(1, j), xh1[j] * g[j] + b[j], 1e-14) << j;
  }
}

TEST(LayerNorm, UsesBiasedVarianceWithEpsInsideSqrt) {
  // With a large eps the convention is visible: x = [0, 2] has biased var 1 (unbiased 2).
  LayerNorm<double> ln(2, 0.5);
  auto x = Tensor<double>::from({1, 2}, {0, 2});
  const Tensor<double>& y = ln.forward(x);
  EXPECT_NEAR(y(0, 1), 1.0 / std::sqrt(1.0 + 0.5), 1e-15);  // not 1/sqrt(2.5), not 1/(1+0.5)
  EXPECT_NEAR(y(0, 0), -1.0 / std::sqrt(1.0 + 0.5), 1e-15);
}

TEST(LayerNorm, DefaultParametersNormaliseEachRow) {
  LayerNorm<float> ln(16);
  Tensor<float> x({3, 5, 16});
  Rng rng(3);
  fill_normal(x, rng, 4.0, 3.0);
  const Tensor<float>& y = ln.forward(x);
  ASSERT_EQ(y.shape(), x.shape());
  const auto m = y.matrix();
  for (Index r = 0; r < m.rows(); ++r) {
    EXPECT_NEAR(m.row(r).mean(), 0.0f, 1e-5f);
    EXPECT_NEAR(m.row(r).array().square().mean(), 1.0f, 1e-3f);
  }
}

TEST(LayerNorm, ParametersHaveTorchNamesShapesAndInit) {
  LayerNorm<float> ln(8);
  auto ps = ln.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].name, "weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({8}));
  EXPECT_EQ(ps[1].name, "bias");
  EXPECT_EQ(ps[1].value.shape(), Shape({8}));
  for (float v : ln.weight.value) EXPECT_EQ(v, 1.0f);
  for (float v : ln.bias.value) EXPECT_EQ(v, 0.0f);
}

TEST(LayerNorm, GradientsMatchCentralDifferences) {
  LayerNorm<double> ln(6);
  Rng rng(11);
  fill_normal(ln.weight.value, rng, 1.0, 0.5);
  fill_normal(ln.bias.value, rng, 0.0, 0.5);
  Tensor<double> x = testing::randn({2, 3, 6}, 12);
  auto res = testing::check_module(
      ln, {{"x", x}}, [&] { return ln.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{ln.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 36 + 6 + 6);
}

TEST(LayerNorm, GradientsAccumulateAndAreThreadCountIndependent) {
  // Big enough (rows * D > 16384) to take the parallel paths.
  LayerNorm<float> ln(128);
  Rng rng(2);
  fill_normal(ln.weight.value, rng, 1.0, 0.5);
  Tensor<float> x({200, 128}), dy({200, 128});
  fill_normal(x, rng, 0, 1);
  fill_normal(dy, rng, 0, 1);
  const int saved = num_threads();
  std::vector<Tensor<float>> out, dx, dw, db;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    ln.zero_grad();
    out.push_back(ln.forward(x).clone());
    dx.push_back(ln.backward(dy).clone());
    dw.push_back(ln.weight.grad.clone());
    db.push_back(ln.bias.grad.clone());
  }
  set_num_threads(saved);
  for (Index i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(out[0].data()[i], out[1].data()[i]);
    ASSERT_EQ(dx[0].data()[i], dx[1].data()[i]);
  }
  for (Index j = 0; j < 128; ++j) {
    ASSERT_EQ(dw[0].data()[j], dw[1].data()[j]);
    ASSERT_EQ(db[0].data()[j], db[1].data()[j]);
  }
  // A second backward adds the same amount again.
  ln.forward(x);
  ln.backward(dy);
  for (Index j = 0; j < 128; ++j) EXPECT_FLOAT_EQ(ln.weight.grad.data()[j], 2 * dw[1].data()[j]);
}

class LayerNormKernel : public ::testing::TestWithParam<Index> {};

// Rows: one block of layer_norm_backward's sums, and three (kLayerNormRowBlock = 32) with a short
// last one.
INSTANTIATE_TEST_SUITE_P(Rows, LayerNormKernel, ::testing::Values(Index(5), Index(70)));

TEST_P(LayerNormKernel, MatchesNaiveReference) {
  const Index rows = GetParam(), D = 7;
  Tensor<double> x = testing::randn({rows, D}, 21), g = testing::randn({D}, 22),
                 b = testing::randn({D}, 23), dy = testing::randn({rows, D}, 24);
  Tensor<double> y({rows, D}), mean({rows}), rstd({rows}), dx({rows, D}), dg({D}), db({D});
  dg.fill(0.5);  // dgamma and dbeta are accumulated into
  db.fill(-0.25);
  kernels::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(),
                              rows, D, 1e-5);
  kernels::layer_norm_backward(dx.data(), dg.data(), db.data(), dy.data(), x.data(), mean.data(),
                               rstd.data(), g.data(), rows, D);
  std::vector<double> ref_dg(D, 0.5), ref_db(D, -0.25);
  for (Index r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (Index j = 0; j < D; ++j) mu += x(r, j) / D;
    for (Index j = 0; j < D; ++j) var += (x(r, j) - mu) * (x(r, j) - mu) / D;
    const double rs = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(mean(r), mu, 1e-14);
    EXPECT_NEAR(rstd(r), rs, 1e-12);
    // Naive dx: sum_k dy_k dy_k/dx_j written out, O(D^2) per row.
    for (Index j = 0; j < D; ++j) {
      const double xhj = (x(r, j) - mu) * rs;
      EXPECT_NEAR(y(r, j), xhj * g(j) + b(j), 1e-13);
      double dxj = 0;
      for (Index k = 0; k < D; ++k) {
        const double xhk = (x(r, k) - mu) * rs;
        const double dxhk_dxj = rs * ((j == k ? 1.0 : 0.0) - 1.0 / D - xhk * xhj / D);
        dxj += dy(r, k) * g(k) * dxhk_dxj;
      }
      EXPECT_NEAR(dx(r, j), dxj, 1e-12);
      ref_dg[j] += dy(r, j) * xhj;
      ref_db[j] += dy(r, j);
    }
  }
  for (Index j = 0; j < D; ++j) {
    EXPECT_NEAR(dg(j), ref_dg[j], 1e-12);
    EXPECT_NEAR(db(j), ref_db[j], 1e-12);
  }
}

TEST(LayerNorm, RejectsBadConfigAndShapes) {
  try {
    LayerNorm<float> bad(0);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("got 0"), std::string::npos) << e.what();
  }
  try {
    LayerNorm<float> bad(-3);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LayerNorm<float>(4, 0.0), ConfigError);
  LayerNorm<float> ln(8);
  try {
    ln.forward(Tensor<float>({2, 7}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[..., 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 7]"), std::string::npos) << e.what();
  }
  ln.forward(Tensor<float>({2, 8}));
  try {
    ln.backward(Tensor<float>({3, 8}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 8]"), std::string::npos) << e.what();
  }
}

// The fused residual connection (kernels/residual.hpp) against the separate kernels it replaces:
// dropout, add, layer norm. Bitwise, for float (the AVX2 mask where the CPU has it) and double,
// with and without dropout, rows that are not a multiple of the vector width.
template <class T>
void expect_fused_residual_is_bitwise_unfused(double p) {
  const Index rows = 37, D = 67, n = rows * D;
  Tensor<T> x({rows, D}), f({rows, D}), gamma({D}), beta({D});
  Rng rng(11);
  fill_normal(x, rng, 0.5, 2);
  fill_normal(f, rng, -0.1, 1);
  fill_normal(gamma, rng, 1, 0.2);
  fill_normal(beta, rng, 0, 0.2);
  const std::uint64_t key = 0xfeedULL;
  // Unfused: d = dropout(f), s = x + d, y = LayerNorm(s).
  Tensor<T> d({rows, D}), s_ref({rows, D}), y_ref({rows, D}), mean_ref({rows}), rstd_ref({rows});
  if (p > 0) {
    kernels::dropout_forward(d.data(), f.data(), n, p, key);
  } else {
    std::copy(f.begin(), f.end(), d.begin());
  }
  for (Index i = 0; i < n; ++i) s_ref.data()[i] = x.data()[i] + d.data()[i];
  kernels::layer_norm_forward(y_ref.data(), mean_ref.data(), rstd_ref.data(), s_ref.data(),
                              gamma.data(), beta.data(), rows, D, 1e-5);
  Tensor<T> s({rows, D}), y({rows, D}), mean({rows}), rstd({rows}), added({rows, D});
  kernels::residual_layer_norm_forward(y.data(), s.data(), mean.data(), rstd.data(), x.data(),
                                       f.data(), p, key, gamma.data(), beta.data(), rows, D, 1e-5);
  kernels::residual_add(added.data(), x.data(), f.data(), n, p, key);
  for (Index i = 0; i < n; ++i) {
    ASSERT_EQ(s.data()[i], s_ref.data()[i]) << i;
    ASSERT_EQ(added.data()[i], s_ref.data()[i]) << i;
    ASSERT_EQ(y.data()[i], y_ref.data()[i]) << i;
  }
  for (Index r = 0; r < rows; ++r) {
    ASSERT_EQ(mean.data()[r], mean_ref.data()[r]);
    ASSERT_EQ(rstd.data()[r], rstd_ref.data()[r]);
  }
}

TEST(LayerNorm, FusedResidualIsBitwiseTheSeparateKernels) {
  for (const double p : {0.0, 0.1, 0.5}) {
    expect_fused_residual_is_bitwise_unfused<float>(p);
    expect_fused_residual_is_bitwise_unfused<double>(p);
  }
}

// The module path: forward_residual with a Dropout's fused mask equals Dropout, add and
// LayerNorm::forward, and its backward (with respect to the sum) equals LayerNorm::backward's.
TEST(LayerNorm, ForwardResidualMatchesDropoutAddNorm) {
  const Index B = 3, L = 5, D = 16;
  Tensor<float> x({B, L, D}), f({B, L, D}), dy({B, L, D});
  Rng rng(4);
  fill_normal(x, rng, 0, 1);
  fill_normal(f, rng, 0, 1);
  fill_normal(dy, rng, 0, 1);
  LayerNorm<float> fused(D), plain(D);
  Dropout<float> drop_fused(0.3), drop_plain(0.3);  // same default state: the same keys
  const Tensor<float>& y = fused.forward_residual(x, f, drop_fused.fused_forward(f.shape()));
  const Tensor<float>& d = drop_plain.forward(f);
  Tensor<float> s({B, L, D});
  for (Index i = 0; i < s.numel(); ++i) s.data()[i] = x.data()[i] + d.data()[i];
  const Tensor<float>& y_ref = plain.forward(s);
  for (Index i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data()[i], y_ref.data()[i]) << i;
  const Tensor<float>& ds = fused.backward(dy);
  const Tensor<float>& ds_ref = plain.backward(dy);
  for (Index i = 0; i < ds.numel(); ++i) ASSERT_EQ(ds.data()[i], ds_ref.data()[i]) << i;
  const Tensor<float>& df = drop_fused.backward(ds);
  const Tensor<float>& df_ref = drop_plain.backward(ds_ref);
  for (Index i = 0; i < df.numel(); ++i) ASSERT_EQ(df.data()[i], df_ref.data()[i]) << i;
  EXPECT_THROW(fused.forward_residual(x, Tensor<float>({B, L, D + 1}), DropoutMask{}), ShapeError);
}

}  // namespace
}  // namespace attn
