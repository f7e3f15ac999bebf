// Strict numbers from untrusted text (attn/strict_number.hpp): exactly the text the writers
// produce is accepted, anything around or beyond it is refused; hex16 and parse_hex round-trip.
#include <attn/strict_number.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "error_helpers.hpp"
#include "pch.hpp"

namespace attn {
namespace {

TEST(StrictNumber, AcceptsExactlyTheWholeNumber) {
  EXPECT_EQ(parse_number<int>("42"), std::optional<int>(42));
  EXPECT_EQ(parse_number<int>("-7"), std::optional<int>(-7));
  EXPECT_EQ(parse_number<double>("0.25"), std::optional<double>(0.25));
  EXPECT_EQ(parse_number<bool>("true"), std::optional<bool>(true));
  EXPECT_EQ(parse_number<bool>("0"), std::optional<bool>(false));
  for (const char* junk : {"", " 1", "1 ", "+1", "12abc", "0x10", "1e999"})
    EXPECT_FALSE(parse_number<int>(junk).has_value()) << junk;
  EXPECT_FALSE(parse_number<unsigned>("-1").has_value());      // no wrap-around
  EXPECT_FALSE(parse_number<std::int8_t>("128").has_value());  // out of range
  EXPECT_FALSE(parse_number<double>("inf").has_value());       // not finite
  EXPECT_FALSE(parse_number<bool>("yes").has_value());
}

TEST(StrictNumber, OrThrowNamesTheKeyAndTheText) {
  const std::string what = testing::error_of<FormatError>(
      [] { parse_number_or_throw<int>("7x", "ckpt.safetensors", "metadata d_model"); });
  EXPECT_EQ(what,
            "ckpt.safetensors: metadata d_model = \"7x\" is not a decimal integer in the "
            "range of its type");
}

TEST(StrictNumber, Hex16IsSixteenLowercaseDigits) {
  EXPECT_EQ(hex16(0), "0000000000000000");
  EXPECT_EQ(hex16(0xABCDEFu), "0000000000abcdef");
  EXPECT_EQ(hex16(std::numeric_limits<std::uint64_t>::max()), "ffffffffffffffff");
}

TEST(StrictNumber, ParseHexRoundTripsAndRefusesAnythingElse) {
  for (std::uint64_t v : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(0x0123456789abcdef),
                          std::numeric_limits<std::uint64_t>::max()})
    EXPECT_EQ(parse_hex<std::uint64_t>(hex16(v)), std::optional<std::uint64_t>(v));
  EXPECT_EQ(parse_hex<std::uint64_t>("BEEF"), std::optional<std::uint64_t>(0xbeef));  // unpadded
  for (const char* junk : {"", "0x10", "-1", "+1", " 1", "1 ", "12g", "10000000000000000"})
    EXPECT_FALSE(parse_hex<std::uint64_t>(junk).has_value()) << junk;  // the last: 2^64
}

}  // namespace
}  // namespace attn
