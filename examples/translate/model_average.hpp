// Checkpoint averaging, as the paper's base models were made (the last 5 checkpoints, section 6.1):
// `attn-translate average` and `train --average` write the mean of a run's checkpoints as one model
// file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace attn::translate {

/// Averages `inputs` (model or training checkpoints of one configuration) into `output`, keeping
/// the first input's model metadata (kModelMetadataPrefixes) minus its training state, plus
/// `extra`. Atomic: a failure leaves `output` alone.
void average_files(const std::vector<std::string>& inputs, const std::string& output,
                   const std::map<std::string, std::string>& extra = {});

/// The paths of the last `n` of `checkpoints` (list_checkpoints of `dir`), oldest first;
/// ConfigError naming `dir` if it has fewer.
std::vector<std::string> last_checkpoints(
    const std::vector<std::pair<std::int64_t, std::string>>& checkpoints, int n,
    const std::string& dir);

/// The last `n` checkpoints of `dir`, as above.
std::vector<std::string> last_checkpoints(const std::string& dir, int n);

/// Averages the last `n` checkpoints of `dir` into `output` (empty: dir/model.safetensors);
/// returns their paths.
std::vector<std::string> average_last(const std::string& dir, int n,
                                      const std::string& output = "");

}  // namespace attn::translate
