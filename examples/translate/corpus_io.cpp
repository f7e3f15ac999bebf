#include "corpus_io.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <istream>
#include <limits>
#include <memory>
#include <string>

#include <attn/error.hpp>
#include <attn/train/atomic_file.hpp>
#include <attn/train/regular_file.hpp>

namespace attn::translate {

bool read_line(std::istream& in, std::string& line, std::size_t max_bytes, std::string_view name,
               std::size_t number, std::string_view why) {
  const auto check_cap = [&](std::size_t bytes) {
    ATTN_CHECK(bytes <= max_bytes, DataError, name, " line ", number, " is longer than ", max_bytes,
               " bytes", why);
  };
  line.clear();
  std::streambuf* buf = in.rdbuf();
  bool any = false, bom = number == 1;
  for (int c = buf->sbumpc(); c != std::char_traits<char>::eof(); c = buf->sbumpc()) {
    any = true;
    if (c == '\n') break;
    check_cap(line.size());  // one byte past the cap may be a '\r' that is not part of the line
    line.push_back(static_cast<char>(c));
    if (bom && line.size() == 3) {
      bom = false;
      strip_utf8_bom(line);
    }
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  check_cap(line.size());
  if (!any) in.setstate(std::ios::eofbit | std::ios::failbit);
  return any;
}

namespace {

// How long a reader of a FIFO waits for a process to open it for writing (a blocking open waits
// for ever: `train --src` naming a FIFO that no process writes to hung).
constexpr std::chrono::seconds kFifoWriterWait{10};

// A file read in chunks, with the path for messages; closes the descriptor when it goes.
struct ChunkReader {
  explicit ChunkReader(const std::string& p) : path(p) {}
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;
  ~ChunkReader() {
    if (fd >= 0) ::close(fd);
  }

  const std::string& path;
  int fd = -1;
  std::vector<unsigned char> chunk = std::vector<unsigned char>(1 << 16);
  std::size_t size = 0;      // bytes in chunk
  std::uint64_t offset = 0;  // of chunk[0] in the file

  // Reads chunk[from, end): all of it unless the file ends first. Returns size.
  std::size_t fill(std::size_t from) {
    size = from;
    while (size < chunk.size()) {
      const ssize_t k = ::read(fd, chunk.data() + size, chunk.size() - size);
      if (k < 0 && errno == EINTR) continue;
      ATTN_CHECK(k >= 0, IOError, "cannot read '", path, "': ", std::strerror(errno));
      if (k == 0) break;
      size += static_cast<std::size_t>(k);
    }
    return size;
  }
  std::size_t next() {
    offset += size;
    return fill(0);
  }
};

// Appends `n` bytes to the text, refusing it once it grows beyond `max_bytes`, however small the
// compressed file is (`inflated`: the text comes out of gzip).
void append_text(std::string& text, const char* bytes, std::size_t n, std::size_t max_bytes,
                 const std::string& path, bool inflated) {
  ATTN_CHECK(
      n <= max_bytes - text.size(), FormatError, "'", path, "' holds more than ", max_bytes,
      " bytes of text (the limit of one text file",
      inflated ? " after decompression); a gzip file that inflates this far is refused" : ")");
  text.append(bytes, n);
}

// After a gzip member: another member, or zeros (padding, which gzip ignores too) to the end.
// Other bytes used to be dropped in silence. Returns whether another member begins.
bool next_member(z_stream& zs, const ChunkReader& r) {
  const unsigned char b = *zs.next_in;
  const std::uint64_t at = r.offset + static_cast<std::uint64_t>(zs.next_in - r.chunk.data());
  ATTN_CHECK(b == 0 || b == 0x1f, FormatError, "'", r.path,
             "' has bytes after its gzip stream that are neither another gzip member nor zeros ",
             "(byte 0x", std::hex, static_cast<unsigned>(b), std::dec, " at offset ", at, ")");
  if (b == 0x1f) {
    ATTN_CHECK(inflateReset(&zs) == Z_OK, FormatError, "cannot inflate '", r.path, "'");
    return true;
  }
  ++zs.next_in;
  --zs.avail_in;
  return false;
}

// The gzip members of the file, one after another, as gzip -d reads them.
std::string inflate_members(ChunkReader& r, std::size_t max_bytes) {
  z_stream zs{};
  ATTN_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, FormatError, "cannot inflate '", r.path, "'");
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&zs, inflateEnd);
  std::string text;
  std::vector<char> out(1 << 16);
  zs.next_in = r.chunk.data();
  zs.avail_in = static_cast<uInt>(r.size);
  bool ended = false, full = false;  // a member ended (no other began); inflate filled `out`
  std::uint64_t member = 0;          // offset of the member being inflated
  for (;;) {
    if (zs.avail_in == 0 && !full) {
      if (r.next() == 0) break;
      zs.next_in = r.chunk.data();
      zs.avail_in = static_cast<uInt>(r.size);
    }
    if (ended) {
      member = r.offset + static_cast<std::uint64_t>(zs.next_in - r.chunk.data());
      ended = !next_member(zs, r);
      continue;
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    const int rc = inflate(&zs, Z_NO_FLUSH);
    ATTN_CHECK(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR, FormatError, "'", r.path,
               "' is not a valid gzip stream: ", zs.msg ? zs.msg : "inflate failed",
               member > 0 ? detail::concat(" (in the bytes after its first member, from offset ",
                                           member, ")")
                          : std::string());
    append_text(text, out.data(), out.size() - zs.avail_out, max_bytes, r.path, true);
    ended = rc == Z_STREAM_END;
    full = !ended && zs.avail_out == 0;
  }
  ATTN_CHECK(ended, FormatError, "'", r.path, "' is a truncated or corrupt gzip stream: it ends ",
             member > 0 ? detail::concat("in the member from offset ", member)
                        : std::string("inside its first member"));
  return text;
}

// A FIFO opened non-blocking (r.fd): waits until a process has it open for writing, for at most
// kFifoWriterWait, and reads what that process has written so far into r.chunk (returns how much).
// A read of an empty FIFO tells whether a writer has it open (EAGAIN) or none has (0 bytes), and
// poll() reports POLLHUP once a writer has come and gone (Linux reports it only after a writer
// has been seen): then the FIFO is read to its end, which may be at once.
std::size_t wait_for_writer(ChunkReader& r) {
  const auto deadline = std::chrono::steady_clock::now() + kFifoWriterWait;
  for (bool came = false;;) {
    const ssize_t k = ::read(r.fd, r.chunk.data(), r.chunk.size());
    if (k > 0) return static_cast<std::size_t>(k);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;  // a writer, nothing yet
    ATTN_CHECK(k == 0, IOError, "cannot read '", r.path, "': ", std::strerror(errno));
    if (came) return 0;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{r.fd, POLLIN, 0};  // past the deadline, one last look without waiting
    const int events =
        ::poll(&p, 1, static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 50)));
    came = events > 0 && (p.revents & POLLHUP) != 0;
    ATTN_CHECK(events > 0 || left.count() > 0, IOError, "cannot read '", r.path,
               "': it is a FIFO that no process opened for writing within ",
               kFifoWriterWait.count(), " s");
  }
}

