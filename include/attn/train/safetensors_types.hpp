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

}  // namespace attn
