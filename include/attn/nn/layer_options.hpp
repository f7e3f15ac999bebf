// LayerOptions: the sizes and regularisation of one Transformer layer, shared by the encoder and
// decoder layers and their stacks. Defaults are the paper's base model (Vaswani et al. 2017, table
// 3).
//
// Configuration structs list their fields once more, in visit_fields(): the one list that
// validation, printing and checkpoint metadata walk (as nlohmann/json's NLOHMANN_DEFINE_TYPE_*
// macros do for a struct's fields). A field added to the struct but not to its visitor is neither
// checked, printed nor saved, so the two sit next to each other.
#pragma once

#include <ostream>
#include <type_traits>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// The largest sizes a model file may describe: a size read from a file is hostile, and is
/// checked against its bound before anything is allocated (train/model_file.hpp). Generous (the
/// paper's big model has d_model 1024, d_ff 4096, 6 layers, a 37,000-token vocabulary), and small
/// enough that sizes computed from them cannot overflow.
struct ConfigLimits {
  static constexpr Index kMaxVocab = Index(1) << 24;
  static constexpr Index kMaxDModel = Index(1) << 16;
  static constexpr Index kMaxDff = Index(1) << 20;
  static constexpr Index kMaxLayers = 1024;
  static constexpr Index kMaxPositions = Index(1) << 20;
};

/// What a configuration field's value must satisfy, checked by detail::check_field, and for a
/// size, the largest value a model file may hold (file_max, 0: none).
struct FieldRule {
  enum Kind {
    any,           // every value of the type
    positive,      // > 0
    non_negative,  // >= 0
    probability,   // in [0, 1)
  };
  Kind kind;
  Index file_max = 0;

  constexpr FieldRule(Kind k, Index max = 0) : kind(k), file_max(max) {}  // NOLINT: implicit
  /// A size: > 0, and at most `max` in a model file.
  static constexpr FieldRule size(Index max) { return {positive, max}; }
};

namespace detail {

/// Throws ConfigError "<name> must be ..., got <value>" unless value satisfies rule.
template <class V>
void check_field(const char* name, const V& value, FieldRule rule) {
  if constexpr (std::is_arithmetic_v<V> && !std::is_same_v<V, bool>) {
    switch (rule.kind) {
      case FieldRule::any:
        break;
      case FieldRule::positive:
        ATTN_CHECK(value > 0, ConfigError, name, " must be > 0, got ", value);
        break;
      case FieldRule::non_negative:
        ATTN_CHECK(value >= 0, ConfigError, name, " must be >= 0, got ", value);
        break;
      case FieldRule::probability:
        detail::check_probability("", name, value);
        break;
    }
  }
}

/// "name=value" for every field of `config`, space-separated, bools as true/false.
template <class Config>
std::ostream& print_fields(std::ostream& os, const Config& config) {
  const char* sep = "";
  config.visit_fields([&](const char* name, const auto& value, FieldRule) {
    os << sep << name << '=';
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>)
      os << (value ? "true" : "false");
    else
      os << value;
    sep = " ";
  });
  return os;
}

/// Throws ConfigError for the first field of `config` outside its FieldRule.
template <class Config>
void check_fields(const Config& config) {
  config.visit_fields(
      [](const char* name, const auto& value, FieldRule rule) { check_field(name, value, rule); });
}

}  // namespace detail

/// Gives Config visit_fields(f), which calls f(name, field, rule) for every field in declaration
/// order, const or not, from Config's private static visit(self, f): the one list of its fields.
/// Printing (operator<<, "name=value ...") walks that list.
template <class Config>
struct FieldList {
  template <class F>
  void visit_fields(F&& f) {
    Config::visit(static_cast<Config&>(*this), f);
  }
  template <class F>
  void visit_fields(F&& f) const {
    Config::visit(static_cast<const Config&>(*this), f);
  }

  friend std::ostream& operator<<(std::ostream& os, const Config& config) {
    return detail::print_fields(os, config);
  }
};

struct LayerOptions : FieldList<LayerOptions> {
  Index d_model = 512;  // D
  Index heads = 8;      // H; d_k = d_v = D / H
  Index d_ff = 2048;    // F
  /// P_drop of the paper: on each sublayer's output, before the residual add.
  double dropout = 0.1;
  /// On the softmax attention weights, and inside the feed-forward after the ReLU: tensor2tensor
  /// extras, both 0 in the paper.
  double attention_dropout = 0.0;
  double relu_dropout = 0.0;
  /// false: the paper's post-norm, x = LayerNorm(x + Dropout(f(x))).
  /// true:  pre-norm, x = x + Dropout(f(LayerNorm(x))); stacks then need a final LayerNorm.
  bool norm_first = false;
  double layer_norm_eps = 1e-5;
  /// The fused attention kernel, or the naive reference one (same results, for tests).
  bool use_fast_kernel = true;

  /// Throws ConfigError naming the offending value.
  void validate() const {
    detail::check_fields(*this);
    ATTN_CHECK(d_model % heads == 0, ConfigError, "d_model (", d_model,
               ") must be divisible by heads (", heads, ")");
  }

 protected:
  friend struct FieldList<LayerOptions>;
  template <class Self, class F>
  static void visit(Self& o, F& f) {
    f("d_model", o.d_model, FieldRule::size(ConfigLimits::kMaxDModel));
    f("heads", o.heads, FieldRule::size(ConfigLimits::kMaxDModel));
    f("d_ff", o.d_ff, FieldRule::size(ConfigLimits::kMaxDff));
    f("dropout", o.dropout, FieldRule::probability);
    f("attention_dropout", o.attention_dropout, FieldRule::probability);
    f("relu_dropout", o.relu_dropout, FieldRule::probability);
    f("norm_first", o.norm_first, FieldRule::any);
    f("layer_norm_eps", o.layer_norm_eps, FieldRule::positive);
    f("use_fast_kernel", o.use_fast_kernel, FieldRule::any);
  }
};

namespace detail {

/// Validates before any member is built, so the error names the LayerOptions field.
inline const LayerOptions& validated(const LayerOptions& o) {
  o.validate();
  return o;
}

}  // namespace detail

}  // namespace attn
