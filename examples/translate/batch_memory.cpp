#include "batch_memory.hpp"

#include <cmath>
#include <utility>

#include <attn/error.hpp>
#include <attn/parallel.hpp>  // memory_limit_bytes

#include "distributed.hpp"  // share_shape

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
                        double model_bytes, Index max_tokens, bool resumed) {
  const double memory = attn::detail::memory_limit_bytes();
  if (memory <= 0) return;
  // The largest share any rank takes of any batch, padded to its own longest sentences.
  double largest = 0;
  ShareShape worst;
  for (const Batch& b : batches)
    for (int rank = 0; rank < ranks && rank < b.rows(); ++rank) {
      ShareShape s = share_shape(b, rank, ranks);
      const double bytes =
          step_activation_bytes(c, static_cast<Index>(s.rows.size()), s.src_len, s.tgt_len);
      if (bytes > largest) largest = bytes, worst = std::move(s);
    }
  const double gib = std::ldexp(1.0, 30);
  ATTN_CHECK(model_bytes + largest <= memory, ConfigError, "a training batch",
             ranks > 1 ? "'s share on one rank, " : " of ", worst.rows.size(),
             " sentences padded to ", worst.src_len, " source and ", worst.tgt_len,
             " target tokens (batches of at most ", max_tokens, " tokens), needs at least ",
             largest / gib, " GiB for its activations besides the model's ", model_bytes / gib,
             " GiB: more than the ", memory / gib, " GiB this process may use; ",
             resumed ? "the checkpoint's train.max_tokens makes the batches: resume where more "
                       "memory may be used"
                     : "lower --max-tokens (--tokens-per-update accumulates smaller batches into "
                       "large updates)");
}

}  // namespace attn::translate
