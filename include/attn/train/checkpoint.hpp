// Model and training checkpoints as safetensors files (needs nlohmann-json; see safetensors.hpp).
//
// A model checkpoint holds one tensor per parameter under its parameters() name (PyTorch's
// state_dict names, so torch's safetensors.torch.load_file gives a loadable state dict) in its own
// dtype (F32 for float, F64 for double), plus string metadata.
//
// A training checkpoint adds what a resumed run needs to continue bit for bit:
//   "adam.<name>.exp_avg", "adam.<name>.exp_avg_sq"   Adam's moments, raw bits of T
//   "extra.<name>"                                    caller tensors (an EMA, ...)
//   metadata "step", "rng_seed", "rng_counter"        decimal integers
//   metadata of the caller                            e.g. "config.<field>" (model_file.hpp)
#pragma once

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "attn/nn/module.hpp"
#include "attn/random.hpp"
#include "attn/strict_number.hpp"
#include "attn/train/adam.hpp"
#include "attn/train/safetensors.hpp"

namespace attn {

struct LoadOptions {
  /// Tensors of the file whose names start with one of these are not reported as unexpected
  /// (kTrainingStatePrefixes lets load_model and average_checkpoints read training checkpoints).
  std::vector<std::string> ignore_prefixes;
  /// Accept any tensor of the file that is not a parameter.
  bool allow_unexpected = false;
  /// The most bytes the tensors skipped (under ignore_prefixes, or any with allow_unexpected) may
  /// hold together: a file declaring more is refused before it is read (a training checkpoint's
  /// Adam moments are twice its parameters' bytes; an "extra." tensor declared 1 TB long over a
  /// sparse hole was read whole).
  std::size_t max_ignored_bytes = std::numeric_limits<std::size_t>::max();
};

/// The prefixes of the non-model tensors of a training checkpoint.
inline const std::vector<std::string> kTrainingStatePrefixes = {"adam.", "extra."};

namespace detail {

inline bool has_prefix(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// Throws FormatError unless tensor `name` of `file` exists with dst's dtype and shape.
template <class T>
void check_checkpoint_tensor(const SafetensorsFile& file, const std::string& name,
                             const Tensor<T>& dst) {
  ATTN_CHECK(file.contains(name), FormatError, "checkpoint ", file.path(), " has no tensor ", name,
             " (expected shape ", dst.shape(), ")");
  const TensorInfo& ti = file.info(name);
  ATTN_CHECK(ti.dtype == dtype_of<T>(), FormatError, "checkpoint tensor ", name,
             ": expected dtype ", dtype_of<T>(), ", file has ", ti.dtype, " (", file.path(), ")");
  ATTN_CHECK(dst.has_storage(), ConfigError, "checkpoint tensor ", name,
             ": the parameter it would be read into has no storage (it was never allocated)");
  ATTN_CHECK(ti.shape == dst.shape().to_vector(), FormatError, "checkpoint tensor ", name,
             ": expected shape ", dst.shape(), ", file has ", shape_str(ti.shape), " (",
             file.path(), ")");
}

template <class T>
void copy_checkpoint_tensor(const SafetensorsFile& file, const std::string& name, Tensor<T>& dst) {
  const TensorInfo& ti = file.info(name);
  if (ti.end > ti.begin) std::memcpy(dst.data(), file.bytes(name), ti.end - ti.begin);
}

/// Checks every parameter against the file and that the file has nothing else (but `known` names
/// and what `opt` allows). Reads nothing: a failed check leaves the parameters untouched.
template <class T>
void validate_model_tensors(const SafetensorsFile& file,
                            const std::vector<NamedParameter<T>>& params, const LoadOptions& opt,
                            const std::unordered_set<std::string>& known = {}) {
  std::unordered_set<std::string> expected;
  for (const auto& p : params) {
    check_checkpoint_tensor(file, p.name, p.value);
    expected.insert(p.name);
  }
  std::size_t ignored_bytes = 0;
  for (const auto& name : file.names()) {
    if (expected.count(name) || known.count(name)) continue;
    bool ignored = opt.allow_unexpected;
    for (const auto& prefix : opt.ignore_prefixes) ignored = ignored || has_prefix(name, prefix);
    ATTN_CHECK(ignored, FormatError, "checkpoint ", file.path(), " has unexpected tensor ", name,
               " ", shape_str(file.info(name).shape), ", which is not a parameter of the model");
    ignored_bytes += file.info(name).end - file.info(name).begin;  // tiling: no overflow
    ATTN_CHECK(ignored_bytes <= opt.max_ignored_bytes, FormatError, "checkpoint ", file.path(),
               ": its tensors outside the model, up to ", name, ", hold ", ignored_bytes,
               " bytes, more than the ", opt.max_ignored_bytes, " allowed");
  }
}

/// A header check for load_safetensors: the file holds every parameter and what `opt` allows
/// besides, so that nothing is read of a file that would be refused. Holds copies (the parameters
/// as handles), so it may outlive its arguments.
template <class T>
auto model_tensors_check(const std::vector<NamedParameter<T>>& params, const LoadOptions& opt,
                         std::unordered_set<std::string> known = {}) {
  return [params, opt, known = std::move(known)](const SafetensorsFile& header) {
    validate_model_tensors(header, params, opt, known);
  };
}

/// Metadata `key` of a training checkpoint as an integer of [0, max]; FormatError naming the file
/// and the key otherwise.
inline std::uint64_t parse_u64(const SafetensorsFile& file, const std::string& key,
                               std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  auto it = file.metadata().find(key);
  ATTN_CHECK(it != file.metadata().end(), FormatError, "checkpoint ", file.path(),
             " has no metadata \"", key, "\" (not a training checkpoint?)");
  const std::optional<std::uint64_t> v = parse_number<std::uint64_t>(it->second);
  ATTN_CHECK(v && *v <= max, FormatError, "checkpoint ", file.path(), ": metadata \"", key,
             "\" must be a non-negative decimal integer, got \"", it->second, "\" (at most ", max,
             ")");
  return *v;
}

/// The most updates a training checkpoint may record: the learning-rate schedule and Adam's bias
/// corrections count them in double, exact to 2^53, and a count near Index's limit (accepted
/// until session 41) overflowed at the next update.
inline constexpr auto kMaxCheckpointSteps = static_cast<std::uint64_t>(Adam<float>::kMaxSteps);

/// FormatError naming `path` unless every element of Adam's moment `m` is finite, and a second
/// moment (exp_avg_sq) also >= 0: a checkpoint with such a state resumed, and its first update
/// wrote NaN weights into the next checkpoint.
template <class T>
void check_adam_moment(const NamedTensor<T>& m, const std::string& path) {
  const std::string suffix = ".exp_avg_sq";
  const bool second = m.name.size() >= suffix.size() &&
                      m.name.compare(m.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const T* x = m.value.data();
  for (Index i = 0; i < m.value.numel(); ++i)
    ATTN_CHECK(std::isfinite(x[i]) && (!second || x[i] >= 0), FormatError, "checkpoint ", path,
               ": Adam's ", m.name, " holds ", x[i], " at element ", i,
               ", expected a finite number", second ? " >= 0" : "");
}

}  // namespace detail

/// Writes every parameter value to `path` (atomically) with `metadata`.
template <class T>
void save_model(const std::string& path, const std::vector<NamedParameter<T>>& params,
                const std::map<std::string, std::string>& metadata = {}) {
  std::vector<TensorEntry> entries;
  for (const auto& p : params) entries.push_back(tensor_entry(p.name, p.value));
  save_safetensors(path, entries, metadata);
}
template <class T>
void save_model(const std::string& path, const Module<T>& model,
                const std::map<std::string, std::string>& metadata = {}) {
  save_model(path, model.parameters(), metadata);
}

/// Loads every parameter from `path`, after checking that the file holds each of them with the
/// same dtype and shape and no other tensor (unless `opt` allows it); FormatError names the
/// tensor otherwise, and nothing is modified. Returns the file's metadata. Values are taken as they
/// are, as PyTorch's load_state_dict takes them: check_finite_parameters (model_file.hpp) refuses
/// a NaN or infinite weight.
template <class T>
std::map<std::string, std::string> load_model(const SafetensorsFile& file,
                                              const std::vector<NamedParameter<T>>& params,
                                              const LoadOptions& opt = {}) {
  detail::validate_model_tensors(file, params, opt);
  for (auto p : params) detail::copy_checkpoint_tensor(file, p.name, p.value);
  return file.metadata();
}
template <class T>
std::map<std::string, std::string> load_model(const std::string& path,
                                              const std::vector<NamedParameter<T>>& params,
                                              const LoadOptions& opt = {}) {
  return load_model(load_safetensors(path, detail::model_tensors_check(params, opt)), params, opt);
}
template <class T>
std::map<std::string, std::string> load_model(const std::string& path, Module<T>& model,
                                              const LoadOptions& opt = {}) {
  return load_model(path, model.parameters(), opt);
}

/// What load_training_checkpoint restores besides the tensors it was given.
struct TrainingCheckpoint {
  Index step = 0;                               // Adam's step count at save time
  std::map<std::string, std::string> metadata;  // all of it, the reserved keys included
  SafetensorsFile file;                         // for extra tensors: file.tensor<T>("extra.x")
};

/// Writes parameters, Adam's moments and step count, the dropout stream's (seed, counter),
/// `metadata` (whose keys must not be "step", "rng_seed" or "rng_counter") and `extra` tensors
/// (stored as "extra.<name>"), atomically.
template <class T>
AtomicWriteResult save_training_checkpoint(const std::string& path,
                                           const std::vector<NamedParameter<T>>& params,
                                           const Adam<T>& adam, const RandomState& rng,
                                           const std::map<std::string, std::string>& metadata = {},
                                           const std::vector<TensorEntry>& extra = {}) {
  std::map<std::string, std::string> meta = metadata;
  for (const char* key : {"step", "rng_seed", "rng_counter"})
    ATTN_CHECK(!meta.count(key), ConfigError, "save_training_checkpoint: metadata key \"", key,
               "\" is reserved");
  meta["step"] = std::to_string(adam.steps());
  meta["rng_seed"] = std::to_string(rng.seed);
  meta["rng_counter"] = std::to_string(rng.counter);
  std::vector<TensorEntry> entries;
  for (const auto& p : params) entries.push_back(tensor_entry(p.name, p.value));
  for (const auto& s : adam.state()) entries.push_back(tensor_entry("adam." + s.name, s.value));
  for (TensorEntry e : extra) {
    e.name = "extra." + e.name;
    entries.push_back(std::move(e));
  }
  return save_safetensors(path, entries, meta);
}

/// Restores what save_training_checkpoint wrote: parameter values, Adam's moments and step
/// count, and `rng`. Every parameter and moment must be present with its dtype and shape, and the
/// file must hold nothing else outside "extra." (at most `max_extra_bytes` there); otherwise
/// FormatError, and nothing is modified. The tensors are read only once the header passed.
template <class T>
TrainingCheckpoint load_training_checkpoint(
    const std::string& path, const std::vector<NamedParameter<T>>& params, Adam<T>& adam,
    RandomState& rng, std::size_t max_extra_bytes = std::numeric_limits<std::size_t>::max()) {
  // Everything is read and checked before anything is modified: a bad file leaves the
  // parameters, Adam and `rng` as they were.
  std::unordered_set<std::string> known;
  for (const auto& s : adam.state()) known.insert("adam." + s.name);
  const LoadOptions extra{{"extra."}, false, max_extra_bytes};
  Index steps = 0;
  std::uint64_t seed = 0, counter = 0;
  TrainingCheckpoint out;
  out.file = load_safetensors(path, [&](const SafetensorsFile& header) {
    steps = static_cast<Index>(detail::parse_u64(header, "step", detail::kMaxCheckpointSteps));
    seed = detail::parse_u64(header, "rng_seed");
    counter = detail::parse_u64(header, "rng_counter");
    for (const auto& s : adam.state())
      detail::check_checkpoint_tensor(header, "adam." + s.name, s.value);
    detail::validate_model_tensors(header, params, extra, known);
  });
  const SafetensorsFile& file = out.file;
  std::vector<NamedTensor<T>> state;
  for (const auto& s : adam.state()) state.push_back({s.name, file.tensor<T>("adam." + s.name)});
  for (const auto& s : state) detail::check_adam_moment(s, path);
  adam.load_state(state, steps);  // checks the state before it changes Adam
  for (auto p : params) detail::copy_checkpoint_tensor(file, p.name, p.value);
  rng.seed = seed;
  rng.counter = counter;
  out.step = steps;
  out.metadata = file.metadata();
  return out;
}

}  // namespace attn
