#include "model_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include <attn/error.hpp>
#include <attn/strict_number.hpp>

namespace attn::translate {

namespace fs = std::filesystem;

std::string final_model_path(const std::string& dir) {
  return (fs::path(dir) / "model.safetensors").string();
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / ("checkpoint_" + std::to_string(step) + ".safetensors")).string();
}

std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  const std::string prefix = "checkpoint_", suffix = ".safetensors";
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix))
      continue;
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    // Not a checkpoint this program wrote (steps are Index values): ignored, like any other file.
    const std::optional<std::int64_t> step = parse_number<std::int64_t>(digits);
    if (!step || *step < 0) continue;
    out.emplace_back(*step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

/// Whether `path` may name a directory entry of any kind: a dangling symlink, or an entry whose
/// status cannot be read (EACCES, ELOOP), counts, so that the reader names what is wrong with it
/// instead of it being passed over as absent.
bool entry_exists(const std::string& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found;
}

}  // namespace

std::string model_file(const std::string& dir) {
  const std::string final_model = final_model_path(dir);
  if (entry_exists(final_model)) return final_model;
  const auto ckpts = list_checkpoints(dir);
  ATTN_CHECK(!ckpts.empty(), IOError, "model directory '", dir,
             "' has neither model.safetensors nor checkpoint_<step>.safetensors");
  return ckpts.back().second;
}

void check_fresh_model_dir(const std::string& dir) {
  ATTN_CHECK(list_checkpoints(dir).empty(), ConfigError, "model directory '", dir,
             "' already holds checkpoints; pass --resume to continue, or use another directory");
  ATTN_CHECK(!entry_exists(final_model_path(dir)), ConfigError, "model directory '", dir,
             "' already holds a model (model.safetensors); pass --resume to continue, or use "
             "another directory");
}

void prune_checkpoints(const std::string& dir, int keep, std::int64_t resume_step) {
  std::vector<std::string> counted;
  for (const auto& [step, path] : list_checkpoints(dir))
    if (step != resume_step) counted.push_back(path);
  const std::size_t n = static_cast<std::size_t>(std::max(keep, 1));
  for (std::size_t i = 0; i + n < counted.size(); ++i) fs::remove(counted[i]);
}

std::string set_aside_checkpoint(const std::string& path) {
  const std::string aside = path + ".unloadable";
  std::error_code ec;
  fs::rename(path, aside, ec);
  ATTN_CHECK(!ec, IOError, "cannot rename the checkpoint that does not load, '", path, "', to '",
             aside, "': ", ec.message());
  return aside;
}

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
             "' is in use by another attn-translate train or select; wait for it to finish, "
             "or use another directory");
  throw IOError(detail::concat("cannot lock model directory '", dir, "': ", std::strerror(err)));
}

ModelDirLock::~ModelDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace attn::translate
