// TransformerConfig: the whole model's sizes and switches, with the paper's presets.
//
// The presets are the paper exactly (Vaswani et al. 2017, Table 3): post-norm, no attention or ReLU
// dropout, sinusoidal positions, one weight matrix shared by both embeddings and the pre-softmax
// projection. Every departure that popular implementations make silently (tensor2tensor's
// transformer_base is pre-norm, with attention/ReLU dropout) is a named switch here, off in the
// presets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include "attn/nn/layer_options.hpp"
#include "attn/strict_number.hpp"

namespace attn {

/// The layer fields (d_model, heads, d_ff, dropout, attention_dropout, relu_dropout, norm_first,
/// layer_norm_eps, use_fast_kernel) are LayerOptions', inherited: declared once, there. The model
/// also applies `dropout` (P_drop) to the embedding + position sums. visit_fields walks every
/// field, the layer's included: validation, printing and checkpoint metadata use that one list.
struct TransformerConfig : LayerOptions, FieldList<TransformerConfig> {
  using FieldList<TransformerConfig>::visit_fields;  // all fields, not only the layer's

  Index src_vocab = 0;  // V of the source side
  Index tgt_vocab = 0;  // V of the target side
  /// One matrix for the source embedding, the target embedding and the pre-softmax projection
  /// (the paper's setting, section 3.4); needs src_vocab == tgt_vocab.
  bool share_embeddings = true;
  /// When the embeddings are not shared: tie the target embedding to the pre-softmax projection.
  bool tie_output = true;

  Index encoder_layers = 6;
  Index decoder_layers = 6;
  bool learned_positions = false;  // Table 3 row (E): learned positional embeddings
  Index max_positions = 1024;      // longest sequence learned positions can embed

  TokenId pad_id = 0;
  std::uint64_t seed = 1;  // parameter initialisation and dropout masks

  /// The paper's base model: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters with
  /// the paper's 37,000-token vocabulary).
  static TransformerConfig base(Index vocab) { return preset(vocab, 512, 8, 2048, 6, 0.1); }
  /// The paper's big model: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (213M).
  static TransformerConfig big(Index vocab) { return preset(vocab, 1024, 16, 4096, 6, 0.3); }
  /// A small model for CPU experiments: N=3, d_model=256, d_ff=1024, h=4, P_drop=0.1.
  static TransformerConfig small(Index vocab) { return preset(vocab, 256, 4, 1024, 3, 0.1); }
  /// A tiny model for tests: N=2, d_model=64, d_ff=128, h=4, no dropout.
  static TransformerConfig tiny(Index vocab) { return preset(vocab, 64, 4, 128, 2, 0.0); }

  /// The names of the presets above, for flags and benchmark arguments.
  static constexpr const char* kPresetNames[] = {"tiny", "small", "base", "big"};
  /// The preset of that name; ConfigError naming the names for any other.
  static TransformerConfig named(const std::string& name, Index vocab) {
    using Preset = TransformerConfig (*)(Index);
    constexpr Preset kPresets[] = {tiny, small, base, big};  // in kPresetNames' order
    static_assert(std::size(kPresets) == std::size(kPresetNames));
    for (std::size_t i = 0; i < std::size(kPresets); ++i)
      if (name == kPresetNames[i]) return kPresets[i](vocab);
    ATTN_CHECK(false, ConfigError, "unknown preset '", name,
               "', expected tiny, small, base or big");
    return {};
  }

  /// The fields the encoder and decoder layers take.
  LayerOptions layer_options() const { return static_cast<const LayerOptions&>(*this); }

  /// Throws ConfigError naming the offending value. Sizes beyond ConfigLimits are
  /// check_config_limits' (below), which the Transformer constructor adds.
  void validate() const {
    detail::check_fields(*this);
    LayerOptions::validate();
    ATTN_CHECK(!share_embeddings || src_vocab == tgt_vocab, ConfigError,
               "share_embeddings needs one vocabulary, got src_vocab ", src_vocab,
               " and tgt_vocab ", tgt_vocab);
    ATTN_CHECK(!learned_positions || max_positions > 0, ConfigError,
               "max_positions must be > 0 with learned positions, got ", max_positions);
    ATTN_CHECK(pad_id < std::min(src_vocab, tgt_vocab), ConfigError, "pad_id ", pad_id,
               " outside the vocabulary [0, ", std::min(src_vocab, tgt_vocab), ")");
  }

