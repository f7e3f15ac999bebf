// Label-smoothed cross-entropy: PyTorch values, hand values, central differences, padding,
// thread-count independence and every error path.
#include <algorithm>
#include <attn/kernels/detail/double_sums.hpp>
#include <attn/train/label_smoothed_loss.hpp>
#include <cmath>
#include <limits>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

// Generated once with /usr/bin/python3 (torch 1.13):
//   x = torch.tensor(<kLogits as [4, 5]>, dtype=torch.float64, requires_grad=True)
//   t = torch.tensor([2, 0, 4, 1])
//   loss = F.cross_entropy(x, t, ignore_index=0, label_smoothing=0.1, reduction='sum')
//   loss.backward()
//   nll = F.cross_entropy(x, t, ignore_index=0, reduction='sum')
//   print(repr(loss.item()), repr(nll.item())); print(x.grad.tolist())
const std::vector<double> kLogits = {0.5,  -1.25, 2.0, 0.0,  0.75, 1.5, 0.25, -0.5, 3.0, -2.0,
                                     -0.3, 0.8,   0.1, -1.7, 2.2,  0.0, 0.0,  0.0,  0.0, 0.0};
const std::vector<TokenId> kTargets = {2, 0, 4, 1};
constexpr double kTorchLoss = 2.874659005170972;
constexpr double kTorchNll = 2.516659005170972;
const std::vector<double> kTorchGrad = {0.11252020542860423,
                                        0.0030285586841916415,
                                        -0.3260856437316695,
                                        0.06037756762386502,
                                        0.15015931199500865,
                                        0.0,
                                        0.0,
                                        0.0,
                                        0.0,
                                        0.0,
                                        0.03578775147225981,
                                        0.14759566752533052,
                                        0.0632255454721903,
                                        -0.0062429098618118455,
                                        -0.24036605460796867,
                                        0.18000000000000002,
                                        -0.72,
                                        0.18000000000000002,
                                        0.18000000000000002,
                                        0.18000000000000002};

template <class T>
class LossTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LossTyped, Scalars);

TYPED_TEST(LossTyped, MatchesTorchCrossEntropyWithLabelSmoothing) {
  using T = TypeParam;
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  std::vector<T> values(kLogits.begin(), kLogits.end());
  auto logits = Tensor<T>::from({4, 5}, values);
  auto targets = Tensor<TokenId>::from({4}, kTargets);
  LabelSmoothedCrossEntropy<T> loss(0.1, /*pad_id=*/0);
  const LossStats s = loss.forward_backward(logits, targets, 1.0);
  EXPECT_NEAR(s.smoothed_loss, kTorchLoss, tol * 4);
  EXPECT_NEAR(s.nll, kTorchNll, tol * 4);
  EXPECT_EQ(s.tokens, 3);
  EXPECT_NEAR(s.perplexity(), std::exp(kTorchNll / 3), tol * 10);
  ASSERT_EQ(loss.dlogits().shape(), Shape({4, 5}));
  for (Index i = 0; i < 20; ++i)
    EXPECT_NEAR(loss.dlogits().data()[i], kTorchGrad[static_cast<std::size_t>(i)], tol) << i;
}

