// A test fixture that gives every test a fresh empty directory, removed with its files afterwards,
// and the small file helpers the file-writing tests share.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace attn::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "attn_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << "mkdtemp " << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ignored;  // a test that failed half-way may leave anything behind
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  /// `name` inside the test's directory.
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  /// The names in the test's directory, sorted.
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  std::string dir_;
};

}  // namespace attn::testing
