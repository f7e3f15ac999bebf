// Embedding, SinusoidalPositionalEncoding and LearnedPositionalEmbedding: values, the padding row,
// the sinusoid formula at long lengths, the cache, start offsets, gradients, errors.
#include <attn/nn/embedding.hpp>
#include <attn/nn/positional_encoding.hpp>

#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

/// Expects `f` to throw ErrorType with every needle in its message.
template <class ErrorType, class F>
void expect_error(F f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming " << needles[0];
  } catch (const ErrorType& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
  }
}

// --- Embedding -----------------------------------------------------------------------------------

TEST(Embedding, ForwardLooksUpRowsScaledBySqrtD) {
  Embedding<double> emb(5, 4);
  Rng rng(1);
  emb.reset_parameters(rng);
  auto ids = Tensor<TokenId>::from({2, 3}, {0, 4, 2, 2, 1, 3});
  const Tensor<double>& y = emb.forward(ids);
  ASSERT_EQ(y.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(emb.scale(), 2.0);
  for (Index b = 0; b < 2; ++b)
    for (Index l = 0; l < 3; ++l)
      for (Index j = 0; j < 4; ++j)
        EXPECT_EQ(y(b, l, j), emb.weight.value(ids(b, l), j) * 2.0) << b << " " << l << " " << j;

  Embedding<double> plain(5, 4, -1, /*scale_by_sqrt_d=*/false);
  plain.weight.value = emb.weight.value.clone();
  const Tensor<double>& y2 = plain.forward(ids);
  for (Index j = 0; j < 4; ++j) EXPECT_EQ(y2(1, 2, j), emb.weight.value(3, j));
}

TEST(Embedding, ParameterNameShapeAndInit) {
  const Index V = 300, D = 64;
  Embedding<double> emb(V, D, /*padding_idx=*/1);
  auto ps = emb.parameters();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].name, "weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({V, D}));
  Rng rng(2);
  emb.reset_parameters(rng);
  for (Index j = 0; j < D; ++j) EXPECT_EQ(emb.weight.value(1, j), 0.0);
  double sum = 0, sq = 0;
  for (double w : emb.weight.value) {
    sum += w;
    sq += w * w;
  }
  const double n = static_cast<double>((V - 1) * D);
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n), 1.0 / std::sqrt(static_cast<double>(D)), 0.005);
}

TEST(Embedding, BackwardScatterAddsAndSkipsThePaddingRow) {
  const Index V = 6, D = 3, pad = 0;
  Embedding<double> emb(V, D, pad);
  Rng rng(3);
  emb.reset_parameters(rng);
  auto ids = Tensor<TokenId>::from({2, 4}, {2, 0, 2, 5, 0, 0, 3, 2});  // 2 repeats, pad at 3 spots
  emb.forward(ids);
  Tensor<double> dy = testing::randn({2, 4, D}, 4);
  emb.zero_grad();
  emb.backward(dy);
  const double s = std::sqrt(3.0);
  for (Index j = 0; j < D; ++j) {
    EXPECT_EQ(emb.weight.grad(pad, j), 0.0);  // exactly zero, not merely small
    EXPECT_DOUBLE_EQ(emb.weight.grad(2, j), s * (dy(0, 0, j) + dy(0, 2, j) + dy(1, 3, j)));
    EXPECT_DOUBLE_EQ(emb.weight.grad(5, j), s * dy(0, 3, j));
    EXPECT_DOUBLE_EQ(emb.weight.grad(3, j), s * dy(1, 2, j));
    EXPECT_EQ(emb.weight.grad(1, j), 0.0);  // unused id
    EXPECT_EQ(emb.weight.grad(4, j), 0.0);
  }
  // Accumulates.
  emb.backward(dy);
  EXPECT_DOUBLE_EQ(emb.weight.grad(5, 1), 2 * s * dy(0, 3, 1));
}

TEST(Embedding, GradientsMatchCentralDifferences) {
  Embedding<double> emb(7, 4);
  Rng rng(5);
  emb.reset_parameters(rng);
  auto ids = Tensor<TokenId>::from({2, 3}, {1, 3, 6, 6, 0, 3});
  auto res = testing::check_module(
      emb, {}, [&] { return emb.forward(ids); },
      [&](const Tensor<double>& dy) {
        emb.backward(dy);
        return std::vector<Tensor<double>>{};
      });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 28);
}

