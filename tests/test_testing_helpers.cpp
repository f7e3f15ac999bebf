// The comparison helpers every other test relies on fail on what they exist to catch. A NaN
// slipped through all of them until session 45: std::max and Eigen's maxCoeff drop it, so an
// all-NaN gradient passed every gradient check and PyTorch comparison.
#include <limits>
#include <vector>

#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(TestingHelpers, GradcheckPassesTheTrueGradientAndFailsAWrongOne) {
  Tensor<double> x = testing::randn({6}, 1);
  const auto loss = [&] { return testing::dot(x, x) / 2; };  // gradient: x
  EXPECT_LT(testing::gradcheck({{"x", x}}, {x.clone()}, loss).max_rel_error, 1e-6);
  Tensor<double> off = x.clone();
  off.data()[4] += 1e-3;
  EXPECT_GT(testing::gradcheck({{"x", x}}, {off}, loss).max_rel_error, 1e-6);
}

TEST(TestingHelpers, GradcheckFailsANanOrInfiniteGradientAnywhere) {
  Tensor<double> x = testing::randn({6}, 2);
  const auto loss = [&] { return testing::dot(x, x) / 2; };
  for (const double bad : {kNaN, kInf, -kInf})
    for (const Index at : {Index(0), Index(3), Index(5)}) {
      SCOPED_TRACE(::testing::Message() << bad << " at " << at);
      Tensor<double> analytic = x.clone();
      analytic.data()[at] = bad;
      const auto res = testing::gradcheck({{"x", x}}, {analytic}, loss);
      EXPECT_EQ(res.max_rel_error, kInf);
      EXPECT_NE(res.worst.find("x[" + std::to_string(at) + "]"), std::string::npos) << res.worst;
    }
  // A loss that is NaN makes every numeric gradient NaN.
  const auto nan_loss = [&] { return kNaN * x.data()[0]; };
  EXPECT_EQ(testing::gradcheck({{"x", x}}, {x.clone()}, nan_loss).max_rel_error, kInf);
  // The worst tensor decides: a good one checked after a NaN one does not hide it.
  Tensor<double> y = testing::randn({3}, 3);
  const auto both = [&] { return (testing::dot(x, x) + testing::dot(y, y)) / 2; };
  Tensor<double> nan_x = x.clone();
  nan_x.data()[1] = kNaN;
  EXPECT_EQ(testing::gradcheck({{"x", x}, {"y", y}}, {nan_x, y.clone()}, both).max_rel_error, kInf);
}

TEST(TestingHelpers, MaxAbsDiffFailsANanOrInfiniteElementAnywhere) {
  const Tensor<double> a = testing::randn({2, 5}, 4);
  EXPECT_EQ(testing::max_abs_diff(a, a), 0.0);
  for (const double bad : {kNaN, kInf})
    for (const Index at : {Index(0), Index(7)}) {
      Tensor<double> b = a.clone();
      b.data()[at] = bad;
      EXPECT_EQ(testing::max_abs_diff(a, b), kInf) << bad << " at " << at;
      EXPECT_EQ(testing::max_abs_diff(b, a), kInf) << bad << " at " << at;
    }
  EXPECT_EQ(testing::max_abs_diff(a, testing::randn({5, 2}, 4)), kInf);  // another shape
}

}  // namespace
}  // namespace attn
