// Parallel text on disk: two line-aligned files (plain or gzip), validated as UTF-8.
//
// Line i of the source file translates line i of the target file. Every problem is reported with
// the file, the 1-based line and what was expected, because a corpus that is silently misaligned
// by one line trains a model that translates nothing.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "text.hpp"  // find_invalid_utf8 and check_utf8_line, which the readers here apply

namespace attn::translate {

/// Sentence pairs: src[i] translates to tgt[i].
struct ParallelCorpus {
  std::vector<std::string> src;
  std::vector<std::string> tgt;

  std::size_t size() const { return src.size(); }
  bool empty() const { return src.empty(); }
};

/// A corpus cut into disjoint training, validation and test parts.
struct CorpusSplit {
  ParallelCorpus train;
  ParallelCorpus valid;
  ParallelCorpus test;
};

/// The most bytes read_lines takes from one file by default, after decompression: 1 GiB. A gzip
/// stream inflates up to about 1000 times its size, so a small file (a "gzip bomb") could
/// otherwise fill the memory; reading stops at the cap, which bounds the memory to about twice it.
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30;

/// The most lines read_lines and `translate`'s stdin take: 2^26 (67,108,864). A line costs 32 bytes
/// of std::string besides its text, so 1 GiB of empty lines would otherwise take 32 GiB; at the
/// cap the lines of a file take at most 2 GiB besides its text.
inline constexpr std::size_t kMaxTextFileLines = std::size_t{1} << 26;

/// The lines of a text file, plain or gzip-compressed (detected from the content, not the name),
/// without their '\n' or a trailing '\r'. A final line without '\n' counts; a final '\n' does not
/// start an extra empty line. A pipe or FIFO is read to its end, as its writer writes; if no
/// process opens a FIFO for writing within 10 s, IOError names it (a plain open waits for ever).
/// Throws IOError if the file cannot be opened or read, FormatError if a gzip stream is corrupt or
/// truncated or if the text (after decompression) is longer than `max_bytes` or has more than
/// kMaxTextFileLines lines (the message names the limit), DataError naming file, line and byte
/// offset if a line is not valid UTF-8.
std::vector<std::string> read_lines(const std::string& path,
                                    std::size_t max_bytes = kMaxTextFileBytes);

/// Reads the next line of `in` into `line`, without its '\n' or a trailing '\r'; false at the
/// end of the input (a final line without '\n' counts); line 1 loses a byte order mark (below,
/// strip_utf8_bom). Stops reading a line longer than `max_bytes` and throws DataError "<name> line
/// <number> is longer than <max_bytes> bytes<why>": a stream without line ends (a pipe from
/// /dev/zero) costs no more memory than the cap.
bool read_line(std::istream& in, std::string& line, std::size_t max_bytes, std::string_view name,
               std::size_t number, std::string_view why);

/// Removes a UTF-8 byte order mark (EF BB BF) from the start of `text`, as editors on Windows
/// write it: otherwise it would become part of the first word of the first line.
inline void strip_utf8_bom(std::string& text) {
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
}

/// Writes `lines`, each followed by '\n'; gzip-compressed when `path` ends in ".gz". The file is
/// written beside `path` and renamed over it when complete, so on failure (IOError naming the
/// path) an existing file is left as it was.
void write_lines(const std::string& path, const std::vector<std::string>& lines);
/// write_lines of lines already joined, each followed by '\n'.
void write_text(const std::string& path, const std::string& text);

/// What read_parallel does with a pair where either side is empty or only whitespace.
enum class EmptyLinePolicy {
  kError,  ///< throw DataError naming the file and the line (default: such a corpus is suspect)
  kSkip,   ///< drop the pair and count it
};

struct ReadParallelOptions {
  EmptyLinePolicy empty_lines = EmptyLinePolicy::kError;
  std::size_t max_bytes = kMaxTextFileBytes;  ///< read_lines' cap, for each of the two files
};

/// Reads two line-aligned files. Throws DataError naming both files and both counts if their line
/// counts differ, and what read_lines throws. `skipped`, when given, receives the number of pairs
/// dropped under EmptyLinePolicy::kSkip.
ParallelCorpus read_parallel(const std::string& src_path, const std::string& tgt_path,
                             const ReadParallelOptions& options = {},
                             std::size_t* skipped = nullptr);

}  // namespace attn::translate
