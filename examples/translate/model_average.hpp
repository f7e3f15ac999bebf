// Checkpoint averaging, as the paper's base models were made (the last 5 checkpoints, section 6.1):
// `attn-translate average` and `train --average` write the mean of a run's checkpoints as one model
// file.
#pragma once

#include <string>
#include <vector>

namespace attn::translate {

/// Averages `inputs` (model or training checkpoints of one configuration) into `output`, keeping
/// the first input's model metadata (kModelMetadataPrefixes) minus its training state. Atomic: a
/// failure leaves `output` alone.
void average_files(const std::vector<std::string>& inputs, const std::string& output);

/// Averages the last `n` checkpoints of `dir` into `output` (empty: dir/model.safetensors);
/// returns their paths.
std::vector<std::string> average_last(const std::string& dir, int n,
                                      const std::string& output = "");

}  // namespace attn::translate
