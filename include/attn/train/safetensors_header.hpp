// The JSON header of a safetensors file, read in one linear pass.
//
// The header is untrusted input of up to kMaxSafetensorsHeader bytes. Building a DOM and walking
// it is not linear: nlohmann's callback parser rescans the parent container on every end of an
// object, so a header like {"a":[{},{},...]} took time quadratic in its length (a 4 MB one ran for
// minutes). This reader is a SAX handler instead: it sees every token once, keeps only what a
// safetensors header may hold (string metadata; per tensor a dtype, a shape and two offsets),
// and refuses anything else as it arrives, so time and memory are linear in the header size.
// Unknown fields of a tensor entry are skipped (the format allows them), nesting at most
// kMaxSafetensorsJsonDepth deep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "attn/error.hpp"

namespace attn::detail {

/// Headers longer than this are refused as corrupt. The reference reader allows 100 MB; 16 MB
/// holds ~150,000 tensor entries, far more than a model has, and parses in a fraction of a second.
inline constexpr std::uint64_t kMaxSafetensorsHeader = 16'000'000;

/// At most this many tensors plus metadata keys in one header.
inline constexpr std::size_t kMaxSafetensorsEntries = 200'000;

/// A valid header nests 3 levels; unknown fields may nest deeper, up to this.
inline constexpr int kMaxSafetensorsJsonDepth = 64;

/// One tensor entry of the header as written, before its values are checked against the file.
struct RawTensorEntry {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> data_offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

/// What a header holds: tensor entries in file order and the __metadata__ strings.
struct SafetensorsHeader {
  std::vector<RawTensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

/// The SAX handler behind parse_safetensors_header; throws FormatError naming `path`.
class SafetensorsHeaderReader {
 public:
  using json = nlohmann::json;
  explicit SafetensorsHeaderReader(const std::string& path) : path_(path) {}
  SafetensorsHeader header;

  bool null() { return scalar("null"); }
  bool boolean(bool b) { return scalar(b ? "true" : "false"); }
  bool number_integer(json::number_integer_t v) { return scalar(std::to_string(v)); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (skip_ == 0 && in_ == In::shape) {
      header.tensors.back().shape.push_back(v);
      return true;
    }
    if (skip_ == 0 && in_ == In::offsets) {
      auto& offsets = header.tensors.back().data_offsets;
      if (offsets.size() >= 2) bad_offsets();
      offsets.push_back(v);
      return true;
    }
    return scalar(std::to_string(v));
  }
  bool number_float(json::number_float_t, const std::string& text) { return scalar(text); }
  bool string(std::string& s) {
    if (skip_ == 0 && in_ == In::metadata) {
      header.metadata[key_] = std::move(s);
      return true;
    }
    if (skip_ == 0 && in_ == In::tensor && key_ == "dtype") {
      header.tensors.back().dtype = std::move(s);
      header.tensors.back().has_dtype = true;
      return true;
    }
    return scalar(json(s).dump());
  }
  bool binary(json::binary_t&) { return scalar("binary"); }

  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    if (skip_ > 0) return true;
    if (depth_ == 1) {
      ATTN_CHECK(++entries_ <= kMaxSafetensorsEntries, FormatError, path_,
                 ": header has more than ", kMaxSafetensorsEntries, " entries");
      ATTN_CHECK(names_.insert(k).second, FormatError, path_, ": tensor name '", k,
                 "' appears twice in the header");
    } else if (in_ == In::metadata) {
      ATTN_CHECK(++entries_ <= kMaxSafetensorsEntries, FormatError, path_,
                 ": header has more than ", kMaxSafetensorsEntries, " entries");
      ATTN_CHECK(!header.metadata.count(k), FormatError, path_, ": __metadata__ key '", k,
                 "' appears twice");
    } else if (in_ == In::tensor) {
      ATTN_CHECK(fields_.insert(k).second, FormatError, path_, ": tensor ", tensor_name(),
                 ": field \"", k, "\" appears twice");
    }
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw FormatError(concat(path_, ": header is not valid JSON: ", e.what()));
  }

 private:
  enum class In { top, metadata, tensor, shape, offsets };

  const std::string& tensor_name() const { return header.tensors.back().name; }
  bool known_field() const { return key_ == "dtype" || key_ == "shape" || key_ == "data_offsets"; }

