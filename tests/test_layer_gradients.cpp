// Central-difference gradient checks (double) of what the module tests left unchecked:
// MultiHeadAttention under an additive float mask (self and cross attention), a DecoderLayer with
// every dropout on and target key padding (post- and pre-norm), and the post-norm Encoder and
// Decoder stacks with and without their optional final LayerNorm, whose parameters must then be
// listed and checked. Each on the naive and the fast attention kernel, on one thread.
#include "encoder_decoder_testing.hpp"
#include "error_helpers.hpp"
#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

#include <attn/nn/decoder.hpp>
#include <attn/nn/encoder.hpp>
#include <attn/nn/multi_head_attention.hpp>

namespace attn {
namespace {

using testing::contains;
using testing::D;
using testing::H;
using testing::randn;
using testing::randomize;
using testing::tiny;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A [T, S] additive mask of N(0, 1) biases with -infinity at about one key in five, and every
/// key of query `blocked_row` blocked (none when -1): that query's attention output is zero and
/// no gradient flows through it. Optionally causal and with key padding.
AttentionMask<double> additive(Index T, Index S, std::uint64_t seed, Index blocked_row = -1,
                               bool causal = false, const std::vector<Index>& lengths = {}) {
  Tensor<double> bias = randn({T, S}, seed);
  for (Index t = 0; t < T; ++t)
    for (Index s = 0; s < S; ++s)
      if ((t * 3 + s * 2) % 5 == 4 || t == blocked_row) bias(t, s) = -kInf;
  AttentionMask<double> m;
  m.additive = AdditiveMask<double>(bias);
  m.causal = causal;
  if (!lengths.empty()) m.key_padding = KeyPaddingMask::from_lengths(lengths, S);
  return m;
}

// Param: the fast attention kernel (else the naive one).
class KernelGrad : public ::testing::TestWithParam<bool> {
 protected:
  testing::OneThread one_thread_;
};

// The additive bias enters the logits in forward and the recomputed probabilities in backward;
// a backward that dropped it, or blocked keys differently, would disagree with the differences.
TEST_P(KernelGrad, SelfAttentionWithAnAdditiveMask) {
  MultiHeadAttention<double> mha(D, H, 0.0, GetParam());
  randomize(mha, 1);
  Tensor<double> x = randn({2, 4, D}, 2);
  for (const auto& mask : {additive(4, 4, 3), additive(4, 4, 4, /*blocked_row=*/2),
                           additive(4, 4, 5, -1, /*causal=*/true, {4, 2})}) {
    auto res = testing::check_module(
        mha, {{"x", x}}, [&] { return mha.forward_self(x, mask); },
        [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{mha.backward(dy)}; });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, x.numel() + mha.num_parameters());
  }
}

TEST_P(KernelGrad, CrossAttentionWithAnAdditiveMask) {
  MultiHeadAttention<double> mha(D, H, 0.0, GetParam());
  randomize(mha, 6);
  Tensor<double> x = randn({2, 3, D}, 7), memory = randn({2, 5, D}, 8);
  for (const auto& mask : {additive(3, 5, 9), additive(3, 5, 10, /*blocked_row=*/0),
                           additive(3, 5, 11, -1, false, {5, 2})}) {
    auto res = testing::check_module(
        mha, {{"x", x}, {"memory", memory}}, [&] { return mha.forward_cross(x, memory, mask); },
        [&](const Tensor<double>& dy) {
          const Tensor<double>& dx = mha.backward(dy);
          return std::vector<Tensor<double>>{dx, mha.dmemory()};
        });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, x.numel() + memory.numel() + mha.num_parameters());
  }
}

