// EncoderLayer, DecoderLayer, Encoder and Decoder beyond their gradients: PyTorch golden outputs
// and gradients loaded by state_dict name, torch's parameter names, incremental decoding against
// the full causal forward, attention weights of every layer, float, and the error paths.
// Gradients and kernel agreement: test_encoder_decoder_gradients.cpp.
#include "encoder_decoder_testing.hpp"
#include "error_helpers.hpp"
#include "golden/golden.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

#include <attn/nn/decoder.hpp>
#include <attn/nn/encoder.hpp>

namespace attn {
namespace {

using testing::D;
using testing::error_of;
using testing::H;
using testing::randn;
using testing::randomize;
using testing::tiny;

// ---------------------------------------------------------------------------------------------
// PyTorch golden: torch's state_dict loads by name into parameters(), outputs and gradients match.

const std::vector<std::string> kGoldenInputs = {
    "x", "y", "memory", "src_lengths", "tgt_lengths", "memory_lengths", "R", "out"};

template <class M>
void expect_parameter_gradients_match(const M& m, const testing::GoldenFile& g) {
  for (const auto& p : m.parameters())
    EXPECT_LT(testing::max_abs_diff(p.grad, g["grad." + p.name]), 1e-11) << p.name;
}

template <class M>
void golden_encoder(M& m, const std::string& file) {
  SCOPED_TRACE(file);
  testing::GoldenFile g(file);
  EXPECT_EQ(testing::load_state_dict(m, g, kGoldenInputs).size(), m.parameters().size());
  const Tensor<double>& x = g["x"];
  const auto pad = KeyPaddingMask::from_lengths(g.lengths("src_lengths"), x.size(1));
  m.zero_grad();
  EXPECT_LT(testing::max_abs_diff(m.forward(x, pad), g["out"]), 1e-12);
  EXPECT_LT(testing::max_abs_diff(m.backward(g["R"]), g["grad.x"]), 1e-11);
  expect_parameter_gradients_match(m, g);
}

template <class M>
void golden_decoder(M& m, const std::string& file) {
  SCOPED_TRACE(file);
  testing::GoldenFile g(file);
  EXPECT_EQ(testing::load_state_dict(m, g, kGoldenInputs).size(), m.parameters().size());
  const Tensor<double>& y = g["y"];
  const Tensor<double>& memory = g["memory"];
  const auto tgt = KeyPaddingMask::from_lengths(g.lengths("tgt_lengths"), y.size(1));
  const auto mem = KeyPaddingMask::from_lengths(g.lengths("memory_lengths"), memory.size(1));
  m.zero_grad();
  EXPECT_LT(testing::max_abs_diff(m.forward(y, memory, tgt, mem), g["out"]), 1e-12);
  EXPECT_LT(testing::max_abs_diff(m.backward(g["R"]), g["grad.y"]), 1e-11);
  EXPECT_LT(testing::max_abs_diff(m.dmemory(), g["grad.memory"]), 1e-11);
  expect_parameter_gradients_match(m, g);
}

TEST(EncoderDecoder, MatchesPyTorchLayers) {
  for (bool fast : {false, true})
    for (bool norm_first : {false, true}) {
      const std::string tag = norm_first ? "pre" : "post";
      EncoderLayer<double> enc(tiny(norm_first, fast));
      golden_encoder(enc, "encoder_layer_" + tag + ".txt");
      DecoderLayer<double> dec(tiny(norm_first, fast));
      golden_decoder(dec, "decoder_layer_" + tag + ".txt");
    }
}

TEST(EncoderDecoder, MatchesPyTorchStacks) {
  for (bool fast : {false, true})
    for (bool norm_first : {false, true}) {
      const std::string tag = norm_first ? "pre" : "post";
      Encoder<double> enc(tiny(norm_first, fast), 2, /*final_norm=*/false);
      golden_encoder(enc, "encoder_" + tag + ".txt");
      Decoder<double> dec(tiny(norm_first, fast), 2, /*final_norm=*/false);
      golden_decoder(dec, "decoder_" + tag + ".txt");
    }
}

TEST(EncoderDecoder, ParameterNamesFollowTorch) {
  Encoder<float> enc(tiny(true, true), 2, true);
  std::vector<std::string> names;
  for (const auto& p : enc.parameters()) names.push_back(p.name);
  const std::vector<std::string> layer = {"self_attn.in_proj_weight",
                                          "self_attn.in_proj_bias",
                                          "self_attn.out_proj.weight",
                                          "self_attn.out_proj.bias",
                                          "linear1.weight",
                                          "linear1.bias",
                                          "linear2.weight",
                                          "linear2.bias",
                                          "norm1.weight",
                                          "norm1.bias",
                                          "norm2.weight",
                                          "norm2.bias"};
  std::vector<std::string> expected;
  for (int i = 0; i < 2; ++i)
    for (const auto& n : layer) expected.push_back("layers." + std::to_string(i) + "." + n);
  expected.push_back("norm.weight");
  expected.push_back("norm.bias");
  EXPECT_EQ(names, expected);
  EXPECT_EQ(Encoder<float>(tiny(false, true), 2, false).parameters().size(), 24u);
  EXPECT_EQ(DecoderLayer<float>(tiny(false, true)).parameters().size(), 18u);
}

// ---------------------------------------------------------------------------------------------

TEST(EncoderDecoder, IncrementalDecodingEqualsFullCausalForward) {
  for (bool norm_first : {false, true}) {
    SCOPED_TRACE(norm_first ? "pre-norm" : "post-norm");
    // Dropout > 0 and training mode on purpose: steps never drop, so compare with eval.
    Decoder<double> dec(tiny(norm_first, true, 0.2), 2, /*final_norm=*/true);
    randomize(dec, 31);
    const Index B = 2, T = 5, S = 4;
    Tensor<double> y = randn({B, T, D}, 32), memory = randn({B, S, D}, 33);
    const auto mem = KeyPaddingMask::from_lengths({4, 2}, S);
    dec.eval();
    Tensor<double> full = dec.forward(y, memory, KeyPaddingMask(), mem).clone();
    dec.train();
    DecoderCache<double> cache = dec.make_cache(B, T);
    const double* storage = cache.layers[1].self.keys.data();
    Tensor<double> yt({B, 1, D});
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the cleared cache
      for (Index t = 0; t < T; ++t) {
        for (Index b = 0; b < B; ++b)
          for (Index d = 0; d < D; ++d) yt(b, 0, d) = y(b, t, d);
        const Tensor<double>& out = dec.forward_step(yt, memory, mem, cache);
        EXPECT_EQ(cache.length(), t + 1);
        for (Index b = 0; b < B; ++b)
          for (Index d = 0; d < D; ++d) EXPECT_NEAR(out(b, 0, d), full(b, t, d), 1e-12);
      }
      cache.clear();
    }
    EXPECT_EQ(cache.layers[1].self.keys.data(), storage);
    EXPECT_TRUE(dec.is_training());
  }
}

TEST(EncoderDecoder, ReorderedCacheContinuesTheChosenRows) {
  // Beam search keeps row 1's prefix in both rows after step 2: from then on both rows must decode
  // exactly as row 1 of the full forward, with the memory and its padding reordered alike.
  Decoder<double> dec(tiny(false, true), 2, false);
  randomize(dec, 35);
  dec.eval();
  const Index B = 2, T = 4, S = 3;
  Tensor<double> y = randn({B, T, D}, 36), memory = randn({B, S, D}, 37);
  const auto mem = KeyPaddingMask::from_lengths({3, 2}, S);
  Tensor<double> full = dec.forward(y, memory, KeyPaddingMask(), mem).clone();
  DecoderCache<double> cache = dec.make_cache(B, T);
  Tensor<double> yt({B, 1, D});
  const auto mem_after = KeyPaddingMask::from_lengths({2, 2}, S);
  for (Index t = 0; t < T; ++t) {
    if (t == 2) cache.reorder({1, 1});
    for (Index b = 0; b < B; ++b)
      for (Index d = 0; d < D; ++d) yt(b, 0, d) = y(t < 2 ? b : 1, t, d);
    const Tensor<double>& out = dec.forward_step(yt, memory, t < 2 ? mem : mem_after, cache);
    for (Index b = 0; b < B; ++b)
      for (Index d = 0; d < D; ++d) EXPECT_NEAR(out(b, 0, d), full(t < 2 ? b : 1, t, d), 1e-12);
  }
  EXPECT_THROW(cache.reorder({0}), ShapeError);
  EXPECT_THROW(cache.reorder({0, 2}), IndexError);
}

TEST(EncoderDecoder, AttentionWeightsOfEveryLayerAndHead) {
  Encoder<double> enc(tiny(false, true), 2, false);
  Decoder<double> dec(tiny(false, true), 2, false);
  randomize(enc, 41);
  randomize(dec, 42);
  enc.keep_attention_weights(true);
  dec.keep_attention_weights(true);
  const Index B = 2, S = 4, T = 3;
  const auto src = KeyPaddingMask::from_lengths({4, 3}, S);
  const Tensor<double>& memory = enc.forward(randn({B, S, D}, 43), src);
  dec.forward(randn({B, T, D}, 44), memory, KeyPaddingMask(), src);
  for (Index i = 0; i < 2; ++i) {
    const Tensor<double>& es = enc.layers[i]->self_attn.attention_weights();
    const Tensor<double>& ds = dec.layers[i]->self_attn.attention_weights();
    const Tensor<double>& dc = dec.layers[i]->multihead_attn.attention_weights();
    ASSERT_EQ(es.shape(), Shape({B, H, S, S}));
    ASSERT_EQ(ds.shape(), Shape({B, H, T, T}));
    ASSERT_EQ(dc.shape(), Shape({B, H, T, S}));
    for (Index h = 0; h < H; ++h) {
      for (Index t = 0; t < S; ++t) EXPECT_EQ(es(1, h, t, 3), 0.0);  // source padding
      for (Index t = 0; t < T; ++t) {
        double sum_self = 0, sum_cross = 0;
        for (Index s = 0; s < T; ++s) {
          sum_self += ds(0, h, t, s);
          if (s > t) {
            EXPECT_EQ(ds(0, h, t, s), 0.0);  // causal
          }
        }
        for (Index s = 0; s < S; ++s) sum_cross += dc(1, h, t, s);
        EXPECT_EQ(dc(1, h, t, 3), 0.0);  // memory padding
        EXPECT_NEAR(sum_self, 1.0, 1e-14);
        EXPECT_NEAR(sum_cross, 1.0, 1e-14);
      }
    }
  }
  // The weights of the two layers are not the same tensor.
  EXPECT_FALSE(enc.layers[0]->self_attn.attention_weights().same_data(
      enc.layers[1]->self_attn.attention_weights()));
}

TEST(EncoderDecoder, FloatCompilesAndRuns) {
  Encoder<float> enc(tiny(true, true), 2, true);
  Decoder<float> dec(tiny(true, true), 2, true);
  Rng rng(5);
  enc.reset_parameters(rng);
  dec.reset_parameters(rng);
  Tensor<float> x({2, 3, D}), y({2, 2, D});
  fill_normal(x, rng, 0, 1);
  fill_normal(y, rng, 0, 1);
  const Tensor<float>& memory = enc.forward(x, KeyPaddingMask());
  const Tensor<float>& out = dec.forward(y, memory, KeyPaddingMask(), KeyPaddingMask());
  EXPECT_EQ(out.shape(), Shape({2, 2, D}));
  dec.backward(Tensor<float>::full({2, 2, D}, 1.0f));
  EXPECT_EQ(enc.backward(dec.dmemory()).shape(), Shape({2, 3, D}));
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

TEST(EncoderDecoder, RejectsBadOptionsShapesAndMasks) {
  LayerOptions o = tiny(false, true);
  o.d_model = 9;
  EXPECT_EQ(error_of([&] { o.validate(); }), "d_model (9) must be divisible by heads (2)");
  o.d_model = 500;
  o.heads = 8;
  EXPECT_EQ(error_of([&] { EncoderLayer<double> l(o); }),
            "d_model (500) must be divisible by heads (8)");
  EXPECT_THROW(DecoderLayer<double>{o}, ConfigError);
  o = tiny(false, true);
  o.dropout = 1.0;
  EXPECT_EQ(error_of([&] { o.validate(); }), "dropout must be in [0, 1), got 1");
  o = tiny(false, true);
  o.attention_dropout = -0.1;
  EXPECT_EQ(error_of([&] { o.validate(); }), "attention_dropout must be in [0, 1), got -0.1");
  o = tiny(false, true);
  o.d_ff = 0;
  EXPECT_EQ(error_of([&] { o.validate(); }), "d_ff must be > 0, got 0");
  o = tiny(false, true);
  o.layer_norm_eps = 0;
  EXPECT_THROW(o.validate(), ConfigError);
  EXPECT_EQ(error_of([] { Encoder<double>(tiny(false, true), 0, false); }),
            "Encoder: num_layers must be > 0, got 0");
  EXPECT_THROW(Decoder<double>(tiny(false, true), 0, false), ConfigError);

  EncoderLayer<double> enc(tiny(false, true));
  EXPECT_EQ(error_of([&] {
              enc.forward(Tensor<double>({2, 3, 5}), KeyPaddingMask());
            }),
            "EncoderLayer: expected x [B, L, 8], got [2, 3, 5]");
  EXPECT_EQ(error_of([&] {
              enc.forward(Tensor<double>({2, 3, D}), KeyPaddingMask::from_lengths({1, 2, 3}, 3));
            }),
            "KeyPaddingMask: expected [B, S] = [2, 3], got [3, 3]");
  enc.forward(Tensor<double>({2, 3, D}), KeyPaddingMask());
  EXPECT_EQ(error_of([&] {
              enc.backward(Tensor<double>({2, 4, D}));
            }),
            "EncoderLayer::backward: expected dy of shape [2, 3, 8], got [2, 4, 8]");

  DecoderLayer<double> dec(tiny(false, true));
  const Tensor<double> y({2, 3, D});
  EXPECT_EQ(error_of([&] {
              dec.forward(y, Tensor<double>({3, 4, D}), {}, {});
            }),
            "DecoderLayer: expected memory [2, S, 8] (B of the target), got [3, 4, 8]");
  EXPECT_EQ(
      error_of([&] {
        dec.forward(y, Tensor<double>({2, 4, D}), KeyPaddingMask::from_lengths({3, 3}, 4), {});
      }),
      "KeyPaddingMask: expected [B, S] = [2, 3], got [2, 4]");
  EXPECT_EQ(
      error_of([&] {
        dec.forward(y, Tensor<double>({2, 4, D}), {}, KeyPaddingMask::from_lengths({3, 3}, 3));
      }),
      "KeyPaddingMask: expected [B, S] = [2, 4], got [2, 3]");
  EXPECT_THROW(dec.forward(Tensor<double>({2, 3}), Tensor<double>({2, 4, D}), {}, {}), ShapeError);
  dec.forward(y, Tensor<double>({2, 4, D}), {}, {});
  EXPECT_EQ(error_of([&] {
              dec.backward(Tensor<double>({2, 2, D}));
            }),
            "DecoderLayer::backward: expected dy of shape [2, 3, 8], got [2, 2, 8]");

  Decoder<double> stack(tiny(false, true), 2, false);
  EXPECT_NE(error_of<StateError>([&] { stack.dmemory(); }).find("needs forward and backward"),
            std::string::npos);
  DecoderCache<double> wrong = Decoder<double>(tiny(false, true), 3, false).make_cache(2, 4);
  EXPECT_EQ(error_of([&] {
              stack.forward_step(Tensor<double>({2, 1, D}), y, {}, wrong);
            }),
            "Decoder::forward_step: expected a cache of 2 layers, got 3");
  DecoderCache<double> cache = stack.make_cache(2, 1);
  stack.forward_step(Tensor<double>({2, 1, D}), y, {}, cache);
  EXPECT_NE(error_of([&] {
              stack.forward_step(Tensor<double>({2, 1, D}), y, {}, cache);
            }).find("cache full, capacity 1"),
            std::string::npos);
}

}  // namespace
}  // namespace attn
