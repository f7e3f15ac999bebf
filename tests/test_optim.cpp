// Adam against torch.optim.Adam literals, the Noam schedule, gradient clipping and scaling.
#include <attn/train/adam.hpp>
#include <attn/train/clip.hpp>
#include <attn/train/schedule.hpp>
#include <cmath>
#include <limits>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

// Two parameters p [4] and q [2, 2] stepped three times with these gradients and learning rates.
// Generated once with /usr/bin/python3 (torch 1.13):
//   p = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=dt, requires_grad=True)
//   q = torch.tensor([[0.1, -0.2], [0.3, 0.05]], dtype=dt, requires_grad=True)
//   opt = torch.optim.Adam([p, q], lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=wd)
//   for (gp, gq), lr in zip(kGradP/kGradQ, kLr):
//       for g in opt.param_groups: g['lr'] = lr
//       p.grad = torch.tensor(gp, dtype=dt); q.grad = torch.tensor(gq, dtype=dt); opt.step()
//       print(p.tolist() + q.flatten().tolist())
//   print(opt.state[p]['exp_avg'].tolist(), opt.state[p]['exp_avg_sq'].tolist())
const std::vector<std::vector<double>> kGradP = {
    {0.1, -0.2, 0.0, 1.5}, {-0.05, 0.3, 1e-4, 1.0}, {0.2, 0.2, -3e-3, -2.0}};
const std::vector<std::vector<double>> kGradQ = {
    {0.01, 2.0, -0.3, 0.0}, {0.02, -1.0, -0.3, 0.7}, {0.0, 0.5, 0.4, -0.1}};
const std::vector<double> kLr = {1e-3, 2e-3, 5e-4};

struct TorchAdamRun {
  double weight_decay;
  std::vector<std::vector<double>> values;  // p then q after each step
  std::vector<double> exp_avg_p, exp_avg_sq_p;
};

const TorchAdamRun kTorchDouble = {
    0.0,
    {{0.49900000001, -0.999000000005, 2.0, -0.0009999999993333332, 0.0990000001,
      -0.20099999999950002, 0.30099999999666666, 0.05},
     {0.4984657845896708, -0.9994944916719353, 1.9985188369176572, -0.0029442980235461816,
      0.09707517049842354, -0.2015342154262683, 0.30299999999, 0.04851881607882268},
     {0.4981385276488301, -0.9997332157820815, 1.998825554792246, -0.002957913263035991,
      0.09670138996032869, -0.20170560770551899, 0.3030618010654297, 0.04827932290711045}},
    {0.023599999999999996, 0.03079999999999999, -0.0002909999999999999, 0.01150000000000001},
    {0.001041080000000001, 0.0033323200000000028, 1.8019600000000017e-07, 0.1428180000000001}};

const TorchAdamRun kTorchDoubleDecay = {
    0.01,
    {{0.4990000000095238, -0.9990000000047619, 1.99900000005, -0.0009999999993333332,
      0.09900000009090909, -0.20099999999949952, 0.30099999999663296, 0.049000001999996004},
     {0.4983528479487008, -0.9994192939230887, 1.9969998142357215, -0.0029442958163623033,
      0.0970650989292354, -0.2015318773157896, 0.3029999985575854, 0.04751786692523505},
     {0.49801497571496955, -0.9996408726968752, 1.9965035804520046, -0.0029579064109014714,
      0.09667657791283678, -0.20170260150571828, 0.3030574218871909, 0.047277918155400056}},
    {0.02495245284795727, 0.028091480706072616, 0.005125099814280721, 0.01149615570418427},
    {0.0010918407809178464, 0.003217590616295746, 2.135353549942593e-05, 0.14281996345595122}};

