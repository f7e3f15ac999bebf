// The safetensors writer's text: tensor names and metadata go into a JSON header, which must be
// UTF-8. A name or a metadata string that is not escaped as nlohmann's type_error from dump(),
// which is no attn::Error; the writer now refuses it first, naming the string and the byte.
#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>

#include <string>

#include "error_helpers.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::error_of;

class SafetensorsText : public testing::TempDirTest {};

TEST(Utf8, ValidityFollowsUnicodesTable) {
  const auto npos = std::string::npos;
  // ASCII, 2-, 3- and 4-byte characters at the ends of their ranges: U+0080, U+07FF, U+0800,
  // U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF.
  EXPECT_EQ(find_invalid_utf8(""), npos);
  EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF"), npos);
  EXPECT_EQ(find_invalid_utf8("\xEE\x80\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"), npos);
  EXPECT_EQ(find_invalid_utf8("w\xFF"), 1u);             // never in UTF-8
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);            // a continuation byte alone
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xE0\x9F\xBF"), 0u);      // overlong U+07FF
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);      // the surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // U+110000
  EXPECT_EQ(find_invalid_utf8("\xF0\x80\x80\x80"), 0u);  // overlong NUL
  EXPECT_EQ(find_invalid_utf8("x\xE2\x82"), 1u);         // ends inside a character
  EXPECT_EQ(find_invalid_utf8("\xE2\x28\xA1"), 0u);      // a character cut short
}

TEST_F(SafetensorsText, NamesAndMetadataThatAreNotUtf8AreConfigErrors) {
  const Tensor<float> t({2});
  const std::string file = path("x.safetensors");
  EXPECT_EQ(error_of<ConfigError>([&] { save_safetensors(file, {tensor_entry("w\xFF", t)}); }),
            "save_safetensors: tensor name \"w\\xFF\" is not valid UTF-8, which the JSON header "
            "must be: byte 1 (\\xFF) begins no well-formed character");
  EXPECT_EQ(error_of<ConfigError>([&] {
              save_safetensors(file, {tensor_entry("w", t)}, {{"\xFF\xFE", "bad key"}});
            }),
            "save_safetensors: metadata key \"\\xFF\\xFE\" is not valid UTF-8, which the JSON "
            "header must be: byte 0 (\\xFF) begins no well-formed character");
  // save_model passes its metadata through: a value cut inside a character.
  const std::vector<NamedParameter<float>> params{{"w", t, t}};
  EXPECT_EQ(error_of<ConfigError>([&] {
              save_model(file, params, {{"note", "caf\xC3"}});
            }),
            "save_safetensors: the value of metadata key \"note\" is not valid UTF-8, which the "
            "JSON header must be: byte 3 (\\xC3) begins no well-formed character");
  EXPECT_TRUE(list().empty());  // refused before anything was written
  // Text that is UTF-8 goes through, whatever its characters.
  save_safetensors(file, {tensor_entry("caf\xC3\xA9", t)}, {{"\xE2\x82\xAC", "\xF0\x9F\x98\x80"}});
  const SafetensorsFile f = load_safetensors(file);
  EXPECT_EQ(f.info("caf\xC3\xA9").shape, std::vector<Index>{2});
  EXPECT_EQ(f.metadata().at("\xE2\x82\xAC"), "\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace attn
