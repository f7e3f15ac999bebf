// The built-in default corpus: English -> German pairs from the gettext catalogs a Debian system
// already has (/usr/share/locale/de/LC_MESSAGES/*.mo), so the trainer runs with no download.
//
// A catalog entry becomes a pair (msgid, msgstr) unless a rule drops it. The rules are applied in
// this order and the first that fires is the entry's DropReason:
//   kHeader:       msgid "" (the catalog's metadata entry).
//   kPlural:       entries with msgid_plural (their forms are not one sentence pair).
//   kEmpty:        an empty translation.
//   kInvalidUtf8:  either side is not valid UTF-8.
//   kControl:      a control character (newline, tab, ...) on either side.
//   kFormat:       a placeholder or markup on either side: a printf directive ('%' followed by
//                  flags other than ' ', width, precision, length and a conversion, or '%(' /
//                  '%{'), any '{' or
//                  '}', '$' before a letter, '{' or '_' (shell variables), '<' or '>' (markup),
//                  an HTML entity ("&amp;", "&#38;"), more than one '_' (identifiers) or more
//                  than one '&' accelerator. Placeholders teach the model nothing about language.
//   then both sides are cleaned (below), and:
//   kSymbols:      fewer than half of the non-space characters are letters on either side
//                  (paths, version strings, key names).
//   kLength:       more than max_chars code points on either side.
//   kShort:        fewer than min_words words on the English side.
//   kUntranslated: translation identical to the original (product names, copies).
// The context of msgctxt entries is dropped and the text kept. Cleaning: one keyboard accelerator
// is removed per side ('_' or '&' directly before a letter or digit; "&&" becomes "&"), U+00A0
// and U+202F become spaces, runs of spaces collapse and both ends are trimmed.
//
// Duplicate sources keep their most frequent translation (ties: the smallest string), so the
// result does not depend on the order of the files. The pairs are then ordered by a fixed 64-bit
// hash of the source (FNV-1a, then SplitMix), and the first valid_size pairs become the
// validation set, the next test_size the test set, the rest the training set: the split is the
// same on every run and for every order of the files.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "corpus_io.hpp"

namespace attn::translate {

enum class DropReason {
  kKept,
  kHeader,
  kPlural,
  kEmpty,
  kInvalidUtf8,
  kControl,
  kFormat,
  kSymbols,
  kLength,
  kShort,
  kUntranslated,
  kCount
};
const char* drop_reason_name(DropReason reason);

struct GettextCorpusOptions {
  std::string directory = "/usr/share/locale/de/LC_MESSAGES";
  std::size_t max_chars = 200;  ///< code points per side
  std::size_t min_words = 2;    ///< whitespace-separated words on the English side
  std::size_t valid_size = 500;
  std::size_t test_size = 500;
};

struct GettextCorpusStats {
  std::size_t files = 0;
  std::size_t files_skipped = 0;        ///< catalogs whose charset is neither UTF-8 nor ASCII
  std::vector<std::string> unreadable;  ///< why each catalog that could not be read was left out
  std::size_t entries = 0;
  std::array<std::size_t, static_cast<std::size_t>(DropReason::kCount)> by_reason{};
  std::size_t duplicates = 0;  ///< kept pairs whose source had already been seen
  std::size_t pairs = 0;       ///< distinct sources in the final corpus
};

/// Removes one keyboard accelerator ("_Open" -> "Open", "&Save" -> "Save", "&&" -> "&").
std::string strip_accelerator(std::string_view text);

/// True if `text` holds a placeholder or markup, as rule 5 above.
bool has_format_markup(std::string_view text);

/// Applies the rules above to one catalog entry. Returns the cleaned pair, or the reason to drop.
struct CleanResult {
  DropReason reason = DropReason::kKept;
  std::string src, tgt;
};
CleanResult clean_gettext_entry(std::string_view msgid, std::string_view msgstr, bool plural,
                                const GettextCorpusOptions& options);

/// Reads every *.mo in options.directory; one that cannot be read (missing, not a regular file,
/// too large, corrupt) is left out and named in stats->unreadable. Throws IOError if the directory
/// cannot be listed, DataError if no pair survives or fewer than valid_size + test_size + 1 do.
CorpusSplit load_gettext_corpus(const GettextCorpusOptions& options = {},
                                GettextCorpusStats* stats = nullptr);

}  // namespace attn::translate