const TorchAdamRun kTorchFloat = {
    0.0,
    {{0.49900001287460327, -0.9990000128746033, 2.0, -0.0010000000474974513, 0.0989999994635582,
      -0.20100000500679016, 0.3009999990463257, 0.05000000074505806},
     {0.49846580624580383, -0.9994944930076599, 1.9985188245773315, -0.002944298554211855,
      0.09707517176866531, -0.2015342265367508, 0.30300000309944153, 0.048518817871809006},
     {0.49813854694366455, -0.9997332096099854, 1.9988255500793457, -0.0029579137917608023,
      0.09670139104127884, -0.20170561969280243, 0.3030618131160736, 0.048279326409101486}},
    {0.023600000888109207, 0.030799999833106995, -0.000291000003926456, 0.011500000953674316},
    {0.001041080104187131, 0.003332320135086775, 1.8019599679064413e-07, 0.14281800389289856}};

template <class T>
std::vector<NamedParameter<T>> make_pq() {
  NamedParameter<T> p{"p", Tensor<T>::from({4}, {0.5, -1.0, 2.0, 0.0}), Tensor<T>({4})};
  NamedParameter<T> q{"q", Tensor<T>::from({2, 2}, {0.1, -0.2, 0.3, 0.05}), Tensor<T>({2, 2})};
  return {p, q};
}

template <class T>
void expect_matches_torch(const TorchAdamRun& ref, double tol) {
  auto params = make_pq<T>();
  Adam<T> adam(params, AdamOptions{0.9, 0.98, 1e-9, ref.weight_decay});
  for (std::size_t s = 0; s < 3; ++s) {
    std::copy(kGradP[s].begin(), kGradP[s].end(), params[0].grad.begin());
    std::copy(kGradQ[s].begin(), kGradQ[s].end(), params[1].grad.begin());
    adam.step(kLr[s]);
    EXPECT_EQ(adam.steps(), static_cast<Index>(s + 1));
    for (std::size_t i = 0; i < 8; ++i) {
      const double got = i < 4 ? params[0].value.data()[i] : params[1].value.data()[i - 4];
      EXPECT_NEAR(got, ref.values[s][i], tol) << "step " << s + 1 << " element " << i;
    }
  }
  const auto state = adam.state();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].name, "p.exp_avg");
  EXPECT_EQ(state[1].name, "p.exp_avg_sq");
  EXPECT_EQ(state[2].name, "q.exp_avg");
  EXPECT_EQ(state[3].name, "q.exp_avg_sq");
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(state[0].value.data()[i], ref.exp_avg_p[i], tol * std::abs(ref.exp_avg_p[i]));
    EXPECT_NEAR(state[1].value.data()[i], ref.exp_avg_sq_p[i], tol * std::abs(ref.exp_avg_sq_p[i]));
  }
}

TEST(Adam, MatchesTorchInDouble) { expect_matches_torch<double>(kTorchDouble, 1e-15); }
TEST(Adam, MatchesTorchWithWeightDecay) { expect_matches_torch<double>(kTorchDoubleDecay, 1e-15); }
TEST(Adam, MatchesTorchInFloat) { expect_matches_torch<float>(kTorchFloat, 1.5e-7); }

