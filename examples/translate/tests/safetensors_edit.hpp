// Tampering with a safetensors file as a careful attacker would (or a bit flip that a checksum
// would not catch): the file stays well-formed, its metadata or tensor bytes changed.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <attn/train/safetensors.hpp>

namespace attn::translate::testing {

/// Rewrites the safetensors file `path` with `edit` applied to its metadata and `poison` to the
/// raw bytes of each tensor (given its name).
inline void rewrite(
    const std::string& path, const std::function<void(std::map<std::string, std::string>&)>& edit,
    const std::function<void(const std::string&, std::vector<unsigned char>&)>& poison = nullptr) {
  const SafetensorsFile f = load_safetensors(path);
  std::vector<TensorEntry> entries;
  for (const auto& name : f.names()) {
    const TensorInfo& ti = f.info(name);
    std::vector<unsigned char> bytes(f.bytes(name), f.bytes(name) + (ti.end - ti.begin));
    if (poison) poison(name, bytes);
    entries.push_back(bytes_entry(name, ti.dtype, ti.shape, std::move(bytes)));
  }
  auto meta = f.metadata();
  edit(meta);
  save_safetensors(path, entries, meta);
}

}  // namespace attn::translate::testing
