// The whole Transformer's gradients: central differences of every parameter (shared and untied
// weights, learned positions, every dropout on), the float model against the double one, and the
// one buffer the gradients live in.
#include <attn/nn/transformer.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention_problem.hpp"  // GemmPathScope
#include "gemm_testing.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using Ids = Tensor<TokenId>;

// Gradient check of every parameter for L = sum(logits * R), where R is zero on the rows of padding
// targets, as in the real loss. That makes the padding embedding row a true stop-gradient (its
// analytic gradient comes only from the tied output projection) and checks that no real position
// depends on a padding position: source padding is masked as keys, target padding only follows.
// In training mode every forward restarts the dropout stream where the first began, so that each
// evaluation of the loss draws the same masks and central differences see one function.
testing::GradCheckResult check_transformer(Transformer<double>& m, const Tensor<TokenId>& src,
                                           const Tensor<TokenId>& tgt) {
  const Index V = m.config().tgt_vocab;
  Tensor<double> r = testing::randn({tgt.size(0), tgt.size(1), V}, 77);
  for (Index i = 0; i < tgt.numel(); ++i)
    if (tgt.data()[i] == m.config().pad_id) std::fill_n(r.data() + i * V, V, 0.0);
  const std::uint64_t counter = m.random_state().counter;
  const auto forward = [&]() -> const Tensor<double>& {
    m.random_state().counter = counter;
    return m.forward(src, tgt);
  };
  m.zero_grad();
  forward();
  m.backward(r);
  std::vector<std::pair<std::string, Tensor<double>>> wrt;
  std::vector<Tensor<double>> analytic;
  for (auto& p : m.parameters()) {
    wrt.emplace_back(p.name, p.value);
    analytic.push_back(p.grad.clone());
  }
  return testing::gradcheck(wrt, analytic, [&] { return testing::dot(forward(), r); });
}

/// The tiny preset shrunk to D = 8, H = 2, F = 12 and `layers` per stack, so that a central
/// difference of every parameter takes a moment.
TransformerConfig gradcheck_config(Index vocab, Index layers) {
  TransformerConfig c = TransformerConfig::tiny(vocab);
  c.d_model = 8;
  c.heads = 2;
  c.d_ff = 12;
  c.encoder_layers = c.decoder_layers = layers;
  return c;
}

TEST(Transformer, GradientsOfEveryParameterIncludingSharedWeights) {
  for (bool norm_first : {false, true}) {
    TransformerConfig c = gradcheck_config(11, 2);
    c.norm_first = norm_first;
    Transformer<double> m(c);
    // Source row 1 and target row 1 end in padding (id 0).
    auto src = Ids::from({2, 4}, {5, 6, 7, 8, 4, 9, 0, 0});
    auto tgt = Ids::from({2, 3}, {2, 5, 6, 2, 7, 0});
    auto res = check_transformer(m, src, tgt);
    EXPECT_GRADIENTS_MATCH(res) << " norm_first=" << norm_first;
  }
}

TEST(Transformer, GradientsWithUntiedLearnedPositions) {
  TransformerConfig c = gradcheck_config(9, 1);
  c.share_embeddings = false;
  c.tie_output = false;
  c.tgt_vocab = 7;
  c.learned_positions = true;
  c.max_positions = 6;
  Transformer<double> m(c);
  auto src = Ids::from({2, 3}, {5, 6, 7, 8, 4, 0});
  auto tgt = Ids::from({2, 3}, {2, 5, 6, 2, 3, 0});
  auto res = check_transformer(m, src, tgt);
  EXPECT_GRADIENTS_MATCH(res);
}

TEST(Transformer, GradientsWithEveryDropoutOn) {
  // Training mode: dropout on the embedding sums, the sublayer outputs, the attention weights and
  // the feed-forward's hidden layer, with the masks held fixed.
  for (bool norm_first : {false, true}) {
    TransformerConfig c = gradcheck_config(11, 1);
    c.norm_first = norm_first;
    c.dropout = 0.2;
    c.attention_dropout = 0.3;
    c.relu_dropout = 0.25;
    Transformer<double> m(c);
    m.train();
    auto src = Ids::from({2, 4}, {5, 6, 7, 8, 4, 9, 0, 0});
    auto tgt = Ids::from({2, 3}, {2, 5, 6, 2, 7, 0});
    auto res = check_transformer(m, src, tgt);
    EXPECT_GRADIENTS_MATCH(res) << " norm_first=" << norm_first;
  }
}