// The float update runs eight elements at a time where the CPU has AVX2 (AVX-512 ones included).
// Against the scalar loop it may differ only by the rounding of a contracted multiply-add (a few
// ulp), at any length (vector and chunk edges) and with weight decay on or off; and it is bitwise
// the same on 1 and 2 threads, which the longest length runs in parallel chunks.
TEST(Adam, VectorUpdateMatchesTheScalarLoop) {
  constexpr Index kParallel = 3 * kParallelMinOptimizer + 17;
  static_assert((kParallel / kernels::detail::kAdamChunk) * kernels::detail::kAdamChunk >
                    kParallelMinOptimizer,
                "the longest length must take Adam's parallel path");
  for (const Index n :
       {Index(1), Index(15), Index(17), Index(8191), Index(8193), Index(20001), kParallel}) {
    for (const float decay : {0.0f, 0.01f}) {
      Tensor<float> x({n}), g({n}), m({n}), v({n});
      Rng rng(static_cast<std::uint64_t>(n));
      fill_normal(x, rng, 0, 1);
      fill_normal(g, rng, 0, 0.1);
      fill_normal(m, rng, 0, 0.01);
      fill_uniform(v, rng, 0, 1e-3);
      const kernels::AdamCoefficients<float> c{0.9f,           0.98f, 0.1f,  0.02f,
                                               1e-3f / 0.271f, 0.44f, 1e-9f, decay};
      std::vector<Tensor<float>> fast{x.clone(), m.clone(), v.clone()};
      std::vector<Tensor<float>> ref{x.clone(), m.clone(), v.clone()};
      kernels::adam_update(fast[0].data(), g.data(), fast[1].data(), fast[2].data(), n, c, true);
      kernels::adam_update(ref[0].data(), g.data(), ref[1].data(), ref[2].data(), n, c, false);
      // Tolerance relative to the terms summed (m and v cancel: beta m - (1 - beta) g can be ~0).
      const Tensor<float>* before[3] = {&x, &m, &v};
      for (std::size_t t = 0; t < 3; ++t)
        for (Index i = 0; i < n; ++i) {
          const float a = fast[t].data()[i], b = ref[t].data()[i];
          const float scale = std::abs(before[t]->data()[i]) + std::abs(g.data()[i]);
          ASSERT_LE(std::abs(a - b), 1e-6f * scale + 1e-30f) << t << " " << n << " " << i;
        }
      const int saved = num_threads();
      std::vector<Tensor<float>> two{x.clone(), m.clone(), v.clone()};
      set_num_threads(2);
      kernels::adam_update(two[0].data(), g.data(), two[1].data(), two[2].data(), n, c, true);
      set_num_threads(1);
      std::vector<Tensor<float>> one{x.clone(), m.clone(), v.clone()};
      kernels::adam_update(one[0].data(), g.data(), one[1].data(), one[2].data(), n, c, true);
      set_num_threads(saved);
      for (std::size_t t = 0; t < 3; ++t)
        for (Index i = 0; i < n; ++i) ASSERT_EQ(one[t].data()[i], two[t].data()[i]);
    }
  }
}

TEST(Adam, BiasCorrectionMakesTheFirstStepLrTimesSign) {
  // m_hat = g and v_hat = g^2 after one step, so the update is lr * g / (|g| + eps) whatever the
  // gradient's scale; without the correction it would be lr * 0.1 / sqrt(0.02) = 0.707 lr.
  for (double g : {1e-4, -0.3, 250.0}) {
    NamedParameter<double> p{"w", Tensor<double>::full({1}, 1.0), Tensor<double>::full({1}, g)};
    Adam<double> adam({p});
    adam.step(0.01);
    EXPECT_NEAR(p.value(0), 1.0 - 0.01 * g / (std::abs(g) + 1e-9), 1e-15) << g;
  }
  // A constant gradient keeps m_hat = g and v_hat = g^2 at every step: steps stay lr-sized.
  NamedParameter<double> p{"w", Tensor<double>::full({1}, 0.0), Tensor<double>::full({1}, 3.0)};
  Adam<double> adam({p});
  for (int s = 0; s < 50; ++s) adam.step(0.1);
  EXPECT_NEAR(p.value(0), -5.0 * 3.0 / (3.0 + 1e-9), 1e-12);
}

