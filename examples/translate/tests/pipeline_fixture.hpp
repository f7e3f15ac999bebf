// The Pipeline test suite of test_pipeline.cpp and test_pipeline_bad_input.cpp (one suite in two
// files of one executable, hence one fixture type for both), and the one-update model directory
// their tests start from.
#pragma once

#include "trainer.hpp"
#include "translate_fixture.hpp"

namespace attn::translate::testing {

using Pipeline = TempDirTest;

// Trains one update into `dir` and saves it: a model directory for the error-path tests.
inline void train_one_step(const tr::TrainOptions& o) {
  tr::Trainer t(o, split());
  t.train(1);
  t.save_checkpoint();
}

}  // namespace attn::translate::testing