TEST(Loss, HandValues) {
  // logits {0, ln 3}: p = {1/4, 3/4}. Target 1.
  auto logits = Tensor<double>::from({1, 2}, {0.0, std::log(3.0)});
  auto targets = Tensor<TokenId>::from({1}, {1});
  LabelSmoothedCrossEntropy<double> plain(0.0, -100);
  LossStats s = plain.forward_backward(logits, targets, 1.0);
  EXPECT_NEAR(s.nll, std::log(4.0 / 3.0), 1e-15);
  EXPECT_NEAR(s.smoothed_loss, std::log(4.0 / 3.0), 1e-15);
  EXPECT_NEAR(plain.dlogits()(0, 0), 0.25, 1e-15);
  EXPECT_NEAR(plain.dlogits()(0, 1), -0.25, 1e-15);
  // eps = 0.2, V = 2: q = {0.1, 0.9}.
  LabelSmoothedCrossEntropy<double> smooth(0.2, -100);
  s = smooth.forward_backward(logits, targets, 2.0);
  EXPECT_NEAR(s.smoothed_loss, 0.1 * std::log(4.0) + 0.9 * std::log(4.0 / 3.0), 1e-15);
  EXPECT_NEAR(s.nll, std::log(4.0 / 3.0), 1e-15);
  EXPECT_NEAR(smooth.dlogits()(0, 0), 2.0 * (0.25 - 0.1), 1e-15);
  EXPECT_NEAR(smooth.dlogits()(0, 1), 2.0 * (0.75 - 0.9), 1e-15);
  // Uniform logits: every class has p = 1/V, so the loss is log V whatever the smoothing.
  auto flat = Tensor<double>::full({1, 7}, 3.5);
  EXPECT_NEAR(smooth.evaluate(flat, targets).smoothed_loss, std::log(7.0), 1e-14);
}

TEST(Loss, GradientMatchesCentralDifferences) {
  Tensor<double> logits = testing::randn({2, 3, 7}, 11);
  auto targets = Tensor<TokenId>::from({2, 3}, {3, 0, 6, 1, 0, 5});  // 0 is padding
  LabelSmoothedCrossEntropy<double> loss(0.1, 0);
  const double scale = 0.37;
  loss.forward_backward(logits, targets, scale);
  const Tensor<double> analytic = loss.dlogits().clone();
  LabelSmoothedCrossEntropy<double> probe(0.1, 0);
  auto res = testing::gradcheck({{"logits", logits}}, {analytic}, [&] {
    return scale * probe.evaluate(logits, targets).smoothed_loss;
  });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 42);
}

TEST(Loss, PaddingIsIgnored) {
  Tensor<double> logits = testing::randn({4, 6}, 3);
  auto targets = Tensor<TokenId>::from({4}, {2, 5, 5, 1});  // pad_id 5
  LabelSmoothedCrossEntropy<double> loss(0.1, 5);
  const LossStats before = loss.forward_backward(logits, targets, 1.0);
  EXPECT_EQ(before.tokens, 2);
  EXPECT_EQ(count_tokens(targets, 5), 2);
  for (Index j = 0; j < 6; ++j) {
    EXPECT_EQ(loss.dlogits()(1, j), 0.0);
    EXPECT_EQ(loss.dlogits()(2, j), 0.0);
  }
  // Changing a padding row changes nothing; the same rows alone give the same sums.
  for (Index j = 0; j < 6; ++j) logits(2, j) += 100.0 * static_cast<double>(j);
  const LossStats after = loss.evaluate(logits, targets);
  EXPECT_EQ(after.smoothed_loss, before.smoothed_loss);
  Tensor<double> kept({2, 6});
  for (Index j = 0; j < 6; ++j) {
    kept(0, j) = logits(0, j);
    kept(1, j) = logits(3, j);
  }
  const LossStats alone = loss.evaluate(kept, Tensor<TokenId>::from({2}, {2, 1}));
  EXPECT_NEAR(alone.smoothed_loss, before.smoothed_loss, 1e-14);
  EXPECT_NEAR(alone.nll, before.nll, 1e-14);
  // All padding: zero loss, zero tokens, no gradient, perplexity undefined.
  const LossStats none = loss.evaluate(logits, Tensor<TokenId>::full({4}, 5));
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.smoothed_loss, 0.0);
  EXPECT_TRUE(std::isnan(none.perplexity()));
}

