// FeedForward (and the ReLU it is built from): parameter names, a naive reference, dropout on the
// hidden activation, gradients, errors.
#include <attn/nn/feed_forward.hpp>

#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(ReLU, ForwardAndBackwardByHand) {
  ReLU<double> relu;
  auto x = Tensor<double>::from({2, 3}, {-1, 0, 2, 3, -0.5, 1e-300});
  const Tensor<double>& y = relu.forward(x);
  const double expected_y[6] = {0, 0, 2, 3, 0, 1e-300};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y.data()[i], expected_y[i]) << i;
  auto dy = Tensor<double>::from({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor<double>& dx = relu.backward(dy);
  const double expected_dx[6] = {0, 0, 3, 4, 0, 6};  // subgradient 0 at x = 0, as PyTorch
  for (int i = 0; i < 6; ++i) EXPECT_EQ(dx.data()[i], expected_dx[i]) << i;
  EXPECT_THROW(relu.backward(Tensor<double>({3, 2})), ShapeError);
}

TEST(ReLU, GradientsMatchCentralDifferences) {
  ReLU<double> relu;
  Tensor<double> x = testing::randn({4, 5}, 31);
  auto res = testing::check_module(
      relu, {{"x", x}}, [&] { return relu.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{relu.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
}

TEST(FeedForward, ParametersHaveTorchLayerNamesAndShapes) {
  FeedForward<float> ffn(8, 32);
  auto ps = ffn.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].name, "linear1.weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({32, 8}));
  EXPECT_EQ(ps[1].name, "linear1.bias");
  EXPECT_EQ(ps[1].value.shape(), Shape({32}));
  EXPECT_EQ(ps[2].name, "linear2.weight");
  EXPECT_EQ(ps[2].value.shape(), Shape({8, 32}));
  EXPECT_EQ(ps[3].name, "linear2.bias");
  EXPECT_EQ(ps[3].value.shape(), Shape({8}));
  EXPECT_EQ(ffn.d_model(), 8);
  EXPECT_EQ(ffn.d_ff(), 32);
}

// A layer that holds its FeedForward the way a Transformer layer does: registered with no name.
class LayerLike : public Module<float> {
 public:
  LayerLike() : ffn(4, 6) {
    norm_weight.allocate({4});
    this->register_module("", &ffn);
    this->register_parameter("norm1.weight", &norm_weight);
  }
  FeedForward<float> ffn;
  Parameter<float> norm_weight;
};

TEST(FeedForward, FlattensIntoTheLayerThatRegistersItUnnamed) {
  LayerLike layer;
  std::vector<std::string> names;
  for (const auto& p : layer.parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"norm1.weight", "linear1.weight", "linear1.bias",
                                             "linear2.weight", "linear2.bias"}));
}

TEST(FeedForward, ResetGivesXavierWeightsAndZeroBiases) {
  FeedForward<double> ffn(6, 10);
  Rng rng(7);
  fill_uniform(ffn.linear1.bias.value, rng, 1, 2);  // nonzero, so the reset is visible
  ffn.reset_parameters(rng);
  const double a = std::sqrt(6.0 / 16.0);
  double max_abs = 0;
  for (double w : ffn.linear1.weight.value) max_abs = std::max(max_abs, std::abs(w));
  for (double w : ffn.linear2.weight.value) max_abs = std::max(max_abs, std::abs(w));
  EXPECT_LE(max_abs, a);
  EXPECT_GT(max_abs, 0.5 * a);
  for (double b : ffn.linear1.bias.value) EXPECT_EQ(b, 0.0);
  for (double b : ffn.linear2.bias.value) EXPECT_EQ(b, 0.0);
}

/// max(0, x W1^T + b1) W2^T + b2 with plain loops.
Tensor<double> naive_ffn(const FeedForward<double>& f, const Tensor<double>& x) {
  const Index D = f.d_model(), F = f.d_ff(), N = x.numel() / D;
  Tensor<double> y(x.shape());
  const auto& w1 = f.linear1.weight.value;
  const auto& b1 = f.linear1.bias.value;
  const auto& w2 = f.linear2.weight.value;
  const auto& b2 = f.linear2.bias.value;
  std::vector<double> h(static_cast<std::size_t>(F));
  for (Index n = 0; n < N; ++n) {
    for (Index j = 0; j < F; ++j) {
      double s = b1(j);
      for (Index k = 0; k < D; ++k) s += x.data()[n * D + k] * w1(j, k);
      h[static_cast<std::size_t>(j)] = std::max(0.0, s);
    }
    for (Index i = 0; i < D; ++i) {
      double s = b2(i);
      for (Index j = 0; j < F; ++j) s += h[static_cast<std::size_t>(j)] * w2(i, j);
      y.data()[n * D + i] = s;
    }
  }
  return y;
}

/// Xavier weights and N(0, 0.5) biases: reset_parameters' zero biases would hide a bias bug.
void randomize(FeedForward<double>& ffn, std::uint64_t seed) {
  Rng rng(seed);
  ffn.reset_parameters(rng);
  fill_normal(ffn.linear1.bias.value, rng, 0, 0.5);
  fill_normal(ffn.linear2.bias.value, rng, 0, 0.5);
}

TEST(FeedForward, ForwardMatchesNaiveReference) {
  FeedForward<double> ffn(5, 7);
  randomize(ffn, 3);
  Tensor<double> x = testing::randn({2, 3, 5}, 4);
  const Tensor<double>& y = ffn.forward(x);
  ASSERT_EQ(y.shape(), x.shape());
  Tensor<double> ref = naive_ffn(ffn, x);
  for (Index i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.data()[i], ref.data()[i], 1e-13) << i;
}

TEST(FeedForward, GradientsMatchCentralDifferences) {
  FeedForward<double> ffn(4, 6);
  randomize(ffn, 5);
  Tensor<double> x = testing::randn({2, 3, 4}, 6);
  auto res = testing::check_module(
      ffn, {{"x", x}}, [&] { return ffn.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{ffn.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 24 + 24 + 6 + 24 + 4);
}

TEST(FeedForward, GradientsMatchWithReluDropout) {
  FeedForward<double> ffn(4, 8, 0.3);
  EXPECT_EQ(ffn.relu_dropout(), 0.3);
  auto state = std::make_shared<RandomState>();
  state->seed = 17;
  ffn.set_random_state(state);
  Rng rng(8);
  ffn.reset_parameters(rng);
  fill_normal(ffn.linear1.bias.value, rng, 0, 0.5);
  Tensor<double> x = testing::randn({3, 4}, 9);
  auto res = testing::check_module_fixed_dropout(
      ffn, *state, {{"x", x}}, [&] { return ffn.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{ffn.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  // Dropout really acted: the training output differs from the eval (no-dropout) output, and the
  // shared state advanced once per forward.
  state->counter = 0;
  const Tensor<double> train_y = ffn.forward(x).clone();
  EXPECT_EQ(state->counter, 1u);
  ffn.eval();
  const Tensor<double>& eval_y = ffn.forward(x);
  EXPECT_EQ(state->counter, 1u);
  Tensor<double> ref = naive_ffn(ffn, x);
  Index differ = 0;
  for (Index i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(eval_y.data()[i], ref.data()[i], 1e-13);
    differ += std::abs(train_y.data()[i] - ref.data()[i]) > 1e-9;
  }
  EXPECT_GT(differ, 0);
}

TEST(FeedForward, RejectsBadConfigAndShapes) {
  const auto expect_config = [](auto make, const std::string& needle) {
    try {
      make();
      FAIL() << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_config([] { FeedForward<float>(0, 8); }, "d_model must be > 0, got 0");
  expect_config([] { FeedForward<float>(8, -2); }, "d_ff must be > 0, got -2");
  expect_config([] { FeedForward<float>(8, 16, 1.0); }, "relu_dropout must be in [0, 1), got 1");
  expect_config([] { FeedForward<float>(8, 16, -0.5); }, "got -0.5");
  FeedForward<float> ffn(8, 16);
  try {
    ffn.forward(Tensor<float>({2, 7}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[..., 8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 7]"), std::string::npos) << e.what();
  }
  ffn.forward(Tensor<float>({2, 8}));
  EXPECT_THROW(ffn.backward(Tensor<float>({3, 8})), ShapeError);
}

}  // namespace
}  // namespace attn
