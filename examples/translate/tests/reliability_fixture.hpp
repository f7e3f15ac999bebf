// The Reliability test suite of test_reliability.cpp and test_reliability_interrupts.cpp (one
// suite in two files of one executable, hence one fixture type for both): a model trained once for
// the suite, with checkpoints at steps 2 and 4, and the CLI's one-line errors.
#pragma once

#include <string>
#include <vector>

#include "translate_fixture.hpp"

namespace attn::translate::testing {

class Reliability : public TrainedModelTest {
 protected:
  static void SetUpTestSuite() { train_suite_model("attn_reliability", 4, 2); }
  void expect_error(const CliResult& r, const std::vector<std::string>& expected) {
    expect_cli_error(r, expected);
  }
};

}  // namespace attn::translate::testing