  /// Every stored field as text, for checkpoint metadata ("config.<field>").
  std::map<std::string, std::string> to_metadata() const {
    std::map<std::string, std::string> m;
    visit_fields([&](const char* name, const auto& v, FieldRule) {
      if (!stored(name)) return;
      std::ostringstream s;
      s.precision(17);
      s << v;
      m[std::string("config.") + name] = s.str();
    });
    return m;
  }

  /// The inverse of to_metadata(); a missing or malformed field is a FormatError naming it.
  static TransformerConfig from_metadata(const std::map<std::string, std::string>& m) {
    TransformerConfig c;
    c.visit_fields([&](const char* name, auto& v, FieldRule) {
      if (!stored(name)) return;
      auto it = m.find(std::string("config.") + name);
      ATTN_CHECK(it != m.end(), FormatError, "checkpoint metadata lacks config.", name);
      v = parse_number_or_throw<std::decay_t<decltype(v)>>(it->second, "checkpoint metadata",
                                                           it->first);
    });
    c.validate();
    return c;
  }

 private:
  friend struct FieldList<TransformerConfig>;
  template <class Self, class F>
  static void visit(Self& c, F& f) {
    constexpr FieldRule vocab = FieldRule::size(ConfigLimits::kMaxVocab);
    constexpr FieldRule layers = FieldRule::size(ConfigLimits::kMaxLayers);
    f("src_vocab", c.src_vocab, vocab);
    f("tgt_vocab", c.tgt_vocab, vocab);
    f("share_embeddings", c.share_embeddings, FieldRule::any);
    f("tie_output", c.tie_output, FieldRule::any);
    LayerOptions::visit(c, f);
    f("encoder_layers", c.encoder_layers, layers);
    f("decoder_layers", c.decoder_layers, layers);
    f("learned_positions", c.learned_positions, FieldRule::any);
    // > 0 with learned positions (validate)
    f("max_positions", c.max_positions, FieldRule(FieldRule::any, ConfigLimits::kMaxPositions));
    f("pad_id", c.pad_id, FieldRule::non_negative);
    f("seed", c.seed, FieldRule::any);
  }

  /// Whether checkpoints store the field: use_fast_kernel picks a kernel of this process, not a
  /// property of the model.
  static bool stored(const char* name) { return std::strcmp(name, "use_fast_kernel") != 0; }

  static TransformerConfig preset(Index vocab, Index d, Index h, Index f, Index n, double p) {
    TransformerConfig c;
    c.src_vocab = c.tgt_vocab = vocab;
    c.d_model = d;
    c.heads = h;
    c.d_ff = f;
    c.encoder_layers = c.decoder_layers = n;
    c.dropout = p;
    return c;
  }
};

/// A size of a TransformerConfig outside ConfigLimits: the field, its value and the bound.
struct ConfigLimitBreach {
  const char* field;
  Index value, max;
};

/// The first size of `c` outside [0, its ConfigLimits bound] (FieldRule::file_max, in the order
/// of the config's one list of fields), if any.
inline std::optional<ConfigLimitBreach> config_limit_breach(const TransformerConfig& c) {
  std::optional<ConfigLimitBreach> breach;
  c.visit_fields([&](const char* name, const auto& value, FieldRule rule) {
    using V = std::decay_t<decltype(value)>;
    if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
      if (breach || rule.file_max <= 0) return;
      // Every integer type, so that a bound on a field of another type is not silently ignored.
      const auto max = static_cast<std::uint64_t>(rule.file_max);
      if constexpr (std::is_signed_v<V>) {
        if (value < 0 || static_cast<std::uint64_t>(value) > max)
          breach = ConfigLimitBreach{name, static_cast<Index>(value), rule.file_max};
      } else if (static_cast<std::uint64_t>(value) > max) {
        const std::uint64_t shown = std::min<std::uint64_t>(value, INT64_MAX);
        breach = ConfigLimitBreach{name, static_cast<Index>(shown), rule.file_max};
      }
    }
  });
  return breach;
}

/// ConfigError naming the field unless every size of `c` is within ConfigLimits. The Transformer
/// constructor calls it after validate(): a model beyond them was built and saved, but its file
/// refused by the reader (check_config_limits(c, file)), and a vocabulary or a layer count of 2^40
/// ended in std::bad_alloc or the OOM killer. validate() leaves it out so that a program can check
/// the limits first in its own words (the translate example names its flags).
inline void check_config_limits(const TransformerConfig& c) {
  const std::optional<ConfigLimitBreach> b = config_limit_breach(c);
  ATTN_CHECK(!b, ConfigError, "TransformerConfig: ", b->field, " = ", b->value, " is outside [0, ",
             b->max, "], the range a model file may hold");
}

}  // namespace attn
