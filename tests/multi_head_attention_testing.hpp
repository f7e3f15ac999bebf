// The module size, the parameter draw and the padding masks shared by the MultiHeadAttention tests
// (test_multi_head_attention.cpp, test_multi_head_attention_gradients.cpp).
#pragma once

#include <attn/nn/multi_head_attention.hpp>
#include <attn/random.hpp>

#include <cstdint>

#include <vector>
#include "tiny_sizes.hpp"

namespace attn {
namespace testing {

/// Xavier weights plus non-zero biases, so that every parameter matters.
inline void init(MultiHeadAttention<double>& mha, std::uint64_t seed) {
  Rng rng(seed);
  mha.reset_parameters(rng);
  fill_normal(mha.in_proj_bias.value, rng, 0, 0.5);
  fill_normal(mha.out_proj.bias.value, rng, 0, 0.5);
}

inline AttentionMask<double> padding(const std::vector<Index>& lengths, Index S,
                                     bool causal = false) {
  AttentionMask<double> m;
  m.key_padding = KeyPaddingMask::from_lengths(lengths, S);
  m.causal = causal;
  return m;
}

}  // namespace testing
}  // namespace attn