TEST(Adam, LoadStateContinuesBitwise) {
  auto a = make_pq<float>();
  auto b = make_pq<float>();
  Adam<float> adam_a(a), adam_b(b);
  for (std::size_t s = 0; s < 2; ++s) {
    std::copy(kGradP[s].begin(), kGradP[s].end(), a[0].grad.begin());
    std::copy(kGradQ[s].begin(), kGradQ[s].end(), a[1].grad.begin());
    adam_a.step(kLr[s]);
  }
  for (std::size_t k = 0; k < 2; ++k)
    std::copy(a[k].value.begin(), a[k].value.end(), b[k].value.begin());
  std::vector<NamedTensor<float>> saved;
  for (const auto& s : adam_a.state()) saved.push_back({s.name, s.value.clone()});
  adam_b.load_state(saved, adam_a.steps());
  EXPECT_EQ(adam_b.steps(), 2);
  for (auto* ps : {&a, &b}) {
    std::copy(kGradP[2].begin(), kGradP[2].end(), (*ps)[0].grad.begin());
    std::copy(kGradQ[2].begin(), kGradQ[2].end(), (*ps)[1].grad.begin());
  }
  adam_a.step(kLr[2]);
  adam_b.step(kLr[2]);
  for (std::size_t k = 0; k < 2; ++k)
    EXPECT_EQ(std::memcmp(a[k].value.data(), b[k].value.data(), a[k].value.numel() * sizeof(float)),
              0);
}

TEST(Adam, LoadStateRejectsMismatches) {
  Adam<double> adam(make_pq<double>());
  std::vector<NamedTensor<double>> state;
  for (const auto& s : adam.state()) state.push_back({s.name, s.value.clone()});
  auto missing = state;
  missing[3].name = "r.exp_avg_sq";
  std::string msg = error_of([&] { adam.load_state(missing, 1); });
  EXPECT_TRUE(contains(msg, "missing state tensor q.exp_avg_sq")) << msg;
  auto shorter = state;
  shorter.pop_back();
  msg = error_of([&] { adam.load_state(shorter, 1); });
  EXPECT_TRUE(contains(msg, "expected 4 state tensors, got 3")) << msg;
  auto wrong = state;
  wrong[2].value = Tensor<double>({4});
  msg = error_of([&] { adam.load_state(wrong, 1); });
  EXPECT_TRUE(contains(msg, "q.exp_avg: expected shape [2, 2], got [4]")) << msg;
  EXPECT_THROW(adam.load_state(wrong, 1), ShapeError);
  EXPECT_THROW(adam.load_state(state, -1), ConfigError);
  EXPECT_EQ(adam.steps(), 0);  // failed loads change nothing
}

TEST(Adam, RejectsBadOptions) {
  auto ps = make_pq<float>();
  EXPECT_TRUE(contains(error_of([&] {
                         Adam<float>(ps, AdamOptions{1.0, 0.98, 1e-9, 0});
                       }),
                       "beta1 must be in [0, 1), got 1"));
  EXPECT_THROW(Adam<float>(ps, AdamOptions{0.9, -0.1, 1e-9, 0}), ConfigError);
  EXPECT_THROW(Adam<float>(ps, AdamOptions{0.9, 0.98, 0.0, 0}), ConfigError);
  EXPECT_THROW(Adam<float>(ps, AdamOptions{0.9, 0.98, 1e-9, -1}), ConfigError);
  auto dup = ps;
  dup[1].name = "p";
  EXPECT_TRUE(contains(error_of([&] { Adam<float>{dup}; }), "'p' appears twice"));
  Adam<float> adam(ps);
  EXPECT_TRUE(contains(error_of([&] { adam.step(-1e-3); }), "got -0.001"));
  EXPECT_THROW(adam.step(std::nan("")), ConfigError);
}

TEST(Adam, RejectsAGradientWithoutStorage) {
  // A default Tensor's shape [] is a scalar's: the shape check alone let it through, and step()
  // read the gradient at address 0.
  std::vector<NamedParameter<float>> ps{{"w", Tensor<float>::full({}, 1.0f), Tensor<float>()}};
  const std::string msg = error_of<ConfigError>([&] { Adam<float>{ps}; });
  EXPECT_TRUE(contains(msg, "Adam: parameter w has a gradient with no storage")) << msg;
}

