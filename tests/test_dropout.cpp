// Dropout: identity in eval mode and at p = 0, the drop rate and scaling, masks as a function of
// (seed, counter), thread-count independence, gradients, configuration errors.
#include <attn/kernels/gemm.hpp>
#include <attn/nn/dropout.hpp>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(Dropout, EvalModeIsExactIdentity) {
  Dropout<float> drop(0.5);
  drop.eval();
  Tensor<float> x({4, 8});
  Rng rng(1);
  fill_normal(x, rng, 0, 1);
  const std::uint64_t counter_before = drop.random_state()->counter;
  const Tensor<float>& y = drop.forward(x);
  EXPECT_TRUE(y.same_data(x));
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(drop.random_state()->counter, counter_before);  // eval draws nothing
  Tensor<float> dy({4, 8});
  fill_normal(dy, rng, 0, 1);
  const Tensor<float>& dx = drop.backward(dy);
  EXPECT_TRUE(dx.same_data(dy));
}

TEST(Dropout, ZeroProbabilityIsIdentityInTraining) {
  Dropout<double> drop(0.0);
  ASSERT_TRUE(drop.is_training());
  Tensor<double> x = testing::randn({3, 5}, 2);
  const Tensor<double> copy = x.clone();
  const Tensor<double>& y = drop.forward(x);
  for (Index i = 0; i < x.numel(); ++i) EXPECT_EQ(y.data()[i], copy.data()[i]);
  EXPECT_EQ(drop.random_state()->counter, 0u);
  Tensor<double> dy = testing::randn({3, 5}, 3);
  EXPECT_TRUE(drop.backward(dy).same_data(dy));
}

TEST(Dropout, IdentityNeverAliasesTheTrainingOutputBuffer) {
  // After an eval-mode pass, a training pass must write to its own buffer, not into x.
  Dropout<double> drop(0.5);
  Tensor<double> x = Tensor<double>::full({2, 64}, 1.0);
  drop.eval();
  drop.forward(x);
  drop.train();
  const Tensor<double>& y = drop.forward(x);
  EXPECT_FALSE(y.same_data(x));
  for (double v : x) EXPECT_EQ(v, 1.0);
}

TEST(Dropout, DropsAboutPAndScalesKeptByInverseKeepProbability) {
  const double p = 0.3;
  Dropout<float> drop(p);
  EXPECT_EQ(drop.p(), p);
  const Index n = 200000;
  Tensor<float> x = Tensor<float>::full({n}, 2.0f);
  const Tensor<float>& y = drop.forward(x);
  Index dropped = 0;
  const float kept_value = 2.0f * static_cast<float>(1.0 / (1.0 - p));
  for (float v : y) {
    if (v == 0.0f)
      ++dropped;
    else
      ASSERT_EQ(v, kept_value);
  }
  // Binomial std of the fraction is sqrt(p(1-p)/n) ~ 0.001; allow 5 of them.
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.005);
}

TEST(Dropout, MaskIsAFunctionOfSeedAndCounter) {
  auto state = std::make_shared<RandomState>();
  state->seed = 42;
  Dropout<double> a(0.5), b(0.5);
  a.set_random_state(state);
  EXPECT_EQ(a.random_state(), state);
  Tensor<double> x = Tensor<double>::full({256}, 1.0);

  state->counter = 7;
  const Tensor<double> first = a.forward(x).clone();
  EXPECT_EQ(state->counter, 8u);  // one key per call
  const Tensor<double> second = a.forward(x).clone();
  EXPECT_EQ(state->counter, 9u);

  // Another Dropout with its own state at the same (seed, counter) draws the same mask.
  b.random_state()->seed = 42;
  b.random_state()->counter = 7;
  const Tensor<double>& again = b.forward(x);
  for (Index i = 0; i < x.numel(); ++i) ASSERT_EQ(again.data()[i], first.data()[i]) << i;

  // Consecutive calls and another seed give other masks.
  Index differ = 0;
  for (Index i = 0; i < x.numel(); ++i) differ += first.data()[i] != second.data()[i];
  EXPECT_GT(differ, 50);
  b.random_state()->seed = 43;
  b.random_state()->counter = 7;
  const Tensor<double>& other_seed = b.forward(x);
  differ = 0;
  for (Index i = 0; i < x.numel(); ++i) differ += first.data()[i] != other_seed.data()[i];
  EXPECT_GT(differ, 50);
}