// The first chunk of a file just opened non-blocking, read as a blocking open and read would, but
// a FIFO without a writer is waited for kFifoWriterWait at most (a blocking open waits for ever).
void read_first_chunk(ChunkReader& r) {
  struct stat st {};
  ATTN_CHECK(::fstat(r.fd, &st) == 0, IOError, "cannot stat '", r.path,
             "': ", std::strerror(errno));
  const std::size_t first = S_ISFIFO(st.st_mode) ? wait_for_writer(r) : 0;
  const int flags = ::fcntl(r.fd, F_GETFL);
  ATTN_CHECK(flags != -1 && ::fcntl(r.fd, F_SETFL, flags & ~O_NONBLOCK) == 0, IOError,
             "cannot read '", r.path, "': ", std::strerror(errno));
  r.fill(first);
}

// Plain text or gzip, told apart by the gzip magic bytes, not by the name.
std::string read_all(const std::string& path, std::size_t max_bytes) {
  ChunkReader r(path);  // its chunk allocated first: nothing throws between the open and its owner
  r.fd = detail::open_without_waiting(path);
  ATTN_CHECK(r.fd >= 0, IOError, "cannot open '", path, "' for reading: ", std::strerror(errno));
  read_first_chunk(r);
  if (r.size >= 2 && r.chunk[0] == 0x1f && r.chunk[1] == 0x8b) return inflate_members(r, max_bytes);
  std::string text;
  for (; r.size > 0; r.next())
    append_text(text, reinterpret_cast<const char*>(r.chunk.data()), r.size, max_bytes, path,
                false);
  return text;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\v\f") == std::string::npos; }

}  // namespace