// The float model on attn's own kernels against the double one on Eigen, with the same parameters
// and padding in both stacks: the logits and every parameter's gradient agree to float rounding
// (the infinity-norm error of each tensor relative to its largest element: at most 2.2e-7 for the
// logits and 7.5e-7 for a gradient on a Zen 3, session 45), on every GEMM path.
// The finite differences and the PyTorch files check double only; this checks the float wiring.
TEST(Transformer, FloatLogitsAndGradientsAgreeWithDoubleOnEveryGemmPath) {
  TransformerConfig c = TransformerConfig::tiny(37);
  c.d_model = 64;
  c.heads = 4;
  c.d_ff = 96;
  c.norm_first = true;
  Transformer<double> md(c);
  Transformer<float> mf(c);
  md.eval();
  mf.eval();
  testing::copy_parameters(md, mf);
  // 4 x 9 source and 4 x 7 target rows: above the 16 rows of the packed GEMM, padding in both.
  std::vector<TokenId> s, t;
  for (Index i = 0; i < 36; ++i)
    s.push_back(i % 9 >= 9 - i / 9 ? 0 : 4 + static_cast<TokenId>(i % 31));
  for (Index i = 0; i < 28; ++i)
    t.push_back(i % 7 >= 7 - i / 7 ? 0 : 2 + static_cast<TokenId>(i % 29));
  const auto src = Ids::from({4, 9}, s), tgt = Ids::from({4, 7}, t);
  const Tensor<double> r = testing::randn({4, 7, c.tgt_vocab}, 81);
  const Tensor<float> rf = testing::to_float(r);
  md.zero_grad();
  const Tensor<double> yd = md.forward(src, tgt).clone();
  md.backward(r);
  const auto rel_error = [](const float* f, const double* d, Index n) {
    double diff = 0, mag = 0;
    for (Index i = 0; i < n; ++i) {
      const double e = std::abs(static_cast<double>(f[i]) - d[i]);
      diff = std::isfinite(e) ? std::max(diff, e) : std::numeric_limits<double>::infinity();
      mag = std::max(mag, std::abs(d[i]));
    }
    return mag > 0 ? diff / mag : diff;
  };
  const auto pd = md.parameters();
  const auto pf = mf.parameters();
  for (kernels::GemmPath path : testing::available_paths()) {
    SCOPED_TRACE(kernels::gemm_path_name(path));
    const testing::GemmPathScope scope(path);
    mf.zero_grad();
    EXPECT_LT(rel_error(mf.forward(src, tgt).data(), yd.data(), yd.numel()), 2e-6);
    mf.backward(rf);
    for (std::size_t i = 0; i < pd.size(); ++i)
      EXPECT_LT(rel_error(pf[i].grad.data(), pd[i].grad.data(), pd[i].grad.numel()), 1e-5)
          << pd[i].name;
  }
}

// Module::gather_gradients, as the Transformer's constructor calls it: every gradient zero, in one
// buffer, in parameters() order, each on a 64-byte boundary, the padding between them zero after
// backward, tied weights sharing one gradient; reset_parameters() keeps all of it.
TEST(Transformer, GradientsLieInOneBufferInParameterOrder) {
  for (bool shared : {true, false}) {
    TransformerConfig c = gradcheck_config(11, 2);
    c.share_embeddings = c.tie_output = shared;
    Transformer<float> m(c);
    for (const auto& p : m.parameters())
      EXPECT_EQ(p.grad.vector().cwiseAbs().maxCoeff(), 0.0f) << p.name;  // zero before backward
    auto src = Ids::from({2, 4}, {5, 6, 7, 8, 4, 9, 0, 0});
    auto tgt = Ids::from({2, 3}, {2, 5, 6, 2, 7, 0});
    const Tensor<float>& logits = m.forward(src, tgt);
    m.backward(Tensor<float>::full(logits.shape(), 0.5f));
    m.reset_parameters(7);
    const auto params = m.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor<float>& g = params[i].grad;
      SCOPED_TRACE(params[i].name + (shared ? " (shared)" : " (untied)"));
      EXPECT_TRUE(g.shares_storage(params[0].grad));
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g.data()) % 64, 0u);
      EXPECT_GT(g.vector().cwiseAbs().maxCoeff(), 0.0f);  // backward wrote here
      if (i + 1 == params.size()) continue;
      const Index padded = (g.numel() + 15) / 16 * 16;
      EXPECT_EQ(params[i + 1].grad.data(), g.data() + padded);
      for (Index j = g.numel(); j < padded; ++j) EXPECT_EQ(g.data()[j], 0.0f);
    }
    EXPECT_EQ(m.generator.weight.grad.same_data(m.src_embed.weight.grad), shared);
    EXPECT_EQ(m.tgt_embed.weight.grad.same_data(m.src_embed.weight.grad), shared);
  }
}

}  // namespace
}  // namespace attn
