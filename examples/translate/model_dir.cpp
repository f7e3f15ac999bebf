#include "model_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <attn/error.hpp>
#include <attn/strict_number.hpp>

namespace attn::translate {

namespace fs = std::filesystem;

ModelDirLock::ModelDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  ATTN_CHECK(!ec, IOError, "cannot create model directory '", dir, "': ", ec.message());
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ATTN_CHECK(fd_ >= 0, IOError, "cannot open model directory '", dir, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  const int err = errno;
  ::close(fd_);
  ATTN_CHECK(err != EWOULDBLOCK, ConfigError, "model directory '", dir,
             "' is in use by another attn-translate train; wait for it to finish, or use "
             "another directory");
  throw IOError(detail::concat("cannot lock model directory '", dir, "': ", std::strerror(err)));
}

ModelDirLock::~ModelDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || !entry.is_regular_file(ec)) continue;
    const auto pid = parse_number<pid_t>(std::string_view(name).substr(at + 5));
    if (!pid || *pid <= 0) continue;
    const bool gone = *pid == ::getpid() || (::kill(*pid, 0) != 0 && errno == ESRCH);
    if (gone && fs::remove(entry.path(), ec)) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace attn::translate
