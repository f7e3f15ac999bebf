// Attention's softmax rows: the AVX-512 and AVX2 rows (kernels/detail/softmax_avx512.hpp,
// softmax_avx2.hpp) against the generic Eigen path (kernels/softmax.hpp) and against each other,
// and their exp against std::exp in double. Each kernel's tests skip on a CPU that lacks it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <attn/kernels/attention.hpp>
#include <attn/kernels/softmax.hpp>
#include <attn/random.hpp>

#if defined(ATTN_HAVE_AVX512)

namespace {

using attn::Index;
namespace kd = attn::kernels::detail;
constexpr float kInf = std::numeric_limits<float>::infinity();

ATTN_TARGET_AVX512 float exp_avx512(float x) {
  alignas(64) float v[16];
  _mm512_store_ps(v, kd::exp16_flushed(_mm512_set1_ps(x)));
  return v[0];
}

ATTN_TARGET_AVX2 float exp_avx2(float x) {
  alignas(32) float v[8];
  _mm256_store_ps(v, kd::avx2::exp8_flushed(_mm256_set1_ps(x)));
  return v[0];
}

// The two row kernels behind one face, for the typed tests.
struct Avx512Rows {
  static bool available() { return kd::cpu_has_avx512(); }
  static float exp(float x) { return exp_avx512(x); }
  static float row(float* r, Index n, float scale, const float* add, const float* pad) {
    return kd::softmax_row_avx512(r, n, scale, add, pad);
  }
  static void probabilities(float* r, Index n, float scale, const float* add, const float* pad,
                            float lse) {
    kd::probabilities_avx512(r, n, scale, add, pad, lse);
  }
};
struct Avx2Rows {
  static bool available() { return kd::cpu_has_avx2_fma(); }
  static float exp(float x) { return exp_avx2(x); }
  static float row(float* r, Index n, float scale, const float* add, const float* pad) {
    return kd::avx2::softmax_row(r, n, scale, add, pad);
  }
  static void probabilities(float* r, Index n, float scale, const float* add, const float* pad,
                            float lse) {
    kd::avx2::probabilities(r, n, scale, add, pad, lse);
  }
};

struct RowsName {
  template <class K>
  static std::string GetName(int) {
    return std::is_same_v<K, Avx512Rows> ? "avx512" : "avx2";
  }
};

template <class K>
class SoftmaxRows : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!K::available()) GTEST_SKIP() << "this CPU lacks the kernel's instructions; never called";
  }
};
using RowKernels = ::testing::Types<Avx512Rows, Avx2Rows>;
TYPED_TEST_SUITE(SoftmaxRows, RowKernels, RowsName);

// The generic path of attention.hpp: scale and mask, then softmax_row_forward.
float reference_row(std::vector<float>& row, float scale, const float* additive, const float* pad) {
  const Index n = static_cast<Index>(row.size());
  kd::scale_and_mask(row.data(), n, scale, additive, pad);
  return attn::kernels::softmax_row_forward(row.data(), n);
}

// A row of n logits with a blocked key every fifth in `additive` and the last key padded.
struct MaskedRow {
  std::vector<float> x, additive, pad;
  MaskedRow(Index n, attn::Rng& rng)
      : x(static_cast<std::size_t>(n)), additive(x.size()), pad(x.size()) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(8 * rng.uniform() - 4);
      additive[i] = i % 5 == 3 ? -kInf : static_cast<float>(rng.uniform());
      pad[i] = i + 1 == x.size() && n > 1 ? -kInf : 0.0f;
    }
  }
  const float* add(int masks) const { return masks & 1 ? additive.data() : nullptr; }
  const float* pd(int masks) const { return masks & 2 ? pad.data() : nullptr; }
};

}  // namespace

