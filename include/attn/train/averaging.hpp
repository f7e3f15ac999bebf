// Weight averaging: the paper's checkpoint averaging (the last 5 checkpoints for base models, 20
// for big ones, written every 10 minutes) and an exponential moving average kept during training.
// Needs nlohmann-json through checkpoint.hpp (see safetensors.hpp).
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attn/train/checkpoint.hpp"

namespace attn {
namespace detail {

/// The entries of `metadata` whose key starts with one of `prefixes`.
inline std::map<std::string, std::string> metadata_with_prefixes(
    const std::map<std::string, std::string>& metadata, const std::vector<std::string>& prefixes) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : metadata)
    for (const std::string& prefix : prefixes)
      if (key.compare(0, prefix.size(), prefix) == 0) {
        out.emplace(key, value);
        break;
      }
  return out;
}

/// FormatError naming `path` and the first key where `got` differs from `want` (read from
/// `first`).
inline void check_same_metadata(const std::map<std::string, std::string>& want,
                                const std::map<std::string, std::string>& got,
                                const std::string& first, const std::string& path) {
  if (want == got) return;
  auto w = want.begin();
  auto g = got.begin();
  while (w != want.end() && g != got.end() && *w == *g) ++w, ++g;
  const std::string& key = w == want.end()  ? g->first
                           : g == got.end() ? w->first
                                            : std::min(w->first, g->first);
  const auto value = [&key](const std::map<std::string, std::string>& m) {
    const auto it = m.find(key);
    return it == m.end() ? std::string("absent") : "\"" + it->second + "\"";
  };
  throw FormatError(concat(path, ": metadata ", key, " is ", value(got), " but ", value(want),
                           " in ", first, ": checkpoints of different models cannot be averaged"));
}

}  // namespace detail

/// Sets every parameter to the arithmetic mean of its values in the checkpoints at `paths`,
/// accumulated in double. Each file is validated against `params` as load_model does (pass
/// LoadOptions{kTrainingStatePrefixes} to average training checkpoints); a file that disagrees
/// throws FormatError naming that file and tensor, and leaves `params` untouched. The metadata
/// keys that start with one of `same_metadata` (e.g. "config.") must be present with the same
/// values in every file, or absent from all: checkpoints of two models whose tensors have the same
/// shapes would otherwise average into nonsense without a word. FormatError names the file and
/// the first key that differs. Values are taken as they are, as load_model and PyTorch's
/// load_state_dict take them: a NaN or infinite weight in a file is in the average (call
/// check_finite_parameters, model_file.hpp, to refuse one; attn-translate does).
template <class T>
void average_checkpoints(const std::vector<std::string>& paths,
                         const std::vector<NamedParameter<T>>& params, const LoadOptions& opt = {},
                         const std::vector<std::string>& same_metadata = {}) {
  ATTN_CHECK(!paths.empty(), ConfigError, "average_checkpoints: no checkpoint paths given");
  std::vector<Eigen::VectorXd> sum;
  for (const auto& p : params) sum.push_back(Eigen::VectorXd::Zero(p.value.numel()));
  std::map<std::string, std::string> first_metadata;
  for (const auto& path : paths) {
    const SafetensorsFile file = load_safetensors(path, detail::model_tensors_check(params, opt));
    const auto metadata = detail::metadata_with_prefixes(file.metadata(), same_metadata);
    if (&path == &paths.front()) first_metadata = metadata;
    detail::check_same_metadata(first_metadata, metadata, paths.front(), path);
    for (std::size_t k = 0; k < params.size(); ++k) {
      const Tensor<T> t = file.tensor<T>(params[k].name);
      sum[k] += t.vector().template cast<double>();
    }
  }
  const double inv = 1.0 / static_cast<double>(paths.size());
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor<T> v = params[k].value;
    v.vector() = (sum[k] * inv).template cast<T>();
  }
}

/// shadow = decay * shadow + (1 - decay) * value after every optimiser step (as
/// torch.optim.swa_utils / timm's ModelEma). The shadow starts as a copy of the values and is
/// kept in T.
///
/// apply() swaps the shadow into the parameters (to evaluate or decode with the average) and
/// restore() swaps the training values back; both are exact swaps, no rounding.
template <class T>
class ExponentialMovingAverage {
 public:
  ExponentialMovingAverage(std::vector<NamedParameter<T>> params, double decay)
      : params_(std::move(params)), decay_(decay) {
    detail::check_probability("ExponentialMovingAverage", "decay", decay);
    for (const auto& p : params_) shadow_.push_back(p.value.clone());
  }

