// What test_training.cpp and test_training_recovery.cpp share beyond the task of
// training_task.hpp: its vocabulary size, the timer of their summary lines, and the bitwise
// comparison of parameter values.
#pragma once

#include <gtest/gtest.h>
#include <attn/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace attn {
namespace testing {

constexpr Index kVocab = 20;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The names of the parameters whose bits differ between two snapshots (empty when identical).
template <class T>
std::vector<std::string> differing(const std::vector<std::pair<std::string, std::vector<T>>>& a,
                                   const std::vector<std::pair<std::string, std::vector<T>>>& b) {
  std::vector<std::string> out;
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    if (a[i].second.size() != b[i].second.size() ||
        std::memcmp(a[i].second.data(), b[i].second.data(), a[i].second.size() * sizeof(T)) != 0)
      out.push_back(a[i].first);
  }
  return out;
}

}  // namespace testing
}  // namespace attn
