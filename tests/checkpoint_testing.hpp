// The two-layer module whose checkpoints test_checkpoint.cpp and test_checkpoint_averaging.cpp
// save, load and average: torch-style names, and parameters drawn from its sizes.
#pragma once

#include <attn/nn/linear.hpp>
#include <attn/nn/module.hpp>
#include <attn/random.hpp>

#include <cstdint>

namespace attn {
namespace testing {

template <class T>
struct TwoLayers : Module<T> {
  TwoLayers(Index d, Index f, bool bias2 = true) : linear1(d, f), linear2(f, d, bias2) {
    this->register_module("encoder.layers.0.linear1", &linear1);
    this->register_module("encoder.layers.0.linear2", &linear2);
    Rng rng(static_cast<std::uint64_t>(d * 131 + f));
    linear1.reset_parameters(rng);
    linear2.reset_parameters(rng);
    fill_normal(linear1.bias.value, rng, 0, 1);
  }
  Linear<T> linear1, linear2;
};

}  // namespace testing
}  // namespace attn
