// A decoding step that runs out of memory part-way: the layers before the one that failed had
// appended the position to their caches, so the caches disagreed, and taking the step again was
// refused as a position out of order ("clear() it" was the only way on). Decoder::forward_step
// now puts every layer back where the step found it.
#include <gtest/gtest.h>

#include <vector>

#include <attn/attn.hpp>

#include "failing_new.hpp"

namespace {

using namespace attn;

std::vector<float> values(const Tensor<float>& t) {
  return std::vector<float>(t.data(), t.data() + t.numel());
}

Tensor<TokenId> ids(std::initializer_list<Index> shape, std::initializer_list<TokenId> values) {
  Tensor<TokenId> t{Shape(shape)};
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

TEST(DecodeStepFailure, AStepThatRunsOutOfMemoryPartWayCanBeTakenAgain) {
  if (!attn::testing::kFailingNew) GTEST_SKIP() << "the sanitizer owns operator new";
  Transformer<float> m(TransformerConfig::tiny(25));
  m.eval();
  const Tensor<float> memory = m.encode(ids({2, 5}, {4, 5, 6, 7, 8, 9, 10, 11, 0, 0})).clone();
  const Tensor<TokenId> bos = Tensor<TokenId>::full({2, 1}, 2), next = ids({2, 1}, {6, 7});
  std::vector<float> first, second;
  {
    DecoderCache<float> clean = m.make_decoder_cache(2, 4);
    first = values(m.decode_step(bos, 0, memory, clean));
    second = values(m.decode_step(next, 1, memory, clean));
  }
  // The first step allocates (the cross-attention caches, the layers' step buffers); the steps
  // after it allocate nothing (test_allocation.cpp).
  DecoderCache<float> cache = m.make_decoder_cache(2, 4);
  const long runs = attn::testing::for_each_failing_allocation(
      [&] { m.decode_step(bos, 0, memory, cache); },
      [&](long k) {
        SCOPED_TRACE(k);
        const Index length = cache.layers[0].self.length;
        for (const auto& layer : cache.layers) ASSERT_EQ(layer.self.length, length);
        if (length == 0) {  // the step failed: taken again, it gives the clean run's bits
          EXPECT_EQ(values(m.decode_step(bos, 0, memory, cache)), first);
        }
        EXPECT_EQ(values(m.decode_step(next, 1, memory, cache)), second);
        cache = m.make_decoder_cache(2, 4);
      });
  EXPECT_GT(runs, 0);  // some runs met a failure
}

}  // namespace
