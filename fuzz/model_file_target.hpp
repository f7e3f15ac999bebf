// The body of the model-file fuzz target: a model file is the one input from which attn builds
// something large. The bytes are parsed as safetensors, the config is read from its metadata
// (config_from_model_file: strict numbers, bounds, no more parameters than the file holds), the
// Transformer is built, the weights loaded and checked finite. attn::Error is the expected refusal;
// a crash, another exception, an allocation beyond -rss_limit_mb or a sanitizer report is a bug.
#pragma once

#include <attn/nn/transformer.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/model_file.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "safetensors_target.hpp"
#include "seeds.hpp"

namespace attn::fuzz {

enum class ModelFileOutcome { rejected, loaded };

inline ModelFileOutcome run_model_file(const std::uint8_t* data, std::size_t size) {
  try {
    const SafetensorsFile file =
        parse_safetensors(std::vector<unsigned char>(data, data + size), "fuzz_model.safetensors");
    const TransformerConfig config = config_from_model_file(file);
    Transformer<float> model(config);
    load_model(file, model.parameters(), LoadOptions{kTrainingStatePrefixes});
    check_finite_parameters(model.parameters(), file.path());
    return ModelFileOutcome::loaded;
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    return ModelFileOutcome::rejected;
  }
}

/// A small model, as the seeds hold it: d_model 8, 2 heads, d_ff 16, one layer each side.
inline TransformerConfig fuzz_model_config() {
  TransformerConfig c = TransformerConfig::tiny(12);
  c.d_model = 8;
  c.heads = 2;
  c.d_ff = 16;
  c.encoder_layers = c.decoder_layers = 1;
  return c;
}

/// Seeds: the small model saved as a model file, and as one with learned positions and separate
/// embeddings; written through a scratch file in `dir`.
inline std::vector<std::pair<std::string, std::string>> model_file_seeds(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> seeds;
  TransformerConfig shared = fuzz_model_config(), separate = fuzz_model_config();
  separate.share_embeddings = false;
  separate.tie_output = false;
  separate.learned_positions = true;
  separate.max_positions = 16;
  int i = 0;
  for (const TransformerConfig& c : {shared, separate}) {
    Transformer<float> model(c);
    auto meta = c.to_metadata();
    meta["translate.max_len"] = "32";
    std::vector<TensorEntry> entries;
    for (const auto& p : model.parameters()) entries.push_back(tensor_entry(p.name, p.value));
    seeds.emplace_back("model_" + std::to_string(i++) + ".safetensors",
                       written_safetensors(dir, entries, meta));
  }
  return seeds;
}

}  // namespace attn::fuzz
