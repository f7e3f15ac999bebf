// Text inputs that are not plain files (corpus_io.hpp's read_lines): a FIFO without a writer is
// named after a bounded wait instead of hanging the reader, a FIFO or pipe is read as its writer
// writes, pauses and all, and a file under another process's lease is read once the lease is let go
// (model-directory files too, train/regular_file.hpp).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <attn/error.hpp>
#include <attn/train/regular_file.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "corpus_io.hpp"

namespace attn::translate {
namespace {

namespace fs = std::filesystem;
using attn::testing::error_of;
using testing::temp_dir;

// read_lines(path) on a thread of its own, the lines or the error kept for the test.
class ReaderThread {
 public:
  explicit ReaderThread(const std::string& path)
      : thread_([this, path] {
          try {
            lines_ = read_lines(path);
          } catch (const Error& e) {
            error_ = e.what();
          }
        }) {}
  ~ReaderThread() {
    if (thread_.joinable()) thread_.join();
  }
  const std::vector<std::string>& lines() {
    thread_.join();
    return lines_;
  }
  const std::string& error() const { return error_; }  // after lines()

 private:
  std::vector<std::string> lines_;
  std::string error_;
  std::thread thread_;
};

// Waits until the bytes written to `fd` (a FIFO's or pipe's) have all been read, or 60 s.
bool drained(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int queued = 1; std::chrono::steady_clock::now() < deadline;) {
    if (::ioctl(fd, FIONREAD, &queued) != 0) return false;
    if (queued == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// `fifo` opened for writing, once a reader has it open (ENXIO before), in blocking mode; -1 if no
// reader comes within 20 s (a blocking open would wait for ever for a reader that gave up).
int open_writer(const std::string& fifo) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) return ::fcntl(fd, F_SETFL, 0) == 0 ? fd : (::close(fd), -1);
    if (errno != ENXIO || std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(CorpusIo, AFifoThatNoProcessOpensForWritingIsNamedAfterAWait) {
  // The open waited for a writer for ever (a train --src naming such a FIFO hung).
  const fs::path dir = temp_dir("fifo");
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of<IOError>([&] { read_lines(fifo); });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("cannot read '" + fifo +
                       "': it is a FIFO that no process opened for writing within 10 s"),
            std::string::npos)
      << error;
  EXPECT_GE(waited, 9.9);
  EXPECT_LT(waited, 30.0);
}

TEST(CorpusIo, AFifoIsReadWhenItsWriterComesLateOrWritesSlowly) {
  const fs::path dir = temp_dir("fifo_writer");
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  {  // The writer opens it 300 ms into the reader's wait and writes 300 ms later: the reader must
     // wait for both, not see an end.
    ReaderThread reader(fifo);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int writer = open_writer(fifo);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_GE(writer, 0);
    EXPECT_EQ(::write(writer, "late\n", 5), 5);
    ::close(writer);
    EXPECT_EQ(reader.lines(), std::vector<std::string>{"late"});
    EXPECT_EQ(reader.error(), "");
  }
  {  // A writer that pauses: once the reader has taken the first lines the FIFO is empty, and the
     // reader must wait for more rather than take the pause for the end.
    const int writer = ::open(fifo.c_str(), O_RDWR);  // Linux opens a FIFO so at once
    ASSERT_GE(writer, 0);
    EXPECT_EQ(::write(writer, "one\ntwo\n", 8), 8);
    ReaderThread reader(fifo);
    EXPECT_TRUE(drained(writer));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(::write(writer, "three", 5), 5);
    ::close(writer);  // the end
    EXPECT_EQ(reader.lines(), (std::vector<std::string>{"one", "two", "three"}));
    EXPECT_EQ(reader.error(), "");
  }
  {  // A writer that opens it and goes without a word: an empty file.
    ReaderThread reader(fifo);
    const int writer = open_writer(fifo);
    EXPECT_GE(writer, 0);
    ::close(writer);
    EXPECT_TRUE(reader.lines().empty());
    EXPECT_EQ(reader.error(), "");
  }
}

TEST(CorpusIo, APipeIsReadThroughItsDevFdPathAsItIsWritten) {
  // What `--src <(zcat train.en.gz)` names: /dev/fd/N of a pipe whose writer is the shell's.
  const fs::path dir = temp_dir("pipe");
  write_lines((dir / "x.gz").string(), {"ein hund", "zwei katzen"});
  const std::string gz = testing::read_file(dir / "x.gz");
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  const auto half = static_cast<ssize_t>(gz.size() / 2);
  EXPECT_EQ(::write(ends[1], gz.data(), half), half);
  ReaderThread reader("/dev/fd/" + std::to_string(ends[0]));
  EXPECT_TRUE(drained(ends[1]));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto rest = static_cast<ssize_t>(gz.size()) - half;
  EXPECT_EQ(::write(ends[1], gz.data() + half, rest), rest);
  ::close(ends[1]);
  EXPECT_EQ(reader.lines(), (std::vector<std::string>{"ein hund", "zwei katzen"}));
  EXPECT_EQ(reader.error(), "");
  ::close(ends[0]);
}

TEST(CorpusIo, AFileUnderALeaseIsReadOnceItsHolderLetsGo) {
  // A non-blocking open of a file another process holds a write lease on fails with EWOULDBLOCK:
  // read_lines and read_regular_file (model-directory files) reported "Resource temporarily
  // unavailable". The break's SIGIO ends the child here, which lets the lease go.
  const fs::path dir = temp_dir("lease");
  const std::string path = (dir / "leased.txt").string();
  testing::write_file(path, "leased\n");
  for (int reader = 0; reader < 2; ++reader) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const int fd = ::open(path.c_str(), O_RDONLY);
      const char held = fd >= 0 && ::fcntl(fd, F_SETLEASE, F_WRLCK) == 0 ? 'y' : 'n';
      if (::write(ready[1], &held, 1) == 1) ::pause();
      ::_exit(0);
    }
    ::close(ready[1]);
    char held = 'n';
    const bool told = ::read(ready[0], &held, 1) == 1;
    ::close(ready[0]);
    if (!told || held != 'y') {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
      GTEST_SKIP() << "this filesystem grants no lease";
    }
    if (reader == 0)
      EXPECT_EQ(read_lines(path), std::vector<std::string>{"leased"});
    else
      EXPECT_EQ(read_regular_file(path, 100), "leased\n");
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
}

}  // namespace
}  // namespace attn::translate