std::vector<std::string> read_lines(const std::string& path, std::size_t max_bytes) {
  std::string data = read_all(path, max_bytes);
  strip_utf8_bom(data);
  const std::size_t breaks = static_cast<std::size_t>(std::count(data.begin(), data.end(), '\n'));
  const std::size_t n = breaks + (!data.empty() && data.back() != '\n' ? 1 : 0);
  ATTN_CHECK(n <= kMaxTextFileLines, FormatError, "'", path, "' has ", n, " lines, more than the ",
             kMaxTextFileLines, " of one text file");
  std::vector<std::string> lines;
  lines.reserve(n);
  std::size_t start = 0;
  while (start < data.size()) {
    std::size_t end = data.find('\n', start);
    if (end == std::string::npos) end = data.size();
    std::string line = data.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    check_utf8_line(line, "'" + path + "'", lines.size() + 1);
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

namespace {

/// `text` as one gzip member (zlib's deflate with the gzip wrapper, windowBits 15 + 16).
std::string gzip(const std::string& text, const std::string& path) {
  z_stream z{};
  ATTN_CHECK(
      deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
      IOError, "cannot compress '", path, "': deflateInit2 failed");
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  ATTN_CHECK(rc == Z_STREAM_END, IOError, "cannot compress '", path, "': deflate returned ", rc);
  return out;
}

}  // namespace

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + '\n';
  write_text(path, text);
}

void write_text(const std::string& path, const std::string& text) {
  // Atomically (a temporary file beside `path`, renamed over it once complete): a failed write,
  // a full disk say, leaves the old file as it was, never a partial one in its place.
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  ATTN_CHECK(!gz || text.size() <= std::numeric_limits<uInt>::max(), IOError, "cannot write '",
             path, "': ", text.size(), " bytes are too many to compress in one piece");
  write_file_atomically(path, gz ? gzip(text, path) : text);
}

ParallelCorpus read_parallel(const std::string& src_path, const std::string& tgt_path,
                             const ReadParallelOptions& options, std::size_t* skipped) {
  std::vector<std::string> src = read_lines(src_path, options.max_bytes);
  std::vector<std::string> tgt = read_lines(tgt_path, options.max_bytes);
  ATTN_CHECK(src.size() == tgt.size(), DataError,
             "parallel files must have the same number of lines: '", src_path, "' has ", src.size(),
             ", '", tgt_path, "' has ", tgt.size());
  ParallelCorpus corpus;
  corpus.src.reserve(src.size());
  corpus.tgt.reserve(tgt.size());
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const bool src_blank = is_blank(src[i]);
    if (src_blank || is_blank(tgt[i])) {
      ATTN_CHECK(options.empty_lines == EmptyLinePolicy::kSkip, DataError, "'",
                 src_blank ? src_path : tgt_path, "' line ", i + 1,
                 ": expected a sentence, found an empty line");
      ++dropped;
      continue;
    }
    corpus.src.push_back(std::move(src[i]));
    corpus.tgt.push_back(std::move(tgt[i]));
  }
  if (skipped != nullptr) *skipped = dropped;
  return corpus;
}

}  // namespace attn::translate
