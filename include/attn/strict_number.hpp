// Strict parsing of numbers from untrusted text (file metadata, file names, command lines).
//
// std::stoll and istream >> accept "12abc" as 12, " 12", "+12", and "-1" for an unsigned type
// (wrapping it), and std::stoll throws a bare "stoll" on junk. parse_number accepts exactly the
// text to_string / to_chars write: the whole string is the number, nothing before or after, in
// range for the type; booleans are "0"/"1" (as an ostream writes them) or "true"/"false";
// floating-point values must be finite. parse_hex is the same for hexadecimal digits, and hex16
// writes the form files keep 64-bit hashes in.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "attn/error.hpp"

namespace attn {

/// The value of `text` as a T, or nothing if `text` is not exactly such a value.
template <class T>
std::optional<T> parse_number(std::string_view text) {
  if constexpr (std::is_same_v<T, bool>) {
    if (text == "1" || text == "true") return true;
    if (text == "0" || text == "false") return false;
    return std::nullopt;
  } else {
    static_assert(std::is_arithmetic_v<T>, "parse_number needs an arithmetic type");
    if (text.empty()) return std::nullopt;
    T value{};
    const char* first = text.data();
    const char* last = text.data() + text.size();
    std::from_chars_result r{};
    if constexpr (std::is_floating_point_v<T>)
      r = std::from_chars(first, last, value, std::chars_format::general);
    else
      r = std::from_chars(first, last, value, 10);
    if (r.ec != std::errc() || r.ptr != last) return std::nullopt;
    if constexpr (std::is_floating_point_v<T>)
      if (!std::isfinite(value)) return std::nullopt;
    return value;
  }
}

/// The value of `text` as an unsigned T written in hexadecimal digits (0-9, a-f, A-F; no sign, no
/// "0x", nothing before or after), in range, or nothing.
template <class T>
std::optional<T> parse_hex(std::string_view text) {
  static_assert(std::is_unsigned_v<T>, "parse_hex needs an unsigned type");
  if (text.empty()) return std::nullopt;
  T value{};
  const char* last = text.data() + text.size();
  const std::from_chars_result r = std::from_chars(text.data(), last, value, 16);
  if (r.ec != std::errc() || r.ptr != last) return std::nullopt;
  return value;
}

/// `v` as 16 lowercase hexadecimal digits, zero-padded: how files and messages show 64-bit hashes.
inline std::string hex16(std::uint64_t v) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<std::size_t>(i)] = kDigits[v & 0xF];
  return out;
}

namespace detail {
template <class T>
const char* number_kind() {
  if constexpr (std::is_same_v<T, bool>)
    return "a boolean (0 or 1)";
  else if constexpr (std::is_floating_point_v<T>)
    return "a finite number";
  else if constexpr (std::is_unsigned_v<T>)
    return "a non-negative decimal integer";
  else
    return "a decimal integer";
}
}  // namespace detail

/// parse_number, or FormatError "<where>: <key> = "<text>" is not <kind> (in range)".
template <class T>
T parse_number_or_throw(std::string_view text, const std::string& where, const std::string& key) {
  const std::optional<T> v = parse_number<T>(text);
  ATTN_CHECK(v.has_value(), FormatError, where, ": ", key, " = \"", std::string(text), "\" is not ",
             detail::number_kind<T>(), std::is_same_v<T, bool> ? "" : " in the range of its type");
  return *v;
}

}  // namespace attn
