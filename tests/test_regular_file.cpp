// RegularFile and read_regular_file (attn/train/regular_file.hpp), the reader of every model
// directory file: what each refusal says, and that no refusal leaves its descriptor open, not even
// one that an allocation failure interrupts (a constructor that throws runs no destructor, so
// RegularFile closes the descriptor itself).
#include <sys/stat.h>
#include <attn/train/regular_file.hpp>

#include <filesystem>
#include <string>

#include "error_helpers.hpp"
#include "failing_new.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;
using testing::open_descriptors;

class RegularFileTest : public testing::TempDirTest {};

TEST_F(RegularFileTest, ReadsTheWholeFileAndItsSize) {
  testing::write_file(path("w"), std::string("weights\0and more", 16));
  const RegularFile file(path("w"), 16);
  EXPECT_EQ(file.size(), 16u);
  std::string bytes(16, '?');
  file.read_all(bytes.data());
  EXPECT_EQ(bytes, std::string("weights\0and more", 16));
  EXPECT_EQ(read_regular_file(path("w"), 100), bytes);
  EXPECT_EQ(read_regular_file(path("w"), 16), bytes);  // the cap is inclusive
}

TEST_F(RegularFileTest, EachRefusalNamesThePathAndWhatWasFoundAndClosesItsDescriptor) {
  testing::write_file(path("big"), std::string(17, 'x'));
  fs::create_directory(path("dir"));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  struct Case {
    std::string name, expected;
  };
  const Case cases[] = {
      {"big", "cannot read " + path("big") + ": it holds 17 bytes, more than the 16 " +
                  "this reader accepts"},
      {"dir", "cannot read " + path("dir") + ": expected a regular file, found a directory"},
      {"fifo", "cannot read " + path("fifo") + ": expected a regular file, found a FIFO"},
      {"missing", "cannot open " + path("missing") + ": No such file or directory"},
  };
  const std::ptrdiff_t before = open_descriptors();
  for (const Case& c : cases) {
    for (int i = 0; i < 3; ++i) {  // a descriptor left open each time would show three times
      EXPECT_EQ(testing::error_of<IOError>([&] { RegularFile(path(c.name), 16); }), c.expected);
      EXPECT_EQ(testing::error_of<IOError>([&] { read_regular_file(path(c.name), 16); }),
                c.expected);
    }
    EXPECT_EQ(open_descriptors(), before) << c.name;
  }
}

TEST_F(RegularFileTest, AnAllocationThatFailsAfterTheOpenLeavesNoDescriptorOpen) {
  if (!testing::kFailingNew) GTEST_SKIP() << "operator new is the sanitizer's in this build";
  testing::write_file(path("big"), std::string(17, 'x'));
  fs::create_directory(path("dir"));
  for (const std::string name : {"big", "dir"}) {
    const std::ptrdiff_t before = open_descriptors();
    // Every allocation of the constructor fails in turn: the path's copy before the open, then
    // each one that builds the refusal's message after it.
    const long failures = testing::for_each_failing_allocation(
        [&] { RegularFile(path(name), 16); },
        [&](long k) { EXPECT_EQ(open_descriptors(), before) << name << ", allocation " << k; });
    EXPECT_GE(failures, 2) << name;  // at least one allocation after the open
  }
}

TEST_F(RegularFileTest, AReadPastTheEndOfAFileThatShrankIsAnIOError) {
  testing::write_file(path("w"), "0123456789");
  const RegularFile file(path("w"), 10);
  fs::resize_file(path("w"), 4);  // truncated by another process after the size was taken
  std::string bytes(10, '?');
  EXPECT_EQ(testing::error_of<IOError>([&] { file.read_all(bytes.data()); }),
            "cannot read " + path("w") + ": the file ended early (truncated while read?)");
}

}  // namespace
}  // namespace attn
