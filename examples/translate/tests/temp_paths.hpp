// Temporary paths of the translate tests outside a TempDirTest's directory: named after the
// process, so that tests ctest runs in parallel processes stay apart, and removed after the last
// test of the process. The whole-file reads and writes are tests/temp_dir.hpp's.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "temp_dir.hpp"

namespace attn::translate::testing {

inline std::string temp_prefix() { return "attn_translate_" + std::to_string(::getpid()) + "_"; }

/// Removes this process's temporary paths after its last test.
class TempCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec))
      if (e.path().filename().string().rfind(temp_prefix(), 0) == 0) fs::remove_all(e.path(), ec);
  }
};

/// Every test executable that includes this header registers one TempCleanup (an inline variable:
/// one per program, however many of its files include it).
[[maybe_unused]] inline ::testing::Environment* const kTempCleanup =
    ::testing::AddGlobalTestEnvironment(new TempCleanup);

/// A temporary path that does not exist (whatever an earlier run left there is removed).
inline std::filesystem::path fresh_temp_path(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / (temp_prefix() + name);
  std::filesystem::remove_all(path);
  return path;
}

/// A new, empty temporary directory.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = fresh_temp_path(name);
  std::filesystem::create_directories(dir);
  return dir;
}

using attn::testing::read_file;
using attn::testing::write_file;

/// Paths in `dir` that a reader of regular files of at most `max_bytes` bytes must refuse, each
/// with the reason RegularFile gives: a directory, a FIFO without a writer (a blocking open would
/// wait for ever), a link to /dev/zero, and a sparse file one byte over the cap. `ext` ends
/// their names.
inline std::vector<std::pair<std::string, std::string>> unreadable_paths(
    const std::filesystem::path& dir, std::size_t max_bytes, const std::string& ext = "") {
  namespace fs = std::filesystem;
  const std::string directory = (dir / ("directory" + ext)).string(),
                    fifo = (dir / ("fifo" + ext)).string(),
                    device = (dir / ("zero" + ext)).string(),
                    large = (dir / ("large" + ext)).string();
  fs::create_directories(directory);
  EXPECT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", device);
  write_file(large, "");
  fs::resize_file(large, max_bytes + 1);  // sparse: nothing is written
  return {{directory, "expected a regular file, found a directory"},
          {fifo, "expected a regular file, found a FIFO"},
          {device, "expected a regular file, found a character device"},
          {large, "it holds " + std::to_string(max_bytes + 1) + " bytes, more than the " +
                      std::to_string(max_bytes) + " this reader accepts"}};
}

}  // namespace attn::translate::testing
