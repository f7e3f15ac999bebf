// Small text utilities the corpus readers and the vocabulary share: UTF-8 validation and code
// points, words, spaces, and the stable hash that orders the built-in corpus and fingerprints
// spm.model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <attn/utf8.hpp>

namespace attn::translate {

using attn::find_invalid_utf8;  // attn/utf8.hpp
inline bool is_valid_utf8(std::string_view text) {
  return find_invalid_utf8(text) == std::string_view::npos;
}

/// DataError "<where> line <line_no>: expected UTF-8 text, found an invalid byte sequence at byte
/// offset <b> of the line (byte 0x<hh>)" unless `line` is well-formed UTF-8: the one message of
/// every reader of text lines (files, stdin, the translator's input).
void check_utf8_line(std::string_view line, std::string_view where, std::size_t line_no);

/// What next_code_point returns for a byte that starts no sequence: 0x80..0xC1, or a lead byte
/// whose sequence `s` cuts short.
inline constexpr std::uint32_t kNotACodePoint = 0xFFFFFFFF;
/// Decodes the code point of the UTF-8 sequence at s[i] and advances i past it; a byte that starts
/// no sequence is passed over alone, as kNotACodePoint. Continuation bytes are not checked
/// (find_invalid_utf8 does that): the code point of ill-formed text is one of no meaning.
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
