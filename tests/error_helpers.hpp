// Helpers for testing error paths: the message an attn::Error carried, and substring checks.
#pragma once

#include <attn/error.hpp>
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

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace attn::testing
