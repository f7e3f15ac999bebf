// Reads the golden files that make_golden.py writes: a sequence of tensors, each as
//   <name> <rank> <d0> ... <d_{rank-1}>
//   <numel values>
// The files sit beside this header, whose absolute path the compiler gives as __FILE__ (CMake
// compiles with absolute paths), so no build-system variable is needed; ATTN_GOLDEN_DIR overrides.
#pragma once

#include <attn/attn.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace attn::testing {

class GoldenFile {
 public:
  explicit GoldenFile(const std::string& file) {
    const std::string path = directory() + "/" + file;
    std::ifstream in(path);
    ATTN_CHECK(in.good(), IOError, "golden file not found: ", path);
    std::string name;
    while (in >> name) {
      int rank = 0;
      in >> rank;
      std::vector<Index> dims(static_cast<std::size_t>(rank));
      for (auto& d : dims) in >> d;
      Tensor<double> t{Shape(dims)};
      for (double& v : t) in >> v;
      ATTN_CHECK(!in.fail(), FormatError, "golden file ", path, ": truncated at tensor ", name);
      order_.push_back(name);
      tensors_.emplace(name, t);
    }
  }

  const Tensor<double>& operator[](const std::string& name) const {
    auto it = tensors_.find(name);
    ATTN_CHECK(it != tensors_.end(), IndexError, "golden file has no tensor named ", name);
    return it->second;
  }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  /// Tensor names in file order.
  const std::vector<std::string>& names() const { return order_; }

  /// A golden vector of lengths as the integers KeyPaddingMask::from_lengths takes.
  std::vector<Index> lengths(const std::string& name) const {
    std::vector<Index> out;
    for (double v : (*this)[name]) out.push_back(static_cast<Index>(v));
    return out;
  }

 private:
  static std::string directory() {
#if defined(ATTN_GOLDEN_DIR)
    return ATTN_GOLDEN_DIR;
#else
    const std::string here = __FILE__;
    const auto slash = here.find_last_of('/');
    return slash == std::string::npos ? "." : here.substr(0, slash);
#endif
  }

  std::map<std::string, Tensor<double>> tensors_;
  std::vector<std::string> order_;
};

/// max |a - b| over all elements; +infinity when the shapes differ or an element of either is
/// NaN or infinite (std::max would drop a NaN difference, and a NaN gradient would match).
inline double max_abs_diff(const Tensor<double>& a, const Tensor<double>& b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.shape() != b.shape()) return kInf;
  double m = 0;
  for (Index i = 0; i < a.numel(); ++i) {
    if (!std::isfinite(a.data()[i]) || !std::isfinite(b.data()[i])) return kInf;
    m = std::max(m, std::abs(a.data()[i] - b.data()[i]));
  }
  return m;
}

/// Copies every golden state_dict tensor into the parameter of the same name: every parameter of
/// `m` must appear with the same shape, and every golden tensor not an input must be a parameter.
/// Returns the names that were loaded.
template <class M>
std::vector<std::string> load_state_dict(M& m, const GoldenFile& g,
                                         const std::vector<std::string>& non_parameters) {
  std::vector<std::string> loaded;
  auto params = m.parameters();
  for (const auto& name : g.names()) {
    if (name.rfind("grad.", 0) == 0) continue;
    if (std::find(non_parameters.begin(), non_parameters.end(), name) != non_parameters.end())
      continue;
    auto it = std::find_if(params.begin(), params.end(),
                           [&](const NamedParameter<double>& p) { return p.name == name; });
    ATTN_CHECK(it != params.end(), IndexError, "torch parameter ", name, " has no counterpart");
    ATTN_CHECK(it->value.shape() == g[name].shape(), ShapeError, "parameter ", name, ": torch ",
               g[name].shape(), ", attn ", it->value.shape());
    std::copy(g[name].begin(), g[name].end(), it->value.begin());
    loaded.push_back(name);
  }
  return loaded;
}

}  // namespace attn::testing
