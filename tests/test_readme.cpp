// The README's code example is examples/readme_example.cpp verbatim, which the packaging tests
// compile and run through add_subdirectory and find_package; this test keeps the two identical.
#include <fstream>
#include <sstream>
#include <string>

#include "pch.hpp"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string repo_root() {
  std::string here = __FILE__;  // <root>/tests/test_readme.cpp
  return here.substr(0, here.rfind("/tests/"));
}

TEST(Readme, CodeExampleIsTheCompiledExample) {
  const std::string readme = read_file(repo_root() + "/README.md");
  const std::string example = read_file(repo_root() + "/examples/readme_example.cpp");
  const std::string open = "```cpp\n";
  const auto begin = readme.find(open);
  ASSERT_NE(begin, std::string::npos) << "README.md has no ```cpp block";
  const auto end = readme.find("```\n", begin + open.size());
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(readme.substr(begin + open.size(), end - begin - open.size()), example)
      << "README.md's first C++ block must equal examples/readme_example.cpp";
}

}  // namespace