  /// Folds the current parameter values into the average.
  void update() {
    ATTN_CHECK(!applied_, ConfigError,
               "ExponentialMovingAverage::update: the average is applied; restore() first");
    const T d = static_cast<T>(decay_), a = static_cast<T>(1 - decay_);
    for (std::size_t k = 0; k < params_.size(); ++k)
      shadow_[k].vector() = shadow_[k].vector() * d + params_[k].value.vector() * a;
    ++updates_;
  }

  /// Writes the average into `params` (same names and shapes as the tracked parameters; another
  /// model instance, for example).
  void copy_to(const std::vector<NamedParameter<T>>& params) const {
    ATTN_CHECK(params.size() == params_.size(), ShapeError,
               "ExponentialMovingAverage::copy_to: ", params_.size(), " parameters tracked, ",
               params.size(), " given");
    for (std::size_t k = 0; k < params.size(); ++k) {
      ATTN_CHECK(params[k].name == params_[k].name && params[k].value.shape() == shadow_[k].shape(),
                 ShapeError, "ExponentialMovingAverage::copy_to: parameter ", k, " is ",
                 params[k].name, " ", params[k].value.shape(), ", expected ", params_[k].name, " ",
                 shadow_[k].shape());
    }
    for (std::size_t k = 0; k < params.size(); ++k) {
      // While applied, the average sits in the tracked parameters and the shadow holds the
      // training values.
      const Tensor<T>& avg = applied_ ? params_[k].value : shadow_[k];
      Tensor<T> dst = params[k].value;
      if (!dst.same_data(avg)) std::copy(avg.begin(), avg.end(), dst.begin());
    }
  }

  /// Swaps the average into the tracked parameters.
  void apply() {
    ATTN_CHECK(!applied_, ConfigError, "ExponentialMovingAverage::apply: already applied");
    swap_all();
    applied_ = true;
  }
  /// Swaps the training values back.
  void restore() {
    ATTN_CHECK(applied_, ConfigError, "ExponentialMovingAverage::restore: not applied");
    swap_all();
    applied_ = false;
  }
  bool applied() const { return applied_; }
  double decay() const { return decay_; }
  Index updates() const { return updates_; }

  /// The average as named tensors (the parameter names), e.g. for the "extra." tensors of a
  /// training checkpoint.
  std::vector<NamedTensor<T>> state() const {
    ATTN_CHECK(!applied_, ConfigError, "ExponentialMovingAverage::state: restore() first");
    std::vector<NamedTensor<T>> out;
    for (std::size_t k = 0; k < params_.size(); ++k) out.push_back({params_[k].name, shadow_[k]});
    return out;
  }
  /// state() as entries named prefix + parameter name, for save_safetensors or the `extra`
  /// argument of save_training_checkpoint.
  std::vector<TensorEntry> entries(const std::string& prefix = "ema.") const {
    std::vector<TensorEntry> out;
    for (const auto& s : state()) out.push_back(tensor_entry(prefix + s.name, s.value));
    return out;
  }
  /// Restores the average from tensors named prefix + parameter name in `file` (validated first:
  /// FormatError naming the tensor, nothing modified).
  void load_state(const SafetensorsFile& file, const std::string& prefix = "extra.ema.") {
    ATTN_CHECK(!applied_, ConfigError, "ExponentialMovingAverage::load_state: restore() first");
    for (std::size_t k = 0; k < params_.size(); ++k)
      detail::check_checkpoint_tensor(file, prefix + params_[k].name, shadow_[k]);
    for (std::size_t k = 0; k < params_.size(); ++k)
      detail::copy_checkpoint_tensor(file, prefix + params_[k].name, shadow_[k]);
  }

 private:
  void swap_all() {
    for (std::size_t k = 0; k < params_.size(); ++k)
      std::swap_ranges(shadow_[k].begin(), shadow_[k].end(), params_[k].value.begin());
  }

  std::vector<NamedParameter<T>> params_;
  std::vector<Tensor<T>> shadow_;  // the average (the training values while applied), per param
  double decay_;
  Index updates_ = 0;
  bool applied_ = false;
};

}  // namespace attn
