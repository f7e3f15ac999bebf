// Transformer::forward_scored: the logits of the non-padding targets only. Its gather and scatter,
// a gradient check of every parameter through it, and the same logits, loss and gradients as the
// whole forward (to the last bit on attn's own GEMM).
#include <attn/nn/scored_positions.hpp>
#include <attn/nn/transformer.hpp>
#include <attn/train/label_smoothed_loss.hpp>

#include <cstring>

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

// The rows a scatter wrote for one batch are zeroed for the next, whose positions differ.
TEST(ScoredPositions, ScatterZeroesTheRowsOfTheBatchBefore) {
  ScoredPositions<float> s;
  s.select(ids({2, 2}, {4, 5, 6, 7}), 0);
  s.scatter(Tensor<float>::full({4, 3}, 9.0f), Shape({2, 2, 3}));
  s.select(ids({2, 2}, {0, 5, 0, 0}), 0);
  const Tensor<float>& full = s.scatter(Tensor<float>::full({1, 3}, 1.0f), Shape({2, 2, 3}));
  EXPECT_EQ(std::vector<float>(full.begin(), full.end()),
            (std::vector<float>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
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
  const std::string scatter = testing::error_of<ShapeError>([&] {
    s.scatter(Tensor<float>({2, 8}), Shape({2, 2, 8}));
  });
  EXPECT_NE(scatter.find("expected [3, 8] for [2, 2, 8], got [2, 8]"), std::string::npos)
      << scatter;
  EXPECT_THROW(s.scatter(Tensor<float>({3, 7}), Shape({2, 2, 8})), ShapeError);
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
    const auto res = testing::check_module(
        m, {}, [&] { return m.forward_scored(src, tgt_in, tgt_out); },
        [&](const Tensor<double>& dlogits) {
          m.backward(dlogits);
          return std::vector<Tensor<double>>{};
        });
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

/// A batch of `rows` sentences of 12 source tokens and T targets: row b has T - (3 b) % 7 real
/// targets (at least 16 of all, so that the products of the scored rows take the whole batch's
/// kernel), then padding.
struct PaddedBatch {
  Tensor<TokenId> src, tgt_in, tgt_out;
  PaddedBatch(Index rows, Index T, TokenId first)
      : src({rows, 12}), tgt_in({rows, T}), tgt_out({rows, T}) {
    for (Index b = 0; b < rows; ++b) {
      for (Index s = 0; s < 12; ++s) src(b, s) = static_cast<TokenId>(4 + (first + 5 * b + s) % 40);
      const Index len = T - (3 * b) % 7;
      for (Index t = 0; t < T; ++t) {
        const auto id = [&](Index k) { return static_cast<TokenId>(4 + (first + 7 * b + k) % 40); };
        tgt_in(b, t) = t >= len ? 0 : t == 0 ? 2 : id(t);
        tgt_out(b, t) = t >= len ? 0 : t + 1 == len ? 3 : id(t + 1);
      }
    }
  }
};

/// Whether two float tensors hold the same bits (+0 and -0 differ), else how close they are.
void expect_same(const Tensor<float>& got, const Tensor<float>& want, bool bitwise,
                 const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  if (bitwise) {
    EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * got.numel()), 0) << what;
    return;
  }
  for (Index i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(got.data()[i], want.data()[i], 1e-5 * (1 + std::abs(want.data()[i])))
        << what << "[" << i << "]";
}

// 24 rows of 30 targets, 648 of them real: the weight gradient of the projection is summed over
// more than one depth block of attn's GEMM (256 deep; 512 with AVX2). Dropout on, V = 48 (a
// multiple of 16: see forward_scored), and a step on another batch first, so that every buffer
// holds the numbers of that one.
TEST(Transformer, ScoredForwardIsTheWholeForwardAtTheNonPaddingTargets) {
  TransformerConfig c = TransformerConfig::tiny(48);
  c.dropout = 0.1;
  Transformer<float> m(c);
  m.train();
  const PaddedBatch other(7, 11, 3), batch(24, 30, 1);
  step(m, other.src, other.tgt_in, other.tgt_out, true);
  step(m, other.src, other.tgt_in, other.tgt_out, false);
  const std::uint64_t seed = m.random_state().counter;
  const StepResult whole = step(m, batch.src, batch.tgt_in, batch.tgt_out, false);
  m.random_state().counter = seed;  // the same dropout masks
  const StepResult scored = step(m, batch.src, batch.tgt_in, batch.tgt_out, true);
  EXPECT_EQ(scored.loss.tokens, 648);
  const bool bitwise = kernels::gemm_path() != kernels::GemmPath::eigen;
  if (bitwise)
    EXPECT_EQ(scored.loss.smoothed_loss, whole.loss.smoothed_loss);
  else
    EXPECT_NEAR(scored.loss.smoothed_loss, whole.loss.smoothed_loss,
                1e-6 * whole.loss.smoothed_loss);
  expect_same(scored.logits, whole.logits, bitwise, "logits");
  const auto params = m.parameters();
  for (std::size_t p = 0; p < params.size(); ++p)
    expect_same(scored.grads[p], whole.grads[p], bitwise, params[p].name);
}

TEST(Transformer, ScoredForwardOfOnlyPaddingHasNoRowsAndZeroGradients) {
  Transformer<float> m(TransformerConfig::tiny(20));
  const auto src = ids({2, 2}, {4, 5, 6, 0}), tgt_in = ids({2, 2}, {2, 4, 2, 0});
  const StepResult r = step(m, src, tgt_in, Tensor<TokenId>::full({2, 2}, 0), true);
  EXPECT_EQ(r.logits.shape(), Shape({0, 20}));
  EXPECT_EQ(r.loss.tokens, 0);
  for (const auto& g : r.grads)
    for (float v : g) ASSERT_EQ(v, 0.0f);
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
  const std::string backward = testing::error_of<ShapeError>([&] {
    m.backward(Tensor<float>({1, 3, 20}));
  });
  EXPECT_NE(backward.find("after forward_scored, expected dlogits [2, 20] (the scored positions), "
                          "got [1, 3, 20]"),
            std::string::npos)
      << backward;
  m.backward(Tensor<float>({2, 20}));
  m.forward(src, tgt_in);
  EXPECT_THROW(m.backward(Tensor<float>({2, 20})), ShapeError);
}

}  // namespace
}  // namespace attn