TEST(Loss, EvaluateEqualsForwardBackwardAndStatsAccumulate) {
  Tensor<float> logits(Shape{3, 9});
  Rng rng(4);
  fill_normal(logits, rng, 0, 2);
  auto targets = Tensor<TokenId>::from({3}, {8, 0, 4});
  LabelSmoothedCrossEntropy<float> loss(0.1, -1);
  Tensor<float> d;
  const LossStats a = loss.forward_backward(logits, targets, 0.5, d);
  const LossStats b = loss.evaluate(logits, targets);
  EXPECT_EQ(d.shape(), Shape({3, 9}));
  EXPECT_EQ(a.smoothed_loss, b.smoothed_loss);
  EXPECT_EQ(a.nll, b.nll);
  LossStats sum = a;
  sum += b;
  EXPECT_EQ(sum.tokens, 6);
  EXPECT_DOUBLE_EQ(sum.nll, 2 * a.nll);
  EXPECT_DOUBLE_EQ(sum.perplexity(), std::exp(a.nll / 3));
  EXPECT_DOUBLE_EQ(sum.mean_loss(), a.smoothed_loss / 3);
}

// In place, the gradient overwrites the logits and equals the out-of-place gradient bit for bit,
// padding rows (target 0) and the target's own logit included.
TEST(Loss, InPlaceGradientEqualsTheOutOfPlaceOne) {
  Tensor<float> logits(Shape{2, 32, 701});
  Rng rng(9);
  fill_normal(logits, rng, 0, 3);
  Tensor<TokenId> targets(Shape{2, 32});
  for (Index i = 0; i < 64; ++i) targets.data()[i] = static_cast<TokenId>((i * 53) % 701);
  LabelSmoothedCrossEntropy<float> loss(0.1, 0);
  Tensor<float> d;
  const LossStats out = loss.forward_backward(logits, targets, 0.01, d, 7);
  Tensor<float> in_place = logits.clone();
  const LossStats in = loss.forward_backward_in_place(in_place, targets, 0.01, 7);
  EXPECT_EQ(out.smoothed_loss, in.smoothed_loss);
  EXPECT_EQ(out.nll, in.nll);
  EXPECT_EQ(out.tokens, in.tokens);
  EXPECT_EQ(in_place.shape(), d.shape());
  EXPECT_EQ(std::memcmp(d.data(), in_place.data(), sizeof(float) * 64 * 701), 0);
}

// A dlogits sharing part of the logits' storage overwrote rows still to be read: a wrong loss in
// silence (session 53's audit). The very same elements are the in-place gradient; rows of one
// buffer that do not overlap are tensors of their own.
TEST(Loss, ADlogitsOverlappingTheLogitsElsewhereIsRefused) {
  const Index N = 8, V = 16;
  Tensor<float> buffer(Shape{2 * N + 1, V});
  Rng rng(3);
  fill_normal(buffer, rng, 0, 3);
  Tensor<TokenId> targets(Shape{N});
  for (Index i = 0; i < N; ++i) targets.data()[i] = static_cast<TokenId>(i + 1);
  LabelSmoothedCrossEntropy<float> loss(0.1, 0);
  const Tensor<float> logits = buffer.slice(1, N + 1);  // rows 1..N of the buffer
  Tensor<float> reference;
  const LossStats want = loss.forward_backward(logits.clone(), targets, 1.0, reference);
  Tensor<float> from_start = buffer;  // row 0 on: resize() keeps the storage, one row before
  EXPECT_EQ(error_of<ConfigError>([&] { loss.forward_backward(logits, targets, 1.0, from_start); }),
            "LabelSmoothedCrossEntropy: dlogits shares part of the storage of logits [8, 16] (it "
            "starts 16 elements before them): pass the logits themselves for an in-place "
            "gradient, or a tensor of its own");
  Tensor<float> same = logits.clone();  // the in-place gradient, through this overload
  const LossStats in_place = loss.forward_backward(same, targets, 1.0, same);
  EXPECT_EQ(in_place.smoothed_loss, want.smoothed_loss);
  EXPECT_EQ(std::memcmp(same.data(), reference.data(), sizeof(float) * N * V), 0);
  // The loss of rows N+1.. of the buffer, its gradient into rows 0..N-1 (resize() keeps a handle
  // at offset 0): one storage, no element both read and written.
  Tensor<float> head = buffer;
  const Tensor<float> late = buffer.slice(N + 1, 2 * N + 1);
  Tensor<float> late_reference;
  const LossStats late_want = loss.forward_backward(late.clone(), targets, 1.0, late_reference);
  const LossStats apart = loss.forward_backward(late, targets, 1.0, head);
  EXPECT_TRUE(head.shares_storage(buffer));
  EXPECT_EQ(apart.smoothed_loss, late_want.smoothed_loss);
  EXPECT_EQ(std::memcmp(head.data(), late_reference.data(), sizeof(float) * N * V), 0);
}

