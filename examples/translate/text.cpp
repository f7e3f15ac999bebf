#include "text.hpp"

#include <algorithm>
#include <ios>
#include <sstream>

#include <attn/error.hpp>
#include <attn/random.hpp>

namespace attn::translate {

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
