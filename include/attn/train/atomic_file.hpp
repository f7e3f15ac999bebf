// Atomic file replacement: a writer either leaves the complete new file at its path or leaves the
// old one untouched, whatever happens (a full disk, a crash, SIGKILL). Every file attn or its
// example CLI writes goes through write_file_atomically.
//
// Only a regular file (or nothing) at <path> is replaced; anything else there is refused. The
// protocol: create "<path>.attn-tmp.<pid>" in the same directory with O_CREAT|O_EXCL|O_NOFOLLOW
// (a file or symlink planted under that name is refused, never followed or truncated), write,
// fsync, close, rename over <path>, then fsync the directory so the rename survives a power loss.
// Any failure up to and including the rename removes the temporary file and throws IOError; the
// old file is intact. After the rename the new file is in place, so a failing directory fsync is
// not reported as a failed write: it is returned as a warning (the write happened, but may not be
// durable), which the caller can print.
//
// Only a writer killed outright (SIGKILL, a power loss, or a signal to attn-translate train once
// its final checkpoint is written) leaves "<path>.attn-tmp.<pid>" behind. The next
// write of <path> removes such leftovers of writers that are gone (remove_stale_temporaries), so a
// killed `translate --output f` costs disk space only until f is written again.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn/error.hpp"
#include "attn/strict_number.hpp"
#include "attn/train/regular_file.hpp"

namespace attn {

namespace detail {

/// Test hook: a write fails (ENOSPC) once this many bytes have gone into one atomic file.
inline std::size_t& safetensors_fail_after_bytes() {
  static std::size_t limit = std::numeric_limits<std::size_t>::max();
  return limit;
}

/// Test hook: the directory fsync after the rename fails with this errno (0: no failure).
inline int& directory_fsync_fails_with() {
  static int err = 0;
  return err;
}

/// Test hook: called with the path at the start of each write_file_atomically, before its
/// temporary file is created. A test that must make the second of two writes fail for real (a
/// file size limit lowered after the first, larger file is in place) does it here.
inline std::function<void(const std::string& path)>& before_atomic_write() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

inline std::string errno_text(int err) { return std::strerror(err); }

/// Writes all of [data, data + n), retrying short writes; false with errno set on failure.
inline bool write_all(int fd, const void* data, std::size_t n, std::size_t& written) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    std::size_t chunk = std::min<std::size_t>(n, 1 << 24);
    const std::size_t limit = safetensors_fail_after_bytes();
    if (written >= limit) {
      errno = ENOSPC;
      return false;
    }
    chunk = std::min(chunk, limit - written);
    const ssize_t k = ::write(fd, p, chunk);
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += k;
    n -= static_cast<std::size_t>(k);
    written += static_cast<std::size_t>(k);
  }
  return true;
}

inline std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// fsyncs directory `dir`; "" on success (or where directories cannot be fsynced, EINVAL), else
/// the reason.
inline std::string sync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return "cannot open directory " + dir + ": " + errno_text(errno);
  int rc = ::fsync(dfd);
  int err = errno;
  if (directory_fsync_fails_with() != 0) rc = -1, err = directory_fsync_fails_with();
  ::close(dfd);
  if (rc == 0 || err == EINVAL) return {};
  return "cannot fsync directory " + dir + ": " + errno_text(err);
}

/// IOError unless `path` is absent or a regular file. The rename that writes a file replaces
/// whatever is at its path: a device, a FIFO or a symbolic link would be swapped for a regular file
/// (run as root, /dev/full itself). Checked before the body is written (to fail fast) and again
/// just before the rename; what is swapped in between those microseconds needs write access to the
/// directory, which can remove the entry anyway, so the race gives nobody more than they have.
inline void check_replaceable(const std::string& path) {
  struct stat target {};
  if (::lstat(path.c_str(), &target) == 0)
    ATTN_CHECK(S_ISREG(target.st_mode), IOError, "refusing to write ", path, ": it is ",
               file_kind(target.st_mode),
               ", and a file is written by replacing it whole (give the path of a regular file)");
}

}  // namespace detail

/// What marks a temporary of write_file_atomically: "<path>" + kAtomicTempInfix + "<pid>". Not
/// the common ".tmp.": remove_stale_temporaries deletes what bears it, and a user's own
/// "notes.txt.tmp.1234" beside a --output notes.txt was deleted as a killed writer's.
inline constexpr std::string_view kAtomicTempInfix = ".attn-tmp.";

/// The temporary name write_file_atomically uses for `path` in this process.
inline std::string atomic_temp_path(const std::string& path) {
  return path + std::string(kAtomicTempInfix) + std::to_string(::getpid());
}

