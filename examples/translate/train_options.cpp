// TrainOptions::validate and make_config: the checks the option table (train_options.hpp) drives.
#include "train_options.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <type_traits>

#include <attn/parallel.hpp>  // memory_limit_bytes
#include <attn/train/model_file.hpp>

namespace attn::translate {

namespace {

// ConfigError naming the flag unless the model of `c` is within ConfigLimits (as a model file's
// must be) and its weights, gradients and Adam's two moments fit in the memory this process may
// use (physical memory, or less under an address-space or data limit, where it ended in
// std::bad_alloc after writing the vocabulary).
void check_model_size(const TransformerConfig& c) {
  if (const std::optional<ConfigLimitBreach> b = config_limit_breach(c)) {
    std::string flag = b->field;
    TrainOptions{}.visit_options([&](const OptionInfo& info, const auto&, const auto&) {
      if (info.overrides_field(b->field)) flag = info.name();
    });
    throw ConfigError(detail::concat(flag, " ", b->value, " is more than the ", b->max,
                                     " a model file may hold"));
  }
  const double gib = std::ldexp(1.0, 30);
  const double needed = 16.0 * static_cast<double>(min_parameter_count(c));
  const double memory = attn::detail::memory_limit_bytes();  // 0 if unknown: no check
  ATTN_CHECK(memory <= 0 || needed <= memory, ConfigError, "a model of at least ",
             min_parameter_count(c), " parameters needs ", needed / gib,
             " GiB for its weights, gradients and Adam's moments, more than the ", memory / gib,
             " GiB this process may use (its machine's memory or its address-space or data "
             "limit; "
             "--d-model, --d-ff, --layers and --vocab-size set the model's size)");
}

// Whether an override is given: an integer > 0, a floating-point value >= 0 (a dropout), a switch
// that is on. Otherwise the preset's value stays.
template <class V>
bool given(const V& v) {
  if constexpr (std::is_same_v<V, bool>)
    return v;
  else if constexpr (std::is_floating_point_v<V>)
    return v >= 0;
  else
    return v > 0;
}

// Sets in `c` the model fields of every row of the table that `o` gives.
void apply_overrides(const TrainOptions& o, TransformerConfig& c) {
  o.visit_options([&](const OptionInfo& info, const auto& value, const auto&) {
    using V = std::decay_t<decltype(value)>;
    if constexpr (std::is_arithmetic_v<V>) {
      if (!info.applied || !given(value)) return;
      c.visit_fields([&](const char* name, auto& field, FieldRule) {
        using C = std::decay_t<decltype(field)>;
        if constexpr (std::is_arithmetic_v<C>)
          if (info.overrides_field(name)) field = static_cast<C>(value);
      });
    }
  });
}

}  // namespace

TransformerConfig make_config(const TrainOptions& o, Index vocab) {
  TransformerConfig c = TransformerConfig::named(o.preset, vocab);
  c.pad_id = SubwordVocab::kPad;
  apply_overrides(o, c);
  c.seed = o.seed;
  c.validate();
  check_model_size(c);
  return c;
}

void TrainOptions::validate() const {
  const TrainOptions& o = *this;
  ATTN_CHECK(!o.model_dir.empty(), ConfigError, "train: --model-dir is required");
  o.visit_options([](const OptionInfo& info, const auto& value, const auto& range) {
    using V = std::decay_t<decltype(value)>;
    if constexpr (kIsNumber<V>)
      ATTN_CHECK(range.contains(value), ConfigError, info.name(), " must be ", range.text(),
                 info.note ? detail::concat(" (", info.note, ")") : std::string(), ", got ", value);
  });
  // A new run's --cooldown ends its learning rate at --steps, so it needs a --steps that many
  // long; a resumed run's is the checkpoint's (checked against --steps once it is restored).
  ATTN_CHECK(o.resume || o.cooldown == 0 || (o.steps > 0 && o.cooldown <= o.steps), ConfigError,
             "--cooldown ", o.cooldown, " needs --steps of at least as many updates (the run's ",
             "length, where the learning rate reaches zero), got --steps ", o.steps);
  ATTN_CHECK(o.average <= o.keep, ConfigError, "--average ", o.average, " averages the last ",
             o.average, " checkpoints, but --keep ", o.keep, " keeps only ", o.keep);
  // A resumed run's --max-tokens and --max-len are its checkpoint's.
  ATTN_CHECK(o.resume || o.max_tokens >= o.max_len, ConfigError, "--max-tokens ", o.max_tokens,
             " must be at least --max-len ", o.max_len,
             " so that a pair of the longest allowed length fits in a batch");
}

}  // namespace attn::translate