TEST(Embedding, PaddingRowIsAStopGradientAndOtherRowsMatchCentralDifferences) {
  // As torch.nn.Embedding(padding_idx=...): forward still reads the padding row (zero after
  // reset_parameters, but weight tying can make it nonzero), backward never writes it. So the
  // padding row is checked for an exactly zero gradient and every other row against central
  // differences, through views that share the weight's storage.
  const Index pad = 3;
  Embedding<double> emb(7, 4, pad);
  Rng rng(5);
  emb.reset_parameters(rng);
  auto ids = Tensor<TokenId>::from({2, 3}, {1, 3, 6, 6, 0, 3});
  for (Index j = 0; j < 4; ++j) EXPECT_EQ(emb.forward(ids)(0, 1, j), 0.0);  // zero pad row
  fill_normal(emb.weight.value, rng, 0, 1);  // now nonzero everywhere, pad row included
  const Tensor<double> r = testing::randn({2, 3, 4}, 6);
  emb.zero_grad();
  emb.forward(ids);
  emb.backward(r);
  for (double g : emb.weight.grad.slice(pad)) EXPECT_EQ(g, 0.0);
  const Tensor<double>& w = emb.weight.value;
  const Tensor<double>& g = emb.weight.grad;
  auto res =
      testing::gradcheck({{"weight[0:3]", w.slice(0, pad)}, {"weight[4:7]", w.slice(pad + 1, 7)}},
                         {g.slice(0, pad).clone(), g.slice(pad + 1, 7).clone()},
                         [&] { return testing::dot(emb.forward(ids), r); });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 24);
}

TEST(Embedding, OutOfRangeIdsNameTheIdPositionAndVocabulary) {
  Embedding<float> emb(10, 4);
  expect_error<IndexError>(
      [&] {
        emb.forward(Tensor<TokenId>::from({1, 3}, {1, 10, 2}));
      },
      {"token id 10", "[0, 1]", "[0, 10)"});
  expect_error<IndexError>(
      [&] {
        emb.forward(Tensor<TokenId>::from({2, 2}, {1, 2, 3, -1}));
      },
      {"token id -1", "[1, 1]", "[0, 10)"});
  // The largest and smallest valid ids pass.
  EXPECT_EQ(emb.forward(Tensor<TokenId>::from({1, 2}, {0, 9})).shape(), Shape({1, 2, 4}));
}

TEST(Embedding, RejectsBadConfigAndShapes) {
  expect_error<ConfigError>([] { Embedding<float>(0, 4); }, {"vocab must be > 0, got 0"});
  expect_error<ConfigError>([] { Embedding<float>(10, -4); }, {"d_model must be > 0, got -4"});
  expect_error<ConfigError>([] { Embedding<float>(10, 4, 10); }, {"[0, 10)", "got 10"});
  expect_error<ConfigError>([] { Embedding<float>(10, 4, -2); }, {"got -2"});
  Embedding<float> emb(10, 4);
  expect_error<ShapeError>([&] { emb.forward(Tensor<TokenId>({6})); }, {"[B, L]", "[6]"});
  expect_error<ShapeError>([&] { emb.forward(Tensor<TokenId>({1, 2, 3})); }, {"[1, 2, 3]"});
  emb.forward(Tensor<TokenId>({2, 3}));
  expect_error<ShapeError>(
      [&] {
        emb.backward(Tensor<float>({2, 3, 5}));
      },
      {"[2, 3, 4]", "[2, 3, 5]"});
}

// --- SinusoidalPositionalEncoding
// ------------------------------------------------------------------

/// The paper's formula, written independently of the implementation (exp/log instead of pow).
double sinusoid(Index pos, Index j, Index D) {
  const double i2 = static_cast<double>(2 * (j / 2));
  const double angle = static_cast<double>(pos) * std::exp(-std::log(10000.0) * i2 / D);
  return j % 2 == 0 ? std::sin(angle) : std::cos(angle);
}

TEST(SinusoidalPositionalEncoding, MatchesThePaperFormulaIncludingLongLengths) {
  const Index D = 512;
  SinusoidalPositionalEncoding<double> pe(D);
  const Tensor<double>& t = pe.table(5001);
  ASSERT_EQ(t.shape(), Shape({5001, D}));
  for (Index pos : {0, 1, 2, 17, 100, 999, 5000})
    for (Index j : {0, 1, 2, 3, 64, 65, 254, 255, 510, 511})
      EXPECT_NEAR(t(pos, j), sinusoid(pos, j, D), 1e-10) << "pos " << pos << " j " << j;
  // Hand values: PE(1, 0) = sin(1), PE(1, 1) = cos(1), PE(0, odd) = 1.
  EXPECT_DOUBLE_EQ(t(1, 0), std::sin(1.0));
  EXPECT_DOUBLE_EQ(t(1, 1), std::cos(1.0));
  EXPECT_EQ(t(0, 511), 1.0);
  EXPECT_EQ(t(0, 510), 0.0);
}