namespace detail {

/// The writer's pid in a temporary file name "<target>.attn-tmp.<pid>" (after the last
/// kAtomicTempInfix), if `name` is one; with a non-empty `target`, only a temporary of that file
/// name counts.
inline std::optional<pid_t> temp_writer_pid(std::string_view name, std::string_view target) {
  const std::size_t at = name.rfind(kAtomicTempInfix);
  if (at == std::string_view::npos || (!target.empty() && name.substr(0, at) != target))
    return std::nullopt;
  const std::optional<pid_t> pid = parse_number<pid_t>(name.substr(at + kAtomicTempInfix.size()));
  if (!pid || *pid <= 0) return std::nullopt;
  return pid;
}

/// Whether the writer `pid` of a temporary is gone: no such process, or this one (which looks
/// before it starts a write of its own).
inline bool temp_writer_gone(pid_t pid) {
  return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace detail

/// Removes the temporary files "<name>.attn-tmp.<pid>" of directory `dir` whose writer is gone, and
/// returns their paths: for every <name> if `target_name` is empty, else for that file name only.
/// Only regular files are removed; a directory that cannot be read removes nothing. The pid names
/// the writer, so this assumes the writers of `dir` run on this machine (in this pid namespace);
/// a live process of that pid, whoever it is, keeps the file. With an empty `target_name`, call it
/// before this process starts any write in `dir`: its own temporaries count as leftovers.
inline std::vector<std::string> remove_stale_temporaries(const std::string& dir,
                                                         const std::string& target_name = "") {
  std::vector<std::string> stale, removed;
  {
    // Owned at once: the names below allocate, and a bad_alloc must not leak the directory.
    const std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
    if (d == nullptr) return removed;
    const std::string prefix = !dir.empty() && dir.back() == '/' ? dir : dir + "/";
    while (const dirent* e = ::readdir(d.get())) {
      const std::optional<pid_t> pid = detail::temp_writer_pid(e->d_name, target_name);
      if (pid && detail::temp_writer_gone(*pid)) stale.push_back(prefix + e->d_name);
    }
  }
  for (const std::string& path : stale) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::unlink(path.c_str()) == 0)
      removed.push_back(path);
  }
  return removed;
}

/// What write_file_atomically reports besides success: a non-empty `warning` says the new file is
/// in place but its directory entry could not be made durable (a power loss may revert it).
struct AtomicWriteResult {
  std::string warning;
};

/// Writes `path` atomically; `body(fd, written)` writes the content with detail::write_all and
/// returns false (errno set) on failure. IOError naming `path` and the step that failed otherwise,
/// with the old file untouched and no temporary file left; so too if `body` throws, and its
/// exception comes out.
inline AtomicWriteResult write_file_atomically(
    const std::string& path, const std::function<bool(int fd, std::size_t& written)>& body) {
  ATTN_CHECK(!path.empty(), IOError,
             "write_file_atomically: expected a file path, got an empty one");
  detail::check_replaceable(path);
  if (detail::before_atomic_write()) detail::before_atomic_write()(path);
  // Leftovers of killed writers of `path`, our own pid's among them (a previous process of this
  // pid killed mid-write): regular files only, so a planted symlink or directory is refused below.
  const std::size_t slash = path.find_last_of('/');
  remove_stale_temporaries(detail::parent_directory(path),
                           slash == std::string::npos ? path : path.substr(slash + 1));
  const std::string tmp = atomic_temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  ATTN_CHECK(fd >= 0, IOError, "cannot create ", tmp, " to write ", path, ": ",
             detail::errno_text(errno));
  // Every way out before the rename leaves no temporary and no open descriptor behind.
  const auto discard = [&](bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
  };
  const auto fail = [&](const char* what, int err, bool close_fd) {
    discard(close_fd);
    throw IOError(
        detail::concat("cannot ", what, " ", path, " (via ", tmp, "): ", detail::errno_text(err)));
  };
  std::size_t written = 0;
  bool wrote = false;
  try {
    wrote = body(fd, written);
  } catch (...) {
    discard(true);
    throw;
  }
  if (!wrote) fail("write", errno, true);
  if (::fsync(fd) != 0) fail("fsync", errno, true);
  if (::close(fd) != 0) fail("close", errno, false);
  try {
    detail::check_replaceable(path);  // again: the body may have taken long
  } catch (...) {
    discard(false);
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename into", errno, false);
  AtomicWriteResult result;
  const std::string why = detail::sync_directory(detail::parent_directory(path));
  if (!why.empty())
    result.warning = path + " was written completely, but " + why +
                     "; the new file may not survive a power loss";
  return result;
}

/// write_file_atomically of the bytes [data, data + n).
inline AtomicWriteResult write_file_atomically(const std::string& path, const void* data,
                                               std::size_t n) {
  return write_file_atomically(
      path, [&](int fd, std::size_t& written) { return detail::write_all(fd, data, n, written); });
}
inline AtomicWriteResult write_file_atomically(const std::string& path, const std::string& text) {
  return write_file_atomically(path, text.data(), text.size());
}

}  // namespace attn
