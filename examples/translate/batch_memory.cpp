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

namespace {

// Rows, source and target lengths of the largest share a rank of `ranks` takes of `b`: rows rank,
// rank + ranks, ..., each share trimmed to its own longest sentences, as share_batch does.
struct Share {
  Index rows = 0, src_len = 0, tgt_len = 0;
};
Share largest_share(const TransformerConfig& c, const Batch& b, int ranks) {
  if (ranks <= 1) return {b.rows(), b.src.size(1), b.tgt_out.size(1)};
  const auto length = [&](const Tensor<TokenId>& ids, Index r) {  // padding trails
    Index n = 0;
    for (Index j = 0; j < ids.size(1); ++j) n += ids(r, j) != c.pad_id;
    return n;
  };
  Share worst;
  double worst_bytes = -1;
  for (Index rank = 0; rank < std::min<Index>(ranks, b.rows()); ++rank) {
    Share s;
    for (Index r = rank; r < b.rows(); r += ranks) {
      ++s.rows;
      s.src_len = std::max(s.src_len, length(b.src, r));
      s.tgt_len = std::max(s.tgt_len, length(b.tgt_out, r));
    }
    const double bytes = step_activation_bytes(c, s.rows, s.src_len, s.tgt_len);
    if (bytes > worst_bytes) worst = s, worst_bytes = bytes;
  }
  return worst;
}

}  // namespace

void check_batch_memory(const TransformerConfig& c, const std::vector<Batch>& batches, int ranks,
                        double model_bytes, Index max_tokens, bool resumed) {
  const double memory = attn::detail::memory_limit_bytes();
  if (memory <= 0) return;
  double largest = 0;
  Share worst;
  for (const Batch& b : batches) {
    const Share s = largest_share(c, b, ranks);
    const double bytes = step_activation_bytes(c, s.rows, s.src_len, s.tgt_len);
    if (bytes > largest) largest = bytes, worst = s;
  }
  const double gib = std::ldexp(1.0, 30);
  ATTN_CHECK(model_bytes + largest <= memory, ConfigError, "a training batch",
             ranks > 1 ? "'s share on one rank, " : " of ", worst.rows, " sentences padded to ",
             worst.src_len, " source and ", worst.tgt_len, " target tokens (batches of at most ",
             max_tokens, " tokens), needs at least ", largest / gib,
             " GiB for its activations besides the model's ", model_bytes / gib,
             " GiB: more than the ", memory / gib, " GiB this process may use; ",
             resumed ? "the checkpoint's train.max_tokens makes the batches: resume where more "
                       "memory may be used"
                     : "lower --max-tokens (--tokens-per-update accumulates smaller batches into "
                       "large updates)");
}

}  // namespace attn::translate
