// The tiny layer configuration and the parameter draw shared by the encoder and decoder tests
// (test_encoder_decoder.cpp, test_encoder_decoder_gradients.cpp).
#pragma once

#include <attn/nn/layer_options.hpp>
#include <attn/nn/module.hpp>
#include <attn/random.hpp>

#include <cstdint>

#include "tiny_sizes.hpp"

namespace attn {
namespace testing {

inline LayerOptions tiny(bool norm_first, bool fast, double dropout = 0.0) {
  LayerOptions o;
  o.d_model = D;
  o.heads = H;
  o.d_ff = F;
  o.dropout = dropout;
  o.attention_dropout = dropout / 2;
  o.relu_dropout = dropout / 2;
  o.norm_first = norm_first;
  o.use_fast_kernel = fast;
  return o;
}

/// Every parameter, LayerNorm included, drawn from N(0, 0.5^2): no symmetric initial values that
/// could hide a wrong gradient.
inline void randomize(Module<double>& m, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& p : m.parameters()) fill_normal(p.value, rng, 0.0, 0.5);
}

}  // namespace testing
}  // namespace attn
