// Attention's softmax rows: the AVX-512 rows (kernels/detail/softmax_avx512.hpp) against the
// generic Eigen path (kernels/softmax.hpp), and exp16 against std::exp in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include <attn/kernels/attention.hpp>
#include <attn/kernels/softmax.hpp>
#include <attn/random.hpp>

#if defined(ATTN_HAVE_AVX512)

namespace {

using attn::Index;
namespace kd = attn::kernels::detail;
constexpr float kInf = std::numeric_limits<float>::infinity();

ATTN_TARGET_AVX512 float exp_one(float x) {
  alignas(64) float v[16];
  _mm512_store_ps(v, kd::exp16_flushed(_mm512_set1_ps(x)));
  return v[0];
}

// The generic path of attention.hpp: scale and mask, then softmax_row_forward.
float reference_row(std::vector<float>& row, float scale, const float* additive, const float* pad) {
  const Index n = static_cast<Index>(row.size());
  kd::scale_and_mask(row.data(), n, scale, additive, pad);
  return attn::kernels::softmax_row_forward(row.data(), n);
}

}  // namespace

TEST(SoftmaxAvx512, ExpIsWithinTwoUlpOfDoubleExp) {
  if (!kd::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512; the kernel is never called";
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    const float got = exp_one(x);
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::abs(got - want) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_one(-kInf), 0.0f);
  EXPECT_EQ(exp_one(-90.0f), 0.0f);  // below the smallest normal float: flushed
  EXPECT_EQ(exp_one(0.0f), 1.0f);
  EXPECT_GT(exp_one(100.0f), 3e38f);  // saturates near the largest float
  EXPECT_TRUE(std::isnan(exp_one(std::numeric_limits<float>::quiet_NaN())));
}

TEST(SoftmaxAvx512, RowsMatchTheEigenPathWithEveryMask) {
  if (!kd::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512; the kernel is never called";
  attn::Rng rng(7);
  int compared = 0;
  for (Index n : {1, 7, 16, 17, 64, 100}) {
    std::vector<float> x(static_cast<std::size_t>(n)), additive(x.size()), pad(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(8 * rng.uniform() - 4);
      additive[i] = i % 5 == 3 ? -kInf : static_cast<float>(rng.uniform());
      pad[i] = i + 1 == x.size() && n > 1 ? -kInf : 0.0f;
    }
    for (int masks = 0; masks < 4; ++masks) {
      const float* add = masks & 1 ? additive.data() : nullptr;
      const float* pd = masks & 2 ? pad.data() : nullptr;
      std::vector<float> want = x, got = x;
      const float want_lse = reference_row(want, 0.125f, add, pd);
      const float got_lse = kd::softmax_row_avx512(got.data(), n, 0.125f, add, pd);
      EXPECT_NEAR(got_lse, want_lse, 1e-6f * std::max(1.0f, std::abs(want_lse)));
      for (Index i = 0; i < n; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        if (want[k] == 0.0f)
          EXPECT_EQ(got[k], 0.0f) << "blocked key " << i << " of " << n;
        else
          EXPECT_NEAR(got[k], want[k], 1e-6f * want[k]) << "key " << i << " of " << n;
      }
      // Backward recomputes the same probabilities from the log-sum-exp.
      std::vector<float> again = x;
      kd::probabilities_avx512(again.data(), n, 0.125f, add, pd, got_lse);
      for (Index i = 0; i < n; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        EXPECT_NEAR(again[k], got[k], 1e-6f * got[k] + 1e-30f) << "key " << i << " of " << n;
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 24);
}

// A NaN logit anywhere (here in a row shorter than a vector, where a max reduction would drop it)
// makes the row and its log-sum-exp NaN: a NaN weight must reach the loss, which then stops
// training, instead of reading as a blocked row.
TEST(SoftmaxAvx512, NanLogitMakesTheRowNan) {
  if (!kd::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512; the kernel is never called";
  for (Index n : {1, 5, 16, 21, 64})
    for (Index at : {Index(0), n - 1}) {
      std::vector<float> row(static_cast<std::size_t>(n), 0.5f);
      row[static_cast<std::size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(kd::softmax_row_avx512(row.data(), n, 1.0f, nullptr, nullptr)))
          << "n=" << n << " NaN at " << at;
      for (float v : row) EXPECT_TRUE(std::isnan(v)) << "n=" << n << " NaN at " << at;
    }
}

TEST(SoftmaxAvx512, FullyBlockedRowIsZeroWithInfiniteLogSumExp) {
  if (!kd::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512; the kernel is never called";
  std::vector<float> row(20, 1.5f), pad(20, -kInf);
  EXPECT_EQ(kd::softmax_row_avx512(row.data(), 20, 1.0f, nullptr, pad.data()), kInf);
  for (float v : row) EXPECT_EQ(v, 0.0f);
  std::vector<float> again(20, 1.5f);
  kd::probabilities_avx512(again.data(), 20, 1.0f, nullptr, nullptr, kInf);
  for (float v : again) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(kd::softmax_row_avx512(row.data(), 0, 1.0f, nullptr, nullptr), kInf);
}

#endif  // ATTN_HAVE_AVX512
