// A minimal .mo writer for tests, independent of the parser (mo_catalog.cpp): header, original
// table, translation table, no hash table, then the strings, each followed by a NUL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::translate::testing {

struct RawEntry {
  std::string original, translation;
};

inline void put32(std::string& out, std::size_t at, std::uint32_t v, bool big) {
  for (int k = 0; k < 4; ++k) {
    const int shift = big ? 24 - 8 * k : 8 * k;
    out[at + static_cast<std::size_t>(k)] = static_cast<char>((v >> shift) & 0xFF);
  }
}

inline std::string make_mo(const std::vector<RawEntry>& entries, bool big_endian = false,
                           std::uint32_t revision = 0) {
  const std::size_t n = entries.size();
  const std::size_t originals = 28, translations = 28 + 8 * n;
  std::string out(28 + 16 * n, '\0');
  put32(out, 0, 0x950412de, big_endian);
  put32(out, 4, revision, big_endian);
  put32(out, 8, static_cast<std::uint32_t>(n), big_endian);
  put32(out, 12, static_cast<std::uint32_t>(originals), big_endian);
  put32(out, 16, static_cast<std::uint32_t>(translations), big_endian);
  put32(out, 20, 0, big_endian);
  put32(out, 24, static_cast<std::uint32_t>(out.size()), big_endian);
  auto add = [&](std::size_t table, std::size_t i, const std::string& s) {
    put32(out, table + 8 * i, static_cast<std::uint32_t>(s.size()), big_endian);
    put32(out, table + 8 * i + 4, static_cast<std::uint32_t>(out.size()), big_endian);
    out += s;
    out += '\0';
  };
  for (std::size_t i = 0; i < n; ++i) add(originals, i, entries[i].original);
  for (std::size_t i = 0; i < n; ++i) add(translations, i, entries[i].translation);
  return out;
}

}  // namespace attn::translate::testing