TEST(SinusoidalPositionalEncoding, FloatTableIsComputedInDouble) {
  // A float angle at pos 5000 would be off by ~3e-4 rad; a double angle rounded to float is not.
  SinusoidalPositionalEncoding<float> pe(64);
  const Tensor<float>& t = pe.table(5001);
  for (Index j = 0; j < 64; ++j) EXPECT_NEAR(t(5000, j), sinusoid(5000, j, 64), 1e-7) << j;
}

TEST(SinusoidalPositionalEncoding, OddDModelEndsWithASineColumn) {
  SinusoidalPositionalEncoding<double> pe(5);
  const Tensor<double>& t = pe.table(8);
  for (Index pos = 0; pos < 8; ++pos)
    for (Index j = 0; j < 5; ++j) EXPECT_NEAR(t(pos, j), sinusoid(pos, j, 5), 1e-13);
}

TEST(SinusoidalPositionalEncoding, CacheGrowsOnDemandAndKeepsValues) {
  SinusoidalPositionalEncoding<double> pe(6);
  EXPECT_EQ(pe.cached_length(), 0);
  const Tensor<double> first = pe.table(10).clone();
  EXPECT_EQ(pe.cached_length(), 10);
  EXPECT_EQ(pe.table(4).shape(), Shape({4, 6}));
  EXPECT_EQ(pe.cached_length(), 10);  // shorter requests reuse the cache
  const Tensor<double>& longer = pe.table(11);
  EXPECT_EQ(longer.shape(), Shape({11, 6}));
  EXPECT_GE(pe.cached_length(), 20);  // doubled, so growth is amortised
  for (Index i = 0; i < first.numel(); ++i) EXPECT_EQ(longer.data()[i], first.data()[i]);
  // forward past the cache grows it as well.
  Tensor<double> x({1, 50, 6});
  pe.forward(x, 3);
  EXPECT_GE(pe.cached_length(), 53);
  EXPECT_NEAR(pe.table(53)(52, 1), sinusoid(52, 1, 6), 1e-13);
}

TEST(SinusoidalPositionalEncoding, ForwardAddsTheTableFromStart) {
  const Index B = 2, L = 4, D = 6;
  SinusoidalPositionalEncoding<double> pe(D);
  Tensor<double> x = testing::randn({B, L, D}, 7);
  const Tensor<double> y0 = pe.forward(x).clone();
  const Tensor<double>& y3 = pe.forward(x, 3);
  for (Index b = 0; b < B; ++b)
    for (Index l = 0; l < L; ++l)
      for (Index j = 0; j < D; ++j) {
        EXPECT_NEAR(y0(b, l, j), x(b, l, j) + sinusoid(l, j, D), 1e-14);
        EXPECT_NEAR(y3(b, l, j), x(b, l, j) + sinusoid(l + 3, j, D), 1e-14);
      }
  // Incremental decoding: position t alone, with start = t, equals row t of the full pass.
  Tensor<double> step = x.slice(0, 1).slice(0).slice(2, 3).reshape({1, 1, D}).clone();
  const Tensor<double>& ys = pe.forward(step, 2);
  for (Index j = 0; j < D; ++j) EXPECT_EQ(ys(0, 0, j), y0(0, 2, j));
}

TEST(SinusoidalPositionalEncoding, BackwardIsTheIdentityAndGradientsMatch) {
  SinusoidalPositionalEncoding<double> pe(4);
  EXPECT_TRUE(pe.parameters().empty());
  Tensor<double> x = testing::randn({2, 3, 4}, 8);
  pe.forward(x, 1);
  Tensor<double> dy = testing::randn({2, 3, 4}, 9);
  EXPECT_TRUE(pe.backward(dy).same_data(dy));
  auto res = testing::check_module(
      pe, {{"x", x}}, [&] { return pe.forward(x, 1); },
      [&](const Tensor<double>& d) { return std::vector<Tensor<double>>{pe.backward(d)}; });
  EXPECT_GRADIENTS_MATCH(res);
}