TEST(Schedule, PeaksAtWarmupAndIsMonotoneAroundIt) {
  const Index d = 512, w = 4000;
  const double peak = noam_lr(w, d, w);
  EXPECT_NEAR(peak, 1.0 / std::sqrt(512.0 * 4000.0), 1e-18);
  EXPECT_NEAR(noam_lr(1, d), 1.0 / std::sqrt(512.0) * std::pow(4000.0, -1.5), 1e-20);
  EXPECT_NEAR(noam_lr(16000, d), 1.0 / std::sqrt(512.0 * 16000.0), 1e-18);
  double prev = 0;
  for (Index s = 1; s <= w; s += 37) {
    const double lr = noam_lr(s, d, w);
    EXPECT_GT(lr, prev) << s;
    EXPECT_LE(lr, peak) << s;
    prev = lr;
  }
  prev = peak;
  for (Index s = w + 1; s <= 10 * w; s += 91) {
    const double lr = noam_lr(s, d, w);
    EXPECT_LT(lr, prev) << s;
    prev = lr;
  }
  EXPECT_DOUBLE_EQ(noam_lr(123, d, w, 2.0), 2.0 * noam_lr(123, d, w));
}

TEST(Schedule, LinearCooldownFallsToZeroOverTheLastUpdates) {
  for (Index s = 1; s <= 7; ++s) EXPECT_EQ(linear_cooldown(s, 10, 3), 1.0) << s;
  EXPECT_DOUBLE_EQ(linear_cooldown(8, 10, 3), 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(linear_cooldown(9, 10, 3), 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(linear_cooldown(10, 10, 3), 1.0 / 4.0);
  // Off, and the whole run.
  for (Index s = 1; s <= 10; ++s) EXPECT_EQ(linear_cooldown(s, 10, 0), 1.0) << s;
  EXPECT_DOUBLE_EQ(linear_cooldown(1, 10, 10), 10.0 / 11.0);
  EXPECT_DOUBLE_EQ(linear_cooldown(10, 10, 10), 1.0 / 11.0);
  // The largest run: no overflow on the way.
  constexpr Index kMax = std::numeric_limits<Index>::max();
  EXPECT_DOUBLE_EQ(linear_cooldown(kMax, kMax, kMax), 1.0 / (static_cast<double>(kMax) + 1.0));
  // Equal steps down, each of 1 / (cooldown + 1).
  for (Index s = 9001; s < 10000; ++s)
    EXPECT_NEAR(linear_cooldown(s, 10000, 1000) - linear_cooldown(s + 1, 10000, 1000), 1.0 / 1001,
                1e-15)
        << s;
}

TEST(Schedule, LinearCooldownRejectsBadArguments) {
  EXPECT_TRUE(contains(error_of<ConfigError>([] { linear_cooldown(1, 10, 11); }),
                       "cooldown must be in [0, end = 10], got 11"));
  EXPECT_TRUE(contains(error_of<ConfigError>([] { linear_cooldown(1, 10, -1); }), "got -1"));
  EXPECT_TRUE(contains(error_of<ConfigError>([] { linear_cooldown(11, 10, 3); }),
                       "step must be in [1, 10], got 11"));
  EXPECT_TRUE(contains(error_of<ConfigError>([] { linear_cooldown(0, 10, 3); }), "got 0"));
}

TEST(Schedule, RejectsBadArguments) {
  EXPECT_TRUE(contains(error_of([] { noam_lr(0, 512); }), "step counts from 1, got 0"));
  EXPECT_THROW(noam_lr(1, 0), ConfigError);
  EXPECT_THROW(noam_lr(1, 512, 0), ConfigError);
  EXPECT_THROW(noam_lr(1, 512, 4000, 0.0), ConfigError);
}

std::vector<NamedParameter<double>> grads_3_4() {
  NamedParameter<double> a{"a", Tensor<double>({2}), Tensor<double>::from({2}, {3.0, 0.0})};
  NamedParameter<double> b{"b", Tensor<double>({1, 1}), Tensor<double>::from({1, 1}, {-4.0})};
  return {a, b};
}

TEST(Clip, NormIsGlobalAndClippingScalesToMaxNorm) {
  auto ps = grads_3_4();
  EXPECT_DOUBLE_EQ(grad_norm(ps), 5.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 10.0), 5.0);  // below the limit: untouched
  EXPECT_EQ(ps[0].grad(0), 3.0);
  EXPECT_EQ(ps[1].grad(0, 0), -4.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);  // returns the norm before clipping
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-6);
  EXPECT_NEAR(ps[0].grad(0), 0.6, 1e-6);
  EXPECT_NEAR(ps[1].grad(0, 0), -0.8, 1e-6);
  EXPECT_NEAR(ps[0].grad(0) / ps[1].grad(0, 0), -0.75, 1e-15);  // direction kept
}

