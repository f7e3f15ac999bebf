// What one training step holds besides the model: the activations backward needs, which grow with
// the batch. A batch too large for this process's memory is refused before the first step, naming
// --max-tokens, instead of ending in std::bad_alloc or the kernel's out-of-memory killer (a
// --max-tokens of 2^40 over 20,000 short pairs made one batch of them all, 0.8 MB a sentence).
#pragma once

#include <vector>

#include <attn/nn/transformer_config.hpp>

#include "batching.hpp"

namespace attn::translate {

/// A lower bound, in bytes, of what forward keeps for backward on `rows` sentences padded to
/// `src_len` source and `tgt_len` target tokens: per layer and token the sublayers' inputs and
/// outputs (about 13 d_model + 2 d_ff floats in an encoder layer, 18 d_model + 2 d_ff in a decoder
/// layer, the cross-attention's keys and values 2 d_model per source token), the attention
/// weights and their dropout masks (2 h L per token and attention), and the logits (V per target
/// token). The base model at 32 x 64 tokens: 0.68 MiB per target token, where the process grows by
/// 0.94 (README, "Model sizes").
double step_activation_bytes(const TransformerConfig& c, Index rows, Index src_len, Index tgt_len);

/// ConfigError unless the largest of `batches` (of at most `max_tokens` tokens), as each of
/// `ranks` ranks takes its share of the rows, fits beside `model_bytes` (weights, gradients,
/// Adam's moments) in the memory this process may use; the message says what to change: the
/// flags, or on a run `resumed` from a checkpoint, whose batch size it keeps, the machine. No
/// check when the system does not say how much memory there is.
void check_batch_memory(const TransformerConfig& c, const std::vector<Batch>& batches, int ranks,
                        double model_bytes, Index max_tokens, bool resumed = false);

}  // namespace attn::translate
