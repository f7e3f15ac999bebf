// Helpers for testing error paths: the message an attn::Error carried, and substring checks.
#pragma once

#include <gtest/gtest.h>

#include <attn/error.hpp>
#include <exception>
#include <string>

namespace attn::testing {

/// The what() of the attn::Error that `fn` throws, or "(no exception)".
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

/// The what() of the E that `fn` throws; a test failure when it throws nothing or another type.
template <class E, class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace attn::testing
