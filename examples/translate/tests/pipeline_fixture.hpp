// The Pipeline test suite of test_pipeline.cpp and test_pipeline_bad_input.cpp (one suite in two
// files of one executable, hence one fixture type for both), the one-update model directory their
// tests start from, and the comparisons of two trainers' weights and checkpoints (which
// test_bpe_dropout.cpp uses too).
#pragma once

#include <cstring>
#include <string>

#include <attn/train/safetensors.hpp>

#include "trainer.hpp"
#include "translate_fixture.hpp"

namespace attn::translate::testing {

using Pipeline = TempDirTest;

inline void expect_same_parameters(Transformer<float>& a, Transformer<float>& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t k = 0; k < pa.size(); ++k) {
    ASSERT_EQ(pa[k].name, pb[k].name);
    ASSERT_EQ(pa[k].value.numel(), pb[k].value.numel());
    for (Index i = 0; i < pa[k].value.numel(); ++i)
      ASSERT_EQ(pa[k].value.data()[i], pb[k].value.data()[i]) << pa[k].name << " element " << i;
  }
}

inline bool same_parameters(Transformer<float>& a, Transformer<float>& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t k = 0; k < pa.size(); ++k)
    if (pa[k].value.vector() != pb[k].value.vector()) return false;
  return true;
}

// Two checkpoint files hold the same tensors (weights, Adam moments, RNG state) bit for bit and
// the same metadata (configuration, training options, data position, loss curves).
inline void expect_same_checkpoint(const std::string& a, const std::string& b) {
  const auto fa = load_safetensors(a), fb = load_safetensors(b);
  EXPECT_EQ(fa.metadata(), fb.metadata());
  ASSERT_EQ(fa.names(), fb.names());
  for (const std::string& name : fa.names()) {
    const auto& ia = fa.info(name);
    const auto& ib = fb.info(name);
    ASSERT_EQ(ia.dtype, ib.dtype) << name;
    ASSERT_EQ(ia.shape, ib.shape) << name;
    ASSERT_EQ(ia.end - ia.begin, ib.end - ib.begin) << name;
    EXPECT_EQ(std::memcmp(fa.bytes(name), fb.bytes(name), ia.end - ia.begin), 0) << name;
  }
}

// Trains one update into `dir` and saves it: a model directory for the error-path tests.
inline void train_one_step(const tr::TrainOptions& o) {
  tr::Trainer t(o, split());
  t.train(1);
  t.save_checkpoint();
}

}  // namespace attn::translate::testing
