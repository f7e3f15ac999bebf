// Valid inputs for the fuzz targets, built in-process: .mo catalogs laid out as GNU msgfmt does,
// and safetensors files written by attn's own writer. The seed generator (make_seeds.cpp) writes
// them as the starting corpus, and the replay test mutates them.
#pragma once

#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "safetensors_target.hpp"

namespace attn::fuzz {

/// A named seed: file name (without directory) and content.
using Seed = std::pair<std::string, std::string>;

/// One message of a .mo catalog: the original ("ctx\x04id", "id\0plural") and its translation
/// (plural forms separated by NUL).
struct MoMessage {
  std::string original, translation;
};

/// The bytes of a .mo file holding `messages` in the given order: header, original table,
/// translation table, a zeroed hash table of `hash_size` entries, then the strings, each followed
/// by its NUL.
inline std::string build_mo(const std::vector<MoMessage>& messages, bool big_endian,
                            std::uint32_t revision = 0, std::uint32_t hash_size = 0) {
  std::string out;
  auto put = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      const int shift = big_endian ? 24 - 8 * i : 8 * i;
      out.push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  const auto n = static_cast<std::uint32_t>(messages.size());
  const std::uint32_t originals = 28, translations = originals + 8 * n;
  const std::uint32_t hash_offset = translations + 8 * n;
  std::uint32_t next = hash_offset + 4 * hash_size;  // where the first string goes
  put(0x950412de);
  put(revision);
  put(n);
  put(originals);
  put(translations);
  put(hash_size);
  put(hash_offset);
  std::string strings;
  auto table = [&](bool translated) {
    for (const auto& m : messages) {
      const std::string& s = translated ? m.translation : m.original;
      put(static_cast<std::uint32_t>(s.size()));
      put(next);
      strings += s;
      strings.push_back('\0');
      next += static_cast<std::uint32_t>(s.size()) + 1;
    }
  };
  table(false);
  table(true);
  out.append(4 * static_cast<std::size_t>(hash_size), '\0');
  return out + strings;
}

inline std::vector<Seed> mo_seeds() {
  using namespace std::string_literals;
  const MoMessage header{"",
                         "Project-Id-Version: attn\nContent-Type: text/plain; charset=UTF-8\n"
                         "Plural-Forms: nplurals=2; plural=(n != 1);\n"};
  const std::vector<MoMessage> messages = {
      header,
      {"File"s, "Datei"s},
      {"menu\x04Open"s,
       "\xc3\x96"
       "ffnen"s},
      {"%d file\0%d files"s, "%d Datei\0%d Dateien"s},
      {"verb\x04Save %d item\0Save %d items"s, "%d Element speichern\0%d Elemente speichern"s},
      {"empty translation"s, ""s},
  };
  return {{"empty.mo", build_mo({}, false)},
          {"header_only.mo", build_mo({header}, false)},
          {"messages_le.mo", build_mo(messages, false)},
          {"messages_be.mo", build_mo(messages, true)}};
}

/// The content of the safetensors file save_safetensors writes for `tensors` and `metadata`
/// (through a temporary file in `dir`: the writer only writes files).
inline std::string written_safetensors(const std::string& dir,
                                       const std::vector<TensorEntry>& tensors,
                                       const std::map<std::string, std::string>& metadata = {}) {
  const std::string path = dir + "/seed.safetensors";
  save_safetensors(path, tensors, metadata);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  return bytes;
}

/// Seeds of the safetensors target; `dir` must be writable. The model and training checkpoints
/// fit fuzz_parameters(), so their mutations reach the checkpoint loaders' checks too.
inline std::vector<Seed> safetensors_seeds(const std::string& dir) {
  std::vector<Seed> seeds;
  seeds.emplace_back("empty.safetensors", written_safetensors(dir, {}));

  const auto params = fuzz_parameters();
  std::vector<TensorEntry> model;
  for (const auto& p : params) model.push_back(tensor_entry(p.name, p.value));
  seeds.emplace_back("model.safetensors",
                     written_safetensors(dir, model, {{"config", R"({"d_model":3})"}}));

  Adam<float> adam(params);
  RandomState rng{1234, 56};
  const std::string path = dir + "/seed.safetensors";
  save_training_checkpoint(path, params, adam, rng, {{"note", "fuzz seed"}},
                           {tensor_entry("ema", Tensor<double>(Shape{2}))});
  std::ifstream in(path, std::ios::binary);
  seeds.emplace_back("training.safetensors", std::string((std::istreambuf_iterator<char>(in)),
                                                         std::istreambuf_iterator<char>()));
  std::remove(path.c_str());

  // Every dtype once, a scalar, an empty tensor and a rank-7 one (more than attn's Shape holds).
  std::vector<TensorEntry> dtypes;
  for (const auto& d : detail::dtype_table())
    dtypes.push_back(bytes_entry(dtype_name(d.dtype), d.dtype, {2},
                                 std::vector<unsigned char>(2 * d.size, 0x5a)));
  dtypes.push_back(bytes_entry("scalar", Dtype::F64, {}, std::vector<unsigned char>(8, 0x3f)));
  dtypes.push_back(bytes_entry("empty", Dtype::F32, {3, 0, 2}, {}));
  dtypes.push_back(bytes_entry("rank7", Dtype::U8, {1, 1, 1, 1, 1, 1, 2}, {7, 9}));
  seeds.emplace_back("dtypes.safetensors", written_safetensors(dir, dtypes, {{"k", "v"}}));
  return seeds;
}

}  // namespace attn::fuzz
