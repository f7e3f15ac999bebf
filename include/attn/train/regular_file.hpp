// The files of a model directory (weights, checkpoints, the vocabulary) read as untrusted input:
// each must be a regular file no larger than its reader's cap, both checked before a byte is
// allocated. A FIFO put in place of one would block the open or the read forever, and a device
// such as /dev/zero would never end. The open is non-blocking, so even a FIFO without a writer is
// refused at once; the checks then run on the open descriptor, so the file cannot be swapped in
// between. (A regular file under another process's lease refuses a non-blocking open for a moment:
// open_without_waiting() tries again.) Text the user names on the command line may well be a pipe,
// `--src <(zcat ...)`: the translate example reads it as a stream (corpus_io.cpp), with the same
// open. The writer's side is atomic_file.hpp. POSIX only.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "attn/error.hpp"

namespace attn {

namespace detail {

/// What a stat mode is, for messages: "a directory", "a FIFO", ...
inline const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

/// How long open_without_waiting() tries again while a lease holds the file: longer than the
/// kernel's default lease-break-time (45 s), after which the kernel breaks a lease itself.
inline constexpr std::chrono::seconds kLeaseWait{60};

/// Whether `path` names a regular file now; errno is kept.
inline bool is_regular_file_now(const std::string& path) {
  const int saved = errno;
  struct stat st {};
  const bool regular = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  errno = saved;
  return regular;
}

/// open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC): a descriptor at once, or -1 and errno. Unlike a
/// blocking open it does not wait for a writer of a FIFO. A regular file that another process holds
/// a lease on (a file server's, say) refuses a non-blocking open with EWOULDBLOCK, while the holder
/// is told to let go; a blocking open would wait for that, so this tries again every 10 ms for up
/// to kLeaseWait. Only for a regular file: a device that refuses non-blocking opens is reported at
/// once, and a FIFO swapped in meanwhile still does not block.
inline int open_without_waiting(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kLeaseWait;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 || errno != EWOULDBLOCK || !is_regular_file_now(path) ||
        std::chrono::steady_clock::now() >= deadline)
      return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace detail

/// An open regular file and its size; closes the descriptor when it goes.
class RegularFile {
 public:
  /// Opens `path`; IOError naming it unless it is a regular file of at most max_bytes bytes.
  RegularFile(const std::string& path, std::size_t max_bytes) : path_(path) {
    fd_ = detail::open_without_waiting(path);
    ATTN_CHECK(fd_ >= 0, IOError, "cannot open ", path, ": ", std::strerror(errno));
    try {  // no destructor runs for a constructor that throws: close here whatever is thrown
      check_size(max_bytes);
    } catch (...) {
      ::close(fd_);
      throw;
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // reads of a regular file block
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile() { ::close(fd_); }

  int fd() const { return fd_; }
  std::size_t size() const { return size_; }

  /// Reads all size() bytes into `out` (which holds as many), from a file not read before; IOError
  /// if the file ends early or a read fails.
  void read_all(void* out) const { read_next(out, size_); }
  /// Reads the next `count` bytes into `out`; IOError if the file ends early or a read fails.
  void read_next(void* out, std::size_t count) const {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t got = 0;
    while (got < count) {
      const ssize_t k = ::read(fd_, p + got, count - got);
      if (k < 0 && errno == EINTR) continue;
      ATTN_CHECK(k > 0, IOError, "cannot read ", path_, ": ",
                 k < 0 ? std::strerror(errno) : "the file ended early (truncated while read?)");
      got += static_cast<std::size_t>(k);
    }
  }

 private:
  /// Sets size_ from the open file; IOError unless it is a regular file of at most max_bytes.
  void check_size(std::size_t max_bytes) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;  // before the message's allocation, which may change it
      fail(std::string("cannot stat it: ") + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode))
      fail(std::string("expected a regular file, found ") + detail::file_kind(st.st_mode));
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > max_bytes)
      fail(detail::concat("it holds ", size_, " bytes, more than the ", max_bytes,
                          " this reader accepts"));
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw IOError(detail::concat("cannot read ", path_, ": ", why));
  }

  std::string path_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

/// The bytes of the regular file `path`, at most max_bytes of them (else IOError naming it).
inline std::string read_regular_file(const std::string& path, std::size_t max_bytes) {
  const RegularFile file(path, max_bytes);
  std::string bytes(file.size(), '\0');
  file.read_all(bytes.data());
  return bytes;
}

}  // namespace attn
