// MultiHeadAttention gradients against central differences (self, cross, masks, training-mode
// dropout) on the naive and the fast kernel, and the two kernels against each other. Golden
// outputs, weights, decoding and errors: test_multi_head_attention.cpp.
#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "multi_head_attention_testing.hpp"
#include "pch.hpp"

#include <attn/nn/multi_head_attention.hpp>

namespace attn {
namespace {

using testing::D;
using testing::H;
using testing::init;
using testing::padding;
using testing::randn;

// Param: use the fast kernel. Gradient checks run on one thread (testing::OneThread); the
// threaded paths are checked on float problems above their thresholds (test_attention_paths.cpp,
// test_training.cpp).
class MhaKernel : public ::testing::TestWithParam<bool> {
 protected:
  testing::OneThread one_thread_;
};

TEST_P(MhaKernel, SelfAttentionGradientsWithCausalAndPadding) {
  MultiHeadAttention<double> mha(D, H, 0.0, GetParam());
  init(mha, 1);
  Tensor<double> x = randn({2, 4, D}, 2);
  // Row 1 is entirely padding: its outputs are out_proj's bias and no gradient flows through it.
  for (const auto& mask : {padding({4, 0}, 4, true), padding({3, 2}, 4, false),
                           AttentionMask<double>::causal_only()}) {
    auto res = testing::check_module(
        mha, {{"x", x}}, [&] { return mha.forward_self(x, mask); },
        [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{mha.backward(dy)}; });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, 64 + 3 * D * D + 3 * D + D * D + D);
  }
}

TEST_P(MhaKernel, CrossAttentionGradientsWithMemoryPadding) {
  MultiHeadAttention<double> mha(D, H, 0.0, GetParam());
  init(mha, 3);
  Tensor<double> x = randn({2, 3, D}, 4);
  Tensor<double> memory = randn({2, 5, D}, 5);
  for (const auto& mask : {padding({5, 2}, 5), padding({0, 4}, 5), AttentionMask<double>::none()}) {
    auto res = testing::check_module(
        mha, {{"x", x}, {"memory", memory}}, [&] { return mha.forward_cross(x, memory, mask); },
        [&](const Tensor<double>& dy) {
          const Tensor<double>& dx = mha.backward(dy);
          return std::vector<Tensor<double>>{dx, mha.dmemory()};
        });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, 48 + 80 + 3 * D * D + 3 * D + D * D + D);
  }
}

TEST_P(MhaKernel, TrainingModeAttentionDropoutGradients) {
  MultiHeadAttention<double> mha(D, H, 0.3, GetParam());
  init(mha, 6);
  auto state = std::make_shared<RandomState>();
  state->seed = 77;
  mha.set_random_state(state);
  mha.train();
  Tensor<double> x = randn({2, 4, D}, 7);
  Tensor<double> memory = randn({2, 3, D}, 8);
  const auto mask = padding({4, 3}, 4, true);
  // Each forward draws a key; resetting the counter repeats the same dropout mask every time.
  auto self = testing::check_module_fixed_dropout(
      mha, *state, {{"x", x}}, [&] { return mha.forward_self(x, mask); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{mha.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(self);
  auto cross = testing::check_module_fixed_dropout(
      mha, *state, {{"x", x}, {"memory", memory}},
      [&] {
        return mha.forward_cross(x, memory, padding({3, 1}, 3));
      },
      [&](const Tensor<double>& dy) {
        const Tensor<double>& dx = mha.backward(dy);
        return std::vector<Tensor<double>>{dx, mha.dmemory()};
      });
  EXPECT_GRADIENTS_MATCH(cross);

  // The dropout is real: training and eval outputs differ, and eval ignores it.
  state->counter = 0;
  Tensor<double> train_out = mha.forward_self(x, mask).clone();
  mha.eval();
  Tensor<double> eval_out = mha.forward_self(x, mask).clone();
  ASSERT_TRUE(train_out.matrix().allFinite() && eval_out.matrix().allFinite());
  EXPECT_GT(testing::max_abs_diff(train_out, eval_out), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(NaiveAndFast, MhaKernel, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "fast" : "naive";
                         });

/// Forward and backward of `run` on a naive and a fast module with identical parameters.
void expect_kernels_agree(bool cross, double p) {
  MultiHeadAttention<double> naive(D, H, p, false), fast(D, H, p, true);
  init(naive, 11);
  auto np = naive.parameters(), fp = fast.parameters();
  for (std::size_t i = 0; i < np.size(); ++i)
    std::copy(np[i].value.begin(), np[i].value.end(), fp[i].value.begin());
  auto state_n = std::make_shared<RandomState>(), state_f = std::make_shared<RandomState>();
  naive.set_random_state(state_n);
  fast.set_random_state(state_f);
  naive.keep_attention_weights(true);
  fast.keep_attention_weights(true);
  Tensor<double> x = randn({3, 5, D}, 12), memory = randn({3, 6, D}, 13), dy = randn({3, 5, D}, 14);
  auto run = [&](MultiHeadAttention<double>& m) {
    m.zero_grad();
    Tensor<double> y = cross ? m.forward_cross(x, memory, padding({6, 1, 4}, 6)).clone()
                             : m.forward_self(x, padding({5, 2, 0}, 5, true)).clone();
    Tensor<double> dx = m.backward(dy).clone();
    return std::make_pair(y, dx);
  };
  auto [yn, dxn] = run(naive);
  auto [yf, dxf] = run(fast);
  EXPECT_LT(testing::max_abs_diff(yn, yf), 1e-12);
  EXPECT_LT(testing::max_abs_diff(dxn, dxf), 1e-12);
  EXPECT_LT(testing::max_abs_diff(naive.attention_weights(), fast.attention_weights()), 1e-12);
  if (cross) {
    EXPECT_LT(testing::max_abs_diff(naive.dmemory(), fast.dmemory()), 1e-12);
  }
  for (std::size_t i = 0; i < np.size(); ++i)
    EXPECT_LT(testing::max_abs_diff(np[i].grad, fp[i].grad), 1e-12) << np[i].name;
}

TEST(MultiHeadAttention, NaiveAndFastKernelsAgree) {
  for (bool cross : {false, true})
    for (double p : {0.0, 0.25}) {
      SCOPED_TRACE(std::string(cross ? "cross" : "self") + " p=" + std::to_string(p));
      expect_kernels_agree(cross, p);
    }
}

}  // namespace
}  // namespace attn