TEST(SinusoidalPositionalEncoding, RejectsBadConfigAndShapes) {
  expect_error<ConfigError>([] { SinusoidalPositionalEncoding<float>(0); }, {"got 0"});
  SinusoidalPositionalEncoding<float> pe(8);
  expect_error<ShapeError>(
      [&] {
        pe.forward(Tensor<float>({2, 3, 7}));
      },
      {"[B, L, 8]", "[2, 3, 7]"});
  expect_error<ShapeError>([&] { pe.forward(Tensor<float>({3, 8})); }, {"[3, 8]"});
  expect_error<IndexError>([&] { pe.forward(Tensor<float>({1, 2, 8}), -1); }, {"got -1"});
  expect_error<IndexError>([&] { pe.table(-5); }, {"got -5"});
  pe.forward(Tensor<float>({1, 2, 8}));
  expect_error<ShapeError>(
      [&] {
        pe.backward(Tensor<float>({1, 3, 8}));
      },
      {"[1, 2, 8]", "[1, 3, 8]"});
}

// --- LearnedPositionalEmbedding
// --------------------------------------------------------------------

TEST(LearnedPositionalEmbedding, ForwardAddsRowsFromStart) {
  LearnedPositionalEmbedding<double> pe(8, 3);
  auto ps = pe.parameters();
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].name, "weight");
  EXPECT_EQ(ps[0].value.shape(), Shape({8, 3}));
  Rng rng(10);
  pe.reset_parameters(rng);
  Tensor<double> x = testing::randn({2, 4, 3}, 11);
  const Tensor<double>& y = pe.forward(x, 4);  // positions 4..7, the last valid ones
  for (Index b = 0; b < 2; ++b)
    for (Index l = 0; l < 4; ++l)
      for (Index j = 0; j < 3; ++j) EXPECT_EQ(y(b, l, j), x(b, l, j) + pe.weight.value(4 + l, j));
}

TEST(LearnedPositionalEmbedding, GradientsMatchCentralDifferences) {
  LearnedPositionalEmbedding<double> pe(6, 4);
  Rng rng(12);
  pe.reset_parameters(rng);
  Tensor<double> x = testing::randn({2, 3, 4}, 13);
  auto res = testing::check_module(
      pe, {{"x", x}}, [&] { return pe.forward(x, 2); },
      [&](const Tensor<double>& dy) { return std::vector<Tensor<double>>{pe.backward(dy)}; });
  EXPECT_GRADIENTS_MATCH(res);
  EXPECT_EQ(res.checked, 24 + 24);
  // Rows outside [start, start + L) get no gradient; rows inside get the sum over the batch.
  pe.zero_grad();
  pe.forward(x, 2);
  Tensor<double> dy = testing::randn({2, 3, 4}, 14);
  EXPECT_TRUE(pe.backward(dy).same_data(dy));
  for (Index j = 0; j < 4; ++j) {
    EXPECT_EQ(pe.weight.grad(0, j), 0.0);
    EXPECT_EQ(pe.weight.grad(1, j), 0.0);
    EXPECT_EQ(pe.weight.grad(5, j), 0.0);
    EXPECT_DOUBLE_EQ(pe.weight.grad(3, j), dy(0, 1, j) + dy(1, 1, j));
  }
}

TEST(LearnedPositionalEmbedding, PositionsBeyondMaxLenAreRejected) {
  LearnedPositionalEmbedding<float> pe(8, 4);
  // A default dy matched the shape [] of the output not yet made, and the message was an axis's.
  for (const Tensor<float>& dy : {Tensor<float>(), Tensor<float>({1, 3, 4})})
    expect_error<StateError>([&] { pe.backward(dy); },
                             {"LearnedPositionalEmbedding::backward: needs a forward first"});
  expect_error<IndexError>(
      [&] {
        pe.forward(Tensor<float>({1, 9, 4}));
      },
      {"max_len 8", "length 9"});
  expect_error<IndexError>(
      [&] {
        pe.forward(Tensor<float>({1, 3, 4}), 6);
      },
      {"max_len 8", "length 3", "start 6", "[6, 9)"});
  expect_error<IndexError>([&] { pe.forward(Tensor<float>({1, 3, 4}), -1); }, {"start -1"});
  EXPECT_EQ(pe.forward(Tensor<float>({1, 3, 4}), 5).shape(), Shape({1, 3, 4}));
  expect_error<ShapeError>([&] { pe.forward(Tensor<float>({1, 3, 5})); }, {"[B, L, 4]"});
  expect_error<ShapeError>(
      [&] {
        pe.backward(Tensor<float>({2, 3, 4}));
      },
      {"[1, 3, 4]", "[2, 3, 4]"});
  expect_error<ConfigError>([] { LearnedPositionalEmbedding<float>(0, 4); },
                            {"max_len must be > 0, got 0"});
  expect_error<ConfigError>([] { LearnedPositionalEmbedding<float>(8, 0); },
                            {"d_model must be > 0, got 0"});
}

}  // namespace
}  // namespace attn
