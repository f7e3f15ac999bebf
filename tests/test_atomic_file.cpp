// write_file_atomically and the leftovers of killed writers: "<path>.attn-tmp.<pid>" files that a
// SIGKILL or a power loss left behind. The next write of <path> removes those whose writer is
// gone, and nothing else (issue 10: a killed `translate --output f` left f.tmp.<pid> forever, the
// temporaries then named so).
#include <sys/stat.h>
#include <attn/train/atomic_file.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "error_helpers.hpp"
#include "failing_new.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

/// A pid no process can have: one above the kernel's pid_max.
std::string dead_pid() {
  long pid_max = 4194304;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  return std::to_string(pid_max + 1);
}

class AtomicFile : public testing::TempDirTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TempDirTest::SetUp());
    // The old file; leftovers of dead writers, of out.txt and of another file; the temporary of
    // a writer that may still be at work (pid 1 exists); a name that holds no pid; and a user's
    // own file under the common ".tmp." (deleted as a dead writer's when that was the infix).
    const std::vector<std::string> names = {"out.txt",
                                            "out.txt.attn-tmp." + dead_pid(),
                                            "log.txt.attn-tmp." + dead_pid(),
                                            "out.txt.attn-tmp.1",
                                            "out.txt.attn-tmp.old",
                                            "out.txt.tmp." + dead_pid()};
    for (const std::string& name : names) std::ofstream(path(name)) << "partial";
    // A directory under a dead writer's temporary name is not a temporary this program wrote.
    fs::create_directory(path("out.txt.attn-tmp.2" + dead_pid()));
  }
};

TEST_F(AtomicFile, AWriteRemovesTheTemporariesOfItsPathThatDeadWritersLeft) {
  write_file_atomically(path("out.txt"), std::string("new"));
  std::ifstream in(path("out.txt"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  // Only out.txt.attn-tmp.<dead pid> is gone: not another file's, not a live writer's, not a
  // directory, not a name that holds no pid.
  EXPECT_EQ(list(),
            (std::vector<std::string>{"log.txt.attn-tmp." + dead_pid(), "out.txt",
                                      "out.txt.attn-tmp.1", "out.txt.attn-tmp.2" + dead_pid(),
                                      "out.txt.attn-tmp.old", "out.txt.tmp." + dead_pid()}));
}

TEST_F(AtomicFile, RemoveStaleTemporariesOfEveryNameOrOfOne) {
  EXPECT_EQ(remove_stale_temporaries(dir_, "log.txt"),
            std::vector<std::string>{path("log.txt.attn-tmp." + dead_pid())});
  std::ofstream(path("log.txt.attn-tmp." + dead_pid())) << "partial";
  std::vector<std::string> removed = remove_stale_temporaries(dir_ + "/");
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{path("log.txt.attn-tmp." + dead_pid()),
                                               path("out.txt.attn-tmp." + dead_pid())}));
  EXPECT_EQ(list(), (std::vector<std::string>{
                        "out.txt", "out.txt.attn-tmp.1", "out.txt.attn-tmp.2" + dead_pid(),
                        "out.txt.attn-tmp.old", "out.txt.tmp." + dead_pid()}));
  EXPECT_TRUE(remove_stale_temporaries(path("no such directory")).empty());
}

TEST_F(AtomicFile, ABodyThatThrowsLeavesTheOldFileAndNoTemporary) {
  const std::vector<std::string> names = list();
  struct BodyFailed {};
  EXPECT_THROW(write_file_atomically(path("out.txt"),
                                     [](int fd, std::size_t& written) -> bool {
                                       detail::write_all(fd, "half", 4, written);
                                       throw BodyFailed{};
                                     }),
               BodyFailed);
  EXPECT_EQ(testing::read_file(path("out.txt")), "partial");
  // The dead writer's temporary is gone, as with any write; no new one is left.
  std::vector<std::string> expected;
  for (const std::string& name : names)
    if (name != "out.txt.attn-tmp." + dead_pid()) expected.push_back(name);
  EXPECT_EQ(list(), expected);
}

TEST_F(AtomicFile, AnAllocationThatFailsLeavesNoDescriptorOpen) {
  if (!testing::kFailingNew) GTEST_SKIP() << "operator new is the sanitizer's in this build";
  const std::ptrdiff_t before = testing::open_descriptors();
  auto no_descriptor_left = [&](long k) {
    EXPECT_EQ(testing::open_descriptors(), before) << "allocation " << k;
  };
  // Each name of a dead writer's temporary is built while the directory is open.
  EXPECT_GE(testing::for_each_failing_allocation([&] { remove_stale_temporaries(dir_); },
                                                 no_descriptor_left),
            2);
  EXPECT_GE(
      testing::for_each_failing_allocation(
          [&] { write_file_atomically(path("out.txt"), std::string("new")); }, no_descriptor_left),
      2);
  EXPECT_EQ(testing::read_file(path("out.txt")), "new");
  for (const std::string& name : list())
    EXPECT_EQ(name.find(".attn-tmp." + std::to_string(::getpid())), std::string::npos) << name;
}

}  // namespace
}  // namespace attn
