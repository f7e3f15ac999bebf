// The README's code example is examples/readme_example.cpp verbatim, which the packaging tests
// compile and run through add_subdirectory and find_package; this test keeps the two identical.
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

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

// "Where the paper lives": every file a row names exists under include/attn/, and every code name
// of the row (`Residual::forward`, `noam_lr`) is defined or declared in one of the row's files.
TEST(Readme, WhereThePaperLivesNamesFilesAndFunctionsThatExist) {
  const std::string readme = read_file(repo_root() + "/README.md");
  const auto begin = readme.find("### Where the paper lives");
  ASSERT_NE(begin, std::string::npos);
  const auto end = readme.find("\n#", begin + 1);
  std::istringstream table(readme.substr(begin, end - begin));
  const std::regex code("`([^`]+)`");
  int rows = 0;
  for (std::string line; std::getline(table, line);) {
    if (line.rfind("| ", 0) != 0 || line.find(".hpp") == std::string::npos) continue;
    const std::string attn_side = line.substr(line.find(" | ") + 3);
    std::vector<std::string> files, names;
    for (std::sregex_iterator it(attn_side.begin(), attn_side.end(), code), e; it != e; ++it) {
      const std::string c = (*it)[1];
      if (c.find(".hpp") != std::string::npos)
        files.push_back(read_file(repo_root() + "/include/attn/" + c));
      else if (c.find(' ') == std::string::npos && c.find('(') == std::string::npos)
        names.push_back(c.substr(c.rfind(':') == std::string::npos ? 0 : c.rfind(':') + 1));
    }
    ASSERT_FALSE(files.empty()) << line;
    for (const auto& n : names) {
      bool found = false;
      for (const auto& f : files) found = found || f.find(n) != std::string::npos;
      EXPECT_TRUE(found) << "README row names `" << n << "`, in none of its files: " << line;
    }
    ++rows;
  }
  EXPECT_GE(rows, 15);
}

}  // namespace
