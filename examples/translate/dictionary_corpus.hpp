// German-English pairs from the Ding dictionary of Debian's trans-de-en package,
// /usr/share/trans/de-en, read at run time.
//
// One entry per line, '#' starts a comment line:
//   German :: English
// Each side holds sub-entries separated by " | " that align one to one (the i-th German
// sub-entry translates the i-th English one): a headword, its inflections, then example
// sentences. Within a sub-entry, synonyms are separated by ';'; the first synonym of each side is
// kept. Annotations are removed: {m} {f} {pl} {vt} (grammar), [Br.] [techn.] (usage), <...>
// (spelling variants, keywords), /ABBR/ (abbreviations) and (...) (glosses and optional words).
//
// Every pair gets a kind, since they teach very different things: a trial on all 390,000
// pairs (mostly single words and "to do sth." patterns) learnt to print "etw." for every input.
//   kSentence: the English side has at least 3 words, starts with an upper-case letter or digit
//              and ends with '.', '!' or '?'.
//   kPattern:  a placeholder (sth., sb., etw., jdn., ...), an ellipsis or " / " alternatives.
//   kPhrase:   at least 2 words on each side.
//   kWord:     the rest.
// Malformed lines (not exactly one " :: ", unbalanced brackets, invalid UTF-8) and misaligned
// ones (different sub-entry counts) are skipped and counted, never fatal.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace attn::translate {

enum class DictKind { kWord, kPhrase, kSentence, kPattern, kCount };
const char* dict_kind_name(DictKind kind);

struct DictPair {
  std::string en, de;
  DictKind kind = DictKind::kWord;
};

struct DictionaryStats {
  std::size_t lines = 0;         ///< non-empty, non-comment lines
  std::size_t malformed = 0;     ///< lines skipped: no or several " :: ", unbalanced brackets
  std::size_t invalid_utf8 = 0;  ///< lines skipped: not UTF-8
  std::size_t misaligned = 0;    ///< lines skipped: sub-entry counts differ
  std::size_t empty = 0;         ///< sub-entries empty after removing annotations
  std::array<std::size_t, static_cast<std::size_t>(DictKind::kCount)> by_kind{};
};

/// Removes {..}, [..], <..>, (..) and /ABBR/, collapses spaces and trims. Returns false (and
/// leaves `out` unspecified) when a bracket is not closed or closes without opening.
bool strip_dictionary_annotations(std::string_view text, std::string& out);

/// The kind of an (English, German) pair, as above.
DictKind classify_dictionary_pair(std::string_view en, std::string_view de);

/// Parses dictionary text; malformed lines are counted in `stats` and skipped.
std::vector<DictPair> parse_dictionary(std::string_view text, DictionaryStats* stats = nullptr);

/// The largest dictionary file load_dictionary reads: 64 MiB. /usr/share/trans/de-en of Debian
/// 12's trans-de-en 1.9 holds 25,611,714 bytes; the cap leaves two and a half times that for later
/// releases, and it bounds what a device or a huge file named by --dictionary costs: its pairs
/// take up to about 72 bytes (two strings) for every 8 bytes of text ("a | " on each side).
inline constexpr std::size_t kMaxDictionaryBytes = std::size_t{64} << 20;

/// Reads and parses `path` (default /usr/share/trans/de-en). Throws IOError naming the file and
/// the package (trans-de-en) unless it is a regular file of at most kMaxDictionaryBytes bytes (a
/// directory, a FIFO or a device is refused before a byte is read, and a FIFO does not block).
std::vector<DictPair> load_dictionary(const std::string& path = "/usr/share/trans/de-en",
                                      DictionaryStats* stats = nullptr);

}  // namespace attn::translate
