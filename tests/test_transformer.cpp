// The whole Transformer: parameter counts of the paper's presets, names, weight sharing,
// determinism, bad input, and greedy/beam decoding (its gradients: test_transformer_gradients.cpp).
#include <attn/decode/beam_search.hpp>
#include <attn/nn/transformer.hpp>

#include <set>

#include "error_helpers.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

// Closed form: one attention block 4 D^2 + 4 D, one FFN 2 D F + F + D, one LayerNorm 2 D;
// an encoder layer has one attention, one FFN, two norms; a decoder layer two, one, three; plus
// one shared V x D embedding.
Index closed_form_parameters(Index V, Index D, Index F, Index N) {
  const Index attn = 4 * D * D + 4 * D, ffn = 2 * D * F + F + D, norm = 2 * D;
  return V * D + N * (attn + ffn + 2 * norm) + N * (2 * attn + ffn + 3 * norm);
}

TEST(Transformer, BaseAndBigParameterCountsMatchClosedForm) {
  // The paper's shared vocabulary had about 37,000 tokens; its Table 3 says 65M and 213M.
  Transformer<float> base(TransformerConfig::base(37000));
  EXPECT_EQ(base.num_parameters(), closed_form_parameters(37000, 512, 2048, 6));
  EXPECT_EQ(base.num_parameters(), 63082496);
  Transformer<float> big(TransformerConfig::big(37000));
  EXPECT_EQ(big.num_parameters(), closed_form_parameters(37000, 1024, 4096, 6));
  EXPECT_EQ(big.num_parameters(), 214245376);
}

TEST(Transformer, ParameterNamesFollowTorchAndSharedWeightsAppearOnce) {
  Transformer<float> m(TransformerConfig::tiny(50));
  auto ps = m.parameters();
  std::map<std::string, Shape> shapes;
  for (auto& p : ps) shapes[p.name] = p.value.shape();
  EXPECT_EQ(shapes.count("src_embed.weight"), 1u);
  EXPECT_EQ(shapes.count("tgt_embed.weight"), 0u);  // tied: listed once
  EXPECT_EQ(shapes.count("generator.weight"), 0u);
  EXPECT_EQ(shapes["encoder.layers.0.self_attn.in_proj_weight"], Shape({192, 64}));
  EXPECT_EQ(shapes["encoder.layers.1.linear1.weight"], Shape({128, 64}));
  EXPECT_EQ(shapes["decoder.layers.1.multihead_attn.out_proj.weight"], Shape({64, 64}));
  EXPECT_EQ(shapes["decoder.layers.0.norm3.bias"], Shape({64}));
  EXPECT_EQ(shapes.count("encoder.norm.weight"), 0u);  // post-norm: no final norm
  EXPECT_TRUE(m.src_embed.weight.value.same_data(m.generator.weight.value));

  TransformerConfig c = TransformerConfig::tiny(50);
  c.share_embeddings = false;
  c.tgt_vocab = 40;
  c.norm_first = true;
  c.learned_positions = true;
  c.max_positions = 32;
  Transformer<float> u(c);
  shapes.clear();
  for (auto& p : u.parameters()) shapes[p.name] = p.value.shape();
  EXPECT_EQ(shapes["src_embed.weight"], Shape({50, 64}));
  EXPECT_EQ(shapes["tgt_embed.weight"], Shape({40, 64}));
  EXPECT_EQ(shapes.count("generator.weight"), 0u);  // tied to tgt_embed by tie_output
  EXPECT_EQ(shapes["src_pos.weight"], Shape({32, 64}));
  EXPECT_EQ(shapes["encoder.norm.weight"], Shape({64}));
  EXPECT_EQ(shapes["decoder.norm.bias"], Shape({64}));
}

Tensor<TokenId> ids(const Shape& shape, const std::vector<TokenId>& v) {
  return Tensor<TokenId>::from(shape, v);
}

