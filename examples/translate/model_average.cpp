#include "model_average.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <attn/nn/transformer.hpp>
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/model_file.hpp>

#include "model_dir.hpp"  // list_checkpoints, final_model_path
#include "model_metadata.hpp"

namespace attn::translate {

namespace {

/// NumericError unless every value of the average in `params` is finite, naming the parameter,
/// the element and the first of `inputs` that holds a non-finite value there: the mean of finite
/// floats, summed in double, is finite, so one of them does. A model with a NaN weight is refused
/// by translate and --resume; average used to write one without a word. The inputs are read as
/// the average read them (`options`).
void check_finite_average(const std::vector<NamedParameter<float>>& params,
                          const std::vector<std::string>& inputs, const LoadOptions& options,
                          const std::string& output) {
  for (const auto& p : params) {
    const float* avg = p.value.data();
    Index bad = 0;
    while (bad < p.value.numel() && std::isfinite(avg[bad])) ++bad;
    if (bad == p.value.numel()) continue;
    std::string source = "no input holds one there";
    for (const std::string& input : inputs) {
      const float x = load_safetensors(input, detail::model_tensors_check(params, options))
                          .tensor<float>(p.name)
                          .data()[bad];
      if (std::isfinite(x)) continue;
      source = detail::concat(input, " holds ", x, " there");
      break;
    }
    throw NumericError(detail::concat("average: not writing ", output, ": parameter ", p.name,
                                      " of the average is ", avg[bad], " at element ", bad, " (",
                                      source, ")"));
  }
}

}  // namespace

void average_files(const std::vector<std::string>& inputs, const std::string& output,
                   const std::map<std::string, std::string>& extra) {
  ATTN_CHECK(!inputs.empty(), ConfigError, "average: no input checkpoints given");
  // The model's identity is the same in every input and the only metadata kept (not the training
  // state, step, RNG and data position, of one checkpoint).
  TransformerConfig config;
  std::map<std::string, std::string> keep;
  {  // only the header: the average reads the tensors, one checkpoint in memory at a time
    const SafetensorsFile first = read_safetensors_header(inputs.front());
    config = config_from_model_file(first);
    keep = attn::detail::metadata_with_prefixes(first.metadata(), kModelMetadataPrefixes);
  }
  Transformer<float> model(config);
  const LoadOptions options = model_file_options(model.parameters());
  average_checkpoints(inputs, model.parameters(), options, kModelMetadataPrefixes);
  check_finite_average(model.parameters(), inputs, options, output);
  keep["averaged_from"] = std::to_string(inputs.size());
  for (const auto& [key, value] : extra) keep[key] = value;
  save_model(output, model, keep);
}

std::vector<std::string> last_checkpoints(
    const std::vector<std::pair<std::int64_t, std::string>>& checkpoints, int n,
    const std::string& dir) {
  ATTN_CHECK(n >= 1, ConfigError, "average: --last must be >= 1, got ", n);
  ATTN_CHECK(static_cast<std::size_t>(n) <= checkpoints.size(), ConfigError,
             "average: asked for the last ", n, " checkpoints but '", dir, "' has ",
             checkpoints.size());
  std::vector<std::string> paths;
  for (std::size_t i = checkpoints.size() - static_cast<std::size_t>(n); i < checkpoints.size();
       ++i)
    paths.push_back(checkpoints[i].second);
  return paths;
}

std::vector<std::string> last_checkpoints(const std::string& dir, int n) {
  return last_checkpoints(list_checkpoints(dir), n, dir);
}

std::vector<std::string> average_last(const std::string& dir, int n, const std::string& output) {
  // A trainer at work in `dir` removes its oldest checkpoint as it writes a new one, so one listed
  // here may be gone when it is read (13 of 70 runs against a trainer saving every update): then
  // the checkpoints are listed again.
  constexpr int kListings = 10;
  for (int listing = 1;; ++listing) {
    const std::vector<std::string> paths = last_checkpoints(dir, n);
    try {
      average_files(paths, output.empty() ? final_model_path(dir) : output);
      return paths;
    } catch (const IOError&) {
      const auto gone = [](const std::string& p) {
        std::error_code ec;
        return !std::filesystem::exists(p, ec) && !ec;
      };
      if (listing == kListings || std::none_of(paths.begin(), paths.end(), gone)) throw;
    }
  }
}

}  // namespace attn::translate
