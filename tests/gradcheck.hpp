// Central-difference gradient checking in double precision, shared by every test_*.cpp.
//
// The scalar checked is L = sum(y * R) for a fixed random R, so dL/dy = R and one backward(R)
// gives the analytic gradient of every input and parameter. Each element of every tensor named
// in `wrt` is perturbed by +-eps and (L+ - L-) / 2 eps compared with the analytic value. The
// error of a tensor is max_i |analytic_i - numeric_i| / max(max_i |numeric_i|, max_i |analytic_i|),
// the relative error of the whole gradient in the infinity norm (0 when both are exactly zero);
// tests require it below 1e-6. A NaN or an infinity on either side is an infinite error: the
// comparisons would otherwise drop it, and an all-NaN gradient would pass.
#pragma once

#include <gtest/gtest.h>

#include <attn/attn.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace attn::testing {

/// One thread for the holder's lifetime, then the count it found: gradient checks run thousands of
/// tiny forwards, and an OpenMP team per kernel call would dominate them on a busy machine. A
/// member of a test fixture, so that it spans SetUp, the test and TearDown.
class OneThread {
 public:
  OneThread() : threads_(num_threads()) { set_num_threads(1); }
  ~OneThread() { set_num_threads(threads_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int threads_;
};

struct GradCheckResult {
  double max_rel_error = 0;  // worst tensor's relative error
  std::string worst;         // "name[flat index]: analytic vs numeric" of the worst element
  Index checked = 0;         // elements compared
  std::string report;        // one line per tensor
};

/// sum(y * r)
inline double dot(const Tensor<double>& y, const Tensor<double>& r) {
  EXPECT_EQ(y.shape(), r.shape());
  double s = 0;
  for (Index i = 0; i < y.numel(); ++i) s += y.data()[i] * r.data()[i];
  return s;
}

/// A tensor of N(0, 1) values, seeded.
inline Tensor<double> randn(const Shape& shape, std::uint64_t seed) {
  Tensor<double> t(shape);
  Rng rng(seed);
  fill_normal(t, rng, 0.0, 1.0);
  return t;
}

/// A float copy of a double tensor.
inline Tensor<float> to_float(const Tensor<double>& x) {
  Tensor<float> f(x.shape());
  for (Index i = 0; i < x.numel(); ++i) f.data()[i] = static_cast<float>(x.data()[i]);
  return f;
}

/// Gives a float model the values of the double model's parameters, rounded: two instances of
/// one module class, whose parameters() list the same names and shapes in the same order.
template <class DoubleModel, class FloatModel>
void copy_parameters(DoubleModel& from, FloatModel& to) {
  const auto pd = from.parameters();
  auto pf = to.parameters();
  ASSERT_EQ(pd.size(), pf.size());
  for (std::size_t i = 0; i < pd.size(); ++i) {
    ASSERT_EQ(pd[i].name, pf[i].name);
    ASSERT_EQ(pd[i].value.shape(), pf[i].value.shape());
    for (Index j = 0; j < pd[i].value.numel(); ++j)
      pf[i].value.data()[j] = static_cast<float>(pd[i].value.data()[j]);
  }
}

/// Compares `analytic` gradients (one per wrt tensor, same order) with central differences of
/// `loss` as each wrt value is perturbed in place. `wrt` holds handles: perturbing them must
/// change what `loss` computes.
inline GradCheckResult gradcheck(const std::vector<std::pair<std::string, Tensor<double>>>& wrt,
                                 const std::vector<Tensor<double>>& analytic,
                                 const std::function<double()>& loss, double eps = 1e-6) {
  GradCheckResult res;
  EXPECT_EQ(wrt.size(), analytic.size());
  std::ostringstream report;
  for (std::size_t t = 0; t < wrt.size(); ++t) {
    Tensor<double> x = wrt[t].second;
    const Tensor<double>& a = analytic[t];
    EXPECT_EQ(x.shape(), a.shape()) << wrt[t].first;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    double max_diff = 0, max_mag = 0;
    Index worst_i = -1;
    double worst_a = 0, worst_n = 0;
    for (Index i = 0; i < x.numel(); ++i) {
      const double saved = x.data()[i];
      x.data()[i] = saved + eps;
      const double lp = loss();
      x.data()[i] = saved - eps;
      const double lm = loss();
      x.data()[i] = saved;
      const double numeric = (lp - lm) / (2 * eps);
      const bool finite = std::isfinite(numeric) && std::isfinite(a.data()[i]);
      const double diff = finite ? std::abs(numeric - a.data()[i]) : kInf;
      if (finite) max_mag = std::max({max_mag, std::abs(numeric), std::abs(a.data()[i])});
      if (diff > max_diff || worst_i < 0) {
        max_diff = std::max(diff, max_diff);
        worst_i = i;
        worst_a = a.data()[i];
        worst_n = numeric;
      }
      ++res.checked;
    }
    const double rel = max_diff == kInf ? kInf : max_mag > 0 ? max_diff / max_mag : 0.0;
    report << "  " << wrt[t].first << " " << x.shape() << ": rel error " << rel << "\n";
    if (rel >= res.max_rel_error) {
      res.max_rel_error = rel;
      std::ostringstream w;
      w << wrt[t].first << "[" << worst_i << "]: analytic " << worst_a << " vs numeric " << worst_n;
      res.worst = w.str();
    }
  }
  res.report = report.str();
  return res;
}

/// Gradient check of a module: the inputs plus every parameter of `m`.
///   forward():           runs the module's forward on the (handles of the) inputs, returns y.
///   backward(dy):        runs backward, returns the gradients of the inputs, in input order.
/// Parameters gradients are read from m.parameters() after zero_grad + forward + backward.
inline GradCheckResult check_module(
    Module<double>& m, const std::vector<std::pair<std::string, Tensor<double>>>& inputs,
    const std::function<Tensor<double>()>& forward,
    const std::function<std::vector<Tensor<double>>(const Tensor<double>&)>& backward,
    std::uint64_t seed = 1234) {
  const Tensor<double> r = randn(forward().shape(), seed);
  m.zero_grad();
  forward();
  std::vector<Tensor<double>> dinputs = backward(r);
  std::vector<std::pair<std::string, Tensor<double>>> wrt = inputs;
  std::vector<Tensor<double>> analytic;
  for (auto& d : dinputs) analytic.push_back(d.clone());
  for (auto& p : m.parameters()) {
    wrt.emplace_back(p.name, p.value);
    analytic.push_back(p.grad.clone());
  }
  return gradcheck(wrt, analytic, [&] { return dot(forward(), r); });
}

/// check_module for a module in training mode with dropout on: `state` (the module's RandomState)
/// restarts its counter before every forward, so that every evaluation of the loss draws the same
/// masks and central differences see one function.
inline GradCheckResult check_module_fixed_dropout(
    Module<double>& m, RandomState& state,
    const std::vector<std::pair<std::string, Tensor<double>>>& inputs,
    const std::function<Tensor<double>()>& forward,
    const std::function<std::vector<Tensor<double>>(const Tensor<double>&)>& backward) {
  return check_module(
      m, inputs,
      [&] {
        state.counter = 0;
        return forward();
      },
      backward);
}

}  // namespace attn::testing

/// Asserts a GradCheckResult is below the tolerance, printing the per-tensor report otherwise.
#define EXPECT_GRADIENTS_MATCH(result)                                           \
  EXPECT_LT((result).max_rel_error, 1e-6) << "worst: " << (result).worst << "\n" \
                                          << (result).report;                    \
  EXPECT_GT((result).checked, 0)
