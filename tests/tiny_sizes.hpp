// The sizes of the tiny modules the layer tests build (multi_head_attention_testing.hpp,
// encoder_decoder_testing.hpp): one definition, so that a test may include both.
#pragma once

#include <attn/tensor.hpp>

namespace attn {
namespace testing {

constexpr Index D = 8;   ///< d_model
constexpr Index H = 2;   ///< heads
constexpr Index F = 12;  ///< d_ff

}  // namespace testing
}  // namespace attn
