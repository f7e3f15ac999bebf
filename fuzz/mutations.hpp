// The deterministic mutations the replay tests (replay_test.cpp, replay_translate_test.cpp) make of
// each seed: truncations and byte flips at positions drawn from a fixed generator, so that every
// platform and every run replays the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace attn::fuzz {

/// Deterministic positions, the same on every platform (no std:: distributions).
struct Lcg {
  std::uint64_t state;
  std::size_t below(std::size_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33) % n;
  }
};

/// Every strict prefix shorter than `short_prefixes` bytes, then up to 31 more spread over the
/// rest (size * k / 32 for k = 1 ... 31), and the file less its last byte.
inline std::vector<std::size_t> truncation_lengths(std::size_t size, std::size_t short_prefixes) {
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n < size && n < short_prefixes; ++n) lengths.push_back(n);
  for (std::size_t k = 1; k < 32; ++k)
    if (size * k / 32 >= short_prefixes) lengths.push_back(size * k / 32);
  if (size > short_prefixes) lengths.push_back(size - 1);
  return lengths;
}

/// Copies of `seed` with the byte at each of `count` positions (drawn from Lcg{salt}) set to each
/// of `values` in turn; -1 stands for the byte inverted.
inline std::vector<std::string> byte_flips(const std::string& seed, std::uint64_t salt, int count,
                                           std::initializer_list<int> values) {
  std::vector<std::string> out;
  if (seed.empty()) return out;
  Lcg rng{salt};
  for (int i = 0; i < count; ++i) {
    const std::size_t at = rng.below(seed.size());
    for (int v : values) {
      std::string m = seed;
      m[at] = static_cast<char>(v < 0 ? ~m[at] : v);
      out.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace attn::fuzz
