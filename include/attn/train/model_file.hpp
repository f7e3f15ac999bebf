// A Transformer described by a model file that someone else wrote: the configuration in its
// metadata is untrusted, and building the model it describes allocates memory. So every field is
// bounded and the whole configuration is checked against the file before anything is built: a
// file cannot make attn allocate much more than the file itself holds. Weights are then loaded
// only if every one is finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/nn/module.hpp"
#include "attn/nn/transformer_config.hpp"
#include "attn/train/safetensors.hpp"

namespace attn {

/// FormatError naming `file` and the field unless every size of `c` is within ConfigLimits
/// (config_limit_breach, transformer_config.hpp).
inline void check_config_limits(const TransformerConfig& c, const std::string& file) {
  const std::optional<ConfigLimitBreach> b = config_limit_breach(c);
  ATTN_CHECK(!b, FormatError, file, ": metadata config.", b->field, " = ", b->value,
             " is outside [0, ", b->max, "]");
  ATTN_CHECK(std::isfinite(c.layer_norm_eps), FormatError, file,
             ": metadata config.layer_norm_eps is not finite");
}

/// A lower bound on the number of parameters of a Transformer with config `c` (within
/// ConfigLimits): the embedding matrices and every layer's attention and feed-forward weights,
/// leaving out biases and layer norms. Every one of them is a tensor of the model file.
inline std::uint64_t min_parameter_count(const TransformerConfig& c) {
  const auto u = [](Index x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t D = u(c.d_model), F = u(c.d_ff);
  std::uint64_t n = u(c.src_vocab) * D;
  if (!c.share_embeddings) n += u(c.tgt_vocab) * D;
  if (c.learned_positions) n += u(c.max_positions) * D;
  n += u(c.encoder_layers) * (4 * D * D + 2 * D * F);  // self-attention in/out, FFN
  n += u(c.decoder_layers) * (8 * D * D + 2 * D * F);  // self- and cross-attention, FFN
  return n;
}

/// The number of values (elements of any dtype) the tensors of `file` hold.
inline std::uint64_t stored_values(const SafetensorsFile& file) {
  std::uint64_t n = 0;
  for (const auto& name : file.names()) {
    const TensorInfo& ti = file.info(name);
    n += (ti.end - ti.begin) / dtype_size(ti.dtype);
  }
  return n;
}

/// The TransformerConfig of `file`'s metadata ("config.<field>", TransformerConfig::to_metadata),
/// parsed strictly, bounded by ConfigLimits, validated, and describing no more parameters than
/// the file holds values. FormatError or ConfigError naming the file otherwise; nothing is built.
inline TransformerConfig config_from_model_file(const SafetensorsFile& file) {
  TransformerConfig c;
  try {
    c = TransformerConfig::from_metadata(file.metadata());
  } catch (const FormatError& e) {
    throw FormatError(detail::concat(file.path(), ": ", e.what()));
  } catch (const ConfigError& e) {
    throw ConfigError(detail::concat(file.path(), ": metadata config.*: ", e.what()));
  }
  check_config_limits(c, file.path());
  const std::uint64_t needed = min_parameter_count(c), held = stored_values(file);
  ATTN_CHECK(needed <= held, FormatError, file.path(), ": its config.* metadata describes a model ",
             "of at least ", needed, " parameters, but the file holds only ", held, " values");
  return c;
}

/// NumericError naming the tensor and `file` unless every parameter value is finite: a model
/// with a NaN weight would otherwise translate every sentence to an empty line.
template <class T>
void check_finite_parameters(const std::vector<NamedParameter<T>>& params,
                             const std::string& file) {
  for (const auto& p : params) {
    const T* x = p.value.data();
    for (Index i = 0; i < p.value.numel(); ++i)
      ATTN_CHECK(std::isfinite(x[i]), NumericError, file, ": parameter ", p.name,
                 " holds a non-finite value (", x[i], ") at element ", i);
  }
}

}  // namespace attn
