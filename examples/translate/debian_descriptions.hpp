// English -> German pairs from Debian's translated package descriptions (the Debian Description
// Translation Project), read at run time from where apt puts them:
//   apt-get update -o Acquire::Languages=de,en
// fetches /var/lib/apt/lists/*_i18n_Translation-en and *_i18n_Translation-de, usually
// lz4-compressed (an LZ4 frame; plain text is read as is).
//
// Each file is a sequence of deb822 records separated by blank lines:
//   Package: 0ad
//   Description-md5: d943033bedada21853d2ae54a2578a7b
//   Description-de: <short description>
//    <long description, one or more lines starting with a space>
//    .                                   (a paragraph break)
//    <next paragraph>
// The md5 is that of the English original, so it pairs a German record with its English one.
// Pairs come at three levels: the short descriptions; the paragraphs (the i-th of one side with
// the i-th of the other, only when both sides have the same number of paragraphs); and within a
// paragraph pair the sentences, when both sides split into the same number and every sentence
// pair's lengths agree (max_length_ratio). A paragraph pair whose sentences do not pair up is kept
// whole if it is short enough, else dropped and counted. List markers ("* ", "- ") are removed;
// pairs with a URL, or whose lengths disagree, are dropped and counted.
//
// Malformed records (no md5, no description field, a line that is neither "Field: value" nor a
// continuation, a bad md5, invalid UTF-8) are skipped and counted, never fatal: one bad record in
// a 60,000-record file should not cost the rest.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "corpus_io.hpp"

namespace attn::translate {

/// One description of one language.
struct Description {
  std::string md5;                      ///< 32 lowercase hex digits
  std::string short_text;               ///< the first line
  std::vector<std::string> paragraphs;  ///< of the long description, lines joined by spaces
};

struct DebianDescriptionStats {
  std::size_t files = 0;
  std::size_t records = 0;                ///< records seen, in all files
  std::size_t malformed = 0;              ///< records skipped as malformed (see above)
  std::size_t invalid_utf8 = 0;           ///< of which: not UTF-8
  std::size_t matched = 0;                ///< German descriptions with an English original
  std::size_t unmatched = 0;              ///< German descriptions without one
  std::size_t paragraphs_misaligned = 0;  ///< descriptions whose paragraph counts differ
  std::size_t sentences_misaligned = 0;   ///< paragraph pairs whose sentences do not pair up
  std::size_t dropped_urls = 0;           ///< pairs with a URL ("://") on either side
  std::size_t dropped_ratio = 0;          ///< pairs whose lengths disagree (max_length_ratio)
  std::size_t pairs = 0;                  ///< pairs produced (before any deduplication)
};

struct DebianDescriptionOptions {
  std::string directory = "/var/lib/apt/lists";
  std::size_t max_chars = 200;  ///< code points per side of a pair; longer ones are dropped
  /// A pair whose longer side (of 20 code points or more) is over this many times the shorter is
  /// no translation of it: dropped, or for sentences the paragraph is taken as misaligned.
  double max_length_ratio = 2.0;
  /// Size limit per file, as read and decompressed: a hostile frame cannot make us allocate
  /// without bound.
  std::size_t max_file_bytes = std::size_t{1} << 30;
  /// Size limit of all the files together, as decompressed: a directory of many large files
  /// (hard links to one, say) took 3.4 bytes of memory per byte of text, without bound. Each file
  /// is read whole (at most max_file_bytes) before it is counted.
  std::size_t max_total_bytes = std::size_t{1} << 30;
};

/// The content of an LZ4 frame (magic 04 22 4D 18), or `data` itself when it is not one. Throws
/// FormatError naming `name` for a corrupt or truncated frame, or one that inflates beyond
/// `max_bytes`.
std::string lz4_decompress_if_framed(std::string_view data, const std::string& name,
                                     std::size_t max_bytes);

/// Parses the records of one Translation-<lang> file. `lang` is "en" or "de" (the field read is
/// Description-<lang>). Malformed records are skipped and counted in `stats`.
std::vector<Description> parse_translation_records(std::string_view text, std::string_view lang,
                                                   DebianDescriptionStats* stats = nullptr);

/// Splits a paragraph into sentences at '.', '!' or '?' followed by a space and an upper-case
/// letter or digit, outside parentheses; a dot after a single letter or a known abbreviation
/// ("e.g.", "z.B.", "bzw.", "etc.") does not end a sentence.
std::vector<std::string> split_sentences(std::string_view paragraph);

/// Pairs German descriptions with their English originals by md5, then by paragraph and sentence
/// as described above. Descriptions of the same md5 count once.
ParallelCorpus pair_descriptions(const std::vector<Description>& english,
                                 const std::vector<Description>& german,
                                 const DebianDescriptionOptions& options = {},
                                 DebianDescriptionStats* stats = nullptr);

/// Reads every *_i18n_Translation-en[.lz4] and *_i18n_Translation-de[.lz4] in
/// options.directory and pairs them. Throws IOError naming the directory and the apt command
/// when there is no file of either language, IOError naming a file that is not a regular file of
/// at most max_file_bytes (train/regular_file.hpp), FormatError for a corrupt lz4 frame or for
/// files that hold more than max_total_bytes together.
ParallelCorpus load_debian_descriptions(const DebianDescriptionOptions& options = {},
                                        DebianDescriptionStats* stats = nullptr);

}  // namespace attn::translate