TYPED_TEST(SoftmaxRows, ExpIsWithinTwoUlpOfDoubleExp) {
  const auto exp_one = [](float x) { return TypeParam::exp(x); };
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

TYPED_TEST(SoftmaxRows, RowsMatchTheEigenPathWithEveryMask) {
  attn::Rng rng(7);
  int compared = 0;
  for (Index n : {1, 7, 8, 9, 16, 17, 24, 64, 100}) {
    const MaskedRow x_row(n, rng);
    for (int masks = 0; masks < 4; ++masks) {
      const float* add = x_row.add(masks);
      const float* pd = x_row.pd(masks);
      std::vector<float> want = x_row.x, got = x_row.x;
      const float want_lse = reference_row(want, 0.125f, add, pd);
      const float got_lse = TypeParam::row(got.data(), n, 0.125f, add, pd);
      EXPECT_NEAR(got_lse, want_lse, 1e-6f * std::max(1.0f, std::abs(want_lse)));
      for (Index i = 0; i < n; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        if (want[k] == 0.0f)
          EXPECT_EQ(got[k], 0.0f) << "blocked key " << i << " of " << n;
        else
          EXPECT_NEAR(got[k], want[k], 1e-6f * want[k]) << "key " << i << " of " << n;
      }
      // Backward recomputes the same probabilities from the log-sum-exp.
      std::vector<float> again = x_row.x;
      TypeParam::probabilities(again.data(), n, 0.125f, add, pd, got_lse);
      for (Index i = 0; i < n; ++i) {
        const std::size_t k = static_cast<std::size_t>(i);
        EXPECT_NEAR(again[k], got[k], 1e-6f * got[k] + 1e-30f) << "key " << i << " of " << n;
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 36);
}

// A NaN logit anywhere (here in a row shorter than a vector, where a max reduction would drop it)
// makes the row and its log-sum-exp NaN: a NaN weight must reach the loss, which then stops
// training, instead of reading as a blocked row.
TYPED_TEST(SoftmaxRows, NanLogitMakesTheRowNan) {
  for (Index n : {1, 5, 9, 16, 21, 64})
    for (Index at : {Index(0), n - 1}) {
      std::vector<float> row(static_cast<std::size_t>(n), 0.5f);
      row[static_cast<std::size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(TypeParam::row(row.data(), n, 1.0f, nullptr, nullptr)))
          << "n=" << n << " NaN at " << at;
      for (float v : row) EXPECT_TRUE(std::isnan(v)) << "n=" << n << " NaN at " << at;
    }
}

TYPED_TEST(SoftmaxRows, FullyBlockedRowIsZeroWithInfiniteLogSumExp) {
  std::vector<float> row(20, 1.5f), pad(20, -kInf);
  EXPECT_EQ(TypeParam::row(row.data(), 20, 1.0f, nullptr, pad.data()), kInf);
  for (float v : row) EXPECT_EQ(v, 0.0f);
  std::vector<float> again(20, 1.5f);
  TypeParam::probabilities(again.data(), 20, 1.0f, nullptr, nullptr, kInf);
  for (float v : again) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(TypeParam::row(row.data(), 0, 1.0f, nullptr, nullptr), kInf);
}

// On a CPU with both, the AVX2 rows give the AVX-512 rows' bits (softmax_avx2.hpp says why), so
// a model trains to the same weights on either kind of machine.
TEST(SoftmaxRows, Avx512AndAvx2RowsGiveTheSameBits) {
  if (!Avx512Rows::available() || !Avx2Rows::available())
    GTEST_SKIP() << "needs a CPU with both AVX-512 and AVX2";
  attn::Rng rng(11);
  for (Index n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100})
    for (int masks = 0; masks < 4; ++masks) {
      const MaskedRow x_row(n, rng);
      const float *add = x_row.add(masks), *pd = x_row.pd(masks);
      std::vector<float> a = x_row.x, b = x_row.x;
      const float lse_a = Avx512Rows::row(a.data(), n, 0.3f, add, pd);
      const float lse_b = Avx2Rows::row(b.data(), n, 0.3f, add, pd);
      EXPECT_EQ(std::memcmp(&lse_a, &lse_b, sizeof(float)), 0) << "n=" << n;
      EXPECT_EQ(a, b) << "n=" << n << " masks=" << masks;
      Avx512Rows::probabilities(a.data(), n, 0.3f, add, pd, lse_a - 0.5f);
      Avx2Rows::probabilities(b.data(), n, 0.3f, add, pd, lse_a - 0.5f);
      EXPECT_EQ(a, b) << "n=" << n << " masks=" << masks;
    }
  for (float x = -110.0f; x <= 90.0f; x += 0.37f) {
    const float ea = Avx512Rows::exp(x), eb = Avx2Rows::exp(x);
    EXPECT_EQ(std::memcmp(&ea, &eb, sizeof(float)), 0) << "exp(" << x << ")";
  }
}

#endif  // ATTN_HAVE_AVX512