// What makes the two checks above about the bias (a module that ignored it in forward and
// backward alike would pass them): it changes the output; a bias constant along each query's
// keys changes nothing (softmax is shift-invariant); and -infinity at a key for every query is
// key padding of that key.
TEST_P(KernelGrad, AdditiveBiasShiftsAndBlocksTheLogits) {
  MultiHeadAttention<double> mha(D, H, 0.0, GetParam());
  randomize(mha, 12);
  const Tensor<double> x = randn({2, 4, D}, 13);
  const Tensor<double> plain = mha.forward_self(x, AttentionMask<double>::none()).clone();
  EXPECT_GT(testing::max_abs_diff(mha.forward_self(x, additive(4, 4, 14)), plain), 1e-3);
  Tensor<double> shift({4, 4}), last_blocked({4, 4});
  for (Index t = 0; t < 4; ++t)
    for (Index s = 0; s < 4; ++s) {
      shift(t, s) = 2.0 * static_cast<double>(t) - 3.0;
      last_blocked(t, s) = s == 3 ? -kInf : 0.0;
    }
  AttentionMask<double> m;
  m.additive = AdditiveMask<double>(shift);
  EXPECT_LT(testing::max_abs_diff(mha.forward_self(x, m), plain), 1e-12);
  m.additive = AdditiveMask<double>(last_blocked);
  const Tensor<double> blocked = mha.forward_self(x, m).clone();
  AttentionMask<double> padding;
  padding.key_padding = KeyPaddingMask::from_lengths({3, 3}, 4);
  EXPECT_LT(testing::max_abs_diff(blocked, mha.forward_self(x, padding)), 1e-12);
  EXPECT_GT(testing::max_abs_diff(blocked, plain), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(NaiveAndFast, KernelGrad, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "fast" : "naive";
                         });

// Params: (norm_first, fast kernel).
class NormKernelGrad : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  testing::OneThread one_thread_;
  bool norm_first() const { return std::get<0>(GetParam()); }
  bool fast() const { return std::get<1>(GetParam()); }
};

// Sublayer, attention and ReLU dropout all on (the counter reset before each forward repeats the
// masks), with target padding on the causal self-attention: {3, 1} leaves batch row 1 one key,
// {2, 0} blocks all of its keys. The dropout test of test_encoder_decoder.cpp has no target
// padding, and its padding tests no dropout.
TEST_P(NormKernelGrad, DecoderLayerWithDropoutAndTargetPadding) {
  auto state = std::make_shared<RandomState>();
  state->seed = 31;
  DecoderLayer<double> dec(tiny(norm_first(), fast(), 0.3));
  randomize(dec, 32);
  dec.set_random_state(state);
  dec.train();
  Tensor<double> y = randn({2, 3, D}, 33), memory = randn({2, 4, D}, 34);
  const auto mem = KeyPaddingMask::from_lengths({4, 2}, 4);
  for (const auto& tgt :
       {KeyPaddingMask::from_lengths({3, 1}, 3), KeyPaddingMask::from_lengths({2, 0}, 3)}) {
    auto res = testing::check_module_fixed_dropout(
        dec, *state, {{"y", y}, {"memory", memory}},
        [&] { return dec.forward(y, memory, tgt, mem); },
        [&](const Tensor<double>& dy) {
          const Tensor<double>& dy_in = dec.backward(dy);
          return std::vector<Tensor<double>>{dy_in, dec.dmemory()};
        });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, y.numel() + memory.numel() + dec.num_parameters());
  }
  // Both matter: six dropout draws per forward, and the padding changes batch row 1 only (row 0's
  // three keys are all real, so its masks and outputs are those of no padding).
  state->counter = 0;
  const Tensor<double> padded =
      dec.forward(y, memory, KeyPaddingMask::from_lengths({3, 1}, 3), mem).clone();
  EXPECT_EQ(state->counter, 6u);
  state->counter = 0;
  const Tensor<double> open = dec.forward(y, memory, KeyPaddingMask(), mem).clone();
  double row0 = 0, row1 = 0;
  for (Index i = 0; i < 3 * D; ++i) {
    row0 = std::max(row0, std::abs(padded.data()[i] - open.data()[i]));
    row1 = std::max(row1, std::abs(padded.data()[3 * D + i] - open.data()[3 * D + i]));
  }
  EXPECT_LT(row0, 1e-12);
  EXPECT_GT(row1, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(PostPreNaiveFast, NormKernelGrad,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& i) {
                           return std::string(std::get<0>(i.param) ? "pre" : "post") + "_" +
                                  (std::get<1>(i.param) ? "fast" : "naive");
                         });

/// Whether `m` has a parameter named `name`.
bool has_parameter(Module<double>& m, const std::string& name) {
  for (const auto& p : m.parameters())
    if (p.name == name) return true;
  return false;
}

