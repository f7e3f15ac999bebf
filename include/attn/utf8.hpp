// UTF-8 validation, shared by the readers of text (the translation example's corpora and inputs)
// and by what must be text (safetensors header strings, which JSON requires to be UTF-8).
#pragma once

#include <cstddef>
#include <string_view>

namespace attn {

/// Byte offset of the first ill-formed UTF-8 sequence in `text`, or std::string_view::npos if the
/// text is well formed. Rejects, as RFC 3629 and Unicode's Table 3-7 do: stray continuation bytes,
/// truncated sequences, overlong encodings, UTF-16 surrogates (U+D800..U+DFFF) and code points
/// above U+10FFFF. One pass, linear in the text.
inline std::size_t find_invalid_utf8(std::string_view text) {
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

}  // namespace attn
