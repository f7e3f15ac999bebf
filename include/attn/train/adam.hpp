// Adam (Kingma & Ba) with bias correction, as the paper trains with it (beta1 = 0.9,
// beta2 = 0.98, eps = 1e-9) and exactly as torch.optim.Adam computes a step:
//   g   = grad + weight_decay * value            (L2 in the gradient, not AdamW's decoupled decay)
//   m   = beta1 m + (1 - beta1) g
//   v   = beta2 v + (1 - beta2) g^2
//   value -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// eps is added to sqrt(v_hat), not under the root. The moments are kept in T like the values.
#pragma once

#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attn/kernels/adam.hpp"
#include "attn/nn/module.hpp"
#include "attn/parallel.hpp"

namespace attn {

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.98;
  double eps = 1e-9;
  double weight_decay = 0;
};

/// A tensor with a name, as optimisers and averages expose their state for checkpoints.
template <class T>
struct NamedTensor {
  std::string name;
  Tensor<T> value;
};

template <class T>
class Adam {
 public:
  /// Holds handles to `params` (values updated in place, grads read); one m and one v each.
  explicit Adam(std::vector<NamedParameter<T>> params, AdamOptions options = {})
      : params_(std::move(params)), opt_(options) {
    detail::check_probability("Adam", "beta1", opt_.beta1);
    detail::check_probability("Adam", "beta2", opt_.beta2);
    ATTN_CHECK(
        opt_.eps > 0 && detail::fits_in<T>(opt_.eps) && static_cast<T>(opt_.eps) > 0, ConfigError,
        "Adam: eps must be > 0, finite and still > 0 in the parameters' type, got ", opt_.eps);
    ATTN_CHECK(opt_.weight_decay >= 0 && detail::fits_in<T>(opt_.weight_decay), ConfigError,
               "Adam: weight_decay must be >= 0 and within the parameters' type, got ",
               opt_.weight_decay);
    std::unordered_map<std::string, int> seen;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      const auto& p = params_[k];
      ATTN_CHECK(seen.emplace(p.name, 0).second, ConfigError, "Adam: parameter name '", p.name,
                 "' appears twice");
      ATTN_CHECK(p.value.has_storage(), ConfigError, "Adam: parameter ", p.name,
                 " has no storage (it was never allocated)");
      for (std::size_t j = 0; j < k; ++j)  // a tensor listed twice was updated twice per step
        ATTN_CHECK(!overlap(p.value, params_[j].value), ConfigError, "Adam: parameters ",
                   params_[j].name, " and ", p.name, " share elements");
      ATTN_CHECK(p.grad.shape() == p.value.shape(), ShapeError, "Adam: parameter ", p.name,
                 " has value ", p.value.shape(), " but grad ", p.grad.shape());
      // A default Tensor's shape [] equals a scalar's, so the shapes alone let a gradient with
      // no storage through, and step() read it at address 0.
      ATTN_CHECK(p.grad.has_storage(), ConfigError, "Adam: parameter ", p.name,
                 " has a gradient with no storage (expected ", p.value.numel(),
                 " elements, got a default-constructed tensor)");
      exp_avg_.emplace_back(p.value.shape());
      exp_avg_sq_.emplace_back(p.value.shape());
    }
  }

  /// One update of every parameter from its current gradient with learning rate `lr`.
  void step(double lr) {
    ATTN_CHECK(std::isfinite(lr) && lr >= 0, ConfigError, "Adam: lr must be finite and >= 0, got ",
               lr);
    ATTN_CHECK(steps_ < kMaxSteps, ConfigError, "Adam: ", steps_,
               " steps taken, the most it counts");
    const double t = static_cast<double>(steps_ + 1);
    const double step_size = lr / (1 - std::pow(opt_.beta1, t));
    ATTN_CHECK(detail::fits_in<T>(step_size), ConfigError, "Adam: lr ", lr, " gives step ", t,
               " a step size of ", step_size, ", beyond the range of the parameters' type");
    ++steps_;
    kernels::AdamCoefficients<T> c;
    c.beta1 = static_cast<T>(opt_.beta1);
    c.beta2 = static_cast<T>(opt_.beta2);
    c.one_minus_beta1 = static_cast<T>(1 - opt_.beta1);
    c.one_minus_beta2 = static_cast<T>(1 - opt_.beta2);
    c.step_size = static_cast<T>(step_size);
    c.bias_correction2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(opt_.beta2, t)));
    c.eps = static_cast<T>(opt_.eps);
    c.weight_decay = static_cast<T>(opt_.weight_decay);
    for (std::size_t k = 0; k < params_.size(); ++k)
      kernels::adam_update(params_[k].value.data(), params_[k].grad.data(), exp_avg_[k].data(),
                           exp_avg_sq_[k].data(), params_[k].value.numel(), c);
  }

  /// Sets every parameter gradient to zero (large tensors in parallel chunks).
  void zero_grad() {
    for (auto& p : params_) parallel_zero(p.grad.data(), p.grad.numel());
  }

  /// The most updates counted: the bias corrections take t in double, exact to 2^53 (a count near
  /// Index's limit overflowed at the next step).
  static constexpr Index kMaxSteps = Index(1) << 53;

  /// Updates taken so far (t of the bias correction).
  Index steps() const { return steps_; }
  const AdamOptions& options() const { return opt_; }
  const std::vector<NamedParameter<T>>& parameters() const { return params_; }

  /// The moments as named handles: "<name>.exp_avg" (m) and "<name>.exp_avg_sq" (v), per parameter
  /// in parameter order. steps() completes the state.
  std::vector<NamedTensor<T>> state() const {
    std::vector<NamedTensor<T>> out;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      out.push_back({params_[k].name + ".exp_avg", exp_avg_[k]});
      out.push_back({params_[k].name + ".exp_avg_sq", exp_avg_sq_[k]});
    }
    return out;
  }

  /// Restores the state written by state() (copied in; every name required, shapes checked).
  void load_state(const std::vector<NamedTensor<T>>& state, Index steps) {
    ATTN_CHECK(steps >= 0 && steps <= kMaxSteps, ConfigError,
               "Adam::load_state: steps must be in [0, ", kMaxSteps, "], got ", steps);
    std::unordered_map<std::string, const Tensor<T>*> by_name;
    for (const auto& s : state) by_name[s.name] = &s.value;
    ATTN_CHECK(by_name.size() == 2 * params_.size(), ConfigError, "Adam::load_state: expected ",
               2 * params_.size(), " state tensors, got ", state.size());
    for (const auto& mine : this->state()) {
      auto it = by_name.find(mine.name);
      ATTN_CHECK(it != by_name.end(), ConfigError, "Adam::load_state: missing state tensor ",
                 mine.name);
      ATTN_CHECK(it->second->shape() == mine.value.shape(), ShapeError,
                 "Adam::load_state: ", mine.name, ": expected shape ", mine.value.shape(), ", got ",
                 it->second->shape());
    }
    for (auto& mine : this->state()) {
      const Tensor<T>& src = *by_name[mine.name];
      std::copy(src.begin(), src.end(), mine.value.begin());
    }
    steps_ = steps;
  }

 private:
  /// Whether two parameters' elements meet (parameters may be views of one buffer: disjoint views
  /// are accepted, a tensor listed twice or overlapping views are not).
  static bool overlap(const Tensor<T>& a, const Tensor<T>& b) {
    return !a.empty() && !b.empty() && a.shares_storage(b) && a.data() < b.data() + b.numel() &&
           b.data() < a.data() + a.numel();
  }

  std::vector<NamedParameter<T>> params_;
  AdamOptions opt_;
  std::vector<Tensor<T>> exp_avg_;     // m, one per parameter, the parameter's shape
  std::vector<Tensor<T>> exp_avg_sq_;  // v, one per parameter, the parameter's shape
  Index steps_ = 0;
};

}  // namespace attn