TEST(Transformer, SameSeedSameNumbersDifferentSeedDifferent) {
  TransformerConfig c = TransformerConfig::tiny(30);
  c.dropout = 0.1;
  auto src = ids({2, 5}, {4, 5, 6, 7, 8, 9, 10, 11, 0, 0});
  auto tgt = ids({2, 4}, {2, 4, 5, 6, 2, 9, 10, 0});
  Transformer<float> a(c), b(c);
  const Tensor<float> la = a.forward(src, tgt).clone();
  const Tensor<float> lb = b.forward(src, tgt).clone();
  for (Index i = 0; i < la.numel(); ++i) ASSERT_EQ(la.data()[i], lb.data()[i]);
  c.seed = 2;
  Transformer<float> d(c);
  const Tensor<float> ld = d.forward(src, tgt).clone();
  EXPECT_NE(ld.data()[5], la.data()[5]);
}

TEST(Transformer, BadInputIsRefusedClearly) {
  Transformer<float> m(TransformerConfig::tiny(20));
  try {
    m.forward(ids({1, 3}, {4, 25, 5}), ids({1, 2}, {2, 4}));
    FAIL() << "token id 25 must be refused";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("25"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("20"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.forward(Tensor<TokenId>({0, 3}), ids({0, 2}, {})), ShapeError);
  EXPECT_THROW(m.forward(ids({2, 1}, {4, 5}), ids({1, 2}, {2, 4})), ShapeError);
  TransformerConfig bad = TransformerConfig::tiny(20);
  bad.heads = 3;
  try {
    Transformer<float> x(bad);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("d_model (64) must be divisible by heads (3)"),
              std::string::npos)
        << e.what();
  }
  bad = TransformerConfig::tiny(20);
  bad.tgt_vocab = 21;
  EXPECT_THROW(Transformer<float> x(bad), ConfigError);
}

TEST(Transformer, ConfigRoundTripsThroughMetadata) {
  TransformerConfig c = TransformerConfig::big(123);
  c.norm_first = true;
  c.seed = 99;
  TransformerConfig d = TransformerConfig::from_metadata(c.to_metadata());
  EXPECT_EQ(d.to_metadata(), c.to_metadata());
  auto m = c.to_metadata();
  m.erase("config.d_model");
  EXPECT_THROW(TransformerConfig::from_metadata(m), FormatError);
  m = c.to_metadata();
  m["config.heads"] = "x";
  EXPECT_THROW(TransformerConfig::from_metadata(m), FormatError);
}

// One list of fields (visit_fields) serves metadata, validation, printing and layer_options().
TEST(Transformer, ConfigFieldsAreOneListForMetadataValidationAndPrinting) {
  TransformerConfig c = TransformerConfig::tiny(20);
  c.relu_dropout = 0.25;
  c.norm_first = true;
  std::vector<std::string> names;
  c.visit_fields([&](const char* name, const auto&, FieldRule) { names.push_back(name); });
  EXPECT_EQ(names.size(), 19u);
  const auto meta = c.to_metadata();
  EXPECT_EQ(meta.size(), names.size() - 1) << "every field but use_fast_kernel is stored";
  for (const auto& n : names)
    EXPECT_EQ(meta.count("config." + n), n == "use_fast_kernel" ? 0u : 1u) << n;

  std::ostringstream printed;
  printed << c;
  EXPECT_NE(printed.str().find("src_vocab=20 tgt_vocab=20 share_embeddings=true"),
            std::string::npos)
      << printed.str();
  EXPECT_NE(printed.str().find("relu_dropout=0.25 norm_first=true"), std::string::npos)
      << printed.str();

  std::ostringstream layer, expected;
  layer << c.layer_options();
  expected << "d_model=64 heads=4 d_ff=128 dropout=0 attention_dropout=0 relu_dropout=0.25 "
              "norm_first=true layer_norm_eps=1e-05 use_fast_kernel=true";
  EXPECT_EQ(layer.str(), expected.str());

  auto message = [](TransformerConfig bad) {
    try {
      bad.validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TransformerConfig bad = c;
  bad.decoder_layers = 0;
  EXPECT_EQ(message(bad), "decoder_layers must be > 0, got 0");
  bad = c;
  bad.attention_dropout = 1.0;
  EXPECT_EQ(message(bad), "attention_dropout must be in [0, 1), got 1");
  bad = c;
  bad.pad_id = -1;
  EXPECT_EQ(message(bad), "pad_id must be >= 0, got -1");
  bad = c;
  bad.pad_id = 20;
  EXPECT_EQ(message(bad), "pad_id 20 outside the vocabulary [0, 20)");
  bad = c;
  bad.learned_positions = true;
  bad.max_positions = 0;
  EXPECT_EQ(message(bad), "max_positions must be > 0 with learned positions, got 0");
}

// Incremental decoding with caches gives the same logits as the full causal forward.
TEST(Transformer, DecodeStepMatchesFullForward) {
  TransformerConfig c = TransformerConfig::tiny(25);
  Transformer<double> m(c);
  m.eval();
  auto src = ids({2, 5}, {4, 5, 6, 7, 8, 9, 10, 11, 0, 0});
  auto tgt = ids({2, 4}, {2, 4, 5, 6, 2, 9, 10, 12});
  const Tensor<double> full = m.forward(src, tgt).clone();  // [2, 4, V]
  const Tensor<double> memory = m.encode(src).clone();
  DecoderCache<double> cache = m.decoder.make_cache(2, 8);
  for (Index t = 0; t < 4; ++t) {
    Tensor<TokenId> tok({2, 1});
    tok(0, 0) = tgt(0, t);
    tok(1, 0) = tgt(1, t);
    const Tensor<double>& step = m.decode_step(tok, t, memory, cache);
    for (Index b = 0; b < 2; ++b)
      for (Index v = 0; v < 25; ++v)
        ASSERT_NEAR(step(b, 0, v), full(b, t, v), 1e-10) << b << " " << t;
  }
}

// A step refused by a later layer (here a memory of another length than the source padding mask,
// which only the cross-attention checked) had advanced layer 0's cache: the layers' caches were
// left at different lengths and the next steps gave wrong logits in silence. Now nothing is
// modified before every layer's check has passed, and a cache whose layers disagree is refused.
TEST(Transformer, ARefusedDecodeStepLeavesTheCacheAsItWas) {
  Transformer<float> m(TransformerConfig::tiny(25));
  m.eval();
  const Tensor<float> memory = m.encode(ids({2, 5}, {4, 5, 6, 7, 8, 9, 10, 11, 0, 0})).clone();
  const Tensor<TokenId> bos = Tensor<TokenId>::full({2, 1}, 2), next = ids({2, 1}, {6, 7});
  DecoderCache<float> clean = m.make_decoder_cache(2, 4);
  const Tensor<float> first = m.decode_step(bos, 0, memory, clean).clone();
  const Tensor<float> second = m.decode_step(next, 1, memory, clean).clone();
  DecoderCache<float> cache = m.make_decoder_cache(2, 4);
  EXPECT_THROW(m.decode_step(bos, 0, Tensor<float>({2, 3, 64}), cache), ShapeError);
  for (const auto& layer : cache.layers) EXPECT_EQ(layer.self.length, 0);
  const Tensor<float>& retried = m.decode_step(bos, 0, memory, cache);
  for (Index i = 0; i < first.numel(); ++i) ASSERT_EQ(retried.data()[i], first.data()[i]) << i;
  // The cross-attention caches hold the projection of a memory of 5 positions: one of 3 is refused
  // even without a padding mask, before any layer appends.
  const KeyPaddingMask padding = m.source_padding();
  m.set_source_padding(KeyPaddingMask());
  EXPECT_TRUE(contains(error_of<ShapeError>([&] {
                         m.decode_step(next, 1, Tensor<float>({2, 3, 64}), cache);
                       }),
                       "the cross-attention cache holds memory [2, 5, 64], got memory [2, 3, 64]"));
  m.set_source_padding(padding);
  const Tensor<float>& continued = m.decode_step(next, 1, memory, cache);
  for (Index i = 0; i < second.numel(); ++i) ASSERT_EQ(continued.data()[i], second.data()[i]) << i;
  cache.layers[1].self.length = 1;  // as a step that failed part-way left it
  EXPECT_EQ(error_of<ShapeError>([&] { m.decode_step(next, 2, memory, cache); }),
            "Decoder::forward_step: the cache's layers disagree on the positions decoded: layer 0 "
            "holds 2, layer 1 holds 1 (clear() it and decode again from position 0)");
  EXPECT_EQ(cache.layers[0].self.length, 2);
}

/// The score beam search ranks by, recomputed with the full (non-incremental) forward: log P of
/// `hyp` given source row b, plus EOS unless the hypothesis stopped at its length limit, divided by
/// GNMT's length penalty of its length (EOS counted).
double model_score(Transformer<float>& m, const Tensor<TokenId>& src, Index b,
                   const std::vector<TokenId>& hyp, Index limit, const DecodeOptions& o) {
  const bool ended_by_eos = static_cast<Index>(hyp.size()) < limit;
  const Index T = static_cast<Index>(hyp.size()) + 1;
  Tensor<TokenId> row({1, src.size(1)}), tgt_in({1, T});
  for (Index s = 0; s < src.size(1); ++s) row(0, s) = src(b, s);
  tgt_in(0, 0) = o.bos;
  for (Index t = 1; t < T; ++t) tgt_in(0, t) = hyp[static_cast<std::size_t>(t - 1)];
  const Tensor<float>& logits = m.forward(row, tgt_in);  // [1, T, V]
  const Index V = logits.size(2);
  double log_p = 0;
  for (Index t = 0; t < (ended_by_eos ? T : T - 1); ++t) {
    const float* z = logits.data() + t * V;
    const double mx = *std::max_element(z, z + V);
    double sum = 0;
    for (Index v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - mx);
    const TokenId next = t + 1 < T ? tgt_in(0, t + 1) : o.eos;
    log_p += static_cast<double>(z[next]) - mx - std::log(sum);
  }
  return log_p / gnmt_length_penalty(ended_by_eos ? T : T - 1, o.length_penalty);
}

TEST(Decode, BeamOfOneIsGreedyAndBeamFourIsNoWorseInModelScore) {
  auto src = ids({3, 4}, {4, 5, 6, 7, 8, 9, 0, 0, 10, 11, 12, 0});
  const std::vector<Index> src_len = {4, 2, 3};
  Index better = 0;
  for (std::uint64_t seed : {5, 6, 7, 8, 9, 10}) {
    TransformerConfig c = TransformerConfig::tiny(16);
    c.seed = seed;
    Transformer<float> m(c);
    DecodeOptions o;
    o.max_extra_length = 6;
    const auto greedy = greedy_decode(m, src, o);
    o.beam_size = 1;
    EXPECT_EQ(greedy, beam_search(m, src, o)) << "seed " << seed;
    for (const auto& h : greedy) EXPECT_LE(h.size(), 4u + 6u);
    o.beam_size = 4;
    const auto beam4 = beam_search(m, src, o);
    ASSERT_EQ(beam4.size(), 3u);
    EXPECT_TRUE(m.is_training()) << "decoding must restore the training mode";
    m.eval();
    for (Index b = 0; b < 3; ++b) {
      const Index limit = src_len[static_cast<std::size_t>(b)] + o.max_extra_length;
      const double s4 = model_score(m, src, b, beam4[static_cast<std::size_t>(b)], limit, o);
      const double s1 = model_score(m, src, b, greedy[static_cast<std::size_t>(b)], limit, o);
      EXPECT_GE(s4, s1 - 1e-9) << "seed " << seed << ", sentence " << b;
      better += s4 > s1 + 1e-9;
    }
  }
  // The wider beam finds a better hypothesis for some sentence, so the comparison above is not
  // only between equal outputs.
  EXPECT_GT(better, 0);
}

/// Greedy decoding of source row b by the full forward(), one token at a time: the first highest
/// logit at the last position among the tokens other than padding, until EOS or `limit` tokens.
std::vector<TokenId> forward_greedy(Transformer<double>& m, const Tensor<TokenId>& src, Index b,
                                    Index limit, const DecodeOptions& o) {
  Tensor<TokenId> row({1, src.size(1)});
  for (Index s = 0; s < src.size(1); ++s) row(0, s) = src(b, s);
  std::vector<TokenId> hyp;
  while (static_cast<Index>(hyp.size()) < limit) {
    const Index T = static_cast<Index>(hyp.size()) + 1;
    Tensor<TokenId> tgt_in({1, T});
    tgt_in(0, 0) = o.bos;
    for (Index t = 1; t < T; ++t) tgt_in(0, t) = hyp[static_cast<std::size_t>(t - 1)];
    const Tensor<double>& logits = m.forward(row, tgt_in);  // [1, T, V]
    const Index V = logits.size(2);
    const double* z = logits.data() + (T - 1) * V;
    TokenId best = -1;
    for (Index v = 0; v < V; ++v)
      if (v != m.config().pad_id && (best < 0 || z[v] > z[best])) best = static_cast<TokenId>(v);
    if (best == o.eos) break;
    hyp.push_back(best);
  }
  return hyp;
}

// The training loss never targets the padding token, and a tied output layer gives it a logit of
// exactly 0 (its embedding row is zero), so a model that has learnt little can rank it first.
// Decoding output it and fed it back, where forward() masks it as a key: the hypothesis was then
// chosen by another model than the one that scores it. Here every other logit is pushed below 0.
TEST(Decode, ThePaddingTokenIsNeverOutput) {
  Transformer<double> m(TransformerConfig::tiny(16));  // pad_id 0, output tied to the embedding
  for (auto& p : m.parameters()) {
    // The last hidden state h + 0.5 and the output rows but the padding one's w - 0.3: each
    // logit but the padding token's moves by 0.5 sum(w) - 0.3 sum(h) - 0.5 * 0.3 * d_model, where
    // sum(h) = 0 and the last term is -9.6 (the shift also reaches the inputs; the first step is
    // checked below).
    if (p.name == "decoder.layers.1.norm3.bias") p.value.fill(0.5);
    if (p.name == "src_embed.weight")
      for (Index i = m.config().d_model; i < p.value.numel(); ++i) p.value.data()[i] -= 0.3;
  }
  m.eval();
  const auto src = ids({3, 4}, {4, 5, 6, 7, 8, 9, 0, 0, 10, 11, 12, 0});
  DecodeOptions o;
  o.max_extra_length = 3;
  const Tensor<double>& first = m.forward(src, Tensor<TokenId>::full({3, 1}, o.bos));
  for (Index b = 0; b < 3; ++b) {  // the padding token is every sentence's most likely first token
    const double* z = first.data() + b * 16;
    ASSERT_EQ(std::max_element(z, z + 16) - z, 0) << "sentence " << b;
  }
  const std::vector<Index> limit = {7, 5, 6};
  const auto greedy = greedy_decode(m, src, o);
  for (Index b = 0; b < 3; ++b)
    EXPECT_EQ(greedy[static_cast<std::size_t>(b)],
              forward_greedy(m, src, b, limit[static_cast<std::size_t>(b)], o))
        << b;
  o.beam_size = 1;
  EXPECT_EQ(beam_search(m, src, o), greedy);
  o.beam_size = 4;
  std::set<TokenId> tokens;  // several: the outputs depend on the source and the prefix
  for (const auto& outputs : {greedy, beam_search(m, src, o)})
    for (const auto& hyp : outputs) {
      EXPECT_EQ(std::count(hyp.begin(), hyp.end(), m.config().pad_id), 0);
      tokens.insert(hyp.begin(), hyp.end());
    }
  EXPECT_GE(tokens.size(), 3u);
}

TEST(Decode, GnmtLengthPenalty) {
  EXPECT_DOUBLE_EQ(gnmt_length_penalty(1, 0.6), 1.0);
  EXPECT_NEAR(gnmt_length_penalty(7, 0.6), std::pow(2.0, 0.6), 1e-15);
  EXPECT_DOUBLE_EQ(gnmt_length_penalty(30, 0.0), 1.0);
  Transformer<float> m(TransformerConfig::tiny(16));
  DecodeOptions o;
  o.beam_size = 0;
  EXPECT_THROW(beam_search(m, ids({1, 2}, {4, 5}), o), ConfigError);
  o = DecodeOptions{};
  o.eos = 16;
  EXPECT_THROW(greedy_decode(m, ids({1, 2}, {4, 5}), o), ConfigError);
}

}  // namespace
}  // namespace attn