TEST(Loss, ResultDoesNotDependOnThreadCount) {
  Tensor<float> logits(Shape{64, 701});  // above the parallel threshold
  Rng rng(8);
  fill_normal(logits, rng, 0, 3);
  Tensor<TokenId> targets(Shape{64});
  for (Index i = 0; i < 64; ++i) targets(i) = static_cast<TokenId>((i * 37) % 701);
  LabelSmoothedCrossEntropy<float> loss(0.1, 0);
  const int saved = num_threads();
  set_num_threads(1);
  Tensor<float> d1, d2;
  const LossStats s1 = loss.forward_backward(logits, targets, 0.01, d1);
  set_num_threads(2);
  const LossStats s2 = loss.forward_backward(logits, targets, 0.01, d2);
  set_num_threads(saved);
  EXPECT_EQ(s1.smoothed_loss, s2.smoothed_loss);
  EXPECT_EQ(s1.nll, s2.nll);
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), sizeof(float) * 64 * 701), 0);
}

// kernels/detail/double_sums.hpp, the cross-entropy's row sum and maximum and the gradient norm's
// sum of squares: every path adds in the generic loop's order, so all give its bits, and that
// order is within a few ulp of the exact sum. Rows of every tail length, unaligned, and rows of
// negative numbers only, whose maximum the zeros past a row's end must not replace.
TEST(DoubleSums, EveryPathGivesTheGenericLoopsBits) {
  using namespace kernels::detail;
  Rng rng(11);
  for (const Index n : {0, 1, 7, 15, 16, 17, 31, 33, 47, 64, 100, 1000, 8000, 8001}) {
    for (const double mean : {0.0, -50.0}) {
      Tensor<float> t(Shape{n + 1});
      fill_normal(t, rng, mean, 3.0);
      const float* x = t.data() + 1;
      const SumAndMax want = sum_and_max_generic(x, n);
      const double want_squares = sum_of_squares_generic(x, n);
      long double exact = 0, exact_squares = 0, magnitude = 0;
      float max = -std::numeric_limits<float>::infinity();
      for (Index j = 0; j < n; ++j) {
        exact += x[j];
        exact_squares += static_cast<long double>(x[j]) * x[j];
        magnitude += std::fabs(x[j]);
        max = std::max(max, x[j]);
      }
      EXPECT_NEAR(want.sum, static_cast<double>(exact), 1e-13 * static_cast<double>(magnitude));
      EXPECT_NEAR(want_squares, static_cast<double>(exact_squares),
                  1e-13 * static_cast<double>(exact_squares));
      EXPECT_EQ(want.max, max) << n;
      const SumAndMax got = sum_and_max(x, n);  // the fastest path this CPU has
      EXPECT_EQ(got.sum, want.sum) << n;
      EXPECT_EQ(got.max, want.max) << n;
      EXPECT_EQ(sum_of_squares(x, n), want_squares) << n;
#if defined(ATTN_HAVE_AVX512)
      if (cpu_has_avx2_fma()) {  // the AVX2 path, also on a CPU with AVX-512
        EXPECT_EQ(avx2::sum_and_max(x, n).sum, want.sum) << n;
        EXPECT_EQ(avx2::sum_and_max(x, n).max, want.max) << n;
        EXPECT_EQ(avx2::sum_of_squares(x, n), want_squares) << n;
      }
#endif
    }
  }
}