  // A scalar where a container or another kind of value belongs is refused where it appears.
  bool scalar(const std::string& text) {
    if (skip_ > 0) return true;
    if (depth_ == 1) wrong_entry();
    if (in_ == In::metadata)
      throw FormatError(concat(path_, ": __metadata__ value of '", key_, "' is not a string"));
    if (in_ == In::shape)
      throw FormatError(concat(path_, ": tensor ", tensor_name(),
                               ": shape entries must be non-negative integers, got ", text));
    if (in_ == In::offsets) bad_offsets();
    if (in_ == In::tensor && known_field()) field_type_error();
    return true;  // an unknown field's value
  }

  bool open(bool object) {
    ATTN_CHECK(depth_ < kMaxSafetensorsJsonDepth, FormatError, path_,
               ": header nests JSON more than ", kMaxSafetensorsJsonDepth,
               " levels deep (a safetensors header nests 3)");
    ++depth_;
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (depth_ == 1) return true;  // the header object itself (the caller checked the '{')
    if (depth_ == 2) {
      if (!object) wrong_entry();
      in_ = key_ == "__metadata__" ? In::metadata : In::tensor;
      if (in_ == In::tensor) {
        header.tensors.push_back({});
        header.tensors.back().name = key_;
        fields_.clear();
      }
      return true;
    }
    if (in_ == In::tensor && !object && key_ == "shape") {
      in_ = In::shape;
      header.tensors.back().has_shape = true;
      return true;
    }
    if (in_ == In::tensor && !object && key_ == "data_offsets") {
      in_ = In::offsets;
      header.tensors.back().has_offsets = true;
      return true;
    }
    if (in_ == In::tensor && !known_field()) {
      skip_ = 1;  // an unknown field holding a container
      return true;
    }
    return scalar(object ? "an object" : "an array");
  }

  bool close() {
    --depth_;
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    if (in_ == In::shape || in_ == In::offsets) {
      if (in_ == In::offsets && header.tensors.back().data_offsets.size() != 2) bad_offsets();
      in_ = In::tensor;
      return true;
    }
    if (depth_ == 1) in_ = In::top;
    return true;
  }

  [[noreturn]] void wrong_entry() {
    if (key_ == "__metadata__")
      throw FormatError(concat(path_, ": __metadata__ must be an object of strings"));
    throw FormatError(concat(path_, ": tensor ", key_, ": entry is not an object"));
  }
  [[noreturn]] void bad_offsets() {
    throw FormatError(concat(path_, ": tensor ", tensor_name(),
                             ": \"data_offsets\" must be an array of two non-negative integers"));
  }
  [[noreturn]] void field_type_error() {
    if (key_ == "dtype")
      throw FormatError(concat(path_, ": tensor ", tensor_name(), ": non-string \"dtype\""));
    if (key_ == "shape")
      throw FormatError(concat(path_, ": tensor ", tensor_name(), ": non-array \"shape\""));
    bad_offsets();
  }

  const std::string& path_;
  std::string key_;                         // the last key read at the current level
  std::unordered_set<std::string> names_;   // top-level keys seen
  std::unordered_set<std::string> fields_;  // keys of the current tensor entry
  std::size_t entries_ = 0;
  int depth_ = 0;  // open containers
  int skip_ = 0;   // > 0 while inside an unknown field's container: its nesting depth
  In in_ = In::top;
};

/// Reads the header JSON [first, last) of the file `path`: linear time, FormatError if it is not a
/// JSON object of string metadata and tensor entries. Missing fields are reported per entry.
inline SafetensorsHeader parse_safetensors_header(const unsigned char* first,
                                                  const unsigned char* last,
                                                  const std::string& path) {
  // nlohmann's lexer takes a NUL byte for the end of its input: the bytes after one went unread.
  const void* nul = std::memchr(first, 0, static_cast<std::size_t>(last - first));
  ATTN_CHECK(nul == nullptr, FormatError, path, ": header holds a NUL byte at offset ",
             static_cast<const unsigned char*>(nul) - first, " (JSON text has none)");
  SafetensorsHeaderReader reader(path);
  nlohmann::json::sax_parse(first, last, &reader);
  for (const RawTensorEntry& t : reader.header.tensors) {
    ATTN_CHECK(t.has_dtype, FormatError, path, ": tensor ", t.name,
               ": missing or non-string \"dtype\"");
    ATTN_CHECK(t.has_shape, FormatError, path, ": tensor ", t.name,
               ": missing or non-array \"shape\"");
    ATTN_CHECK(t.has_offsets, FormatError, path, ": tensor ", t.name,
               ": \"data_offsets\" must be an array of two non-negative integers");
  }
  return std::move(reader.header);
}

}  // namespace attn::detail
