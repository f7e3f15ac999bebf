#include "text.hpp"

#include <algorithm>
#include <ios>
#include <sstream>

#include <attn/error.hpp>
#include <attn/random.hpp>

namespace attn::translate {

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The allowed range of the second byte encodes the overlong, surrogate and > U+10FFFF rules
    // (Unicode 15, Table 3-7 "Well-Formed UTF-8 Byte Sequences").
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong below U+0800
      if (c == 0xED) hi = 0x9F;  // surrogates U+D800..U+DFFF
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong below U+10000
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // continuation byte without a lead, C0/C1 overlong leads, F5..FF
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

void check_utf8_line(std::string_view line, std::string_view where, std::size_t line_no) {
  const std::size_t bad = find_invalid_utf8(line);
  ATTN_CHECK(bad == std::string_view::npos, DataError, where, " line ", line_no,
             ": expected UTF-8 text, found an invalid byte sequence at byte offset ", bad,
             " of the line (byte 0x", std::hex,
             static_cast<unsigned>(static_cast<unsigned char>(line[bad])), ")");
}

std::uint32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (c >= 0x80 && (c < 0xC2 || i + len > s.size())) {
    ++i;
    return kNotACodePoint;
  }
  std::uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (std::size_t k = 1; k < len; ++k)
    cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

std::size_t count_code_points(std::string_view s) {
  return static_cast<std::size_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::size_t count_words(std::string_view s) {
  std::size_t words = 0;
  bool in_word = false;
  for (char c : s) {
    if (c == ' ') {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++words;
    }
  }
  return words;
}

std::string normalize_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t start = i;
    const std::uint32_t cp = next_code_point(text, i);
    if (cp == ' ' || cp == 0xA0 || cp == 0x202F) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out.append(text.substr(start, i - start));
  }
  return out;
}

std::uint64_t stable_hash(std::string_view text) {
  // FNV-1a alone orders similar strings together
  return mix64(fnv1a(kFnv1aOffset, text.data(), text.size()));
}

std::string round_trip_text(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

}  // namespace attn::translate
