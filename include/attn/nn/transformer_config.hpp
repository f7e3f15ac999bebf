// TransformerConfig: the whole model's sizes and switches, with the paper's presets.
//
// The presets are the paper exactly (Vaswani et al. 2017, Table 3): post-norm, no attention or ReLU
// dropout, sinusoidal positions, one weight matrix shared by both embeddings and the pre-softmax
// projection. Every departure that popular implementations make silently (tensor2tensor's
// transformer_base is pre-norm, with attention/ReLU dropout) is a named switch here, off in the
// presets.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>

#include "attn/nn/layer_options.hpp"
#include "attn/strict_number.hpp"

namespace attn {

struct TransformerConfig {
  Index src_vocab = 0;  // V of the source side
  Index tgt_vocab = 0;  // V of the target side
  /// One matrix for the source embedding, the target embedding and the pre-softmax projection
  /// (the paper's setting, section 3.4); needs src_vocab == tgt_vocab.
  bool share_embeddings = true;
  /// When the embeddings are not shared: tie the target embedding to the pre-softmax projection.
  bool tie_output = true;

  Index d_model = 512;
  Index heads = 8;
  Index d_ff = 2048;
  Index encoder_layers = 6;
  Index decoder_layers = 6;

  double dropout = 0.1;            // P_drop: sublayer outputs and embedding + position sums
  double attention_dropout = 0.0;  // departure (tensor2tensor): on attention weights
  double relu_dropout = 0.0;       // departure (tensor2tensor): after the FFN's ReLU
  bool norm_first = false;         // departure: pre-norm layers (adds a final LayerNorm per stack)
  bool learned_positions = false;  // Table 3 row (E): learned positional embeddings
  Index max_positions = 1024;      // longest sequence learned positions can embed
  double layer_norm_eps = 1e-5;
  bool use_fast_kernel = true;

  TokenId pad_id = 0;
  std::uint64_t seed = 1;  // parameter initialisation and dropout masks

  /// The paper's base model: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters with
  /// the paper's 37,000-token vocabulary).
  static TransformerConfig base(Index vocab) { return preset(vocab, 512, 8, 2048, 6, 0.1); }
  /// The paper's big model: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (213M).
  static TransformerConfig big(Index vocab) { return preset(vocab, 1024, 16, 4096, 6, 0.3); }
  /// A small model for CPU experiments: N=3, d_model=256, d_ff=1024, h=4, P_drop=0.1.
  static TransformerConfig small(Index vocab) { return preset(vocab, 256, 4, 1024, 3, 0.1); }
  /// A tiny model for tests: N=2, d_model=64, d_ff=128, h=4, no dropout.
  static TransformerConfig tiny(Index vocab) { return preset(vocab, 64, 4, 128, 2, 0.0); }

  LayerOptions layer_options() const {
    LayerOptions o;
    o.d_model = d_model;
    o.heads = heads;
    o.d_ff = d_ff;
    o.dropout = dropout;
    o.attention_dropout = attention_dropout;
    o.relu_dropout = relu_dropout;
    o.norm_first = norm_first;
    o.layer_norm_eps = layer_norm_eps;
    o.use_fast_kernel = use_fast_kernel;
    return o;
  }

  /// Throws ConfigError naming the offending value.
  void validate() const {
    layer_options().validate();
    ATTN_CHECK(src_vocab > 0 && tgt_vocab > 0, ConfigError,
               "vocabulary sizes must be > 0, got src_vocab ", src_vocab, " and tgt_vocab ",
               tgt_vocab);
    ATTN_CHECK(!share_embeddings || src_vocab == tgt_vocab, ConfigError,
               "share_embeddings needs one vocabulary, got src_vocab ", src_vocab,
               " and tgt_vocab ", tgt_vocab);
    ATTN_CHECK(encoder_layers > 0 && decoder_layers > 0, ConfigError,
               "layer counts must be > 0, got encoder_layers ", encoder_layers,
               " and decoder_layers ", decoder_layers);
    ATTN_CHECK(pad_id >= 0 && pad_id < std::min(src_vocab, tgt_vocab), ConfigError, "pad_id ",
               pad_id, " outside the vocabulary [0, ", std::min(src_vocab, tgt_vocab), ")");
    ATTN_CHECK(!learned_positions || max_positions > 0, ConfigError,
               "max_positions must be > 0 with learned positions, got ", max_positions);
  }

  /// Every field as text, for checkpoint metadata ("config.<field>").
  std::map<std::string, std::string> to_metadata() const {
    std::map<std::string, std::string> m;
    auto put = [&](const char* k, auto v) {
      std::ostringstream s;
      s.precision(17);
      s << v;
      m[std::string("config.") + k] = s.str();
    };
    put("src_vocab", src_vocab);
    put("tgt_vocab", tgt_vocab);
    put("share_embeddings", share_embeddings);
    put("tie_output", tie_output);
    put("d_model", d_model);
    put("heads", heads);
    put("d_ff", d_ff);
    put("encoder_layers", encoder_layers);
    put("decoder_layers", decoder_layers);
    put("dropout", dropout);
    put("attention_dropout", attention_dropout);
    put("relu_dropout", relu_dropout);
    put("norm_first", norm_first);
    put("learned_positions", learned_positions);
    put("max_positions", max_positions);
    put("layer_norm_eps", layer_norm_eps);
    put("pad_id", pad_id);
    put("seed", seed);
    return m;
  }

  /// The inverse of to_metadata(); a missing or malformed field is a FormatError naming it.
  static TransformerConfig from_metadata(const std::map<std::string, std::string>& m) {
    TransformerConfig c;
    auto get = [&](const char* k, auto& v) {
      auto it = m.find(std::string("config.") + k);
      ATTN_CHECK(it != m.end(), FormatError, "checkpoint metadata lacks config.", k);
      v = parse_number_or_throw<std::decay_t<decltype(v)>>(it->second, "checkpoint metadata",
                                                           it->first);
    };
    get("src_vocab", c.src_vocab);
    get("tgt_vocab", c.tgt_vocab);
    get("share_embeddings", c.share_embeddings);
    get("tie_output", c.tie_output);
    get("d_model", c.d_model);
    get("heads", c.heads);
    get("d_ff", c.d_ff);
    get("encoder_layers", c.encoder_layers);
    get("decoder_layers", c.decoder_layers);
    get("dropout", c.dropout);
    get("attention_dropout", c.attention_dropout);
    get("relu_dropout", c.relu_dropout);
    get("norm_first", c.norm_first);
    get("learned_positions", c.learned_positions);
    get("max_positions", c.max_positions);
    get("layer_norm_eps", c.layer_norm_eps);
    get("pad_id", c.pad_id);
    get("seed", c.seed);
    c.validate();
    return c;
  }

 private:
  static TransformerConfig preset(Index vocab, Index d, Index h, Index f, Index n, double p) {
    TransformerConfig c;
    c.src_vocab = c.tgt_vocab = vocab;
    c.d_model = d;
    c.heads = h;
    c.d_ff = f;
    c.encoder_layers = c.decoder_layers = n;
    c.dropout = p;
    return c;
  }
};

}  // namespace attn
