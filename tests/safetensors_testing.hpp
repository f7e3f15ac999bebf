// Safetensors files as an attacker shapes them, for the tests of the readers (tests/ and
// examples/translate/tests/).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace attn {
namespace testing {

/// Declares one more tensor in the safetensors file `path`: `name`, U8 of `bytes` bytes, after
/// the others, its data a sparse hole (the file grows by `bytes` on disk but not in blocks).
inline void append_sparse_tensor(const std::string& path, const std::string& name,
                                 std::uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  const std::string file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  in.close();
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(file.substr(8, n));
  const std::string data = file.substr(8 + n);
  using Json = nlohmann::ordered_json;
  Json entry = Json::object();
  entry["dtype"] = "U8";
  entry["shape"] = Json::array({bytes});
  entry["data_offsets"] = Json::array({std::uint64_t{data.size()}, data.size() + bytes});
  header[name] = std::move(entry);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t length = text.size();
  std::string head(8, '\0');
  std::memcpy(head.data(), &length, 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << head << text << data;
  std::filesystem::resize_file(path, head.size() + text.size() + data.size() + bytes);
}

}  // namespace testing
}  // namespace attn