/// The checks of a post-norm stack's gradient check: every input and parameter compared, the
/// final norm's parameters ("norm.weight", "norm.bias") among them exactly when it has one, and
/// then with a gradient that is not zero (a norm left out of forward and backward alike would
/// pass the comparison with zeros on both sides).
template <class Stack>
void expect_stack_checked(Stack& stack, const testing::GradCheckResult& res, Index inputs,
                          bool final_norm) {
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, inputs + stack.num_parameters());
  ASSERT_EQ(stack.norm != nullptr, final_norm);
  for (const char* name : {"norm.weight", "norm.bias"}) {
    EXPECT_EQ(has_parameter(stack, name), final_norm) << name;
    EXPECT_EQ(contains(res.report, std::string("  ") + name + " "), final_norm) << res.report;
  }
  if (final_norm) {
    EXPECT_GT(stack.norm->weight.grad.vector().cwiseAbs().maxCoeff(), 1e-3);
    EXPECT_GT(stack.norm->bias.grad.vector().cwiseAbs().maxCoeff(), 1e-3);
  }
}

// The paper's post-norm stacks end in their last layer's norm3 and need no final LayerNorm, but
// torch.nn.Transformer adds one (final_norm = true); test_encoder_decoder.cpp checks post-norm
// stacks only without it and pre-norm ones only with it.
TEST_P(KernelGrad, PostNormEncoderWithAndWithoutFinalNorm) {
  for (bool final_norm : {false, true}) {
    SCOPED_TRACE(final_norm ? "final norm" : "no final norm");
    Encoder<double> enc(tiny(/*norm_first=*/false, GetParam()), 2, final_norm);
    randomize(enc, 41);
    Tensor<double> x = randn({2, 3, D}, 42);
    const auto pad = KeyPaddingMask::from_lengths({3, 2}, 3);
    auto res = testing::check_module(
        enc, {{"x", x}}, [&] { return enc.forward(x, pad); },
        [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{enc.backward(dy)}; });
    expect_stack_checked(enc, res, x.numel(), final_norm);
  }
}

TEST_P(KernelGrad, PostNormDecoderWithAndWithoutFinalNorm) {
  for (bool final_norm : {false, true}) {
    SCOPED_TRACE(final_norm ? "final norm" : "no final norm");
    Decoder<double> dec(tiny(/*norm_first=*/false, GetParam()), 2, final_norm);
    randomize(dec, 43);
    Tensor<double> y = randn({2, 3, D}, 44), memory = randn({2, 4, D}, 45);
    const auto tgt = KeyPaddingMask::from_lengths({2, 3}, 3);
    const auto mem = KeyPaddingMask::from_lengths({4, 1}, 4);
    auto res = testing::check_module(
        dec, {{"y", y}, {"memory", memory}}, [&] { return dec.forward(y, memory, tgt, mem); },
        [&](const Tensor<double>& dy) {
          const Tensor<double>& dy_in = dec.backward(dy);
          return std::vector<Tensor<double>>{dy_in, dec.dmemory()};
        });
    expect_stack_checked(dec, res, y.numel() + memory.numel(), final_norm);
  }
}

// A post-norm stack's final norm is applied to what the same layers give without it.
TEST_P(KernelGrad, PostNormFinalNormNormalizesTheLastLayersOutput) {
  Encoder<double> with(tiny(false, GetParam()), 2, true),
      without(tiny(false, GetParam()), 2, false);
  randomize(with, 46);
  auto from = with.parameters(), to = without.parameters();
  ASSERT_EQ(from.size(), to.size() + 2);  // the same layers first, then norm.weight, norm.bias
  for (std::size_t i = 0; i < to.size(); ++i) {
    ASSERT_EQ(from[i].name, to[i].name);
    std::copy(from[i].value.begin(), from[i].value.end(), to[i].value.begin());
  }
  const Tensor<double> x = randn({2, 3, D}, 47);
  const auto pad = KeyPaddingMask::from_lengths({3, 1}, 3);
  const Tensor<double> normed = with.forward(x, pad).clone();
  const Tensor<double> last = without.forward(x, pad).clone();
  EXPECT_LT(testing::max_abs_diff(normed, with.norm->forward(last)), 1e-12);
  EXPECT_GT(testing::max_abs_diff(normed, last), 1e-3);
}

}  // namespace
}  // namespace attn
