// The vocabulary of the safetensors format shared by its reader and writer: element types, where a
// tensor lives in a file, and shape printing. See safetensors.hpp for the file layout.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/tensor.hpp"
#include "attn/utf8.hpp"

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
/// (find_invalid_utf8, in one pass: the header is JSON text, which must be UTF-8, and nlohmann's
/// dump() refuses anything else with an exception that is not an attn::Error), naming the `kind`
/// and `name` of the string (escaped_bytes) and the byte where the ill-formed sequence begins.
inline void check_header_text(const std::string& text, const char* kind, const std::string& name) {
  const std::size_t at = find_invalid_utf8(text);
  if (at == std::string::npos) return;
  const std::string where = "byte " + std::to_string(at) + " (" +
                            escaped_bytes(text.substr(at, 1)) + ") begins no well-formed character";
  ATTN_CHECK(false, ConfigError, "save_safetensors: ", kind, " \"", escaped_bytes(name),
             "\" is not valid UTF-8, which the JSON header must be: ", where);
}

}  // namespace detail
}  // namespace attn
