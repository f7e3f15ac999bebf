// The vocabulary of the safetensors format shared by its reader and writer: element types, where a
// tensor lives in a file, and shape printing. See safetensors.hpp for the file layout.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

/// Element types of the safetensors format.
enum class Dtype {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64
};

namespace detail {
struct DtypeInfo {
  Dtype dtype;
  const char* name;
  std::size_t size;
};
inline const std::vector<DtypeInfo>& dtype_table() {
  static const std::vector<DtypeInfo> table = {
      {Dtype::BOOL, "BOOL", 1},       {Dtype::U8, "U8", 1},           {Dtype::I8, "I8", 1},
      {Dtype::F8_E5M2, "F8_E5M2", 1}, {Dtype::F8_E4M3, "F8_E4M3", 1}, {Dtype::I16, "I16", 2},
      {Dtype::U16, "U16", 2},         {Dtype::F16, "F16", 2},         {Dtype::BF16, "BF16", 2},
      {Dtype::I32, "I32", 4},         {Dtype::U32, "U32", 4},         {Dtype::F32, "F32", 4},
      {Dtype::F64, "F64", 8},         {Dtype::I64, "I64", 8},         {Dtype::U64, "U64", 8}};
  return table;
}
}  // namespace detail

inline const char* dtype_name(Dtype d) {
  for (const auto& e : detail::dtype_table())
    if (e.dtype == d) return e.name;
  return "?";
}
inline std::size_t dtype_size(Dtype d) {
  for (const auto& e : detail::dtype_table())
    if (e.dtype == d) return e.size;
  return 0;
}
inline std::ostream& operator<<(std::ostream& os, Dtype d) { return os << dtype_name(d); }

/// The safetensors dtype of a C++ scalar: float F32, double F64, int32 I32, int64 I64, uint8 U8.
template <class T>
constexpr Dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return Dtype::F32;
  else if constexpr (std::is_same_v<T, double>)
    return Dtype::F64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return Dtype::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return Dtype::I64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return Dtype::U8;
  else
    static_assert(sizeof(T) == 0, "no safetensors dtype for this scalar type");
}

/// Where a tensor lives in a loaded file.
struct TensorInfo {
  Dtype dtype;
  std::vector<Index> shape;
  std::size_t begin, end;  // byte offsets in the data buffer
};

inline std::string shape_str(const std::vector<Index>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace detail {

/// The index of the first byte of `s` that is not part of well-formed UTF-8 (Unicode's Table 3-7:
/// no overlong forms, no surrogates, nothing past U+10FFFF), or std::string::npos when all of it
/// is. One pass: the header is JSON text, which must be UTF-8, and nlohmann's dump() refuses
/// anything else with an exception that is not an attn::Error.
inline std::size_t utf8_invalid_at(const std::string& s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = byte(i);
    std::size_t n = 0;                   // continuation bytes
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;  // overlong below U+0800
      if (c == 0xED) hi = 0x9F;  // surrogates U+D800..U+DFFF
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;  // overlong below U+10000
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return i + k;
      const unsigned char b = byte(i + k);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i + k;
    }
    i += n + 1;
  }
  return std::string::npos;
}

/// `s` with every byte outside printable ASCII written as \xHH, for messages about bytes that are
/// not text.
inline std::string escaped_bytes(const std::string& s) {
  static const char* const kHex = "0123456789ABCDEF";
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

/// ConfigError unless `text`, a string save_safetensors puts in the header, is valid UTF-8
/// (utf8_invalid_at), naming the `kind` and `name` of the string (escaped_bytes) and the first
/// byte that is not.
inline void check_header_text(const std::string& text, const char* kind, const std::string& name) {
  const std::size_t at = utf8_invalid_at(text);
  if (at == std::string::npos) return;
  const std::string where = at < text.size()
                                ? "byte " + std::to_string(at) + " (" +
                                      escaped_bytes(text.substr(at, 1)) + ") breaks the encoding"
                                : std::string("it ends inside a character");
  ATTN_CHECK(false, ConfigError, "save_safetensors: ", kind, " \"", escaped_bytes(name),
             "\" is not valid UTF-8, which the JSON header must be: ", where);
}

}  // namespace detail
}  // namespace attn
