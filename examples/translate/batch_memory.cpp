#include "batch_memory.hpp"

#include <algorithm>
#include <cmath>

#include <attn/error.hpp>
#include <attn/parallel.hpp>  // memory_limit_bytes

namespace attn::translate {

double step_activation_bytes(const TransformerConfig& c, Index rows, Index src_len, Index tgt_len) {
  const double B = static_cast<double>(rows), S = static_cast<double>(src_len),
               T = static_cast<double>(tgt_len), d = static_cast<double>(c.d_model),
               f = static_cast<double>(c.d_ff), h = static_cast<double>(c.heads);
  const double encoder_layer = B * S * (13 * d + 2 * f) + B * h * S * S * 2;
  const double decoder_layer =
      B * T * (18 * d + 2 * f) + B * S * 2 * d + B * h * T * T * 2 + B * h * T * S * 2;
  const double logits = B * T * static_cast<double>(c.tgt_vocab);
  return sizeof(float) * (static_cast<double>(c.encoder_layers) * encoder_layer +
                          static_cast<double>(c.decoder_layers) * decoder_layer + logits);
}

void check_batch_memory(const TransformerConfig& c, const std::vector<Batch>& batches, int ranks,
                        double model_bytes, Index max_tokens) {
  const double memory = attn::detail::memory_limit_bytes();
  if (memory <= 0) return;
  double largest = 0;
  const Batch* worst = nullptr;
  for (const Batch& b : batches) {
    const Index share = (b.rows() + ranks - 1) / std::max(ranks, 1);  // rank 0's, the largest
    const double bytes = step_activation_bytes(c, share, b.src.size(1), b.tgt_in.size(1));
    if (bytes > largest) largest = bytes, worst = &b;
  }
  const double gib = std::ldexp(1.0, 30);
  ATTN_CHECK(worst == nullptr || model_bytes + largest <= memory, ConfigError, "--max-tokens ",
             max_tokens, " makes a batch of ", worst->rows(), " sentences padded to ",
             worst->src.size(1), " source and ", worst->tgt_in.size(1),
             " target tokens, whose step needs at least ", largest / gib,
             " GiB for its activations besides the model's ", model_bytes / gib,
             " GiB: more than the ", memory / gib,
             " GiB this process may use; lower --max-tokens (--tokens-per-update accumulates "
             "smaller batches into large updates)");
}

}  // namespace attn::translate