// In float the sum of squares runs 16 lanes of double at a time (kernels/detail/double_sums.hpp):
// the norm of several tensors of odd sizes is the exact one to double rounding, and a NaN or Inf
// gradient anywhere makes it NaN or Inf.
TEST(Clip, FloatNormIsTheExactOneAndSeesEveryElement) {
  std::vector<NamedParameter<float>> ps;
  long double exact = 0;
  Rng rng(5);
  for (const Index n : {1, 17, 1000, 4099}) {
    NamedParameter<float> p{"p", Tensor<float>({n}), Tensor<float>({n})};
    fill_normal(p.grad, rng, 0.0, 2.0);
    for (Index j = 0; j < n; ++j) exact += static_cast<long double>(p.grad(j)) * p.grad(j);
    ps.push_back(p);
  }
  EXPECT_NEAR(grad_norm(ps), std::sqrt(static_cast<double>(exact)), 1e-14 * std::sqrt(5117.0));
  ps[3].grad(4098) = std::numeric_limits<float>::infinity();
  EXPECT_EQ(grad_norm(ps), std::numeric_limits<double>::infinity());
  ps[3].grad(4098) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(grad_norm(ps)));
}

TEST(Clip, NonFiniteNormIsNumericError) {
  auto ps = grads_3_4();
  ps[1].grad(0, 0) = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(contains(error_of([&] { clip_grad_norm(ps, 1.0); }), "gradient norm is Inf"));
  ps[1].grad(0, 0) = std::nan("");
  EXPECT_TRUE(contains(error_of([&] { clip_grad_norm(ps, 1.0); }), "gradient norm is NaN"));
  EXPECT_THROW(clip_grad_norm(ps, 1.0), NumericError);
  EXPECT_THROW(clip_grad_norm(grads_3_4(), 0.0), ConfigError);
  EXPECT_THROW(scale_gradients(grads_3_4(), std::nan("")), NumericError);
}

TEST(Clip, ScaleGradientsTurnsAccumulatedSumIntoMean) {
  Linear<double> lin(3, 2);
  Rng rng(3);
  lin.reset_parameters(rng);
  Tensor<double> x1 = testing::randn({4, 3}, 1), x2 = testing::randn({4, 3}, 2);
  Tensor<double> dy = testing::randn({4, 2}, 3);
  lin.zero_grad();
  lin.forward(x1);
  lin.backward(dy);
  const Tensor<double> g1 = lin.weight.grad.clone();
  lin.zero_grad();
  lin.forward(x2);
  lin.backward(dy);
  const Tensor<double> g2 = lin.weight.grad.clone();
  lin.forward(x1);
  lin.backward(dy);  // grads now hold g2 + g1
  scale_gradients(lin.parameters(), 0.5);
  for (Index i = 0; i < g1.numel(); ++i)
    EXPECT_NEAR(lin.weight.grad.data()[i], 0.5 * (g1.data()[i] + g2.data()[i]), 1e-15);
}

}  // namespace
}  // namespace attn
