// The body of the .mo fuzz target, shared by the libFuzzer entry point (fuzz_mo_catalog.cpp) and
// the replay test that runs the same inputs in the ordinary test suite.
#pragma once

#include <attn/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mo_catalog.hpp"

namespace attn::fuzz {

enum class Outcome { rejected, accepted };

/// Parses `data` as a .mo catalog. A clean attn::Error is the expected way to refuse bad bytes;
/// any other exception escapes (libFuzzer reports it as a crash) and so do sanitizer reports.
inline Outcome run_mo_catalog(const std::uint8_t* data, std::size_t size) {
  try {
    const translate::MoCatalog catalog =
        translate::parse_mo(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.mo");
    // Walk the result so that a string pointing outside the input would be read here, under ASan.
    std::size_t bytes = 0;
    for (const auto& e : catalog.entries) {
      bytes += e.context.size() + e.msgid.size() + e.msgid_plural.size();
      for (const auto& s : e.msgstr) bytes += s.size();
    }
    volatile std::size_t sink = bytes;
    (void)sink;
    return Outcome::accepted;
  } catch (const InternalError&) {
    throw;  // a broken invariant is a finding, not a refusal of the input
  } catch (const Error&) {
    return Outcome::rejected;
  }
}

}  // namespace attn::fuzz
