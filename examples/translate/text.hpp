// Small text utilities the corpus readers and the vocabulary share: UTF-8 code points, words,
// spaces, and the stable hash that orders the built-in corpus and fingerprints spm.model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attn::translate {

/// Decodes the code point of valid UTF-8 at s[i] and advances i past it.
std::uint32_t next_code_point(std::string_view s, std::size_t& i);
/// Code points of `s`: its bytes that are not UTF-8 continuation bytes.
std::size_t count_code_points(std::string_view s);
/// Words of `s`: runs of characters other than the space (the corpora's length filters).
std::size_t count_words(std::string_view s);
/// Collapses runs of spaces (and U+00A0, U+202F) into one space and trims both ends.
std::string normalize_spaces(std::string_view text);

/// `v` in 17 significant digits, which read back give the same double (std::to_string keeps six
/// decimals: 0 and 1e-7 alike).
std::string round_trip_text(double v);

/// A 64-bit hash of `text`, fixed across platforms and runs: it orders the built-in corpus before
/// its split (builtin_corpus.hpp) and is the vocabulary's fingerprint (bpe.hpp), so its bits must
/// never change.
std::uint64_t stable_hash(std::string_view text);

}  // namespace attn::translate
