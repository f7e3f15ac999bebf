// EncoderLayer, DecoderLayer, Encoder and Decoder gradients against central differences (post-
// and pre-norm, naive and fast kernels, masks, training-mode dropout), and the naive and fast
// kernels against each other. Golden outputs, decoding and errors: test_encoder_decoder.cpp.
#include "encoder_decoder_testing.hpp"
#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

#include <attn/nn/decoder.hpp>
#include <attn/nn/encoder.hpp>

namespace attn {
namespace {

using testing::D;
using testing::randn;
using testing::randomize;
using testing::tiny;

/// The same values in every parameter of `to` as in `from` (same architecture).
void copy_parameters(const Module<double>& from, Module<double>& to) {
  auto a = from.parameters();
  auto b = to.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    std::copy(a[i].value.begin(), a[i].value.end(), b[i].value.begin());
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient checks over (norm_first, fast kernel).

class LayerGrad : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  // Gradient checks on one thread; the threaded paths are checked on float problems above their
  // thresholds (test_attention_paths.cpp, test_training.cpp).
  testing::OneThread one_thread_;

  bool norm_first() const { return std::get<0>(GetParam()); }
  bool fast() const { return std::get<1>(GetParam()); }
};

TEST_P(LayerGrad, EncoderLayer) {
  EncoderLayer<double> layer(tiny(norm_first(), fast()));
  randomize(layer, 1);
  Tensor<double> x = randn({2, 4, D}, 2);
  // Batch row 1 is all padding: its attention contributes only out_proj's bias.
  for (const auto& pad :
       {KeyPaddingMask::from_lengths({4, 2}, 4), KeyPaddingMask::from_lengths({3, 0}, 4)}) {
    auto res = testing::check_module(
        layer, {{"x", x}}, [&] { return layer.forward(x, pad); },
        [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{layer.backward(dy)}; });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, x.numel() + layer.num_parameters());
  }
}

TEST_P(LayerGrad, DecoderLayer) {
  DecoderLayer<double> layer(tiny(norm_first(), fast()));
  randomize(layer, 3);
  Tensor<double> y = randn({2, 3, D}, 4), memory = randn({2, 4, D}, 5);
  const auto tgt = KeyPaddingMask::from_lengths({3, 2}, 3);
  for (const auto& mem : {KeyPaddingMask::from_lengths({4, 1}, 4),
                          KeyPaddingMask::from_lengths({0, 3}, 4), KeyPaddingMask()}) {
    auto res = testing::check_module(
        layer, {{"y", y}, {"memory", memory}}, [&] { return layer.forward(y, memory, tgt, mem); },
        [&](const Tensor<double>& dy) {
          const Tensor<double>& dy_in = layer.backward(dy);
          return std::vector<Tensor<double>>{dy_in, layer.dmemory()};
        });
    EXPECT_GRADIENTS_MATCH(res);
    EXPECT_EQ(res.checked, y.numel() + memory.numel() + layer.num_parameters());
  }
}

TEST_P(LayerGrad, EncoderStack) {
  Encoder<double> enc(tiny(norm_first(), fast()), 2, /*final_norm=*/norm_first());
  randomize(enc, 6);
  Tensor<double> x = randn({2, 3, D}, 7);
  const auto pad = KeyPaddingMask::from_lengths({3, 2}, 3);
  auto res = testing::check_module(
      enc, {{"x", x}}, [&] { return enc.forward(x, pad); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{enc.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, x.numel() + enc.num_parameters());
}

TEST_P(LayerGrad, DecoderStack) {
  Decoder<double> dec(tiny(norm_first(), fast()), 2, /*final_norm=*/norm_first());
  randomize(dec, 8);
  Tensor<double> y = randn({2, 3, D}, 9), memory = randn({2, 4, D}, 10);
  const auto tgt = KeyPaddingMask::from_lengths({2, 3}, 3);
  const auto mem = KeyPaddingMask::from_lengths({4, 2}, 4);
  auto res = testing::check_module(
      dec, {{"y", y}, {"memory", memory}}, [&] { return dec.forward(y, memory, tgt, mem); },
      [&](const Tensor<double>& dy) {
        const Tensor<double>& dy_in = dec.backward(dy);
        return std::vector<Tensor<double>>{dy_in, dec.dmemory()};
      });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, y.numel() + memory.numel() + dec.num_parameters());
}

TEST_P(LayerGrad, TrainingModeDropoutGradients) {
  // Sublayer, attention and ReLU dropout all on; resetting the shared counter inside the loss
  // makes every forward draw the same masks, so central differences see one function.
  auto state = std::make_shared<RandomState>();
  state->seed = 99;
  EncoderLayer<double> enc(tiny(norm_first(), fast(), 0.3));
  DecoderLayer<double> dec(tiny(norm_first(), fast(), 0.3));
  randomize(enc, 11);
  randomize(dec, 12);
  enc.set_random_state(state);
  dec.set_random_state(state);
  enc.train();
  dec.train();
  Tensor<double> x = randn({2, 3, D}, 13), memory = randn({2, 4, D}, 14);
  const auto src = KeyPaddingMask::from_lengths({3, 2}, 3);
  auto res = testing::check_module_fixed_dropout(
      enc, *state, {{"x", x}}, [&] { return enc.forward(x, src); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{enc.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  const auto mem = KeyPaddingMask::from_lengths({4, 3}, 4);
  res = testing::check_module_fixed_dropout(
      dec, *state, {{"y", x}, {"memory", memory}},
      [&] { return dec.forward(x, memory, KeyPaddingMask(), mem); },
      [&](const Tensor<double>& dy) {
        const Tensor<double>& dy_in = dec.backward(dy);
        return std::vector<Tensor<double>>{dy_in, dec.dmemory()};
      });
  EXPECT_GRADIENTS_MATCH(res);
  // Six dropout draws per decoder forward (3 sublayers, 2 attentions, 1 ReLU), and they matter.
  state->counter = 0;
  Tensor<double> train_out = dec.forward(x, memory, KeyPaddingMask(), mem).clone();
  EXPECT_EQ(state->counter, 6u);
  dec.eval();
  const Tensor<double>& eval_out = dec.forward(x, memory, KeyPaddingMask(), mem);
  ASSERT_TRUE(train_out.matrix().allFinite() && eval_out.matrix().allFinite());
  EXPECT_GT(testing::max_abs_diff(train_out, eval_out), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(PostPreNaiveFast, LayerGrad,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& i) {
                           return std::string(std::get<0>(i.param) ? "pre" : "post") + "_" +
                                  (std::get<1>(i.param) ? "fast" : "naive");
                         });

// ---------------------------------------------------------------------------------------------

TEST(EncoderDecoder, NaiveAndFastKernelsAgree) {
  for (bool norm_first : {false, true}) {
    SCOPED_TRACE(norm_first ? "pre-norm" : "post-norm");
    Encoder<double> enc_n(tiny(norm_first, false), 2, true), enc_f(tiny(norm_first, true), 2, true);
    Decoder<double> dec_n(tiny(norm_first, false), 2, true), dec_f(tiny(norm_first, true), 2, true);
    randomize(enc_n, 21);
    randomize(dec_n, 22);
    copy_parameters(enc_n, enc_f);
    copy_parameters(dec_n, dec_f);
    Tensor<double> x = randn({3, 5, D}, 23), y = randn({3, 4, D}, 24), dy = randn({3, 4, D}, 25);
    const auto src = KeyPaddingMask::from_lengths({5, 1, 3}, 5);
    const auto tgt = KeyPaddingMask::from_lengths({4, 4, 2}, 4);
    auto run = [&](Encoder<double>& enc, Decoder<double>& dec) {
      enc.zero_grad();
      dec.zero_grad();
      const Tensor<double>& memory = enc.forward(x, src);
      Tensor<double> out = dec.forward(y, memory, tgt, src).clone();
      Tensor<double> dy_in = dec.backward(dy).clone();
      Tensor<double> dx = enc.backward(dec.dmemory()).clone();
      return std::make_tuple(out, dy_in, dx);
    };
    auto [out_n, dyin_n, dx_n] = run(enc_n, dec_n);
    auto [out_f, dyin_f, dx_f] = run(enc_f, dec_f);
    EXPECT_LT(testing::max_abs_diff(out_n, out_f), 1e-12);
    EXPECT_LT(testing::max_abs_diff(dyin_n, dyin_f), 1e-12);
    EXPECT_LT(testing::max_abs_diff(dx_n, dx_f), 1e-12);
    auto pn = enc_n.parameters(), pf = enc_f.parameters();
    for (std::size_t i = 0; i < pn.size(); ++i)
      EXPECT_LT(testing::max_abs_diff(pn[i].grad, pf[i].grad), 1e-12) << pn[i].name;
    pn = dec_n.parameters();
    pf = dec_f.parameters();
    for (std::size_t i = 0; i < pn.size(); ++i)
      EXPECT_LT(testing::max_abs_diff(pn[i].grad, pf[i].grad), 1e-12) << pn[i].name;
  }
}

}  // namespace
}  // namespace attn