TEST(Dropout, ResultIsIndependentOfThreadCount) {
  Dropout<float> drop(0.1);
  const Index n = 3 * 32768 + 17;  // above the parallel threshold, not a multiple of 2
  Tensor<float> x({n}), dy({n});
  Rng rng(4);
  fill_normal(x, rng, 0, 1);
  fill_normal(dy, rng, 0, 1);
  const int saved = num_threads();
  std::vector<Tensor<float>> ys, dxs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    drop.random_state()->counter = 0;
    ys.push_back(drop.forward(x).clone());
    dxs.push_back(drop.backward(dy).clone());
  }
  set_num_threads(saved);
  for (Index i = 0; i < n; ++i) {
    ASSERT_EQ(ys[0].data()[i], ys[1].data()[i]) << i;
    ASSERT_EQ(dxs[0].data()[i], dxs[1].data()[i]) << i;
  }
}

TEST(Dropout, BackwardReusesTheForwardMask) {
  Dropout<double> drop(0.5);
  Tensor<double> x = Tensor<double>::full({500}, 3.0);
  const Tensor<double> y = drop.forward(x).clone();
  drop.forward(x);  // a later call draws a new key; backward follows the LAST forward
  const Tensor<double> y2 = drop.forward(x).clone();
  Tensor<double> dy = Tensor<double>::full({500}, 1.0);
  const Tensor<double>& dx = drop.backward(dy);
  Index differ = 0;
  for (Index i = 0; i < 500; ++i) {
    EXPECT_EQ(dx.data()[i], y2.data()[i] / 3.0);
    differ += y.data()[i] != y2.data()[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(Dropout, KernelMatchesNaiveReference) {
  const Index n = 1000;
  const double p = 0.25;
  const std::uint64_t key = 0x1234567ULL;
  Tensor<double> x = testing::randn({n}, 5), y({n}), dx({n});
  kernels::dropout_forward(y.data(), x.data(), n, p, key);
  kernels::dropout_backward(dx.data(), x.data(), n, p, key);
  for (Index i = 0; i < n; ++i) {
    const bool drop = uniform_at(key, static_cast<std::uint64_t>(i)) < p;
    const double expected = drop ? 0.0 : x.data()[i] / (1 - p);
    EXPECT_DOUBLE_EQ(y.data()[i], expected);
    EXPECT_DOUBLE_EQ(dx.data()[i], expected);
  }
}

// The float kernel hashes eight elements at a time where the CPU has AVX2; its mask and output
// must be bitwise those of the scalar loop, at every length (vector edges, chunk edges), for drop
// rates whose threshold p * 2^32 is and is not an integer, and in place.
TEST(Dropout, VectorKernelIsBitwiseTheScalarLoop) {
  const std::uint64_t key = 0x9abcdef012345ULL;
  for (const Index n : {Index(1), Index(7), Index(8), Index(9), Index(15), Index(16), Index(17),
                        Index(4095), Index(4097), Index(100003)}) {
    for (const double p : {0.0, 0.1, 0.25, 0.5, 0.3333333333333333, 0.999}) {
      Tensor<float> x({n});
      Rng rng(7);
      fill_normal(x, rng, 0, 1);
      Tensor<float> fast({n}), reference({n});
      kernels::detail::apply_dropout_mask(fast.data(), x.data(), n, p, key, true);
      kernels::detail::apply_dropout_mask(reference.data(), x.data(), n, p, key, false);
      Index dropped = 0;
      for (Index i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(&fast.data()[i], &reference.data()[i], sizeof(float)), 0)
            << "n=" << n << " p=" << p << " i=" << i;
        dropped += reference.data()[i] == 0.0f;
      }
      if (n > 4096) {
        EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(n), p, 0.03) << n;
      }
      kernels::detail::apply_dropout_mask(x.data(), x.data(), n, p, key, true);  // in place
      for (Index i = 0; i < n; ++i) ASSERT_EQ(x.data()[i], reference.data()[i]) << i;
    }
  }
}

// Spans that start at an odd element (the high half of a pair's draw: rows of a block, attention
// rows) and drop rates within 2^-32 of 1 (every element dropped) take the scalar loop's bits too.
TEST(Dropout, VectorKernelSpansFromAnyElementAreTheScalarLoop) {
  const std::uint64_t key = 0x5eed5eed1234ULL;
  const Index n = 61;
  Tensor<float> x({n});
  Rng rng(3);
  fill_normal(x, rng, 0, 1);
  for (const std::uint64_t first : {0ULL, 1ULL, 2ULL, 7ULL, (1ULL << 33) + 5})
    for (const double p : {0.1, 0.5, 1.0 - 0x1.0p-32, 1.0 - 0x1.0p-34}) {
      for (const Index len : {Index(0), Index(1), Index(2), Index(9), n}) {
        Tensor<float> fast({n}), reference({n});
        kernels::detail::dropout_mask_span(fast.data(), x.data(), len, first, key, p, true);
        kernels::detail::dropout_mask_span(reference.data(), x.data(), len, first, key, p, false);
        Tensor<float> in_place = x.clone();  // as attention rows and dropout_block run it
        kernels::detail::dropout_mask_span(in_place.data(), in_place.data(), len, first, key, p);
        for (Index i = 0; i < len; ++i) {
          ASSERT_EQ(std::memcmp(&fast.data()[i], &reference.data()[i], sizeof(float)), 0)
              << "first=" << first << " p=" << p << " len=" << len << " i=" << i;
          ASSERT_EQ(std::memcmp(&in_place.data()[i], &reference.data()[i], sizeof(float)), 0)
              << "in place: first=" << first << " p=" << p << " len=" << len << " i=" << i;
        }
        if (p > 0.99) {
          for (Index i = 0; i < len; ++i) ASSERT_EQ(reference.data()[i], 0.0f) << i;
        }
      }
    }
}

#if defined(ATTN_HAVE_AVX512)
// dropout_mask_span takes the widest kernel the CPU has, so the tests above reach one of them:
// each kernel this CPU can run is checked here against the scalar loop itself, from even and odd
// first elements and over lengths around its 8 or 16 lanes.
TEST(Dropout, EachVectorKernelTheCpuHasIsBitwiseTheScalarLoop) {
  using Kernel =
      void (*)(float*, const float*, Index, std::uint64_t, std::uint64_t, std::uint32_t, float);
  std::vector<std::pair<const char*, Kernel>> kernels;
  if (kernels::detail::cpu_has_avx2_fma())
    kernels.emplace_back("avx2", &kernels::detail::avx2::dropout_mask);
  if (kernels::detail::cpu_has_avx512())
    kernels.emplace_back("avx512", &kernels::detail::avx512::dropout_mask);
  if (kernels.empty()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  const std::uint64_t key = 0x7e57ab1e5eedULL;
  const Index n = 100;
  Tensor<float> x({n});
  Rng rng(11);
  fill_normal(x, rng, 0, 1);
  for (const auto& [name, kernel] : kernels)
    for (const std::uint64_t first : {0ULL, 1ULL, 6ULL, 15ULL, (1ULL << 40) + 3})
      for (const double p : {0.1, 0.5, 0.3333333333333333})
        for (const Index len : {Index(1), Index(7), Index(8), Index(15), Index(16), Index(17),
                                Index(31), Index(33), n}) {
          const float scale = static_cast<float>(1.0 / (1.0 - p));
          const auto below = static_cast<std::uint32_t>(std::ceil(std::ldexp(p, 32)));
          std::vector<float> fast(n, -1.0f), reference(n, -1.0f);
          kernel(fast.data(), x.data(), len, first, key, below, scale);
          kernels::detail::dropout_mask_scalar(reference.data(), x.data(), len, first, key, p,
                                               scale);
          ASSERT_EQ(std::memcmp(fast.data(), reference.data(), sizeof(float) * n), 0)
              << name << " first=" << first << " p=" << p << " len=" << len;
        }
}
#endif

// Draw i is half of the SplitMix64 output of pair i / 2 (random.hpp): the even draw the low half,
// the odd one the high half, and pairs of one key are the stream key + j gamma.
TEST(Dropout, DrawsAreTheHalvesOfTheKeysSplitMixStream) {
  const std::uint64_t key = 0x0123456789abcdefULL;
  for (std::uint64_t j : {0ULL, 1ULL, 1000ULL}) {
    const std::uint64_t out = mix64(key + j * kSplitMixGamma);
    EXPECT_EQ(draw_bits(key, 2 * j), static_cast<std::uint32_t>(out));
    EXPECT_EQ(draw_bits(key, 2 * j + 1), static_cast<std::uint32_t>(out >> 32));
    EXPECT_EQ(uniform_at(key, 2 * j + 1), static_cast<double>(out >> 32) * 0x1.0p-32);
  }
}

// The two halves of one SplitMix64 output are two elements' draws, and consecutive masks of a
// model come from consecutive keys: neither pair may be correlated. With p = 0.5, both dropped has
// probability 0.25 (standard error 4e-4 over 2^20 pairs).
TEST(Dropout, NeighboursAndConsecutiveMasksAreIndependent) {
  RandomState state{42, 0};
  const std::uint64_t key = state.next_key(), next = state.next_key();
  const std::uint64_t n = 1 << 20;
  double neighbours = 0, keys = 0, dropped = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const bool d = uniform_at(key, 2 * i) < 0.5;
    dropped += d;
    neighbours += d && uniform_at(key, 2 * i + 1) < 0.5;
    keys += d && uniform_at(next, 2 * i) < 0.5;
  }
  EXPECT_NEAR(dropped / n, 0.5, 3e-3);
  EXPECT_NEAR(neighbours / n, 0.25, 3e-3);
  EXPECT_NEAR(keys / n, 0.25, 3e-3);
}

TEST(Dropout, GradientsMatchCentralDifferences) {
  Dropout<double> drop(0.4);
  auto state = std::make_shared<RandomState>();
  state->seed = 9;
  drop.set_random_state(state);
  Tensor<double> x = testing::randn({3, 4, 5}, 6);
  auto res = testing::check_module_fixed_dropout(
      drop, *state, {{"x", x}}, [&] { return drop.forward(x); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{drop.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 60);
  // The check is only meaningful if the mask has both dropped and kept elements.
  state->counter = 0;
  const Tensor<double>& y = drop.forward(x);
  Index zeros = 0;
  for (double v : y) zeros += v == 0.0;
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, 60);
}

TEST(Dropout, RejectsProbabilitiesOutsideZeroOne) {
  for (double p : {1.0, -0.1, 1.5}) {
    try {
      Dropout<float> bad(p);
      FAIL() << p;
    } catch (const ConfigError& e) {
      std::ostringstream value;
      value << p;
      EXPECT_NE(std::string(e.what()).find("got " + value.str()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[0, 1)"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Dropout<float>(std::nan("")), ConfigError);
  Dropout<float> drop(0.1);
  EXPECT_THROW(drop.set_random_state(nullptr), ConfigError);
  drop.forward(Tensor<float>({2, 3}));
  try {
    drop.backward(Tensor<float>({3, 2}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
}

// The kernels' own entry points took any p (session 53's audit): p >= 1 zeroed the output, and NaN
// or a negative p was taken for no dropout, in silence. Each call checks p once.
TEST(Dropout, KernelEntryPointsRejectProbabilitiesOutsideZeroOne) {
  std::vector<float> x(100, 1.0f), y(100);
  RowMatrix<float> a = RowMatrix<float>::Ones(32, 16), b = RowMatrix<float>::Ones(16, 8), c(32, 8);
  kernels::Epilogue<float> epi;
  epi.dropout.key = 1;
  for (const double p : {std::nan(""), -0.5, 1.0, 2.0}) {
    std::ostringstream value;
    value << p;
    const std::string got = "dropout probability must be in [0, 1), got " + value.str();
    EXPECT_EQ(testing::error_of<ConfigError>(
                  [&] { kernels::dropout_forward(y.data(), x.data(), 100, p, 7); }),
              "kernels::dropout_forward: " + got);
    EXPECT_EQ(testing::error_of<ConfigError>(
                  [&] { kernels::dropout_backward(y.data(), x.data(), 100, p, 7); }),
              "kernels::dropout_backward: " + got);
    epi.dropout.p = p;
    EXPECT_EQ(testing::error_of<ConfigError>([&] { kernels::gemm(c, a, b, false, epi); }),
              "kernels::gemm: " + got);
  }
  EXPECT_EQ(testing::error_of<ShapeError>(
                [&] { kernels::dropout_forward(y.data(), x.data(), -5, 0.1, 7); }),
            "kernels::dropout_forward: n must be >= 0, got -5");
  epi.dropout.p = 0.5;
  kernels::gemm(c, a, b, false, epi);  // each product is 16: 32 where kept, else 0
  for (Index i = 0; i < c.size(); ++i) EXPECT_TRUE(c.data()[i] == 0 || c.data()[i] == 32) << i;
}

}  // namespace
}  // namespace attn
