// Temporary paths of the translate tests outside a TempDirTest's directory: named after the
// process, so that tests ctest runs in parallel processes stay apart, and removed after the last
// test of the process. The whole-file reads and writes are tests/temp_dir.hpp's.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

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

}  // namespace attn::translate::testing
