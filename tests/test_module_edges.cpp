// Modules and caches at the edges of their use: backward before forward, inputs changed between
// forward and backward, positions and cache lengths near Index's limit, caches gathered into
// themselves, fused dropout probabilities and mask biases. Each case crashed, overflowed or
// answered wrongly in silence before session 43's audit; each is now an attn::Error naming what was
// expected and what came. tests/test_api_edges.cpp holds session 42's cases and the training side.
#include <attn/attn.hpp>

#include <cmath>
#include <limits>

#include "error_helpers.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

LayerOptions small_layer() {
  LayerOptions o;
  o.d_model = 8;
  o.heads = 2;
  o.d_ff = 16;
  o.dropout = 0;
  return o;
}

TEST(ModuleEdges, BackwardBeforeForwardSaysSo) {
  // LayerNorm, Embedding, ReLU and the layers through LayerNorm dereferenced a null pointer (their
  // empty output shape equals a scalar dy's); Linear's came from the product, naming shapes the
  // caller never gave.
  LayerNorm<float> norm(8);
  for (const Tensor<float>& dy : {Tensor<float>(), Tensor<float>(Shape{})})
    EXPECT_EQ(error_of<StateError>([&] { norm.backward(dy); }),
              "LayerNorm::backward: needs a forward first");
  Linear<float> linear(3, 4);
  EXPECT_EQ(error_of<StateError>([&] { linear.backward(Tensor<float>(Shape{})); }),
            "Linear::backward: needs a forward first");
  Embedding<float> embedding(10, 4);
  EXPECT_EQ(error_of<StateError>([&] { embedding.backward(Tensor<float>(Shape{})); }),
            "Embedding::backward: needs a forward first");
  ReLU<float> relu;
  EXPECT_EQ(error_of<StateError>([&] { relu.backward(Tensor<float>(Shape{})); }),
            "ReLU::backward: needs a forward first");
  // Dropout passed a scalar dy through: its empty shape of no forward equals a scalar's.
  Dropout<float> dropout(0.5);
  for (const Tensor<float>& dy : {Tensor<float>(), Tensor<float>(Shape{})})
    EXPECT_EQ(error_of<StateError>([&] { dropout.backward(dy); }),
              "Dropout::backward: needs a forward first");
  EncoderLayer<float> encoder(small_layer());
  EXPECT_EQ(error_of<StateError>([&] { encoder.backward(Tensor<float>()); }),
            "EncoderLayer::backward: needs a forward first");
  DecoderLayer<float> decoder(small_layer());
  EXPECT_EQ(error_of<StateError>([&] { decoder.backward(Tensor<float>()); }),
            "DecoderLayer::backward: needs a forward first");
}

TEST(ModuleEdges, ATensorWithoutStorageHoldsNoElements) {
  // A default tensor said it held one element and was not empty: fill, clone, at({}) and the
  // modules given one dereferenced its null pointer.
  Tensor<float> none;
  EXPECT_EQ(none.numel(), 0);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.begin(), none.end());
  none.fill(1.0f);
  EXPECT_EQ(none.vector().sum(), 0.0f);
  EXPECT_TRUE(none.clone().empty());
  EXPECT_EQ(none.clone().data(), nullptr);
  EXPECT_EQ(error_of<IndexError>([&] { none.at({}); }), "at: the tensor has no storage");
  const Tensor<float> scalar(Shape{});  // rank 0 with storage: one element
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.at({}), 0.0f);
  Parameter<float> never_allocated;
  EXPECT_TRUE(contains(error_of<ConfigError>([&] {
                         Adam<float>({{"w", never_allocated.value, never_allocated.grad}});
                       }),
                       "Adam: parameter w has no storage"));
}

TEST(ModuleEdges, ElementwiseModulesRefuseATensorWithoutStorage) {
  // ReLU's forward and Dropout's training forward returned a one-element scalar for a default
  // tensor, whose element neither had read; Dropout's eval forward passed it through.
  ReLU<float> relu;
  EXPECT_EQ(error_of<ShapeError>([&] { relu.forward(Tensor<float>()); }),
            "ReLU::forward: expected a tensor with storage, got a default-constructed one");
  Dropout<float> dropout(0.5);
  for (const bool training : {true, false}) {
    dropout.train(training);
    EXPECT_EQ(error_of<ShapeError>([&] { dropout.forward(Tensor<float>()); }),
              "Dropout::forward: expected a tensor with storage, got a default-constructed one");
  }
  // A scalar is a tensor: one element in, one out.
  EXPECT_EQ(relu.forward(Tensor<float>::from({}, {2.0f})).at({}), 2.0f);
}

TEST(ModuleEdges, LearnedPositionsNearIndexsLimitAreRefused) {
  // start + L overflowed: undefined behaviour, then rows read from before the table.
  LearnedPositionalEmbedding<float> pe(16, 4);
  const Tensor<float> x({1, 2, 4});
  for (const Index start : {std::numeric_limits<Index>::max() - 1, Index(15)})
    EXPECT_TRUE(contains(error_of<IndexError>([&] { pe.forward(x, start); }),
                         "(length 2 from start " + std::to_string(start) + ") exceed max_len 16"));
  EXPECT_TRUE(
      contains(error_of<IndexError>([&] { pe.forward(x, std::numeric_limits<Index>::max()); }),
               "positions [9223372036854775807, 9223372036854775809)"));
  EXPECT_NO_THROW(pe.forward(x, 14));
}

