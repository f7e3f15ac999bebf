// Transformer::forward_scored: the logits of the non-padding targets only. Its gather and scatter,
// a gradient check of every parameter through it, and the same logits, loss and gradients as the
// whole forward (to the last bit on attn's own GEMM).
#include <attn/nn/scored_positions.hpp>
#include <attn/nn/transformer.hpp>
#include <attn/train/label_smoothed_loss.hpp>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

Tensor<TokenId> ids(const Shape& shape, const std::vector<TokenId>& v) {
  return Tensor<TokenId>::from(shape, v);
}

TEST(ScoredPositions, GatherAndScatterTheNonPaddingRowsInOrder) {
  ScoredPositions<float> s;
  s.select(ids({2, 3}, {4, 0, 5, 0, 6, 0}), 0);
  ASSERT_EQ(s.count(), 3);
  EXPECT_EQ(s.targets().shape(), Shape({3}));
  EXPECT_EQ(std::vector<TokenId>(s.targets().begin(), s.targets().end()),
            (std::vector<TokenId>{4, 5, 6}));
  Tensor<float> h({2, 3, 2});
  for (Index i = 0; i < h.numel(); ++i) h.data()[i] = static_cast<float>(i + 1);
  const Tensor<float>& g = s.gather(h);
  EXPECT_EQ(g.shape(), Shape({3, 2}));
  EXPECT_EQ(std::vector<float>(g.begin(), g.end()), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor<float> d = Tensor<float>::from({3, 2}, {-1, -2, -3, -4, -5, -6});
  const Tensor<float>& full = s.scatter(d, h.shape());
  EXPECT_EQ(full.shape(), h.shape());
  EXPECT_EQ(std::vector<float>(full.begin(), full.end()),
            (std::vector<float>{-1, -2, 0, 0, -3, -4, 0, 0, -5, -6, 0, 0}));
}

TEST(ScoredPositions, AllPaddingGivesNoRowsAndAZeroGradient) {
  ScoredPositions<float> s;
  s.select(ids({1, 2}, {0, 0}), 0);
  EXPECT_EQ(s.count(), 0);
  EXPECT_EQ(s.gather(Tensor<float>::full({1, 2, 3}, 1.0f)).shape(), Shape({0, 3}));
  const Tensor<float>& full = s.scatter(Tensor<float>({0, 3}), Shape({1, 2, 3}));
  for (float v : full) EXPECT_EQ(v, 0.0f);
}

TEST(ScoredPositions, RowCountsThatDoNotMatchAreRefused) {
  ScoredPositions<float> s;
  s.select(ids({2, 2}, {4, 0, 5, 6}), 0);
  const std::string msg = testing::error_of<ShapeError>([&] {
    s.gather(Tensor<float>({3, 2, 8}));
  });
  EXPECT_NE(msg.find("expected 4 rows, got [3, 2, 8]"), std::string::npos) << msg;
  EXPECT_THROW(s.scatter(Tensor<float>({2, 8}), Shape({2, 2, 8})), ShapeError);
}

// The gradient check of test_transformer.cpp through forward_scored: L = sum(logits * R) over the
// scored rows, every parameter, both norm orders.
TEST(Transformer, ScoredForwardGradientsOfEveryParameter) {
  for (bool norm_first : {false, true}) {
    TransformerConfig c = TransformerConfig::tiny(11);
    c.d_model = 8;
    c.heads = 2;
    c.d_ff = 12;
    c.encoder_layers = c.decoder_layers = 1;
    c.norm_first = norm_first;
    Transformer<double> m(c);
    const auto src = ids({2, 4}, {5, 6, 7, 8, 4, 9, 0, 0});
    const auto tgt_in = ids({2, 3}, {2, 5, 6, 2, 7, 0});
    const auto tgt_out = ids({2, 3}, {5, 6, 3, 7, 3, 0});
    const Tensor<double> r = testing::randn({5, c.tgt_vocab}, 78);
    m.zero_grad();
    m.forward_scored(src, tgt_in, tgt_out);
    m.backward(r);
    std::vector<std::pair<std::string, Tensor<double>>> wrt;
    std::vector<Tensor<double>> analytic;
    for (auto& p : m.parameters()) {
      wrt.emplace_back(p.name, p.value);
      analytic.push_back(p.grad.clone());
    }
    const auto res = testing::gradcheck(
        wrt, analytic, [&] { return testing::dot(m.forward_scored(src, tgt_in, tgt_out), r); });
    EXPECT_GRADIENTS_MATCH(res) << " norm_first=" << norm_first;
  }
}

struct StepResult {
  Tensor<float> logits;  // [rows, V] of the scored positions
  LossStats loss;
  std::vector<Tensor<float>> grads;
};

// One training step's forward, loss and backward, through forward() or forward_scored().
StepResult step(Transformer<float>& m, const Tensor<TokenId>& src, const Tensor<TokenId>& tgt_in,
                const Tensor<TokenId>& tgt_out, bool scored) {
  LabelSmoothedCrossEntropy<float> loss(0.1, m.config().pad_id);
  StepResult r;
  m.zero_grad();
  if (scored) {
    Tensor<float> logits = m.forward_scored(src, tgt_in, tgt_out);
    r.logits = logits.clone();
    r.loss = loss.forward_backward_in_place(logits, m.scored_targets(), 0.01);
    m.backward(logits);
  } else {
    Tensor<float> logits = m.forward(src, tgt_in);
    const Index V = logits.size(2);
    r.logits = Tensor<float>({count_tokens(tgt_out, m.config().pad_id), V});
    for (Index i = 0, row = 0; i < tgt_out.numel(); ++i)
      if (tgt_out.data()[i] != m.config().pad_id)
        std::copy_n(logits.data() + i * V, V, r.logits.data() + V * row++);
    r.loss = loss.forward_backward_in_place(logits, tgt_out, 0.01);
    m.backward(logits);
  }
  for (auto& p : m.parameters()) r.grads.push_back(p.grad.clone());
  return r;
}

// A batch of 4 rows of 9 targets, 22 of them real (16 or more: the products of the scored rows take
// the same kernel as the whole batch's), with dropout on.
TEST(Transformer, ScoredForwardIsTheWholeForwardAtTheNonPaddingTargets) {
  TransformerConfig c = TransformerConfig::tiny(40);
  c.dropout = 0.1;
  Transformer<float> m(c);
  m.train();
  const auto src =
      ids({4, 5}, {4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 12, 13, 14, 15, 16, 17, 18, 0, 0, 0});
  std::vector<TokenId> in(36, 0), out(36, 0);
  const Index lengths[4] = {9, 3, 6, 4};
  for (Index b = 0; b < 4; ++b)
    for (Index t = 0; t < lengths[b]; ++t) {
      in[static_cast<std::size_t>(b * 9 + t)] = t == 0 ? 2 : static_cast<TokenId>(4 + (b + t) % 30);
      out[static_cast<std::size_t>(b * 9 + t)] =
          t + 1 == lengths[b] ? 3 : static_cast<TokenId>(4 + (b + t + 1) % 30);
    }
  const auto tgt_in = ids({4, 9}, in), tgt_out = ids({4, 9}, out);
  const std::uint64_t seed = m.random_state().counter;
  const StepResult whole = step(m, src, tgt_in, tgt_out, false);
  m.random_state().counter = seed;  // the same dropout masks
  const StepResult scored = step(m, src, tgt_in, tgt_out, true);
  ASSERT_EQ(scored.logits.shape(), Shape({22, 40}));
  EXPECT_EQ(scored.loss.tokens, 22);
  const bool bitwise = kernels::gemm_path() != kernels::GemmPath::eigen;
  const double tol = bitwise ? 0.0 : 1e-5;
  EXPECT_NEAR(scored.loss.smoothed_loss, whole.loss.smoothed_loss,
              tol * std::abs(whole.loss.smoothed_loss));
  for (Index i = 0; i < whole.logits.numel(); ++i)
    ASSERT_NEAR(scored.logits.data()[i], whole.logits.data()[i], tol) << "logit " << i;
  const auto params = m.parameters();
  for (std::size_t p = 0; p < params.size(); ++p)
    for (Index i = 0; i < whole.grads[p].numel(); ++i)
      ASSERT_NEAR(scored.grads[p].data()[i], whole.grads[p].data()[i],
                  tol * (1 + std::abs(whole.grads[p].data()[i])))
          << params[p].name << "[" << i << "]";
}

TEST(Transformer, ScoredForwardRefusesMismatchedShapes) {
  Transformer<float> m(TransformerConfig::tiny(20));
  const auto src = ids({1, 3}, {4, 5, 6}), tgt_in = ids({1, 3}, {2, 4, 5});
  const std::string msg = testing::error_of<ShapeError>([&] {
    m.forward_scored(src, tgt_in, ids({1, 2}, {4, 5}));
  });
  EXPECT_NE(msg.find("expected tgt_out of tgt_in's shape [1, 3], got [1, 2]"), std::string::npos)
      << msg;
  m.forward_scored(src, tgt_in, ids({1, 3}, {4, 5, 0}));
  // Two scored rows: the whole batch's [1, 3, V] is not their gradient.
  EXPECT_THROW(m.backward(Tensor<float>({1, 3, 20})), ShapeError);
  m.backward(Tensor<float>({2, 20}));
  m.forward(src, tgt_in);
  EXPECT_THROW(m.backward(Tensor<float>({2, 20})), ShapeError);
}

}  // namespace
}  // namespace attn
