// Guarding a model directory while a trainer writes to it: an advisory lock so that a second
// trainer on the same directory is refused (each would prune the other's checkpoints), and the
// removal of temporary files that killed writers left behind.
#pragma once

#include <string>
#include <vector>

namespace attn::translate {

/// An exclusive flock(2) on the directory `dir` (created if missing), held for the object's
/// lifetime and released by the kernel if the process dies. ConfigError naming the directory if
/// another process holds it.
class ModelDirLock {
 public:
  explicit ModelDirLock(const std::string& dir);
  ~ModelDirLock();
  ModelDirLock(const ModelDirLock&) = delete;
  ModelDirLock& operator=(const ModelDirLock&) = delete;

 private:
  int fd_ = -1;
};

/// Removes "<name>.tmp.<pid>" files of `dir` whose writer is gone (no such process, or this
/// process, which is not writing any yet); returns their paths. Call it holding ModelDirLock.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

}  // namespace attn::translate
