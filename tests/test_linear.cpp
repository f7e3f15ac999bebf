// Linear: forward against a hand computation, gradients against central differences, errors.
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(Linear, ForwardMatchesHandComputation) {
  Linear<double> lin(2, 3);
  lin.weight.value = Tensor<double>::from({3, 2}, {1, 2, 3, 4, 5, 6});
  lin.bias.value = Tensor<double>::from({3}, {0.5, -1, 2});
  auto x = Tensor<double>::from({1, 2}, {1, -1});
  const Tensor<double>& y = lin.forward(x);
  EXPECT_EQ(y.shape(), Shape({1, 3}));
  EXPECT_DOUBLE_EQ(y(0, 0), -0.5);
  EXPECT_DOUBLE_EQ(y(0, 1), -2.0);
  EXPECT_DOUBLE_EQ(y(0, 2), 1.0);
}

TEST(Linear, GradientsMatchCentralDifferences) {
  Linear<double> lin(5, 4);
  Rng rng(1);
  lin.reset_parameters(rng);
  fill_normal(lin.bias.value, rng, 0, 1);
  Tensor<double> x = testing::randn({2, 3, 5}, 2);
  auto res = testing::check_module(
      lin, {{"x", x}}, [&] { return lin.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{lin.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 30 + 20 + 4);
}

TEST(Linear, GradientsAccumulateAcrossBackwardCalls) {
  Linear<double> lin(3, 2);
  Rng rng(5);
  lin.reset_parameters(rng);
  Tensor<double> x = testing::randn({4, 3}, 9);
  Tensor<double> dy = testing::randn({4, 2}, 10);
  lin.zero_grad();
  lin.forward(x);
  lin.backward(dy);
  Tensor<double> once = lin.weight.grad.clone();
  lin.forward(x);
  lin.backward(dy);
  for (Index i = 0; i < once.numel(); ++i)
    EXPECT_DOUBLE_EQ(lin.weight.grad.data()[i], 2 * once.data()[i]);
  lin.zero_grad();
  for (double g : lin.weight.grad) EXPECT_EQ(g, 0.0);
}

TEST(Linear, ParametersHaveTorchNamesAndShapes) {
  Linear<float> lin(8, 16);
  auto ps = lin.parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].name, "weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({16, 8}));
  EXPECT_EQ(ps[1].name, "bias");
  EXPECT_EQ(ps[1].value.shape(), Shape({16}));
  EXPECT_EQ(lin.num_parameters(), 16 * 8 + 16);
  Linear<float> no_bias(8, 16, false);
  EXPECT_EQ(no_bias.parameters().size(), 1u);
}

TEST(Linear, RejectsWrongShapes) {
  Linear<float> lin(8, 4);
  Tensor<float> x({2, 7});
  try {
    lin.forward(x);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[..., 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 7]"), std::string::npos) << e.what();
  }
  lin.forward(Tensor<float>({2, 8}));
  EXPECT_THROW(lin.backward(Tensor<float>({2, 5})), ShapeError);
  EXPECT_THROW(Linear<float>(0, 4), ConfigError);
}

}  // namespace
}  // namespace attn