TEST(Loss, TargetOutsideVocabularyIsIndexError) {
  Tensor<double> logits({2, 3, 10});
  auto targets = Tensor<TokenId>::from({2, 3}, {1, 2, 3, 4, 12, 0});
  LabelSmoothedCrossEntropy<double> loss(0.1, 0);
  EXPECT_THROW(loss.forward_backward(logits, targets, 1.0), IndexError);
  const std::string msg = error_of([&] { loss.forward_backward(logits, targets, 1.0, 77); });
  EXPECT_TRUE(contains(msg, "target id 12")) << msg;
  EXPECT_TRUE(contains(msg, "position 4")) << msg;
  EXPECT_TRUE(contains(msg, "[0, 10)")) << msg;
  EXPECT_TRUE(contains(msg, "step 77")) << msg;
  targets(1, 1) = -3;  // negative and not the padding id
  EXPECT_TRUE(contains(error_of([&] { loss.evaluate(logits, targets); }), "target id -3")) << msg;
}

TEST(Loss, NonFiniteLogitsAreNumericErrorNamingTheStep) {
  Tensor<double> logits = testing::randn({3, 4}, 1);
  auto targets = Tensor<TokenId>::from({3}, {1, 2, 3});
  LabelSmoothedCrossEntropy<double> loss(0.1, 0);
  logits(2, 1) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(loss.forward_backward(logits, targets, 1.0), NumericError);
  std::string msg = error_of([&] { loss.forward_backward(logits, targets, 1.0, 1234); });
  EXPECT_TRUE(contains(msg, "row 2")) << msg;
  EXPECT_TRUE(contains(msg, "at step 1234")) << msg;
  logits(2, 1) = 0;
  logits(0, 3) = -std::numeric_limits<double>::infinity();
  msg = error_of([&] { loss.evaluate(logits, targets, 5); });
  EXPECT_TRUE(contains(msg, "row 0")) << msg;
  EXPECT_TRUE(contains(msg, "at step 5")) << msg;
  // A NaN in a padding row is still a NaN in the model.
  logits(0, 3) = 0;
  targets(1) = 0;
  logits(1, 0) = std::numeric_limits<double>::infinity();
  EXPECT_THROW(loss.evaluate(logits, targets), NumericError);
  logits(1, 0) = 0;
  EXPECT_NO_THROW(loss.evaluate(logits, targets));
  EXPECT_THROW(loss.forward_backward(logits, targets, std::nan("")), NumericError);
}

TEST(Loss, CheckFiniteNamesTheStep) {
  LossStats s;
  s.smoothed_loss = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(error_of([&] { check_finite(s, 1234); }), "loss is NaN at step 1234");
  s.smoothed_loss = 1.0;
  s.nll = std::numeric_limits<double>::infinity();
  EXPECT_EQ(error_of([&] { check_finite(s, 7); }), "loss is Inf at step 7");
  s.nll = 2.0;
  EXPECT_NO_THROW(check_finite(s, 7));
}

TEST(Loss, RejectsBadShapesAndConfig) {
  LabelSmoothedCrossEntropy<float> loss(0.1, 0);
  Tensor<float> logits({2, 3, 5});
  std::string msg = error_of([&] { loss.evaluate(logits, Tensor<TokenId>({3, 2})); });
  EXPECT_TRUE(contains(msg, "targets of shape [2, 3], got [3, 2]")) << msg;
  EXPECT_THROW(loss.evaluate(logits, Tensor<TokenId>({3, 2})), ShapeError);
  msg = error_of([&] { loss.evaluate(Tensor<float>({5}), Tensor<TokenId>({5})); });
  EXPECT_TRUE(contains(msg, "rank >= 2, got [5]")) << msg;
  msg = error_of([] { LabelSmoothedCrossEntropy<float>(1.0, 0); });
  EXPECT_TRUE(contains(msg, "[0, 1), got 1")) << msg;
  EXPECT_THROW(LabelSmoothedCrossEntropy<double>(-0.1, 0), ConfigError);
}

}  // namespace
}  // namespace attn