TEST(ModuleEdges, ChangedIdsBetweenEmbeddingForwardAndBackwardAreRefused) {
  // Embedding keeps a handle to the ids it was given; a caller that refilled that buffer wrote a
  // gradient row outside the table.
  Embedding<float> e(10, 4);
  Tensor<TokenId> ids = Tensor<TokenId>::from({1, 2}, {1, 2});
  const Tensor<float> y = e.forward(ids).clone();
  ids(0, 1) = 1'000'000;
  EXPECT_EQ(error_of<IndexError>([&] { e.backward(y); }),
            "Embedding::backward: token id 1000000 at position 1 is outside [0, 10) (the ids "
            "given to forward changed since)");
}

TEST(ModuleEdges, KeyValueCachesCheckTheirLengthAndRefuseToGatherFromThemselves) {
  KVCache<float> a;
  a.allocate(2, 3, 2);
  for (Index i = 0; i < a.keys.numel(); ++i) a.keys.data()[i] = a.values.data()[i] = float(i);
  a.length = 2;
  // Gathering from itself, or from a copy (a handle to the same storage), overwrote rows still
  // to be read: {1, 0} gave both rows the old row 1.
  KVCache<float> copy = a;
  for (KVCache<float>* from : {&a, &copy})
    EXPECT_TRUE(contains(error_of<ConfigError>([&] {
                           a.gather(*from, {1, 0});
                         }),
                         "KVCache::gather: the source shares this cache's storage"));
  EXPECT_EQ(a.keys.data()[0], 0.0f) << "the refused gather changed nothing";
  // `length` is a public field: past the capacity, reorder and gather copied past the rows.
  a.length = 100;
  EXPECT_EQ(error_of<ShapeError>([&] {
              a.reorder({1, 0});
            }),
            "KVCache::reorder: length 100 outside [0, capacity 3]");
  KVCache<float> to;
  EXPECT_TRUE(contains(error_of<ShapeError>([&] {
                         to.gather(a, {1, 0});
                       }),
                       "KVCache::gather (the source): length 100 outside [0, capacity 3]"));
  a.length = -1;
  EXPECT_THROW(a.reorder({1, 0}), ShapeError);
  // A decoding step wrote its key and value before the buffer.
  MultiHeadAttention<float> mha(2, 1);
  EXPECT_EQ(error_of<ShapeError>([&] {
              mha.forward_self_step(Tensor<float>({2, 1, 2}), a);
            }),
            "MultiHeadAttention::forward_self_step: length -1 outside [0, capacity 3]");
}

TEST(ModuleEdges, FusedDropoutProbabilitiesAreChecked) {
  // p >= 1 zeroed every output; NaN or a negative p was taken for no dropout, in silence.
  Linear<float> linear(4, 4);
  LayerNorm<float> norm(4);
  const Tensor<float> x({2, 4});
  for (const double p : {1.0, -0.5, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_TRUE(contains(error_of<ConfigError>([&] {
                           linear.forward(x, false, {p, 1});
                         }),
                         "Linear: dropout probability must be in [0, 1)"))
        << p;
    EXPECT_TRUE(contains(error_of<ConfigError>([&] {
                           norm.forward_residual(x, x, {p, 1});
                         }),
                         "LayerNorm::forward_residual: dropout probability must be in [0, 1)"))
        << p;
  }
  EXPECT_NO_THROW(linear.forward(x, false, {0.5, 1}));
}

TEST(ModuleEdges, AttentionWeightsAndMaskBiasesSayWhatTheyHold) {
  MultiHeadAttention<float> mha(4, 2);
  Rng rng(1);
  mha.reset_parameters(rng);
  Tensor<float> x3({1, 3, 4}), x5({1, 5, 4});
  fill_normal(x3, rng, 0, 1);
  fill_normal(x5, rng, 0, 1);
  // Kept, not kept, kept again: the weights of the first forward were returned as the last's.
  mha.keep_attention_weights(true);
  mha.forward_self(x3, {});
  mha.keep_attention_weights(false);
  mha.forward_self(x5, {});
  mha.keep_attention_weights(true);
  EXPECT_TRUE(contains(error_of<StateError>([&] { mha.attention_weights(); }),
                       "no forward since keep_attention_weights(true)"));
  mha.forward_self(x5, {});
  EXPECT_EQ(mha.attention_weights().shape(), Shape({1, 2, 5, 5}));
  // A bias of +inf or NaN made its row's outputs NaN; -inf blocks a key.
  for (const float bad :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Tensor<float> bias({3, 3});
    bias(1, 2) = bad;
    EXPECT_TRUE(contains(error_of<ConfigError>([&] { AdditiveMask<float>{bias}; }),
                         "AdditiveMask: a bias must be finite or -inf (a blocked key), got "))
        << bad;
    EXPECT_TRUE(
        contains(error_of<ConfigError>([&] { AdditiveMask<float>{bias}; }), " at query 1, key 2"));
  }
  Tensor<float> blocked({3, 3});
  blocked(1, 2) = -std::numeric_limits<float>::infinity();
  EXPECT_NO_THROW(AdditiveMask<float>{blocked});
}

}  // namespace
}  // namespace attn
